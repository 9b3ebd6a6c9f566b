//! kiln-tokenizer (under construction).
