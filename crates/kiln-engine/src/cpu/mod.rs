//! The CPU backend: the reference implementation of [`Backend`], multithreaded on a rayon pool sized by the
//! caller (`-t`), with the quantization layer's SIMD dot products in the matmuls.
//!
//! Owns: the thread pool, the chosen ISA, the kill switches in effect, and the scratch buffer for quantized
//! activations (reused across calls: no allocation per token in matmuls or attention).

mod attention;
mod matmul;
mod moe;

pub use attention::CpuKv;

use crate::backend::{
    AttnParams, AttnRow, Backend, BlockAttn, KvLayout, MoeFfn, RopeMode, RopeParams,
};
use crate::error::{Error, Result};
use crate::flags::Flags;
use crate::weights::Weight;
use kiln_quant::dot::Isa;
use kiln_quant::GgmlType;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The largest head dimension the CPU attention supports (stack buffers are sized by it).
pub const MAX_HEAD_DIM: usize = 512;

/// The CPU backend.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    isa: Isa,
    flags: Flags,
    act_scratch: Mutex<Vec<u8>>,
    /// The activations' block scales as f32 for the repacked kernel (reused across calls).
    scale_scratch: Mutex<Vec<f32>>,
    /// Weights repacked for the interleaved kernel ([`Flags::cpu_repack`]), built at first use, by
    /// [`crate::weights::Weight::cache_key`].
    repacked: Mutex<HashMap<(usize, usize), Arc<matmul::Repacked>>>,
    /// Held while a pass runs in the pool ([`CpuBackend::run_pass`]).
    pass_lock: Mutex<()>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuBackend({} threads, {}, {:?})",
            self.threads, self.isa, self.flags
        )
    }
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0 = one per available core).
    pub fn new(threads: usize, flags: Flags) -> Result<CpuBackend> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kiln-cpu-{i}"))
            .build()
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))?;
        let isa = match (flags.simd, flags.cpu_avx512) {
            (false, _) => Isa::Scalar,
            (true, true) => Isa::detect(),
            (true, false) => Isa::capped(Isa::Avx2),
        };
        Ok(CpuBackend {
            pool,
            threads,
            isa,
            flags,
            act_scratch: Mutex::new(Vec::new()),
            scale_scratch: Mutex::new(Vec::new()),
            repacked: Mutex::new(HashMap::new()),
            pass_lock: Mutex::new(()),
        })
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs a forward pass on one of the pool's threads. Its parallel regions then start from inside the pool
    /// (the other workers steal their share) instead of each being injected from outside and waited for: a
    /// decode step has a few regions per layer, and each outside call cost a thread wake-up or two.
    ///
    /// One pass at a time: a worker waiting inside a pass's region may pick up any queued pool job, and a second
    /// pass started there would wait on the scratch buffers its own thread holds further down the stack.
    pub(crate) fn run_pass(&self, pass: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        if !self.flags.cpu_pool_pass || self.pool.current_thread_index().is_some() {
            return pass();
        }
        let _one = self.pass_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.pool.install(pass)
    }

    /// How many weights have a repacked copy so far.
    pub fn packed_weights(&self) -> usize {
        self.repacked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The instruction set the dot products run on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kill switches in effect.
    pub fn flags(&self) -> Flags {
        self.flags
    }

    /// The values [`Backend::matmul`] gives for the rows `rows` of `w` times the one activation row `x`, without a
    /// pass over the other rows: the same bits where `w` runs on the repacked kernels (a 2-D Q4_0/Q4_1/Q8_0 or
    /// K-quant weight on AVX2 and AVX-512), else the one-row kernel's. Quantized activations only.
    pub(crate) fn matmul_rows_of(&self, w: &Weight, rows: &[usize], x: &[f32]) -> Result<Vec<f32>> {
        let v = w.view();
        if !self.flags.quant_act || x.len() < v.cols || rows.iter().any(|&r| r >= v.rows) {
            return Err(Error::Batch(format!(
                "rows of '{}': {} values for rows of {}, rows {rows:?} of {} (quantized activations only)",
                w.name,
                x.len(),
                v.cols,
                v.rows
            )));
        }
        let act_ty = kiln_quant::dot::vec_dot_type(v.ty);
        let arb = act_ty.row_bytes(v.cols as u64).ok_or_else(|| {
            matmul::quant_err(
                &w.name,
                format!("row of {} is not whole {act_ty} blocks", v.cols),
            )
        })?;
        let mut a = vec![0u8; arb as usize];
        kiln_quant::dot::quantize_activation_isa(act_ty, self.isa, &x[..v.cols], &mut a)
            .map_err(|e| matmul::quant_err(&w.name, e))?;
        if self.repacked(w).is_some() {
            return Ok(rows
                .iter()
                .map(|&r| kiln_quant::dot::repacked_dot_reference(v.ty, v.cols, v.row(r), &a))
                .collect());
        }
        let kernel = kiln_quant::dot::dot_kernel(v.ty, self.isa)
            .map_err(|e| matmul::quant_err(&w.name, e))?;
        Ok(rows
            .iter()
            .map(|&r| kernel.dot(v.cols, v.row(r), &a))
            .collect())
    }

    /// A copy of the 2-D weight `w` in `ty` (dequantized, then quantized on the pool), in a GGUF in memory of its
    /// own, named `w`'s name with `.{ty}` added.
    pub(crate) fn requantized(&self, w: &Weight, ty: GgmlType) -> Result<Weight> {
        use rayon::prelude::*;
        let v = w.view();
        let err = |e: String| matmul::quant_err(&w.name, e);
        let out_row = ty
            .row_bytes(v.cols as u64)
            .ok_or_else(|| err(format!("rows of {} are not whole {ty} blocks", v.cols)))?
            as usize;
        const CHUNK: usize = 256;
        let mut bytes = vec![0u8; v.rows * out_row];
        self.pool.install(|| {
            bytes
                .par_chunks_mut(CHUNK * out_row)
                .enumerate()
                .try_for_each(|(c, out)| {
                    let n = out.len() / out_row;
                    let src = &v.bytes[c * CHUNK * v.row_bytes..(c * CHUNK + n) * v.row_bytes];
                    let mut f = vec![0f32; n * v.cols];
                    kiln_quant::dequantize(v.ty, src, &mut f).map_err(|e| err(e.to_string()))?;
                    kiln_quant::quantize(ty, &f, out).map_err(|e| err(e.to_string()))
                })
        })?;
        let name = format!("{}.{ty}", w.name);
        let shape = [v.cols as u64, v.rows as u64];
        let mut gw = kiln_gguf::GgufWriter::new();
        gw.add_tensor(&name, ty, &shape)?;
        let mut dw = gw.begin(Vec::new())?;
        dw.write_tensor_data(&name, &bytes)?;
        let file = Arc::new(kiln_gguf::GgufFile::from_bytes(dw.finish()?)?);
        crate::weights::Binder::new(file).req(&name, &shape)
    }

    /// `w` repacked for the interleaved kernel, when it applies (2-D Q4_0/Q4_1/Q8_0 on AVX2 or AVX-512,
    /// [`Flags::cpu_repack`]; Q4_K/Q5_K/Q6_K on AVX2 or AVX-512 VNNI, [`Flags::cpu_repack_k`]; quantized activations);
    /// packed on the pool at first use (for a placed model, its [`crate::Model::warm_up`]) and kept for the
    /// backend's lifetime.
    fn repacked(&self, w: &Weight) -> Option<Arc<matmul::Repacked>> {
        let k_quant = matches!(w.ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
        let on = if k_quant {
            self.flags.cpu_repack_k
        } else {
            self.flags.cpu_repack
        };
        if !on || !self.flags.quant_act || w.shape.len() != 2 {
            return None;
        }
        let kernel = kiln_quant::dot::repack_kernel(w.ty, self.isa)?;
        let key = w.cache_key();
        let mut cache = self.repacked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(&key) {
            return Some(p.clone());
        }
        let p = Arc::new(matmul::Repacked::new(
            self,
            kernel,
            &w.view(),
            Some(w.file()),
        ));
        cache.insert(key, p.clone());
        Some(p)
    }
}

fn rms_row(out: &mut [f32], x: &[f32], w: &[u8], eps: f32) {
    let [ss] = sum_squares([x]);
    rms_apply(out, x, ss, w, eps);
}

/// `out = x · (1 / sqrt(ss / len + eps)) · w`, elementwise.
fn rms_apply(out: &mut [f32], x: &[f32], ss: f32, w: &[u8], eps: f32) {
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    // The weight read 4 bytes at a time from exact chunks (no per-element bounds check), so this vectorizes.
    for ((o, &v), wb) in out.iter_mut().zip(x).zip(w.chunks_exact(4)) {
        *o = v * scale * f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
    }
}

/// [`rms_apply`] in place: `x = x · scale · w`, the same operations per element.
fn rms_apply_inplace(x: &mut [f32], ss: f32, w: &[u8], eps: f32) {
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, wb) in x.iter_mut().zip(w.chunks_exact(4)) {
        *v = *v * scale * f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
    }
}

/// Σ v² of each row, each summed in element order (one row's chain, the bits of a row alone); the rows'
/// chains interleave so their add latencies overlap (one serial chain per row was ~6% of a Q4_K prefill).
// Index loops on purpose: the inner loop over rows is what interleaves the chains.
#[allow(clippy::needless_range_loop)]
fn sum_squares<const N: usize>(rows: [&[f32]; N]) -> [f32; N] {
    let width = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == width));
    let mut ss = [0f32; N];
    for i in 0..width {
        for r in 0..N {
            let v = rows[r][i];
            ss[r] += v * v;
        }
    }
    ss
}

/// Rows normalized 8 at a time through [`sum_squares`] (same bits as [`rms_row`] on each).
const RMS_ROWS: usize = 8;

fn check_norm(w: &Weight, width: usize) -> Result<()> {
    if w.ty != GgmlType::F32 || w.shape.iter().product::<u64>() != width as u64 {
        return Err(Error::TensorType {
            name: w.name.clone(),
            ty: w.ty,
            usage: "an RMSNorm weight (f32, one value per channel)",
        });
    }
    Ok(())
}

fn too_small(op: &str) -> Error {
    Error::Batch(format!("{op}: buffer too small for the batch"))
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Kv = CpuKv;

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn alloc_kv(&self, layout: &KvLayout) -> Result<CpuKv> {
        CpuKv::new(layout)
    }

    fn embed(&self, out: &mut Vec<f32>, table: &Weight, tokens: &[u32]) -> Result<()> {
        let view = table.view();
        let d = view.cols;
        if out.len() < tokens.len() * d {
            return Err(too_small("embed"));
        }
        for (i, &t) in tokens.iter().enumerate() {
            if t as usize >= view.rows {
                return Err(Error::BadToken {
                    id: t,
                    n_vocab: view.rows,
                });
            }
            kiln_quant::dequantize(view.ty, view.row(t as usize), &mut out[i * d..(i + 1) * d])
                .map_err(|e| Error::Quant {
                    name: table.name.clone(),
                    error: e.to_string(),
                })?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        check_norm(weight, width)?;
        if out.len() < n_rows * width || x.len() < n_rows * width {
            return Err(too_small("rms_norm"));
        }
        let w = weight.bytes();
        let (out, x) = (&mut out[..n_rows * width], &x[..n_rows * width]);
        for (oc, xc) in out
            .chunks_mut(RMS_ROWS * width)
            .zip(x.chunks(RMS_ROWS * width))
        {
            if xc.len() == RMS_ROWS * width {
                let ss = sum_squares::<RMS_ROWS>(std::array::from_fn(|r| {
                    &xc[r * width..(r + 1) * width]
                }));
                for ((o, xr), ss) in oc
                    .chunks_exact_mut(width)
                    .zip(xc.chunks_exact(width))
                    .zip(ss)
                {
                    rms_apply(o, xr, ss, w, eps);
                }
            } else {
                for (o, xr) in oc.chunks_exact_mut(width).zip(xc.chunks_exact(width)) {
                    rms_row(o, xr, w, eps);
                }
            }
        }
        Ok(())
    }

    fn rms_norm_inplace(
        &self,
        x: &mut Vec<f32>,
        weight: &Weight,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        check_norm(weight, width)?;
        if x.len() < n_rows * width {
            return Err(too_small("rms_norm"));
        }
        let w = weight.bytes();
        for xc in x[..n_rows * width].chunks_mut(RMS_ROWS * width) {
            let mut ss = [0f32; RMS_ROWS];
            if xc.len() == RMS_ROWS * width {
                ss = sum_squares::<RMS_ROWS>(std::array::from_fn(|r| {
                    &xc[r * width..(r + 1) * width]
                }));
            } else {
                for (s, r) in ss.iter_mut().zip(xc.chunks_exact(width)) {
                    [*s] = sum_squares([r]);
                }
            }
            for (xr, ss) in xc.chunks_exact_mut(width).zip(ss) {
                rms_apply_inplace(xr, ss, w, eps);
            }
        }
        Ok(())
    }

    fn matmul(&self, out: &mut Vec<f32>, w: &Weight, x: &Vec<f32>, n_rows: usize) -> Result<()> {
        let p = self.repacked(w);
        matmul::matmul_packed(self, out, &w.view(), p.as_deref(), x, n_rows)
    }

    fn matmul_many(
        &self,
        outs: &mut [&mut Vec<f32>],
        ws: &[&Weight],
        x: &Vec<f32>,
        n_rows: usize,
    ) -> Result<()> {
        // Q/K/V and gate/up; without allocating (every decoded token comes through here).
        match (outs, ws) {
            ([a, b], [wa, wb]) => {
                let p = [self.repacked(wa), self.repacked(wb)];
                matmul::matmul_many(
                    self,
                    &mut [a, b],
                    &[wa.view(), wb.view()],
                    &[p[0].as_deref(), p[1].as_deref()],
                    x,
                    n_rows,
                )
            }
            ([a, b, c], [wa, wb, wc]) => {
                let p = [self.repacked(wa), self.repacked(wb), self.repacked(wc)];
                matmul::matmul_many(
                    self,
                    &mut [a, b, c],
                    &[wa.view(), wb.view(), wc.view()],
                    &[p[0].as_deref(), p[1].as_deref(), p[2].as_deref()],
                    x,
                    n_rows,
                )
            }
            (outs, ws) => {
                for (o, w) in outs.iter_mut().zip(ws) {
                    self.matmul(o, w, x, n_rows)?;
                }
                Ok(())
            }
        }
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<()> {
        let w = n_heads * head_dim;
        if x.len() < positions.len() * w || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(2) {
            return Err(too_small("rope"));
        }
        let half = head_dim / 2;
        let mut cos = [0f32; MAX_HEAD_DIM / 2];
        let mut sin = [0f32; MAX_HEAD_DIM / 2];
        for (row, &pos) in x.chunks_exact_mut(w).zip(positions) {
            // Frequencies as transformers computes them in f32: inv_freq_i = 1 / theta^(2i/d).
            let p_scaled = pos as f32 * p.freq_scale;
            for i in 0..half {
                let inv = 1.0 / p.theta.powf((2 * i) as f32 / head_dim as f32);
                let a = p_scaled * inv;
                cos[i] = a.cos();
                sin[i] = a.sin();
            }
            for h in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = match p.mode {
                        RopeMode::Normal => (2 * i, 2 * i + 1),
                        RopeMode::Neox => (i, i + half),
                    };
                    let (x0, x1) = (h[a], h[b]);
                    h[a] = x0 * cos[i] - x1 * sin[i];
                    h[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        kv: &mut CpuKv,
        layer: usize,
        rows: &[AttnRow],
        p: &AttnParams,
    ) -> Result<()> {
        attention::attention(self, out, q, k, v, kv, layer, rows, None, p)
    }

    fn attention_visible(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        kv: &mut CpuKv,
        layer: usize,
        rows: &[AttnRow],
        visible: usize,
        attn: BlockAttn,
        p: &AttnParams,
    ) -> Result<()> {
        attention::attention(
            self,
            out,
            q,
            k,
            v,
            kv,
            layer,
            rows,
            Some((visible, attn)),
            p,
        )
    }

    fn kv_store(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        rows: &[AttnRow],
    ) -> Result<()> {
        attention::kv_store(kv, layer, k, v, rows)
    }

    fn copy_into(&self, dst: &mut Vec<f32>, offset: usize, src: &Vec<f32>, n: usize) -> Result<()> {
        if dst.len() < offset + n || src.len() < n {
            return Err(too_small("copy_into"));
        }
        dst[offset..offset + n].copy_from_slice(&src[..n]);
        Ok(())
    }

    fn write(&self, dst: &mut Vec<f32>, src: &[f32]) -> Result<()> {
        if dst.len() < src.len() {
            return Err(too_small("write"));
        }
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn swiglu(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        if out.len() < n || gate.len() < n || up.len() < n {
            return Err(too_small("swiglu"));
        }
        if n < SWIGLU_PAR_MIN {
            swiglu_slice(&mut out[..n], &gate[..n], &up[..n]);
            return Ok(());
        }
        // Prefill and verify passes: chunks over the pool (each element's operations are the same either way).
        use rayon::prelude::*;
        self.pool.install(|| {
            out[..n]
                .par_chunks_mut(SWIGLU_CHUNK)
                .zip(gate[..n].par_chunks(SWIGLU_CHUNK))
                .zip(up[..n].par_chunks(SWIGLU_CHUNK))
                .for_each(|((o, g), u)| swiglu_slice(o, g, u))
        });
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        if x.len() < n || y.len() < n {
            return Err(too_small("add"));
        }
        for (a, &b) in x[..n].iter_mut().zip(&y[..n]) {
            *a += b;
        }
        Ok(())
    }

    fn moe_ffn(&self, out: &mut Vec<f32>, x: &Vec<f32>, n_rows: usize, m: &MoeFfn) -> Result<()> {
        moe::moe_ffn(self, out, x, n_rows, m)
    }

    fn gather_rows(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        rows: &[usize],
        width: usize,
    ) -> Result<()> {
        if out.len() < rows.len() * width || rows.iter().any(|&r| x.len() < (r + 1) * width) {
            return Err(too_small("gather_rows"));
        }
        for (o, &r) in out.chunks_exact_mut(width).zip(rows) {
            o.copy_from_slice(&x[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn read(&self, x: &Vec<f32>, dst: &mut [f32]) -> Result<()> {
        if x.len() < dst.len() {
            return Err(too_small("read"));
        }
        dst.copy_from_slice(&x[..dst.len()]);
        Ok(())
    }

    fn argmax_rows(&self, x: &Vec<f32>, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        if x.len() < n_rows * width || width == 0 {
            return Err(too_small("argmax_rows"));
        }
        Ok(x[..n_rows * width]
            .chunks_exact(width)
            .map(crate::sampler::greedy_argmax)
            .collect())
    }
}

/// `out = silu(gate) * up`, with silu(g) = g · sigmoid(g) as transformers computes it.
/// Elements from which [`Backend::swiglu`] runs on the pool (a decode row of a small model stays on the calling
/// thread: a dispatch costs more than its `exp`s), and the elements a task takes.
const SWIGLU_PAR_MIN: usize = 16384;
const SWIGLU_CHUNK: usize = 4096;

pub(crate) fn swiglu_slice(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}
