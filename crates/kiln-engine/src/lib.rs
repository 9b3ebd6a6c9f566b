//! kiln-engine (under construction).
pub mod sampler;
