//! The shared blocks the architectures are built from: weights of an attention block, a dense SwiGLU FFN and a
//! MoE FFN (each declared with its expected shapes), and the forward code of each block against [`Backend`].
//! [`Decoder`] stacks them (its FFN block the architecture's [`Ffn`]); the per-architecture files bind a decoder
//! with their options. Every intermediate lives in a named [`Scratch`] buffer.

use crate::backend::{AttnParams, AttnRow, Backend, MoeFfn, RopeMode, RopeParams};
use crate::error::{Error, Result};
use crate::hparams::Hparams;
use crate::weights::{require_f32, Binder, Weight};

/// Per-session activation buffers, sized for the largest batch. Names are the intermediates of a layer.
pub(crate) struct Scratch<B: Backend> {
    /// Residual stream, `rows × n_embd`.
    pub x: B::Buf,
    /// Normalised input of the current block, `rows × n_embd`.
    pub xn: B::Buf,
    /// Queries, `rows × n_head·head_dim`.
    pub q: B::Buf,
    /// Keys, `rows × n_head_kv·head_dim`.
    pub k: B::Buf,
    /// Values, `rows × n_head_kv·head_dim`.
    pub v: B::Buf,
    /// Attention output before the output projection, `rows × n_head·head_dim`.
    pub attn: B::Buf,
    /// Block output before the residual add, `rows × n_embd`.
    pub out: B::Buf,
    /// FFN gate projection, `rows × n_ff`.
    pub gate: B::Buf,
    /// FFN up projection, `rows × n_ff`.
    pub up: B::Buf,
    /// silu(gate)·up, `rows × n_ff`.
    pub act: B::Buf,
    /// Rows that want logits, gathered and normalised, `rows × n_embd`.
    pub head_in: B::Buf,
    /// Logits, `rows × n_vocab`.
    pub logits: B::Buf,
    /// Hidden states of the tapped layers, `taps × rows × n_embd` (grown before a tapped pass, outside it).
    pub taps: Option<(B::Buf, usize)>,
}

impl<B: Backend> Scratch<B> {
    pub(crate) fn new(be: &B, hp: &Hparams, rows: usize, logit_rows: usize) -> Result<Self> {
        let qd = hp.n_head * hp.head_dim;
        let kvd = hp.n_head_kv * hp.head_dim;
        let ff = hp.n_ff.max(hp.n_ff_exp);
        Ok(Scratch {
            x: be.alloc(rows * hp.n_embd)?,
            xn: be.alloc(rows * hp.n_embd)?,
            q: be.alloc(rows * qd)?,
            k: be.alloc(rows * kvd)?,
            v: be.alloc(rows * kvd)?,
            attn: be.alloc(rows * qd)?,
            out: be.alloc(rows * hp.n_embd)?,
            gate: be.alloc(rows * ff)?,
            up: be.alloc(rows * ff)?,
            act: be.alloc(rows * ff)?,
            head_in: be.alloc(logit_rows * hp.n_embd)?,
            logits: be.alloc(logit_rows * hp.n_vocab)?,
            taps: None,
        })
    }

    /// Makes room for `n_taps` tapped layers of `rows` rows.
    pub(crate) fn reserve_taps(
        &mut self,
        be: &B,
        hp: &Hparams,
        n_taps: usize,
        rows: usize,
    ) -> Result<()> {
        let need = n_taps * rows * hp.n_embd;
        if need > 0 && self.taps.as_ref().is_none_or(|(_, cap)| *cap < need) {
            self.taps = Some((be.alloc(need)?, need));
        }
        Ok(())
    }
}

/// What a forward pass over one batch needs besides the weights.
pub(crate) struct Pass<'a, B: Backend> {
    pub be: &'a B,
    pub hp: &'a Hparams,
    pub st: &'a mut Scratch<B>,
    pub kv: &'a mut B::Kv,
    pub rows: &'a [AttnRow],
    pub positions: &'a [usize],
    /// Layers whose output hidden states (the residual stream after the layer) are kept, ascending and
    /// distinct; layer `taps[t]` goes to slot `t` of the scratch's tap buffer.
    pub taps: &'a [usize],
}

impl<B: Backend> Pass<'_, B> {
    pub(crate) fn n(&self) -> usize {
        self.rows.len()
    }

    /// Called by each architecture after layer `il`: keeps the hidden state if the layer is tapped (a copy on
    /// the backend; the session reads them all after the pass).
    pub(crate) fn after_layer(&mut self, il: usize) -> Result<()> {
        if let Some(t) = self.taps.iter().position(|&l| l == il) {
            let n = self.n() * self.hp.n_embd;
            let (buf, _) = self
                .st
                .taps
                .as_mut()
                .ok_or_else(|| Error::Batch("tapped pass without a tap buffer".into()))?;
            self.be.copy_into(buf, t * n, &self.st.x, n)?;
        }
        Ok(())
    }
}

/// Embedding, final norm and output head. With tied embeddings `output` is the embedding matrix.
pub(crate) struct Head {
    pub token_embd: Weight,
    pub output_norm: Weight,
    pub output: Weight,
}

impl Head {
    pub(crate) fn bind(b: &mut Binder, hp: &Hparams) -> Result<Head> {
        let (d, nv) = (hp.n_embd as u64, hp.n_vocab as u64);
        let token_embd = b.req("token_embd.weight", &[d, nv])?;
        let output_norm = b.req("output_norm.weight", &[d])?;
        require_f32(&output_norm, "an RMSNorm weight (f32)")?;
        // No output.weight means tied embeddings (SmolLM2, small Qwen3): the head reuses token_embd.
        let output = b
            .opt("output.weight", &[d, nv])?
            .unwrap_or_else(|| token_embd.clone());
        Ok(Head {
            token_embd,
            output_norm,
            output,
        })
    }
}

/// Self-attention block weights. `q_norm`/`k_norm` are Qwen3's per-head QK-norm.
pub(crate) struct AttnWeights {
    pub norm: Weight,
    pub q: Weight,
    pub k: Weight,
    pub v: Weight,
    pub o: Weight,
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
}

impl AttnWeights {
    pub(crate) fn bind(b: &mut Binder, hp: &Hparams, il: usize, qk_norm: bool) -> Result<Self> {
        let d = hp.n_embd as u64;
        let qd = (hp.n_head * hp.head_dim) as u64;
        let kvd = (hp.n_head_kv * hp.head_dim) as u64;
        let hd = hp.head_dim as u64;
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let norm = b.req(&n("attn_norm"), &[d])?;
        require_f32(&norm, "an RMSNorm weight (f32)")?;
        let (q_norm, k_norm) = if qk_norm {
            let qn = b.req(&n("attn_q_norm"), &[hd])?;
            let kn = b.req(&n("attn_k_norm"), &[hd])?;
            require_f32(&qn, "an RMSNorm weight (f32)")?;
            require_f32(&kn, "an RMSNorm weight (f32)")?;
            (Some(qn), Some(kn))
        } else {
            (None, None)
        };
        Ok(AttnWeights {
            norm,
            q: b.req(&n("attn_q"), &[d, qd])?,
            k: b.req(&n("attn_k"), &[d, kvd])?,
            v: b.req(&n("attn_v"), &[d, kvd])?,
            o: b.req(&n("attn_output"), &[qd, d])?,
            q_norm,
            k_norm,
        })
    }

    /// `x += Wo · attention(rope(norm_qk(Wq·n(x))), rope(norm_qk(Wk·n(x))), Wv·n(x))`. `then`: the weights the
    /// block after this one reads first ([`Backend::prefetch`]).
    pub(crate) fn forward<B: Backend>(
        &self,
        p: &mut Pass<B>,
        layer: usize,
        rope: &RopeParams,
        then: &[&Weight],
    ) -> Result<()> {
        let (be, hp, n) = (p.be, p.hp, p.n());
        let st = &mut *p.st;
        be.rms_norm(&mut st.xn, &st.x, &self.norm, n, hp.n_embd, hp.rms_eps)?;
        // Read after the attention: the output projection, then the next block's first weights.
        be.prefetch(&[[&self.o].as_slice(), then].concat());
        be.matmul_many(
            &mut [&mut st.q, &mut st.k, &mut st.v],
            &[&self.q, &self.k, &self.v],
            &st.xn,
            n,
        )?;
        let ap = AttnParams {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            scale: 1.0 / (hp.head_dim as f32).sqrt(),
        };
        let qk_norm = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => Some((qn, kn, hp.rms_eps)),
            _ => None,
        };
        be.attention_block(
            &mut st.attn,
            &mut st.q,
            &mut st.k,
            &st.v,
            p.kv,
            layer,
            p.rows,
            p.positions,
            &ap,
            rope,
            qk_norm,
            None,
        )?;
        be.prefetch(then);
        be.matmul_add(&mut st.x, &self.o, &st.attn, &mut st.out, n)
    }
}

/// Dense SwiGLU FFN weights.
pub(crate) struct DenseFfn {
    pub norm: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// A layer's feed-forward block: what distinguishes the decoders built from [`Decoder`].
pub(crate) trait Ffn: Sized {
    /// Layer `il`'s weights.
    fn bind(b: &mut Binder, hp: &Hparams, il: usize) -> Result<Self>;
    /// `x += ffn(n(x))` over the pass's rows. `then`: the weights read first after this block
    /// ([`Backend::prefetch`]).
    fn forward<B: Backend>(&self, p: &mut Pass<B>, then: &[&Weight]) -> Result<()>;
    /// The weights this block's first matmul reads, when known before the pass (for the block before it to
    /// prefetch).
    fn first_read(&self) -> Vec<&Weight>;
}

/// The decoder every supported architecture is: token embedding, `n_layer` × (attention block, FFN block), final
/// norm and output head. The architectures differ in the FFN, QK-norm and the RoPE layout only.
pub(crate) struct Decoder<F> {
    head: Head,
    layers: Vec<(AttnWeights, F)>,
    rope: RopeParams,
}

impl<F: Ffn> Decoder<F> {
    pub(crate) fn bind(
        b: &mut Binder,
        hp: &Hparams,
        qk_norm: bool,
        mode: RopeMode,
    ) -> Result<Self> {
        let head = Head::bind(b, hp)?;
        let layers = (0..hp.n_layer)
            .map(|il| Ok((AttnWeights::bind(b, hp, il, qk_norm)?, F::bind(b, hp, il)?)))
            .collect::<Result<_>>()?;
        Ok(Decoder {
            head,
            layers,
            rope: RopeParams {
                mode,
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
        for (il, (attn, ffn)) in self.layers.iter().enumerate() {
            let next = match self.layers.get(il + 1) {
                Some((a, _)) => vec![&a.q, &a.k],
                None => vec![&self.head.output],
            };
            attn.forward(p, il, &self.rope, &ffn.first_read())?;
            ffn.forward(p, &next)?;
            p.after_layer(il)?;
        }
        head_forward(p, &self.head, logit_rows)
    }
}

impl Ffn for DenseFfn {
    fn bind(b: &mut Binder, hp: &Hparams, il: usize) -> Result<Self> {
        let (d, ff) = (hp.n_embd as u64, hp.n_ff as u64);
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let norm = b.req(&n("ffn_norm"), &[d])?;
        require_f32(&norm, "an RMSNorm weight (f32)")?;
        Ok(DenseFfn {
            norm,
            gate: b.req(&n("ffn_gate"), &[d, ff])?,
            up: b.req(&n("ffn_up"), &[d, ff])?,
            down: b.req(&n("ffn_down"), &[ff, d])?,
        })
    }

    /// `x += W_down · (silu(W_gate · n(x)) * (W_up · n(x)))`.
    fn forward<B: Backend>(&self, p: &mut Pass<B>, then: &[&Weight]) -> Result<()> {
        let (be, hp, n) = (p.be, p.hp, p.n());
        let st = &mut *p.st;
        be.rms_norm(&mut st.xn, &st.x, &self.norm, n, hp.n_embd, hp.rms_eps)?;
        be.prefetch(&[&self.down]);
        be.matmul_many(
            &mut [&mut st.gate, &mut st.up],
            &[&self.gate, &self.up],
            &st.xn,
            n,
        )?;
        be.swiglu(&mut st.act, &st.gate, &st.up, n * hp.n_ff)?;
        be.prefetch(then);
        be.matmul_add(&mut st.x, &self.down, &st.act, &mut st.out, n)
    }

    fn first_read(&self) -> Vec<&Weight> {
        vec![&self.gate, &self.up]
    }
}

/// Mixture-of-experts FFN weights (no shared expert).
pub(crate) struct MoeWeights {
    pub norm: Weight,
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl Ffn for MoeWeights {
    fn bind(b: &mut Binder, hp: &Hparams, il: usize) -> Result<Self> {
        let (d, ff, ne) = (hp.n_embd as u64, hp.n_ff_exp as u64, hp.n_expert as u64);
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let norm = b.req(&n("ffn_norm"), &[d])?;
        require_f32(&norm, "an RMSNorm weight (f32)")?;
        Ok(MoeWeights {
            norm,
            router: b.req(&n("ffn_gate_inp"), &[d, ne])?,
            gate: b.req(&n("ffn_gate_exps"), &[d, ff, ne])?,
            up: b.req(&n("ffn_up_exps"), &[d, ff, ne])?,
            down: b.req(&n("ffn_down_exps"), &[ff, d, ne])?,
        })
    }

    /// `x += Σ_e w_e · expert_e(n(x))` over the routed experts. No prefetch: which experts a pass reads is known
    /// only once it routes, and the MoE matmuls issue none.
    fn forward<B: Backend>(&self, p: &mut Pass<B>, _then: &[&Weight]) -> Result<()> {
        let (be, hp, n) = (p.be, p.hp, p.n());
        let st = &mut *p.st;
        be.rms_norm(&mut st.xn, &st.x, &self.norm, n, hp.n_embd, hp.rms_eps)?;
        let m = MoeFfn {
            router: &self.router,
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
            n_used: hp.n_expert_used,
            norm_topk: hp.norm_topk,
        };
        be.moe_ffn(&mut st.out, &st.xn, n, &m)?;
        be.add(&mut st.x, &st.out, n * hp.n_embd)
    }

    fn first_read(&self) -> Vec<&Weight> {
        Vec::new()
    }
}

/// The final norm and output projection for the rows in `logit_rows` (indices into the batch).
pub(crate) fn head_forward<B: Backend>(
    p: &mut Pass<B>,
    head: &Head,
    logit_rows: &[usize],
) -> Result<()> {
    if logit_rows.is_empty() {
        return Ok(());
    }
    let (be, hp) = (p.be, p.hp);
    let st = &mut *p.st;
    let m = logit_rows.len();
    be.gather_rows(&mut st.xn, &st.x, logit_rows, hp.n_embd)?;
    be.rms_norm(
        &mut st.head_in,
        &st.xn,
        &head.output_norm,
        m,
        hp.n_embd,
        hp.rms_eps,
    )?;
    be.matmul(&mut st.logits, &head.output, &st.head_in, m)
}
