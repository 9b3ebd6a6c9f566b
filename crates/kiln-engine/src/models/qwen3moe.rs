//! Qwen3-MoE: Qwen3 attention (QK-norm, NEOX RoPE) with a routed mixture-of-experts FFN in every layer:
//! softmax router, top-`expert_used_count` experts, weights renormalised (`norm_topk_prob`), no shared expert.

use super::blocks::{Decoder, MoeWeights};
use crate::backend::RopeMode;
use crate::error::Result;
use crate::hparams::Hparams;
use crate::weights::Binder;

/// Qwen3-MoE weights.
pub(crate) type Qwen3Moe = Decoder<MoeWeights>;

pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Qwen3Moe> {
    Decoder::bind(b, hp, true, RopeMode::Neox)
}
