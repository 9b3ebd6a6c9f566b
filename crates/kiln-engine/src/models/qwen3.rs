//! Qwen3 dense: Llama's block structure plus per-head RMSNorm of queries and keys (`attn_q_norm`,
//! `attn_k_norm`, applied before RoPE), NEOX (half-split) RoPE, and usually an untied output head.

use super::blocks::{Decoder, DenseFfn};
use crate::backend::RopeMode;
use crate::error::Result;
use crate::hparams::Hparams;
use crate::weights::Binder;

/// Qwen3 weights.
pub(crate) type Qwen3 = Decoder<DenseFfn>;

pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Qwen3> {
    Decoder::bind(b, hp, true, RopeMode::Neox)
}
