//! The DFlash drafter: weights from a z-lab directory (`config.json` + `model.safetensors`), and its forward pass
//! exactly as the reference `dflash` package (0.1.0) defines it:
//!
//! - context features (the target's hidden states after each tapped layer, concatenated per token) → `fc` →
//!   `hidden_norm`; they skip the drafter's layernorms and MLP and only feed each layer's K/V projections;
//! - the block `[anchor, MASK × (B−1)]` is embedded with the target's embedding table (× `input_embedding_scale`);
//! - every layer: `input_layernorm` → Q from the block only, K/V = [proj(context); proj(block)], QK-norm, NEOX
//!   RoPE at absolute positions, attention non-causal over context + the whole block, `o_proj`, residual,
//!   `post_attention_layernorm` → SwiGLU MLP → residual; then `norm`;
//! - draft logits = the target's output head applied to the normed hidden states (no target output norm),
//!   × `output_multiplier`, optionally soft-capped.
//!
//! Only the context's K/V are kept between rounds ([`DraftState`]); the block's are recomputed each round. The
//! drafter runs in f32 on the host (weights are widened from bf16 at load); the shared embedding and head run
//! through the target's backend, so a quantized head is read as stored.

use super::config::DraftConfig;
use crate::backend::Backend;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::weights::{Binder, Weight};
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// A row-major f32 matrix `rows × cols` (torch `Linear.weight`: out × in).
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}

struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q: Mat,
    k: Mat,
    v: Mat,
    o: Mat,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
}

/// A loaded drafter bound to its target's embedding table and output head.
pub struct Drafter {
    cfg: DraftConfig,
    fc: Mat,
    hidden_norm: Vec<f32>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    embd: Weight,
    head: Weight,
}

impl std::fmt::Debug for Drafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Drafter({:?})", self.cfg)
    }
}

/// One sequence's drafter state: the context K/V of every layer (positions `0..len`).
#[derive(Clone, Debug, Default)]
pub struct DraftState {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

impl DraftState {
    /// Context positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no context is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Tensors by name: shape and values widened to f32.
pub(crate) type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads the tensors of a safetensors file as f32, by name.
pub(crate) fn read_safetensors(path: &Path) -> Result<TensorMap> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Config(format!("{}: not a safetensors file: {e}", path.display())))?;
    let mut out = HashMap::new();
    for (name, t) in st.tensors() {
        let d = t.data();
        let vals: Vec<f32> = match t.dtype() {
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(Error::Config(format!(
                    "{}: tensor '{name}' has dtype {other:?} (bf16, f16 or f32 expected)",
                    path.display()
                )))
            }
        };
        out.insert(name, (t.shape().to_vec(), vals));
    }
    Ok(out)
}

struct Tensors {
    map: TensorMap,
}

impl Tensors {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (s, v) = self.map.remove(name).ok_or_else(|| Error::MissingTensor {
            name: format!("draft {name}"),
            expected: shape.iter().map(|&x| x as u64).collect(),
        })?;
        if s != shape {
            return Err(Error::TensorShape {
                name: format!("draft {name}"),
                actual: s.iter().map(|&x| x as u64).collect(),
                expected: shape.iter().map(|&x| x as u64).collect(),
            });
        }
        Ok(v)
    }

    fn mat(&mut self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        Ok(Mat {
            rows,
            cols,
            w: self.take(name, &[rows, cols])?,
        })
    }
}

impl Drafter {
    /// Loads the drafter at `path` — a z-lab directory, or a GGUF written by [`super::convert_to_gguf`] — and
    /// binds it to `target` (validated against it).
    pub fn load(path: impl AsRef<Path>, target: &Model) -> Result<Drafter> {
        let dir = path.as_ref();
        if dir.is_file() {
            let (cfg, map) = super::gguf::read_gguf(dir)?;
            cfg.validate_target(target.hparams())?;
            return Drafter::from_tensors(cfg, map, target);
        }
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
        let cfg = DraftConfig::parse(&text)?;
        cfg.validate_target(target.hparams())?;
        let map = read_safetensors(&dir.join("model.safetensors"))?;
        Drafter::from_tensors(cfg, map, target)
    }

    fn from_tensors(cfg: DraftConfig, map: TensorMap, target: &Model) -> Result<Drafter> {
        let mut t = Tensors { map };
        let (h, ff, hd) = (cfg.hidden, cfg.n_ff, cfg.head_dim);
        let (qd, kvd) = (cfg.n_head * hd, cfg.n_head_kv * hd);
        let layers = (0..cfg.n_layer)
            .map(|i| {
                let n = |s: &str| format!("layers.{i}.{s}.weight");
                Ok(Layer {
                    input_norm: t.take(&n("input_layernorm"), &[h])?,
                    post_norm: t.take(&n("post_attention_layernorm"), &[h])?,
                    q: t.mat(&n("self_attn.q_proj"), qd, h)?,
                    k: t.mat(&n("self_attn.k_proj"), kvd, h)?,
                    v: t.mat(&n("self_attn.v_proj"), kvd, h)?,
                    o: t.mat(&n("self_attn.o_proj"), h, qd)?,
                    q_norm: t.take(&n("self_attn.q_norm"), &[hd])?,
                    k_norm: t.take(&n("self_attn.k_norm"), &[hd])?,
                    gate: t.mat(&n("mlp.gate_proj"), ff, h)?,
                    up: t.mat(&n("mlp.up_proj"), ff, h)?,
                    down: t.mat(&n("mlp.down_proj"), h, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let fc = t.mat("fc.weight", h, cfg.target_layer_ids.len() * h)?;
        let hidden_norm = t.take("hidden_norm.weight", &[h])?;
        let norm = t.take("norm.weight", &[h])?;
        if let Some(extra) = t.map.keys().min() {
            return Err(Error::Unsupported(format!(
                "draft tensor '{extra}' is not part of a DFlash drafter ({} unexpected tensors)",
                t.map.len()
            )));
        }
        let hp = target.hparams();
        let mut b = Binder::new(target.gguf_arc());
        let (d, nv) = (hp.n_embd as u64, hp.n_vocab as u64);
        let embd = b.req("token_embd.weight", &[d, nv])?;
        let head = b
            .opt("output.weight", &[d, nv])?
            .unwrap_or_else(|| embd.clone());
        Ok(Drafter {
            cfg,
            fc,
            hidden_norm,
            norm,
            layers,
            embd,
            head,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DraftConfig {
        &self.cfg
    }

    /// A fresh per-sequence state.
    pub fn new_state(&self) -> DraftState {
        DraftState {
            k: vec![Vec::new(); self.cfg.n_layer],
            v: vec![Vec::new(); self.cfg.n_layer],
            len: 0,
        }
    }

    /// Width of one token's context features (`taps × hidden`).
    pub fn feature_width(&self) -> usize {
        self.cfg.target_layer_ids.len() * self.cfg.hidden
    }

    /// Appends context features (`rows × feature_width`, tokens at positions `st.len()..`) to `st`: fc,
    /// hidden_norm, then every layer's k_proj/k_norm/RoPE and v_proj.
    pub fn append_context(&self, st: &mut DraftState, features: &[f32]) -> Result<()> {
        let fw = self.feature_width();
        if !features.len().is_multiple_of(fw) {
            return Err(Error::Batch(format!(
                "draft context features: {} values are not whole rows of {fw}",
                features.len()
            )));
        }
        let n = features.len() / fw;
        if n == 0 {
            return Ok(());
        }
        let c = &self.cfg;
        let mut x = matmul(&self.fc, features, n);
        rms_norm_rows(&mut x, &self.hidden_norm, c.rms_eps);
        let positions: Vec<usize> = (st.len..st.len + n).collect();
        for (il, l) in self.layers.iter().enumerate() {
            let mut k = matmul(&l.k, &x, n);
            rms_norm_rows(&mut k, &l.k_norm, c.rms_eps);
            rope_neox(&mut k, &positions, c.head_dim, c.rope_theta);
            st.k[il].extend_from_slice(&k);
            st.v[il].extend_from_slice(&matmul(&l.v, &x, n));
        }
        st.len += n;
        Ok(())
    }

    /// Rolls the context back to `len` positions.
    pub fn truncate(&self, st: &mut DraftState, len: usize) {
        if len < st.len {
            let kvd = self.cfg.n_head_kv * self.cfg.head_dim;
            for l in 0..self.cfg.n_layer {
                st.k[l].truncate(len * kvd);
                st.v[l].truncate(len * kvd);
            }
            st.len = len;
        }
    }

    /// The drafter's output hidden states (after `norm`) for a block of tokens at positions
    /// `st.len() .. st.len() + block.len()`, attending to the whole context and block.
    pub fn block_hidden(
        &self,
        be: &CpuBackend,
        st: &DraftState,
        block: &[u32],
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = block.len();
        let mut x = vec![0f32; n * c.hidden];
        be.embed(&mut x, &self.embd, block)?;
        if c.input_embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
        }
        self.block_hidden_from_embeddings(st, x)
    }

    /// [`Drafter::block_hidden`] from given block embeddings (`block × hidden`, already scaled).
    pub fn block_hidden_from_embeddings(
        &self,
        st: &DraftState,
        mut x: Vec<f32>,
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = x.len() / c.hidden;
        let positions: Vec<usize> = (st.len..st.len + n).collect();
        for (il, l) in self.layers.iter().enumerate() {
            let mut xn = x.clone();
            rms_norm_rows(&mut xn, &l.input_norm, c.rms_eps);
            let mut q = matmul(&l.q, &xn, n);
            let mut k = matmul(&l.k, &xn, n);
            let v = matmul(&l.v, &xn, n);
            rms_norm_rows(&mut q, &l.q_norm, c.rms_eps);
            rms_norm_rows(&mut k, &l.k_norm, c.rms_eps);
            rope_neox(&mut q, &positions, c.head_dim, c.rope_theta);
            rope_neox(&mut k, &positions, c.head_dim, c.rope_theta);
            let a = attention(c, &q, &st.k[il], &st.v[il], &k, &v, n);
            let o = matmul(&l.o, &a, n);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let mut xn = x.clone();
            rms_norm_rows(&mut xn, &l.post_norm, c.rms_eps);
            let g = matmul(&l.gate, &xn, n);
            let u = matmul(&l.up, &xn, n);
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matmul(&l.down, &act, n);
            x.iter_mut().zip(&d).for_each(|(x, d)| *x += d);
        }
        rms_norm_rows(&mut x, &self.norm, c.rms_eps);
        Ok(x)
    }

    /// Draft logits (`rows × vocab`) of hidden states from [`Drafter::block_hidden`]: the target's head,
    /// × `output_multiplier`, soft-capped when configured.
    pub fn logits(&self, be: &CpuBackend, hidden: &[f32]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = hidden.len() / c.hidden;
        let x = hidden.to_vec();
        let mut out = vec![0f32; n * c.vocab];
        be.matmul(&mut out, &self.head, &x, n)?;
        if c.output_multiplier != 1.0 {
            out.iter_mut().for_each(|v| *v *= c.output_multiplier);
        }
        if let Some(cap) = c.softcap {
            out.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        Ok(out)
    }

    /// Greedy proposals for the block `[anchor, MASK × (n − 1)]` at positions `st.len()..`: the argmax of the
    /// draft logits of rows 1..n (`n − 1` tokens).
    pub fn propose(
        &self,
        be: &CpuBackend,
        st: &DraftState,
        anchor: u32,
        n: usize,
    ) -> Result<Vec<u32>> {
        if n < 2 {
            return Ok(Vec::new());
        }
        let mut block = vec![self.cfg.mask_token_id; n];
        block[0] = anchor;
        let h = self.block_hidden(be, st, &block)?;
        let logits = self.logits(be, &h[self.cfg.hidden..])?;
        Ok(logits.chunks_exact(self.cfg.vocab).map(argmax).collect())
    }
}

/// Index of the largest value (the first on ties, like torch.argmax on CPU).
pub(crate) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A dot product with eight partial sums (vectorizes; fixed order, so deterministic).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out[r] = W · x[r]` for `n` rows.
fn matmul(m: &Mat, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m.rows];
    out.par_chunks_mut(64).enumerate().for_each(|(ci, chunk)| {
        for (j, o) in chunk.iter_mut().enumerate() {
            let idx = ci * 64 + j;
            let (r, c) = (idx / m.rows, idx % m.rows);
            *o = dot(
                &m.w[c * m.cols..(c + 1) * m.cols],
                &x[r * m.cols..(r + 1) * m.cols],
            );
        }
    });
    out
}

/// RMSNorm of each `w.len()`-wide row in place.
fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let s = 1.0 / (ms + eps).sqrt();
        row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * s * w);
    }
}

/// NEOX RoPE (halves rotate together) of every head of each row, at the row's absolute position.
fn rope_neox(x: &mut [f32], positions: &[usize], head_dim: usize, theta: f32) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
        .collect();
    let width = x.len() / positions.len().max(1);
    for (row, &p) in x.chunks_exact_mut(width).zip(positions) {
        for head in row.chunks_exact_mut(head_dim) {
            for j in 0..half {
                let a = p as f32 * inv[j];
                let (s, c) = a.sin_cos();
                let (x0, x1) = (head[j], head[j + half]);
                head[j] = x0 * c - x1 * s;
                head[j + half] = x1 * c + x0 * s;
            }
        }
    }
}

/// Non-causal attention of `n` block queries over the context K/V (`kc`, `vc`) followed by the block's own K/V.
fn attention(
    c: &DraftConfig,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kb: &[f32],
    vb: &[f32],
    n: usize,
) -> Vec<f32> {
    let hd = c.head_dim;
    let (qd, kvd) = (c.n_head * hd, c.n_head_kv * hd);
    let group = c.n_head / c.n_head_kv;
    let n_ctx = kc.len() / kvd;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; n * qd];
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (r, h) = (idx / c.n_head, idx % c.n_head);
        let kh = h / group;
        let qv = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
        let key = |j: usize| -> (&[f32], &[f32]) {
            let (ks, vs, jj) = if j < n_ctx {
                (kc, vc, j)
            } else {
                (kb, vb, j - n_ctx)
            };
            let at = jj * kvd + kh * hd;
            (&ks[at..at + hd], &vs[at..at + hd])
        };
        let scores: Vec<f32> = (0..n_ctx + n).map(|j| dot(qv, key(j).0) * scale).collect();
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for (j, w) in e.iter().enumerate() {
            let vv = key(j).1;
            let w = w / z;
            o.iter_mut().zip(vv).for_each(|(o, v)| *o += w * v);
        }
    });
    out
}
