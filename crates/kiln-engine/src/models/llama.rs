//! Llama (SmolLM2, Llama 2/3 without frequency factors): pre-norm blocks of GQA attention with normal
//! (adjacent-pair) RoPE and a SwiGLU FFN; tied embeddings when `output.weight` is absent.
//!
//! GGUF stores Q/K with the converter's row permutation, which turns HF's half-split rotation into rotation of
//! adjacent pairs; hence `RopeMode::Normal` here and `Neox` for Qwen3.

use super::blocks::{head_forward, AttnWeights, DenseFfn, Head, Pass};
use crate::backend::{Backend, RopeMode, RopeParams};
use crate::error::{Error, Result};
use crate::hparams::Hparams;
use crate::weights::Binder;

pub(crate) struct Layer {
    attn: AttnWeights,
    ffn: DenseFfn,
}

/// Llama weights.
pub(crate) struct Llama {
    head: Head,
    layers: Vec<Layer>,
    rope: RopeParams,
}

impl Llama {
    pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Llama> {
        // Llama 3.1-style rope scaling ships as per-frequency factors; ignoring them would be silently wrong.
        if b.has("rope_freqs.weight") {
            return Err(Error::Unsupported(
                "RoPE frequency factors (tensor 'rope_freqs.weight', llama3 rope scaling)".into(),
            ));
        }
        let head = Head::bind(b, hp)?;
        let layers = (0..hp.n_layer)
            .map(|il| {
                Ok(Layer {
                    attn: AttnWeights::bind(b, hp, il, false)?,
                    ffn: DenseFfn::bind(b, hp, il)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Llama {
            head,
            layers,
            rope: RopeParams {
                mode: RopeMode::Normal,
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
