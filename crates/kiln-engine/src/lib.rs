//! kiln-engine (under construction).
