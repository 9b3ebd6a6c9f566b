//! DFlash speculative decoding (z-lab, "Block Diffusion for Flash Speculative Decoding"; reference: the `dflash`
//! package 0.1.0): a small drafter that reads the target's hidden states and proposes a whole block of tokens in
//! one forward, verified by one target forward over the block.
//!
//! - [`DraftConfig`]: the drafter's `config.json`, parsed strictly and validated against the target.
//! - [`Drafter`]: weights (`model.safetensors`) and the forward pass; [`DraftState`] is one sequence's context.
//! - [`generate`]: the speculative loop, output identical to plain generation; [`Forced`] forces acceptance for
//!   tests and efficiency measurements; [`SpecStats`] counts rounds, τ and the acceptance histogram.
//! - [`convert_to_gguf`]: one GGUF per drafter (optionally quantized), loaded by [`Drafter::load`] too.
//! - [`write_random_drafter`]: reproducible random-weight drafters in the z-lab format.

mod adaptive;
mod config;
mod drafter;
mod gguf;
pub(crate) mod spec;
mod synth;

pub use adaptive::{DraftLength, DraftMax};
pub use config::{default_layer_ids, DraftConfig};
pub use drafter::{DraftState, Drafter};
pub use gguf::{convert_to_gguf, CONFIG_KEY, DRAFT_ARCH};
pub(crate) use spec::{add_gpu, generate_in};
pub use spec::{generate, generate_with, Acceptance, Forced, SpecOutput, SpecStats};
pub use synth::{draft_spec_for, write_random_drafter, DraftSpec};
