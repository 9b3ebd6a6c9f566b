//! The CUDA backend (cargo feature `cuda`): [`Backend`] over `kiln_cuda`'s kernels, so the one set of model
//! definitions runs on the GPU. Every tensor of the GGUF is uploaded once when the backend is created
//! ([`crate::Model::use_cuda`]); ops look weights up by tensor name. Activations and the KV cache live on the
//! device; only logits and tapped hidden states are read back.
//!
//! Not yet on the GPU: the mixture-of-experts FFN (qwen3moe fails with a clear error).

use crate::backend::{
    AttnParams, AttnRow, Backend, KvLayout, KvType, MoeFfn, RopeMode, RopeParams,
};
use crate::error::{Error, Result};
use crate::weights::Weight;
use kiln_cuda::{DBuf, DKv, DWeight, Device};
use kiln_gguf::GgufFile;
use kiln_quant::GgmlType;
use std::collections::HashMap;

/// A GPU with the model's weights resident.
pub struct CudaBackend {
    dev: Device,
    mats: HashMap<String, DWeight>,
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

fn dev_err(e: kiln_cuda::Error) -> Error {
    Error::Device(e.to_string())
}

impl CudaBackend {
    /// Opens GPU `ordinal` and uploads every tensor of `file`, calling `progress(bytes_done, bytes_total)`.
    pub fn new(
        ordinal: usize,
        file: &GgufFile,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<Self> {
        let dev = Device::open(ordinal).map_err(dev_err)?;
        let mut mats = HashMap::new();
        let mut vecs = HashMap::new();
        let total: u64 = file.tensors().iter().map(|t| t.size).sum();
        let mut done = 0u64;
        let mut progress = progress;
        for t in file.tensors() {
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
                let w = dev
                    .upload_weight(&t.name, t.ty, cols, rows, bytes)
                    .map_err(dev_err)?;
                mats.insert(t.name.clone(), w);
            }
            // Other types stay on the host; an op that needs one reports it by name.
            done += t.size;
            if let Some(cb) = progress.as_mut() {
                cb(done, total);
            }
        }
        dev.synchronize().map_err(dev_err)?;
        Ok(CudaBackend { dev, mats, vecs })
    }

    /// The device (name, architecture).
    pub fn device(&self) -> &Device {
        &self.dev
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
        self.dev
            .embed(out, self.mat(table)?, tokens)
            .map_err(dev_err)
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

    fn matmul(&self, out: &mut DBuf, w: &Weight, x: &DBuf, n_rows: usize) -> Result<()> {
        self.dev
            .matmul(out, self.mat(w)?, x, n_rows)
            .map_err(dev_err)
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
            .rope(x, positions, n_heads, head_dim, p.theta, p.freq_scale, neox)
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
        let rows: Vec<(usize, usize)> = rows.iter().map(|r| (r.slot, r.pos)).collect();
        self.dev
            .attention(
                out,
                q,
                k,
                v,
                kv,
                layer,
                &rows,
                p.n_head,
                p.n_head_kv,
                p.head_dim,
                p.scale,
            )
            .map_err(dev_err)
    }

    fn swiglu(&self, out: &mut DBuf, gate: &DBuf, up: &DBuf, n: usize) -> Result<()> {
        self.dev.swiglu(out, gate, up, n).map_err(dev_err)
    }

    fn add(&self, x: &mut DBuf, y: &DBuf, n: usize) -> Result<()> {
        self.dev.add(x, y, n).map_err(dev_err)
    }

    fn moe_ffn(&self, _out: &mut DBuf, _x: &DBuf, _n_rows: usize, m: &MoeFfn) -> Result<()> {
        Err(Error::Unsupported(format!(
            "mixture-of-experts FFN ('{}') on the CUDA backend: use --device cpu",
            m.router.name
        )))
    }

    fn gather_rows(&self, out: &mut DBuf, x: &DBuf, rows: &[usize], width: usize) -> Result<()> {
        self.dev.gather_rows(out, x, rows, width).map_err(dev_err)
    }

    fn read(&self, x: &DBuf, dst: &mut [f32]) -> Result<()> {
        self.dev.read(x, dst).map_err(dev_err)
    }
}
