//! Qwen3 dense: Llama's block structure plus per-head RMSNorm of queries and keys (`attn_q_norm`,
//! `attn_k_norm`, applied before RoPE), NEOX (half-split) RoPE, and usually an untied output head.

use super::blocks::{head_forward, AttnWeights, DenseFfn, Head, Pass};
use crate::backend::{Backend, RopeMode, RopeParams};
use crate::error::Result;
use crate::hparams::Hparams;
use crate::weights::Binder;

pub(crate) struct Layer {
    attn: AttnWeights,
    ffn: DenseFfn,
}

/// Qwen3 weights.
pub(crate) struct Qwen3 {
    head: Head,
    layers: Vec<Layer>,
    rope: RopeParams,
}

impl Qwen3 {
    pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Qwen3> {
        let head = Head::bind(b, hp)?;
        let layers = (0..hp.n_layer)
            .map(|il| {
                Ok(Layer {
                    attn: AttnWeights::bind(b, hp, il, true)?,
                    ffn: DenseFfn::bind(b, hp, il)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Qwen3 {
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
            l.ffn.forward(p)?;
            p.after_layer(il)?;
        }
        head_forward(p, &self.head, logit_rows)
    }
}
