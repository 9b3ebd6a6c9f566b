//! Llama (SmolLM2, Llama 2/3 without frequency factors): pre-norm blocks of GQA attention with normal
//! (adjacent-pair) RoPE and a SwiGLU FFN; tied embeddings when `output.weight` is absent.
//!
//! GGUF stores Q/K with the converter's row permutation, which turns HF's half-split rotation into rotation of
//! adjacent pairs; hence `RopeMode::Normal` here and `Neox` for Qwen3.

use super::blocks::{Decoder, DenseFfn};
use crate::backend::RopeMode;
use crate::error::{Error, Result};
use crate::hparams::Hparams;
use crate::weights::Binder;

/// Llama weights.
pub(crate) type Llama = Decoder<DenseFfn>;

pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Llama> {
    // Llama 3.1-style rope scaling ships as per-frequency factors; ignoring them would be silently wrong.
    if b.has("rope_freqs.weight") {
        return Err(Error::Unsupported(
            "RoPE frequency factors (tensor 'rope_freqs.weight', llama3 rope scaling)".into(),
        ));
    }
    Decoder::bind(b, hp, false, RopeMode::Normal)
}
