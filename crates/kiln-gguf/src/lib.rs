//! kiln-gguf (under construction).
