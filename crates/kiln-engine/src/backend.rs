//! The `Backend` trait: the coarse, tensor-resident operations the model definitions are written against.
//!
//! A backend owns its activation buffers ([`Backend::Buf`], f32 elements, row-major `rows × width`) and its KV
//! cache storage ([`Backend::Kv`]); activations stay resident across the ops of a forward pass and only logits
//! and tapped hidden states are read back ([`Backend::read`]). Arguments come in the order outputs, inputs,
//! dimensions, parameters; every op returns `Result`. Ops act on the first `n_rows` rows of buffers sized for
//! the session's largest batch.
//!
//! Batch invariance is part of the contract: an op's result for one row must not depend on which other rows
//! share the call (fixed per-row reduction order in matmuls and attention), so batched decode, a speculative
//! verify block and a prefill chunk all give each row the bits it would get alone. The CPU backend
//! ([`crate::cpu::CpuBackend`]) is the reference every other backend is tested against.

use crate::error::Result;
use crate::weights::Weight;

/// RoPE variant: which element pairs rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama, on GGUF's permuted Q/K weights).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (Qwen3, GPT-NeoX).
    Neox,
}

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Pair layout.
    pub mode: RopeMode,
    /// Base frequency.
    pub theta: f32,
    /// Multiplier applied to positions (linear scaling; 1.0 for none).
    pub freq_scale: f32,
}

/// Which positions a drafter layer's block rows attend to, as the reference builds its mask: every context
/// position and the whole block (a full-attention layer, the z-lab default), or, when `causal`, only positions up
/// to the row's own; with a sliding `window` W, only positions less than W away from the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockAttn {
    /// Rows see no later position of the block.
    pub causal: bool,
    /// Sliding window: a row at p sees positions q with |p − q| < W.
    pub window: Option<usize>,
}

impl BlockAttn {
    /// Every context position and the whole block.
    pub const FULL: BlockAttn = BlockAttn {
        causal: false,
        window: None,
    };

    /// Positions `lo..hi` of its slot that a block row at `pos` sees, `end` being one past the block's last row.
    pub fn span(&self, pos: usize, end: usize) -> (usize, usize) {
        let hi = if self.causal { pos + 1 } else { end };
        match self.window {
            None => (0, hi),
            Some(w) => (
                (pos + 1).saturating_sub(w),
                if self.causal { hi } else { hi.min(pos + w) },
            ),
        }
    }
}

/// Attention shape and scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (each serves `n_head / n_head_kv` query heads).
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Score scale (1/sqrt(head_dim)).
    pub scale: f32,
}

/// Where one batch row sits: its KV slot and position. The row's K/V are stored at `(slot, pos)` and its query
/// attends to positions `0..=pos` of that slot (causal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnRow {
    /// Sequence slot.
    pub slot: usize,
    /// Position within the slot.
    pub pos: usize,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// Half precision (half the memory; llama.cpp's default).
    #[default]
    F16,
    /// Single precision (exact; used by the reference comparisons).
    F32,
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            other => Err(format!("unknown KV cache type '{other}' (f16 or f32)")),
        }
    }
}

/// Geometry of the KV cache: `n_layer × n_slots × slot_ctx × n_head_kv × head_dim` for keys and for values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub n_layer: usize,
    /// Sequence slots.
    pub n_slots: usize,
    /// Positions per slot.
    pub slot_ctx: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Element type.
    pub ty: KvType,
}

/// The weights and routing rule of one mixture-of-experts FFN.
#[derive(Clone, Copy, Debug)]
pub struct MoeFfn<'a> {
    /// Router `[n_embd, n_expert]`.
    pub router: &'a Weight,
    /// Expert gate projections `[n_embd, n_ff_exp, n_expert]`.
    pub gate: &'a Weight,
    /// Expert up projections `[n_embd, n_ff_exp, n_expert]`.
    pub up: &'a Weight,
    /// Expert down projections `[n_ff_exp, n_embd, n_expert]`.
    pub down: &'a Weight,
    /// Experts per token.
    pub n_used: usize,
    /// Renormalise the chosen experts' softmax weights to sum to one.
    pub norm_topk: bool,
}

/// The operations a model definition needs. See the module docs for conventions.
pub trait Backend: Send + Sync {
    /// An activation buffer of f32 elements.
    type Buf: Send;
    /// KV cache storage for all layers and slots.
    type Kv: Send;

    /// A zeroed buffer of `len` f32 elements.
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    /// KV storage for `layout`.
    fn alloc_kv(&self, layout: &KvLayout) -> Result<Self::Kv>;

    /// `out[i] = table[tokens[i]]` (rows of the embedding matrix, dequantized).
    fn embed(&self, out: &mut Self::Buf, table: &Weight, tokens: &[u32]) -> Result<()>;
    /// Row-wise RMSNorm of `n_rows × width` values, times `weight` (`width` f32 values).
    fn rms_norm(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()>;
    /// [`Backend::rms_norm`] in place (QK-norm: `n_rows` is tokens × heads, `width` the head dimension).
    fn rms_norm_inplace(
        &self,
        x: &mut Self::Buf,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()>;
    /// `out[r] = W · x[r]` for `n_rows` rows: `x` is `n_rows × w.cols()`, `out` is `n_rows × w.rows`.
    fn matmul(&self, out: &mut Self::Buf, w: &Weight, x: &Self::Buf, n_rows: usize) -> Result<()>;
    /// `outs[i] = ws[i] · x` for weights reading the same input (Q/K/V, gate/up), which a backend may run as one
    /// launch; each output must have the bits of its own [`Backend::matmul`].
    fn matmul_many(
        &self,
        outs: &mut [&mut Self::Buf],
        ws: &[&Weight],
        x: &Self::Buf,
        n_rows: usize,
    ) -> Result<()> {
        for (o, w) in outs.iter_mut().zip(ws) {
            self.matmul(o, w, x, n_rows)?;
        }
        Ok(())
    }
    /// A hint: `next` are the weights of the matmul after the next one (in the order it reads them), which the
    /// ops between (norms, attention, SwiGLU) leave time to fetch. A backend with a cache to warm may start
    /// fetching them with the next matmul; results never depend on it.
    fn prefetch(&self, next: &[&Weight]) {
        let _ = next;
    }
    /// Rotates `n_heads` heads of `head_dim` in each of `positions.len()` rows, in place.
    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<()>;
    /// Stores each row's `k`/`v` at its `(slot, pos)` in layer `layer` of `kv`, then computes causal attention for
    /// each row's query over positions `0..=pos` of its slot. `out` is `rows.len() × n_head·head_dim`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        out: &mut Self::Buf,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        kv: &mut Self::Kv,
        layer: usize,
        rows: &[AttnRow],
        p: &AttnParams,
    ) -> Result<()>;
    /// The attention block after the Q/K/V projections, as one op a backend may fuse: per-head QK-norm of `q`
    /// and `k` (when `qk_norm` gives the two weights), RoPE at each row's position, then [`Backend::attention`],
    /// or with `visible` = `Some((end, mask))` [`Backend::attention_visible`] (a DFlash drafter's block).
    /// `q` and `k` are modified in place.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        out: &mut Self::Buf,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        kv: &mut Self::Kv,
        layer: usize,
        rows: &[AttnRow],
        positions: &[usize],
        p: &AttnParams,
        rope: &RopeParams,
        qk_norm: Option<(&Weight, &Weight, f32)>,
        visible: Option<(usize, BlockAttn)>,
    ) -> Result<()> {
        unfused_attention_block(
            self, out, q, k, v, kv, layer, rows, positions, p, rope, qk_norm, visible,
        )
    }
    /// `x += W · a` for `n_rows` rows (the residual projection), which a backend may fuse into the matmul; `tmp`
    /// is scratch of the output's size for backends that do not.
    fn matmul_add(
        &self,
        x: &mut Self::Buf,
        w: &Weight,
        a: &Self::Buf,
        tmp: &mut Self::Buf,
        n_rows: usize,
    ) -> Result<()> {
        self.matmul(tmp, w, a, n_rows)?;
        self.add(x, tmp, n_rows * w.view().rows)
    }
    /// `out = silu(gate) * up` over `n` elements.
    fn swiglu(&self, out: &mut Self::Buf, gate: &Self::Buf, up: &Self::Buf, n: usize)
        -> Result<()>;
    /// `x += y` over `n` elements (the residual connection).
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> Result<()>;
    /// Mixture-of-experts FFN: per row, route over the experts, run the chosen ones, sum weighted outputs.
    fn moe_ffn(&self, out: &mut Self::Buf, x: &Self::Buf, n_rows: usize, m: &MoeFfn) -> Result<()>;
    /// `out[i] = x[rows[i]]` for rows of `width` elements.
    fn gather_rows(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        rows: &[usize],
        width: usize,
    ) -> Result<()>;
    /// Copies the first `dst.len()` elements of `x` to the host.
    fn read(&self, x: &Self::Buf, dst: &mut [f32]) -> Result<()>;
    /// Copies `src` from the host into the first `src.len()` elements of `dst`.
    fn write(&self, dst: &mut Self::Buf, src: &[f32]) -> Result<()>;
    /// `dst[offset..offset + n] = src[..n]` on the backend (a tapped layer's hidden states, kept until the pass
    /// ends so the pass reads nothing back midway).
    fn copy_into(
        &self,
        dst: &mut Self::Buf,
        offset: usize,
        src: &Self::Buf,
        n: usize,
    ) -> Result<()>;
    /// Stores the rows' K and V (`rows × n_head_kv · head_dim` each) in layer `layer` of the cache at each row's
    /// `(slot, pos)`, without attention (a DFlash drafter's context).
    fn kv_store(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        rows: &[AttnRow],
    ) -> Result<()>;
    /// The keys' per-head norm (`k_norm`: weight and eps) and RoPE at each row's position, in place, then
    /// [`Backend::kv_store`], as one op a backend may fuse (a DFlash drafter's context rows).
    #[allow(clippy::too_many_arguments)]
    fn kv_store_block(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        k: &mut Self::Buf,
        v: &Self::Buf,
        rows: &[AttnRow],
        positions: &[usize],
        p: &AttnParams,
        rope: &RopeParams,
        k_norm: (&Weight, f32),
    ) -> Result<()> {
        unfused_kv_store_block(self, kv, layer, k, v, rows, positions, p, rope, k_norm)
    }
    /// [`Backend::attention`], except that every row attends to the positions `attn.span(pos, visible)` of its
    /// slot, where `visible` is the last row's position + 1: with [`BlockAttn::FULL`] the rows of a block see one
    /// another whatever their order, as a DFlash drafter's block does. A backend that takes only that says so in
    /// [`Backend::block_masks`] and refuses other masks here.
    #[allow(clippy::too_many_arguments)]
    fn attention_visible(
        &self,
        out: &mut Self::Buf,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        kv: &mut Self::Kv,
        layer: usize,
        rows: &[AttnRow],
        visible: usize,
        attn: BlockAttn,
        p: &AttnParams,
    ) -> Result<()>;
    /// Whether [`Backend::attention_visible`] takes masks other than [`BlockAttn::FULL`] (causal, windowed).
    fn block_masks(&self) -> bool {
        true
    }
    /// [`crate::sampler::greedy_argmax`] of each of `n_rows` rows of `width` values: the greedy token without
    /// copying the logits to the host (a GPU reads 4 bytes a row instead of the vocabulary).
    fn argmax_rows(&self, x: &Self::Buf, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        let mut host = vec![0.0; n_rows * width];
        self.read(x, &mut host)?;
        Ok(host
            .chunks(width.max(1))
            .map(crate::sampler::greedy_argmax)
            .collect())
    }
}

/// [`Backend::kv_store_block`] as separate ops (the trait's default; a backend's unfused path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn unfused_kv_store_block<B: Backend + ?Sized>(
    be: &B,
    kv: &mut B::Kv,
    layer: usize,
    k: &mut B::Buf,
    v: &B::Buf,
    rows: &[AttnRow],
    positions: &[usize],
    p: &AttnParams,
    rope: &RopeParams,
    (k_norm, eps): (&Weight, f32),
) -> Result<()> {
    be.rms_norm_inplace(k, k_norm, rows.len() * p.n_head_kv, p.head_dim, eps)?;
    be.rope(k, positions, p.n_head_kv, p.head_dim, rope)?;
    be.kv_store(kv, layer, k, v, rows)
}

/// [`Backend::attention_block`] as separate ops (the trait's default; a backend's unfused path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn unfused_attention_block<B: Backend + ?Sized>(
    be: &B,
    out: &mut B::Buf,
    q: &mut B::Buf,
    k: &mut B::Buf,
    v: &B::Buf,
    kv: &mut B::Kv,
    layer: usize,
    rows: &[AttnRow],
    positions: &[usize],
    p: &AttnParams,
    rope: &RopeParams,
    qk_norm: Option<(&Weight, &Weight, f32)>,
    visible: Option<(usize, BlockAttn)>,
) -> Result<()> {
    let n = rows.len();
    if let Some((qn, kn, eps)) = qk_norm {
        be.rms_norm_inplace(q, qn, n * p.n_head, p.head_dim, eps)?;
        be.rms_norm_inplace(k, kn, n * p.n_head_kv, p.head_dim, eps)?;
    }
    be.rope(q, positions, p.n_head, p.head_dim, rope)?;
    be.rope(k, positions, p.n_head_kv, p.head_dim, rope)?;
    match visible {
        Some((end, mask)) => be.attention_visible(out, q, k, v, kv, layer, rows, end, mask, p),
        None => be.attention(out, q, k, v, kv, layer, rows, p),
    }
}
