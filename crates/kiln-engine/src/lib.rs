//! kiln-engine (under construction).
pub mod sampler;
pub mod fidelity;
