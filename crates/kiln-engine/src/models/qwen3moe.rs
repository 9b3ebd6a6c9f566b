//! Qwen3-MoE: Qwen3 attention (QK-norm, NEOX RoPE) with a routed mixture-of-experts FFN in every layer:
//! softmax router, top-`expert_used_count` experts, weights renormalised (`norm_topk_prob`), no shared expert.

use super::blocks::{head_forward, AttnWeights, Head, MoeWeights, Pass};
use crate::backend::{Backend, RopeMode, RopeParams};
use crate::error::Result;
use crate::hparams::Hparams;
use crate::weights::Binder;

pub(crate) struct Layer {
    attn: AttnWeights,
    moe: MoeWeights,
}

/// Qwen3-MoE weights.
pub(crate) struct Qwen3Moe {
    head: Head,
    layers: Vec<Layer>,
    rope: RopeParams,
}

impl Qwen3Moe {
    pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Qwen3Moe> {
        let head = Head::bind(b, hp)?;
        let layers = (0..hp.n_layer)
            .map(|il| {
                Ok(Layer {
                    attn: AttnWeights::bind(b, hp, il, true)?,
                    moe: MoeWeights::bind(b, hp, il)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Qwen3Moe {
            head,
            layers,
            rope: RopeParams {
                mode: RopeMode::Neox,
                theta: hp.rope_theta,
                freq_scale: hp.rope_freq_scale,
            },
        })
    }

    pub(crate) fn forward<B: Backend>(
        &self,
        p: &mut Pass<B>,
        tokens: &[u32],
        logit_rows: &[usize],
    ) -> Result<()> {
        p.be.embed(&mut p.st.x, &self.head.token_embd, tokens)?;
        for (il, l) in self.layers.iter().enumerate() {
            l.attn.forward(p, il, &self.rope)?;
            l.moe.forward(p)?;
            p.after_layer(il)?;
        }
        head_forward(p, &self.head, logit_rows)
    }
}
