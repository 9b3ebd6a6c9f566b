//! The CUDA backend (cargo feature `cuda`): [`Backend`] over `kiln_cuda`'s kernels, so the one set of model
//! definitions runs on the GPU. Every tensor of the GGUF is uploaded once when the backend is created
//! ([`crate::Model::use_cuda`]); ops look weights up by tensor name. Activations and the KV cache live on the
//! device; only logits and tapped hidden states are read back.
//!
//! Matrices are repacked at upload for the GEMV kernels; `token_embd.weight` stays in GGUF layout for the
//! embedding lookup (and is uploaded a second time, repacked, when the output head is tied to it). A forward pass
//! is run through [`CudaBackend::pass`]: its rows' metadata goes to the device once, and the pass is captured as a
//! CUDA graph the first time its shape is seen and replayed after.
//!
//! The mixture-of-experts FFN routes on the device and runs the chosen experts on the GEMV kernels (grouped by
//! expert from 2 rows) or, in prefill passes, on the tensor-core prefill kernel (`Device::moe_ffn`).

use crate::backend::{
    AttnParams, AttnRow, Backend, BlockAttn, KvLayout, KvType, MoeFfn, RopeMode, RopeParams,
};
use crate::error::{Error, Result};
use crate::flags::Flags;
use crate::hparams::Hparams;
use crate::weights::Weight;
use kiln_cuda::{AttnShape, DBuf, DKv, DWeight, Device, MoeShape};
use kiln_gguf::{GgufFile, TensorInfo};
use kiln_quant::GgmlType;
use std::collections::HashMap;

/// A GPU with the model's weights resident.
pub struct CudaBackend {
    dev: Device,
    ordinal: usize,
    mats: HashMap<String, DWeight>,
    /// Tables read by `embed` (GGUF layout).
    tables: HashMap<String, DWeight>,
    vecs: HashMap<String, DBuf>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBackend({:?}, {} tensors)",
            self.dev,
            self.mats.len() + self.vecs.len()
        )
    }
}

fn moe_shape(n_exp: usize, k: usize, ff: usize, width: usize, norm_topk: bool) -> MoeShape {
    MoeShape {
        n_exp,
        k,
        ff,
        width,
        norm_topk,
    }
}

fn dev_err(e: kiln_cuda::Error) -> Error {
    Error::Device(e.to_string())
}

impl CudaBackend {
    /// Opens GPU `ordinal` and uploads every tensor of `file`, calling `progress(bytes_done, bytes_total)`.
    pub fn new(
        ordinal: usize,
        file: &GgufFile,
        flags: Flags,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<Self> {
        let tensors: Vec<(&GgufFile, &TensorInfo)> =
            file.tensors().iter().map(|t| (file, t)).collect();
        Self::from_tensors(ordinal, &tensors, flags, progress)
    }

    /// Opens GPU `ordinal` and uploads the given tensors (of one or more files; names must be unique). Without
    /// an `output.weight` among them, `token_embd.weight` also serves as the output head (tied embeddings).
    pub fn from_tensors(
        ordinal: usize,
        tensors: &[(&GgufFile, &TensorInfo)],
        flags: Flags,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<Self> {
        let opts = kiln_cuda::Options {
            fast_gemv: flags.cuda_gemv,
            fused: flags.cuda_fuse,
            split_kv: flags.cuda_split_kv,
            split_direct: flags.cuda_split_direct,
            prep_in_split: flags.cuda_prep_in_split,
            prep_rows_in_split: flags.cuda_prep_rows_in_split,
            attn_head_split: flags.cuda_attn_head_split,
            attn_fit_grid: flags.cuda_attn_fit_grid,
            gemv_stage: flags.cuda_gemv_stage,
            early_weights: flags.cuda_early_weights,
            prefill_mma: flags.cuda_prefill_mma,
            block_mma: flags.cuda_block_mma,
            block_tile16: flags.cuda_block_tile16,
            block_direct: flags.cuda_block_direct,
            block_ring: flags.cuda_block_ring,
            block_n8: flags.cuda_block_n8,
            flash_attn: flags.cuda_flash_attn,
            k8: flags.cuda_k8,
            prefill_k8: flags.cuda_prefill_k8,
            moe_group: flags.cuda_moe_group,
            moe_gather_quant: flags.cuda_moe_gather_quant,
            prefill_blas: flags.cuda_prefill_blas,
            prefill_blas_float: flags.cuda_prefill_blas_float,
            graphs: flags.cuda_graph,
            pdl: flags.cuda_pdl,
            l2_prefetch: flags.cuda_l2_prefetch,
            reference: !flags.quant_act,
        };
        let dev = Device::open(ordinal, opts).map_err(dev_err)?;
        let mut mats = HashMap::new();
        let mut tables = HashMap::new();
        let mut vecs = HashMap::new();
        let tied = !tensors.iter().any(|(_, t)| t.name == "output.weight");
        let total: u64 = tensors.iter().map(|(_, t)| t.size).sum();
        let mut done = 0u64;
        let mut progress = progress;
        for &(file, t) in tensors {
            let bytes = file.tensor_data(t);
            if t.shape.len() == 1 && t.ty == GgmlType::F32 {
                // Norm weights: f32 vectors the row kernels read directly.
                let v: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                vecs.insert(t.name.clone(), dev.upload(&v).map_err(dev_err)?);
            } else if kiln_cuda::supports(t.ty) {
                let cols = t.shape[0] as usize;
                let rows = t.shape[1..].iter().product::<u64>() as usize;
                let upload = |gemv| {
                    dev.upload_weight(&t.name, t.ty, cols, rows, bytes, gemv)
                        .map_err(dev_err)
                };
                if t.name == "token_embd.weight" {
                    tables.insert(t.name.clone(), upload(false)?);
                    if tied {
                        mats.insert(t.name.clone(), upload(true)?);
                    }
                } else if t.shape.len() == 3 {
                    // Expert tensors: each expert's matrix repacked on its own for the MoE GEMV.
                    let w = dev
                        .upload_experts(&t.name, t.ty, cols, rows, t.shape[2] as usize, bytes)
                        .map_err(dev_err)?;
                    mats.insert(t.name.clone(), w);
                } else {
                    mats.insert(t.name.clone(), upload(t.shape.len() == 2)?);
                }
            }
            // Other types stay on the host; an op that needs one reports it by name.
            done += t.size;
            if let Some(cb) = progress.as_mut() {
                cb(done, total);
            }
        }
        dev.synchronize().map_err(dev_err)?;
        Ok(CudaBackend {
            dev,
            ordinal,
            mats,
            tables,
            vecs,
        })
    }

    /// Sizes the device's scratch for a session of passes of up to `rows` rows over slots of `slot_ctx`
    /// (before any pass is captured, so capture never allocates).
    pub(crate) fn reserve(&self, rows: usize, hp: &Hparams, slot_ctx: usize) -> Result<()> {
        self.dev
            .reserve_attention(rows, hp.n_head, hp.head_dim, slot_ctx)
            .map_err(dev_err)?;
        self.dev.reserve_dense(rows).map_err(dev_err)?;
        if hp.n_expert > 0 {
            let m = moe_shape(
                hp.n_expert,
                hp.n_expert_used,
                hp.n_ff_exp,
                hp.n_embd,
                hp.norm_topk,
            );
            self.dev.reserve_moe(rows, &m).map_err(dev_err)?;
        }
        Ok(())
    }

    /// Runs one forward pass `f` over the rows described by `tokens`/`rows`/`logit_rows`: uploads their metadata,
    /// then runs `f` eagerly or as a CUDA graph (captured the first time `key` is seen, replayed after). `key`
    /// identifies the buffers the pass uses (and anything else that changes its kernels, such as tapped layers); `capturable` is false when `f` reads anything back mid-pass; `prefill`
    /// marks a pass of prompt rows only ([`crate::Batch::prefill`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pass(
        &self,
        key: [u64; 3],
        tokens: &[u32],
        rows: &[AttnRow],
        logit_rows: &[usize],
        capturable: bool,
        prefill: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let sp: Vec<(usize, usize)> = rows.iter().map(|r| (r.slot, r.pos)).collect();
        // A prefill pass may launch other kernels than a decode pass of the same shape.
        let full = [
            key[0],
            key[1],
            key[2],
            rows.len() as u64 | (prefill as u64) << 63,
            logit_rows.len() as u64,
        ];
        let mut err = None;
        let mut g = || {
            f().map_err(|e| {
                let msg = e.to_string();
                err = Some(e);
                kiln_cuda::Error::Shape {
                    op: "forward",
                    detail: msg,
                }
            })
        };
        let dev = &self.dev;
        let r = dev.timed_pass(&mut || {
            dev.set_pass(tokens, &sp, logit_rows, prefill)?;
            dev.run_pass(full, capturable, &mut g)
        });
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(err.take().unwrap_or_else(|| dev_err(e))),
        }
    }

    /// Drops the bf16 copy of the matrix `name` when its few-row matmuls read it quantized on the K8 kernels
    /// (Q4_K/Q6_K), so cuBLAS never takes it.
    pub(crate) fn keep_quantized(&mut self, name: &str) {
        if let Some(w) = self.mats.get_mut(name) {
            if self.dev.reads_k8(w) {
                self.dev.drop_dense_copy(w);
            }
        }
    }

    /// The device (name, architecture).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The GPU's index (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn mat(&self, w: &Weight) -> Result<&DWeight> {
        self.mats.get(&w.name).ok_or_else(|| Error::TensorType {
            name: w.name.clone(),
            ty: w.ty,
            usage: "a matrix the CUDA backend supports",
        })
    }

    fn vec(&self, w: &Weight) -> Result<&DBuf> {
        self.vecs.get(&w.name).ok_or_else(|| Error::TensorType {
            name: w.name.clone(),
            ty: w.ty,
            usage: "an RMSNorm weight (1-D f32)",
        })
    }
}

impl Backend for CudaBackend {
    type Buf = DBuf;
    type Kv = DKv;

    fn alloc(&self, len: usize) -> Result<DBuf> {
        self.dev.alloc(len).map_err(dev_err)
    }

    fn alloc_kv(&self, l: &KvLayout) -> Result<DKv> {
        self.dev
            .alloc_kv(
                l.n_layer,
                l.n_slots,
                l.slot_ctx,
                l.n_head_kv * l.head_dim,
                l.ty == KvType::F16,
            )
            .map_err(dev_err)
    }

    fn embed(&self, out: &mut DBuf, table: &Weight, tokens: &[u32]) -> Result<()> {
        let t = self
            .tables
            .get(&table.name)
            .ok_or_else(|| Error::TensorType {
                name: table.name.clone(),
                ty: table.ty,
                usage: "an embedding table the CUDA backend supports",
            })?;
        self.dev.embed(out, t, tokens.len()).map_err(dev_err)
    }

    fn rms_norm(
        &self,
        out: &mut DBuf,
        x: &DBuf,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.dev
            .rms_norm(out, x, self.vec(weight)?, n_rows, width, eps)
            .map_err(dev_err)
    }

    fn rms_norm_inplace(
        &self,
        x: &mut DBuf,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.dev
            .rms_norm_inplace(x, self.vec(weight)?, n_rows, width, eps)
            .map_err(dev_err)
    }

    fn prefetch(&self, next: &[&Weight]) {
        let ws: Vec<&DWeight> = next.iter().filter_map(|w| self.mats.get(&w.name)).collect();
        self.dev.prefetch(&ws);
    }

    fn matmul(&self, out: &mut DBuf, w: &Weight, x: &DBuf, n_rows: usize) -> Result<()> {
        self.dev
            .matmul(out, self.mat(w)?, x, n_rows, false)
            .map_err(dev_err)
    }

    fn matmul_many(
        &self,
        outs: &mut [&mut DBuf],
        ws: &[&Weight],
        x: &DBuf,
        n_rows: usize,
    ) -> Result<()> {
        let mats = ws.iter().map(|w| self.mat(w)).collect::<Result<Vec<_>>>()?;
        self.dev
            .matmul_many(outs, &mats, x, n_rows)
            .map_err(dev_err)
    }

    fn matmul_add(
        &self,
        x: &mut DBuf,
        w: &Weight,
        a: &DBuf,
        tmp: &mut DBuf,
        n_rows: usize,
    ) -> Result<()> {
        let m = self.mat(w)?;
        if self.dev.options().fused {
            return self.dev.matmul(x, m, a, n_rows, true).map_err(dev_err);
        }
        self.dev.matmul(tmp, m, a, n_rows, false).map_err(dev_err)?;
        self.dev.add(x, tmp, n_rows * m.rows).map_err(dev_err)
    }

    fn rope(
        &self,
        x: &mut DBuf,
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<()> {
        let neox = p.mode == RopeMode::Neox;
        self.dev
            .rope(
                x,
                positions.len(),
                n_heads,
                head_dim,
                p.theta,
                p.freq_scale,
                neox,
            )
            .map_err(dev_err)
    }

    fn attention(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        rows: &[AttnRow],
        p: &AttnParams,
    ) -> Result<()> {
        self.dev
            .attention(
                out,
                q,
                k,
                v,
                kv,
                layer,
                rows.len(),
                p.n_head,
                p.n_head_kv,
                p.head_dim,
                p.scale,
            )
            .map_err(dev_err)
    }

    fn attention_visible(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        rows: &[AttnRow],
        visible: usize,
        attn: BlockAttn,
        p: &AttnParams,
    ) -> Result<()> {
        if visible == 0 {
            return Err(Error::Batch("attention over no visible positions".into()));
        }
        if attn != BlockAttn::FULL {
            return Err(Error::Unsupported(format!(
                "drafter attention {attn:?} on CUDA (drafters with causal or sliding-window layers run on the CPU)"
            )));
        }
        self.dev
            .attention_visible(
                out,
                q,
                k,
                v,
                kv,
                layer,
                rows.len(),
                p.n_head,
                p.n_head_kv,
                p.head_dim,
                p.scale,
                visible,
            )
            .map_err(dev_err)
    }

    fn block_masks(&self) -> bool {
        false
    }

    fn kv_store(
        &self,
        kv: &mut DKv,
        layer: usize,
        k: &DBuf,
        v: &DBuf,
        rows: &[AttnRow],
    ) -> Result<()> {
        self.dev
            .kv_store(kv, k, v, layer, rows.len())
            .map_err(dev_err)
    }

    fn kv_store_block(
        &self,
        kv: &mut DKv,
        layer: usize,
        k: &mut DBuf,
        v: &DBuf,
        rows: &[AttnRow],
        positions: &[usize],
        p: &AttnParams,
        rope: &RopeParams,
        k_norm: (&Weight, f32),
    ) -> Result<()> {
        if !self.dev.options().fused {
            return crate::backend::unfused_kv_store_block(
                self, kv, layer, k, v, rows, positions, p, rope, k_norm,
            );
        }
        let shape = attn_shape(p, rope, k_norm.1);
        self.dev
            .kv_prep(
                kv,
                k,
                v,
                layer,
                rows.len(),
                &shape,
                Some(self.vec(k_norm.0)?),
            )
            .map_err(dev_err)
    }

    fn copy_into(&self, dst: &mut DBuf, offset: usize, src: &DBuf, n: usize) -> Result<()> {
        self.dev.copy(dst, offset, src, n).map_err(dev_err)
    }

    fn write(&self, dst: &mut DBuf, src: &[f32]) -> Result<()> {
        self.dev.write(dst, src).map_err(dev_err)
    }

    fn attention_block(
        &self,
        out: &mut DBuf,
        q: &mut DBuf,
        k: &mut DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        rows: &[AttnRow],
        positions: &[usize],
        p: &AttnParams,
        rope: &RopeParams,
        qk_norm: Option<(&Weight, &Weight, f32)>,
        visible: Option<(usize, BlockAttn)>,
    ) -> Result<()> {
        // The fused kernels take the full block mask only (`attention_visible` refuses the others).
        let full = visible.is_none_or(|(_, mask)| mask == BlockAttn::FULL);
        if !self.dev.options().fused || !full {
            return crate::backend::unfused_attention_block(
                self, out, q, k, v, kv, layer, rows, positions, p, rope, qk_norm, visible,
            );
        }
        let shape = attn_shape(p, rope, qk_norm.map_or(0.0, |n| n.2));
        let norms = match qk_norm {
            Some((qn, kn, _)) => Some((self.vec(qn)?, self.vec(kn)?)),
            None => None,
        };
        self.dev
            .attention_fused(
                out,
                q,
                k,
                v,
                kv,
                layer,
                rows.len(),
                &shape,
                norms,
                visible.map_or(0, |(end, _)| end),
            )
            .map_err(dev_err)
    }

    fn swiglu(&self, out: &mut DBuf, gate: &DBuf, up: &DBuf, n: usize) -> Result<()> {
        self.dev.swiglu(out, gate, up, n).map_err(dev_err)
    }

    fn add(&self, x: &mut DBuf, y: &DBuf, n: usize) -> Result<()> {
        self.dev.add(x, y, n).map_err(dev_err)
    }

    fn moe_ffn(&self, out: &mut DBuf, x: &DBuf, n_rows: usize, m: &MoeFfn) -> Result<()> {
        let gate = self.mat(m.gate)?;
        let n_exp = m.router.shape.get(1).copied().unwrap_or(0) as usize;
        let ff = m.gate.shape.get(1).copied().unwrap_or(0) as usize;
        let shape = moe_shape(n_exp, m.n_used, ff, gate.cols, m.norm_topk);
        self.dev
            .moe_ffn(
                out,
                x,
                n_rows,
                self.mat(m.router)?,
                gate,
                self.mat(m.up)?,
                self.mat(m.down)?,
                &shape,
            )
            .map_err(dev_err)
    }

    fn gather_rows(&self, out: &mut DBuf, x: &DBuf, rows: &[usize], width: usize) -> Result<()> {
        // The rows come from the pass metadata (the logit rows the pass was set up with).
        let _ = rows;
        self.dev.gather_rows(out, x, width).map_err(dev_err)
    }

    fn argmax_rows(&self, x: &DBuf, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        self.dev.argmax(x, n_rows, width).map_err(dev_err)
    }

    fn read(&self, x: &DBuf, dst: &mut [f32]) -> Result<()> {
        self.dev.read(x, dst).map_err(dev_err)
    }
}

/// The device's attention geometry and RoPE / QK-norm parameters.
fn attn_shape(p: &AttnParams, rope: &RopeParams, eps: f32) -> AttnShape {
    AttnShape {
        n_head: p.n_head,
        n_head_kv: p.n_head_kv,
        head_dim: p.head_dim,
        scale: p.scale,
        theta: rope.theta,
        freq_scale: rope.freq_scale,
        neox: rope.mode == RopeMode::Neox,
        eps,
    }
}
