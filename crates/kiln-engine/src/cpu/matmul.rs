//! CPU matmul: `out[j][r] = W[r] · x[j]` for every activation row `j` and weight row `r`.
//!
//! Fast path: each activation row is quantized once to the weight's dot-product format (`vec_dot_type`), then the
//! weight rows are split into tiles spread over the thread pool; inside a tile every activation row is multiplied
//! with every weight row of the tile, so a weight tile is read from memory once per call and stays in L1 while the
//! activation rows stream past (prefill reads the weights once, not once per token).
//!
//! Reference path (`KILN_NO_QUANT_ACT=1`): the tile's weight rows are dequantized to f32 and multiplied with the
//! f32 activations.
//!
//! Batch invariance: every output element is one call of a dot-product kernel on (weight row, activation row), and
//! an activation row's quantization depends only on that row, so a row's results are the same bits whatever other
//! rows share the call and however the tiles fall.

use super::CpuBackend;
use crate::error::{Error, Result};
use crate::weights::WeightView;
use kiln_gguf::GgufFile;
use kiln_quant::dot::{
    dot_fn, dot_kernel, gemm_kernel, quantize_activation_isa, vec_dot_type, GemmKernel,
    RepackKernel,
};
use kiln_quant::GgmlType;
use rayon::prelude::*;
use std::sync::Arc;

/// A raw output pointer shared by tiles that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tiles write disjoint index sets of one buffer that outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `i` must be in bounds of the buffer and written by no other thread during the parallel region.
    #[inline]
    unsafe fn write(self, i: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { *self.0.add(i) = v };
    }

    /// # Safety
    /// `i..i + v.len()` must be in bounds of the buffer and written by no other thread during the parallel
    /// region.
    #[inline]
    unsafe fn write_row(self, i: usize, v: &[f32]) {
        // A full group is two vector stores; a generic copy here was a memmove call per 8 values (~5% of a
        // Q4_K prefill).
        if let Ok(v8) = <[f32; 8]>::try_from(v) {
            // SAFETY: guaranteed by the caller.
            unsafe { self.0.add(i).cast::<[f32; 8]>().write_unaligned(v8) };
            return;
        }
        for (k, &x) in v.iter().enumerate() {
            // SAFETY: guaranteed by the caller.
            unsafe { *self.0.add(i + k) = x };
        }
    }
}

pub(super) fn quant_err(name: &str, e: impl std::fmt::Display) -> Error {
    Error::Quant {
        name: name.to_string(),
        error: e.to_string(),
    }
}

/// Activation rows multiplied with a weight row per kernel call group.
const ACT_GROUP: usize = 32;

/// Activation rows from which the tiled kernel (Q4_K/Q6_K) runs instead of `dot_rows`: packing a group of 8
/// weight rows costs about as much as multiplying it with two activation rows, so it pays from three on.
/// Both kernels give the same bits, so this threshold is a speed choice only.
const GEMM_MIN_ROWS: usize = 3;

/// Most weights [`matmul_many`] runs in one region (Q/K/V).
const MANY_MAX: usize = 3;

/// Weight rows per tile of the tiled kernel: whole packed groups, few enough tiles per thread to keep the
/// per-tile packing scratch reused, enough to balance the threads.
const GEMM_TILE: usize = 4 * GemmKernel::GROUP_ROWS;

/// Activation rows per call of the tiled kernel from the matmul (its widest tile on AVX-512).
const GEMM_ACT_STEP: usize = 8;

/// Weight rows per tile: enough tiles to keep every thread busy on a single-row (decode) call, and small tiles
/// for many rows so a tile stays in L1 while all activation rows pass.
fn tile_rows(n_w_rows: usize, n_act_rows: usize, threads: usize) -> usize {
    if n_act_rows == 1 {
        (n_w_rows / (threads * 8)).clamp(4, 64)
    } else {
        16
    }
}

/// A weight repacked for the interleaved kernel ([`RepackKernel`]: Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K): every matmul on it
/// reads this copy, one row or many (but for the K-quants' AVX2 form, which leaves 3 rows or more to the tiled or
/// row kernels, same bits), so its rows keep the same bits in decode, prefill and verify passes.
pub(crate) struct Repacked {
    kernel: RepackKernel,
    /// The packed weight starts at `bytes[start]`, 64-byte aligned: the K-quants' vectors are whole cache lines.
    bytes: Vec<u8>,
    start: usize,
    /// The GGUF the weight came from, kept mapped while its cache key (the file's address) is in use.
    _file: Option<Arc<GgufFile>>,
}

impl Repacked {
    /// Packs `w` on the backend's pool, groups of rows in parallel.
    pub(crate) fn new(
        be: &CpuBackend,
        kernel: RepackKernel,
        w: &WeightView,
        file: Option<Arc<GgufFile>>,
    ) -> Repacked {
        let (k, m, rb) = (w.cols, w.rows, w.row_bytes);
        let group = kernel.group_len(k);
        let mut bytes = vec![0u8; kernel.packed_len(k, m) + 63];
        let start = bytes.as_ptr().align_offset(64).min(63);
        // 64 groups a task.
        let chunk = 64 * kernel.group_rows();
        be.pool.install(|| {
            bytes[start..]
                .par_chunks_mut(64 * group)
                .enumerate()
                .for_each(|(t, out)| {
                    let r0 = t * chunk;
                    kernel.pack(k, &w.bytes[r0 * rb..], rb, (m - r0).min(chunk), out);
                })
        });
        Repacked {
            kernel,
            bytes,
            start,
            _file: file,
        }
    }

    /// Weight rows per packed group.
    fn group_rows(&self) -> usize {
        self.kernel.group_rows()
    }

    /// The block scales of `n_act` activation rows (`arb` bytes each) in `scratch`, as the kernel reads them.
    fn scales<'a>(
        &self,
        k: usize,
        acts: &[u8],
        arb: usize,
        n_act: usize,
        scratch: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let need = self.kernel.scales_len(k, n_act);
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        self.kernel
            .act_scales(k, acts, arb, n_act, &mut scratch[..need]);
        &scratch[..need]
    }

    /// Weight rows `r0..r1` (`r0` a multiple of [`Repacked::group_rows`]) times the `n_act` activation rows
    /// `acts` (`arb` bytes each, block scales `ys` from [`Repacked::scales`]), stored at `out[j * m + r]`.
    #[allow(clippy::too_many_arguments)]
    fn run_rows(
        &self,
        k: usize,
        m: usize,
        (r0, r1): (usize, usize),
        (acts, arb, ys): (&[u8], usize, &[f32]),
        n_act: usize,
        out: OutPtr,
    ) {
        let packed = &self.bytes[self.start + r0 / self.group_rows() * self.kernel.group_len(k)..];
        self.kernel
            .run_with(k, packed, r1 - r0, acts, arb, ys, n_act, |j, i0, vals| {
                // SAFETY: (j, r0 + i0 ..) lie in rows r0..r1 of activation row j, which only this caller's
                // tile writes; in bounds as out.len() >= n_act * m was checked by the matmul.
                unsafe { out.write_row(j * m + r0 + i0, vals) };
            });
    }
}

/// `out[j * w.rows + r] = w.row(r) · x[j * w.cols ..]` for `j < n_rows`.
pub(crate) fn matmul(
    be: &CpuBackend,
    out: &mut [f32],
    w: &WeightView,
    x: &[f32],
    n_rows: usize,
) -> Result<()> {
    matmul_packed(be, out, w, None, x, n_rows)
}

/// [`matmul`] on the weight's repacked copy when it has one.
pub(crate) fn matmul_packed(
    be: &CpuBackend,
    out: &mut [f32],
    w: &WeightView,
    packed: Option<&Repacked>,
    x: &[f32],
    n_rows: usize,
) -> Result<()> {
    let (k, m) = (w.cols, w.rows);
    if x.len() < n_rows * k || out.len() < n_rows * m {
        return Err(Error::Batch(format!(
            "matmul with '{}': buffers too small for {n_rows} rows of {k} -> {m}",
            w.name
        )));
    }
    if n_rows == 0 {
        return Ok(());
    }
    // Same bits either way: a decode-only repacked kernel leaves many rows to the tiled kernel (or, with
    // KILN_NO_CPU_GEMM, to the row kernels, as that switch promises).
    let packed = packed.filter(|p| !(p.kernel.decode_only() && n_rows >= GEMM_MIN_ROWS));
    let act_ty = vec_dot_type(w.ty);
    let use_quant = be.flags.quant_act || w.ty == GgmlType::F32;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let tile = tile_rows(m, n_rows, be.threads);
    let n_tiles = m.div_ceil(tile);

    if use_quant {
        let kernel = dot_kernel(w.ty, be.isa).map_err(|e| quant_err(w.name, e))?;
        let arb = act_ty
            .row_bytes(k as u64)
            .ok_or_else(|| quant_err(w.name, format!("row of {k} is not whole {act_ty} blocks")))?
            as usize;
        let mut guard = be.act_scratch.lock().unwrap_or_else(|p| p.into_inner());
        let acts: &mut Vec<u8> = &mut guard;
        if acts.len() < n_rows * arb {
            acts.resize(n_rows * arb, 0);
        }
        let isa = be.isa;
        let quantize = |(xr, ar): (&[f32], &mut [u8])| {
            quantize_activation_isa(act_ty, isa, xr, ar).map_err(|e| quant_err(w.name, e))
        };
        let pairs = x[..n_rows * k]
            .chunks_exact(k)
            .zip(acts[..n_rows * arb].chunks_exact_mut(arb));
        if n_rows >= 4 {
            be.pool.install(|| {
                pairs
                    .collect::<Vec<_>>()
                    .into_par_iter()
                    .try_for_each(quantize)
            })?;
        } else {
            pairs.into_iter().try_for_each(quantize)?;
        }
        let acts: &[u8] = &acts[..n_rows * arb];
        if let Some(p) = packed {
            let tile = tile.next_multiple_of(p.group_rows());
            let mut sg = be.scale_scratch.lock().unwrap_or_else(|p| p.into_inner());
            let ys = p.scales(k, acts, arb, n_rows, &mut sg);
            be.pool.install(|| {
                (0..m.div_ceil(tile)).into_par_iter().for_each(|t| {
                    let rows = (t * tile, ((t + 1) * tile).min(m));
                    p.run_rows(k, m, rows, (acts, arb, ys), n_rows, out_ptr);
                })
            });
            return Ok(());
        }
        let tiled = be.flags.cpu_gemm && n_rows >= GEMM_MIN_ROWS;
        if let Some(g) = gemm_kernel(w.ty, be.isa).filter(|_| tiled) {
            gemm_tiles(be, g, w, acts, arb, n_rows, out_ptr);
            return Ok(());
        }
        be.pool.install(|| {
            (0..n_tiles).into_par_iter().for_each(|t| {
                let r0 = t * tile;
                let r1 = (r0 + tile).min(m);
                // Activation rows in groups small enough to stay in L1/L2 while the tile's weight rows pass;
                // `dot_rows` decodes each weight row once per group (same bits as one row at a time).
                let mut tmp = [0f32; ACT_GROUP];
                for j0 in (0..n_rows).step_by(ACT_GROUP) {
                    let nj = (n_rows - j0).min(ACT_GROUP);
                    let a = &acts[j0 * arb..(j0 + nj) * arb];
                    for r in r0..r1 {
                        kernel.dot_rows(k, w.row(r), a, arb, &mut tmp[..nj]);
                        for (jj, &v) in tmp[..nj].iter().enumerate() {
                            // SAFETY: (j, r) is written by exactly one tile (r in r0..r1); the index is in
                            // bounds because out.len() >= n_rows * m was checked above.
                            unsafe { out_ptr.write((j0 + jj) * m + r, v) };
                        }
                    }
                }
            })
        });
        Ok(())
    } else {
        // Reference: f32 activations against dequantized weights, multiplied with the f32 kernel.
        let dot = dot_fn(GgmlType::F32, be.isa).map_err(|e| quant_err(w.name, e))?;
        be.pool.install(|| {
            (0..n_tiles).into_par_iter().try_for_each(|t| {
                let r0 = t * tile;
                let r1 = (r0 + tile).min(m);
                let mut wf = vec![0f32; (r1 - r0) * k];
                kiln_quant::dequantize(w.ty, &w.bytes[r0 * w.row_bytes..r1 * w.row_bytes], &mut wf)
                    .map_err(|e| quant_err(w.name, e))?;
                for j in 0..n_rows {
                    let a: &[u8] = bytemuck_f32(&x[j * k..(j + 1) * k]);
                    for r in r0..r1 {
                        let wr: &[u8] = bytemuck_f32(&wf[(r - r0) * k..(r - r0 + 1) * k]);
                        let v = dot(k, wr, a);
                        // SAFETY: as above, disjoint (j, r) per tile, in bounds.
                        unsafe { out_ptr.write(j * m + r, v) };
                    }
                }
                Ok(())
            })
        })
    }
}

/// `outs[i][j * ws[i].rows + r] = ws[i].row(r) · x[j]`: weights that read the same activations (Q/K/V, gate/up).
/// Below [`GEMM_MIN_ROWS`] rows (decode) with quantized activations of one format, the activations are quantized
/// once and every weight's tiles run in one parallel region (one thread-pool dispatch instead of one per weight);
/// otherwise one [`matmul`] each. Every output is the same dot-kernel call either way, so the bits are the same.
pub(crate) fn matmul_many(
    be: &CpuBackend,
    outs: &mut [&mut [f32]],
    ws: &[WeightView],
    packed: &[Option<&Repacked>],
    x: &[f32],
    n_rows: usize,
) -> Result<()> {
    let act_ty = ws.first().map(|w| vec_dot_type(w.ty));
    let k = ws.first().map(|w| w.cols).unwrap_or(0);
    let one_region = n_rows > 0
        && n_rows < GEMM_MIN_ROWS
        && be.flags.quant_act
        && be.flags.cpu_one_region
        && outs.len() == ws.len()
        && ws.len() <= MANY_MAX
        && ws
            .iter()
            .all(|w| Some(vec_dot_type(w.ty)) == act_ty && w.cols == k && w.ty != GgmlType::F32);
    if !one_region {
        for (i, (o, w)) in outs.iter_mut().zip(ws).enumerate() {
            matmul_packed(be, o, w, packed.get(i).copied().flatten(), x, n_rows)?;
        }
        return Ok(());
    }
    let act_ty = act_ty.unwrap_or(GgmlType::F32);
    // Fixed-size per-weight state: this runs for every decoded token, so nothing here allocates.
    let mut kernels = [None; MANY_MAX];
    let mut ptrs = [OutPtr(std::ptr::null_mut()); MANY_MAX];
    // Tile size of each weight, and the first job index of each weight (`ends[i]` = jobs before weight i + 1).
    let mut tiles = [0usize; MANY_MAX];
    let mut ends = [0usize; MANY_MAX];
    let mut total = 0;
    for (i, (o, w)) in outs.iter_mut().zip(ws).enumerate() {
        if x.len() < n_rows * k || o.len() < n_rows * w.rows {
            return Err(Error::Batch(format!(
                "matmul with '{}': buffers too small for {n_rows} rows of {k} -> {}",
                w.name, w.rows
            )));
        }
        kernels[i] = Some(dot_kernel(w.ty, be.isa).map_err(|e| quant_err(w.name, e))?);
        ptrs[i] = OutPtr(o.as_mut_ptr());
        tiles[i] = tile_rows(w.rows, n_rows, be.threads);
        if let Some(p) = packed.get(i).copied().flatten() {
            tiles[i] = tiles[i].next_multiple_of(p.group_rows());
        }
        total += w.rows.div_ceil(tiles[i]);
        ends[i] = total;
    }
    let arb = act_ty.row_bytes(k as u64).ok_or_else(|| {
        quant_err(
            ws[0].name,
            format!("row of {k} is not whole {act_ty} blocks"),
        )
    })? as usize;
    let mut guard = be.act_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let acts: &mut Vec<u8> = &mut guard;
    if acts.len() < n_rows * arb {
        acts.resize(n_rows * arb, 0);
    }
    for (xr, ar) in x[..n_rows * k]
        .chunks_exact(k)
        .zip(acts[..n_rows * arb].chunks_exact_mut(arb))
    {
        quantize_activation_isa(act_ty, be.isa, xr, ar).map_err(|e| quant_err(ws[0].name, e))?;
    }
    let acts: &[u8] = &acts[..n_rows * arb];
    // The repacked weights' activation scales, once for all of them (one activation format).
    let mut sg = be.scale_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let ys: &[f32] = match packed.iter().flatten().next() {
        Some(p) => p.scales(k, acts, arb, n_rows, &mut sg),
        None => &[],
    };
    be.pool.install(|| {
        (0..total).into_par_iter().for_each(|job| {
            let i = ends[..ws.len()].iter().position(|&e| job < e).unwrap_or(0);
            let first = if i == 0 { 0 } else { ends[i - 1] };
            let (w, m) = (&ws[i], ws[i].rows);
            let r0 = (job - first) * tiles[i];
            if let Some(p) = packed.get(i).copied().flatten() {
                let rows = (r0, (r0 + tiles[i]).min(m));
                p.run_rows(k, m, rows, (acts, arb, ys), n_rows, ptrs[i]);
                return;
            }
            let Some(kernel) = kernels[i] else { return };
            let mut tmp = [0f32; GEMM_MIN_ROWS];
            for r in r0..(r0 + tiles[i]).min(m) {
                kernel.dot_rows(k, w.row(r), acts, arb, &mut tmp[..n_rows]);
                for (j, &v) in tmp[..n_rows].iter().enumerate() {
                    // SAFETY: (j, r) of weight i is written by exactly one job; in bounds as checked above.
                    unsafe { ptrs[i].write(j * m + r, v) };
                }
            }
        })
    });
    Ok(())
}

/// The tiled path: weight tiles of [`GEMM_TILE`] rows over the pool; each tile is packed once into a per-task
/// scratch and multiplied with every activation row, and the next tile's weights are prefetched meanwhile
/// (packing reads them straight from memory, where the stall showed up as ~half of the packing time).
fn gemm_tiles(
    be: &CpuBackend,
    g: GemmKernel,
    w: &WeightView,
    acts: &[u8],
    arb: usize,
    n_rows: usize,
    out_ptr: OutPtr,
) {
    let (k, m, rb) = (w.cols, w.rows, w.row_bytes);
    let group = GemmKernel::GROUP_ROWS;
    be.pool.install(|| {
        (0..m.div_ceil(GEMM_TILE)).into_par_iter().for_each_init(
            || vec![0u8; g.packed_len(k, GEMM_TILE)],
            |packed, t| {
                let r0 = t * GEMM_TILE;
                let nr = (m - r0).min(GEMM_TILE);
                g.pack(k, &w.bytes[r0 * rb..], rb, nr, packed);
                let group_bytes = g.packed_len(k, group);
                for (gi, g0) in (0..nr).step_by(group).enumerate() {
                    let gr = (nr - g0).min(group);
                    // The next tile's rows, a group's worth per group, issued a slice per call of
                    // GEMM_ACT_STEP activation rows: issued all at once they filled the miss buffers and
                    // the prefetch instructions themselves stalled (~2.5% of a prefill).
                    let next = ((r0 + nr + g0) * rb).min(w.bytes.len());
                    let ahead = &w.bytes[next..(next + group * rb).min(w.bytes.len())];
                    let per = ahead
                        .len()
                        .div_ceil(n_rows.div_ceil(GEMM_ACT_STEP))
                        .next_multiple_of(64);
                    let packed = &packed[gi * group_bytes..];
                    for (s, j0) in (0..n_rows).step_by(GEMM_ACT_STEP).enumerate() {
                        let lo = (s * per).min(ahead.len());
                        prefetch(&ahead[lo..(lo + per).min(ahead.len())]);
                        let nj = (n_rows - j0).min(GEMM_ACT_STEP);
                        let a = &acts[j0 * arb..];
                        g.run_with(k, packed, gr, a, arb, nj, |j, i0, vals| {
                            // SAFETY: elements (j0 + j, r0 + g0 + i0 ..) belong to this tile only; in
                            // bounds as out.len() >= n_rows * m was checked by the caller.
                            unsafe { out_ptr.write_row((j0 + j) * m + r0 + g0 + i0, vals) };
                        });
                    }
                }
            },
        )
    });
}

/// Asks the CPU to bring `bytes` into L2 ahead of use (a hint: no effect on results).
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: prefetching is a hint that cannot fault; SSE is part of the x86_64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Views f32s as their little-endian bytes (the dot kernels take raw bytes).
fn bytemuck_f32(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 has alignment 1; the length is exact. kiln targets little-endian CPUs,
    // where the in-memory bytes are the GGUF byte order.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Flags;

    /// Deterministic pseudo-random values in [-1, 1).
    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn check_type(ty: GgmlType, k: usize, m: usize, n_rows: usize, tol: f32) {
        let wf = rand_vec(m * k, 1);
        let rb = ty.row_bytes(k as u64).unwrap() as usize;
        let mut wq = vec![0u8; m * rb];
        kiln_quant::quantize(ty, &wf, &mut wq).unwrap();
        let mut wd = vec![0f32; m * k];
        kiln_quant::dequantize(ty, &wq, &mut wd).unwrap();
        let x = rand_vec(n_rows * k, 2);
        let view = WeightView {
            name: "w",
            ty,
            cols: k,
            rows: m,
            row_bytes: rb,
            bytes: &wq,
        };
        for flags in [Flags::default(), Flags::reference()] {
            let be = CpuBackend::new(2, flags).unwrap();
            let mut out = vec![f32::NAN; n_rows * m];
            matmul(&be, &mut out, &view, &x, n_rows).unwrap();
            for j in 0..n_rows {
                for r in 0..m {
                    let want: f32 = (0..k).map(|i| wd[r * k + i] * x[j * k + i]).sum();
                    let got = out[j * m + r];
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty} {flags:?} row {j} col {r}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The quantized path equals f32 arithmetic on the dequantized weight and dequantized activation.
    #[test]
    fn quantized_path_is_exact_on_quantized_operands() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q4_1,
        ] {
            let (k, m) = (1536, 40);
            let wf = rand_vec(m * k, 3);
            let rb = ty.row_bytes(k as u64).unwrap() as usize;
            let mut wq = vec![0u8; m * rb];
            kiln_quant::quantize(ty, &wf, &mut wq).unwrap();
            let mut wd = vec![0f32; m * k];
            kiln_quant::dequantize(ty, &wq, &mut wd).unwrap();
            let mut x = rand_vec(k, 4);
            x[7] = 300.0; // an outlier, as real activations have
            let at = vec_dot_type(ty);
            let mut xq = vec![0u8; at.row_bytes(k as u64).unwrap() as usize];
            kiln_quant::dot::quantize_activation(at, &x, &mut xq).unwrap();
            let mut xd = vec![0f32; k];
            kiln_quant::dequantize(at, &xq, &mut xd).unwrap();
            let view = WeightView {
                name: "w",
                ty,
                cols: k,
                rows: m,
                row_bytes: rb,
                bytes: &wq,
            };
            let be = CpuBackend::new(2, Flags::default()).unwrap();
            let mut out = vec![f32::NAN; m];
            matmul(&be, &mut out, &view, &x, 1).unwrap();
            for r in 0..m {
                let want: f64 = (0..k).map(|i| wd[r * k + i] as f64 * xd[i] as f64).sum();
                let scale: f64 = (0..k)
                    .map(|i| (wd[r * k + i] as f64 * xd[i] as f64).abs())
                    .sum();
                // Q8_1 stores its block sum `s` as f16, as ggml does, so Q4_1's min term carries that rounding.
                let tol = if ty == GgmlType::Q4_1 { 2e-3 } else { 1e-5 };
                assert!(
                    (out[r] as f64 - want).abs() <= tol * scale + 1e-4,
                    "{ty} row {r}: {} vs {want}",
                    out[r]
                );
            }
        }
    }

    /// Batch invariance across the kernel switch: a row's outputs are the same bits whether it is multiplied
    /// alone (row-by-row kernel) or inside a batch of any size (the tiled kernel for Q4_K/Q6_K from
    /// `GEMM_MIN_ROWS` rows), and for the K-quants the same bits with the tiled kernel switched off
    /// (`KILN_NO_CPU_GEMM`) and as the scalar reference (`KILN_NO_SIMD`).
    #[test]
    fn rows_are_bit_identical_alone_in_any_batch_and_without_simd() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
        ] {
            // 44 weight rows: a partial 8-row group and a partial tile.
            let (k, m, n) = (768, 44, 37);
            let wf = rand_vec(m * k, 11);
            let rb = ty.row_bytes(k as u64).unwrap() as usize;
            let mut wq = vec![0u8; m * rb];
            kiln_quant::quantize(ty, &wf, &mut wq).unwrap();
            let view = WeightView {
                name: "w",
                ty,
                cols: k,
                rows: m,
                row_bytes: rb,
                bytes: &wq,
            };
            let x = rand_vec(n * k, 12);
            let be = CpuBackend::new(2, Flags::default()).unwrap();
            let mut alone = vec![f32::NAN; n * m];
            for j in 0..n {
                matmul(&be, &mut alone[j * m..(j + 1) * m], &view, &x[j * k..], 1).unwrap();
            }
            for (first, count) in [(0, 2), (3, 3), (1, 4), (5, 9), (0, 17), (0, n)] {
                let mut out = vec![f32::NAN; count * m];
                matmul(&be, &mut out, &view, &x[first * k..], count).unwrap();
                for (i, (o, a)) in out.iter().zip(&alone[first * m..]).enumerate() {
                    assert_eq!(
                        o.to_bits(),
                        a.to_bits(),
                        "{ty}: row {} col {} of a {count}-row call",
                        first + i / m,
                        i % m
                    );
                }
            }
            if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
                // The tiled kernel's kill switch (the row kernel on the whole batch) and the scalar reference:
                // the same bits.
                let variants = [
                    (
                        Flags {
                            cpu_gemm: false,
                            ..Flags::default()
                        },
                        "KILN_NO_CPU_GEMM changes the bits",
                    ),
                    (
                        Flags {
                            simd: false,
                            ..Flags::default()
                        },
                        "scalar reference differs from the SIMD kernels",
                    ),
                ];
                for (flags, what) in variants {
                    let be = CpuBackend::new(2, flags).unwrap();
                    let mut out = vec![f32::NAN; n * m];
                    matmul(&be, &mut out, &view, &x, n).unwrap();
                    assert!(
                        out.iter()
                            .zip(&alone)
                            .all(|(o, a)| o.to_bits() == a.to_bits()),
                        "{ty}: {what}"
                    );
                }
            }
        }
    }

    #[test]
    fn matmul_matches_dequantized_reference() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::F16,
        ] {
            for (k, m, n_rows) in [
                (256, 1, 1),
                (256, 37, 1),
                (256, 37, 5),
                (256, 130, 17),
                (1536, 576, 3),
            ] {
                check_type(ty, k, m, n_rows, 0.15 * (k as f32 / 256.0).sqrt());
            }
        }
    }

    /// Weights sharing an input in one region give every output the bits of its own matmul (1 and 2 rows: the
    /// one-region path; 5 rows: the fallback), for a K-quant pair (Q8_K activations) and a legacy pair (Q8_0).
    #[test]
    fn matmul_many_equals_separate_matmuls() {
        let k = 512;
        for tys in [
            [GgmlType::Q4_K, GgmlType::Q6_K],
            [GgmlType::Q8_0, GgmlType::Q4_0],
        ] {
            let weights: Vec<(Vec<u8>, usize, usize)> = tys
                .iter()
                .zip([37usize, 20])
                .map(|(&ty, m)| {
                    let rb = ty.row_bytes(k as u64).unwrap() as usize;
                    let mut wq = vec![0u8; m * rb];
                    kiln_quant::quantize(ty, &rand_vec(m * k, m as u64), &mut wq).unwrap();
                    (wq, m, rb)
                })
                .collect();
            let views: Vec<WeightView> = tys
                .iter()
                .zip(&weights)
                .map(|(&ty, (wq, m, rb))| WeightView {
                    name: "w",
                    ty,
                    cols: k,
                    rows: *m,
                    row_bytes: *rb,
                    bytes: wq,
                })
                .collect();
            let be = CpuBackend::new(2, Flags::default()).unwrap();
            for n_rows in [1usize, 2, 5] {
                let x = rand_vec(n_rows * k, 9 + n_rows as u64);
                let mut a = vec![f32::NAN; n_rows * 37];
                let mut b = vec![f32::NAN; n_rows * 20];
                matmul_many(
                    &be,
                    &mut [&mut a, &mut b],
                    &views,
                    &[None, None],
                    &x,
                    n_rows,
                )
                .unwrap();
                for (got, w) in [&a, &b].into_iter().zip(&views) {
                    let mut want = vec![f32::NAN; n_rows * w.rows];
                    matmul(&be, &mut want, w, &x, n_rows).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(got), bits(&want), "{tys:?} {n_rows} rows");
                }
            }
        }
    }

    /// The repacked kernels (Q4_0/Q4_1/Q8_0, Q4_K/Q5_K/Q6_K; AVX-512 VNNI and AVX2) through the matmul: against the
    /// dequantized product, every row of a many-row call (partial groups of 8 or 16 weight rows, partial tiles)
    /// the bits of that row alone, the K-quants the bits of the unpacked matmul (row and tiled kernels), and
    /// `matmul_many` on repacked weights the bits of separate matmuls (1 and 2 rows: one region; 5: the fallback).
    #[test]
    fn repacked_rows_are_exact_alone_in_any_batch_and_in_one_region() {
        use kiln_quant::dot::Isa;
        let be = CpuBackend::new(2, Flags::default()).unwrap();
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        let runs = types.into_iter().flat_map(|ty| {
            let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
            [Isa::Avx512Vnni, Isa::Avx2]
                .into_iter()
                .map(move |isa| (ty, k_quant, isa))
        });
        for (ty, k_quant, isa) in runs {
            // Each kernel asked for by its ISA: the matmul takes any repacked weight it is given (the K-quants'
            // AVX2 form only below 3 rows: more go to the tiled or row kernels, the same bits).
            let Some(kernel) = kiln_quant::dot::repack_kernel(ty, isa) else {
                eprintln!("no {isa} on this CPU: the repacked {ty} kernel is not tested here");
                continue;
            };
            let at = vec_dot_type(ty);
            let mut packs = Vec::new();
            for (k, m, n) in [(256usize, 37usize, 5usize), (1536, 44, 17)] {
                let rb = ty.row_bytes(k as u64).unwrap() as usize;
                let mut wq = vec![0u8; m * rb];
                kiln_quant::quantize(ty, &rand_vec(m * k, m as u64), &mut wq).unwrap();
                let view = WeightView {
                    name: "w",
                    ty,
                    cols: k,
                    rows: m,
                    row_bytes: rb,
                    bytes: &wq,
                };
                let p = Repacked::new(&be, kernel, &view, None);
                let x = rand_vec(n * k, 3 + n as u64);
                let mut all = vec![f32::NAN; n * m];
                matmul_packed(&be, &mut all, &view, Some(&p), &x, n).unwrap();
                if k_quant {
                    let mut unpacked = vec![f32::NAN; n * m];
                    matmul_packed(&be, &mut unpacked, &view, None, &x, n).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&all),
                        bits(&unpacked),
                        "{ty} {k}: the unpacked kernels"
                    );
                }
                for j in 0..n {
                    let mut one = vec![f32::NAN; m];
                    matmul_packed(&be, &mut one, &view, Some(&p), &x[j * k..], 1).unwrap();
                    let xr = &x[j * k..(j + 1) * k];
                    let arb = at.row_bytes(k as u64).unwrap() as usize;
                    let (mut xq, mut xd) = (vec![0u8; arb], vec![0f32; k]);
                    kiln_quant::dot::quantize_activation(at, xr, &mut xq).unwrap();
                    kiln_quant::dequantize(at, &xq, &mut xd).unwrap();
                    let mut wd = vec![0f32; m * k];
                    kiln_quant::dequantize(ty, &wq, &mut wd).unwrap();
                    for r in 0..m {
                        assert_eq!(
                            one[r].to_bits(),
                            all[j * m + r].to_bits(),
                            "{ty} {k}: act {j} row {r}"
                        );
                        let prods = (0..k).map(|i| wd[r * k + i] as f64 * xd[i] as f64);
                        let (want, scale) =
                            prods.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()));
                        // Q4_1's min term carries the f16 rounding of Q8_1's block sum `s`, as in ggml.
                        let tol = if ty == GgmlType::Q4_1 { 2e-3 } else { 1e-5 };
                        assert!(
                            (one[r] as f64 - want).abs() <= tol * scale + 1e-4,
                            "{ty} row {r}: {} vs {want}",
                            one[r]
                        );
                    }
                }
                packs.push((wq, m, rb, k));
            }
            // Two repacked weights of one width in one call.
            let (wq, m, rb, k) = &packs[0];
            let view = WeightView {
                name: "w",
                ty,
                cols: *k,
                rows: *m,
                row_bytes: *rb,
                bytes: wq,
            };
            let p = Repacked::new(&be, kernel, &view, None);
            for n_rows in [1usize, 2, 5] {
                let x = rand_vec(n_rows * k, 40 + n_rows as u64);
                let (mut a, mut b) = (vec![f32::NAN; n_rows * m], vec![f32::NAN; n_rows * m]);
                let views = [view, view];
                matmul_many(
                    &be,
                    &mut [&mut a, &mut b],
                    &views,
                    &[Some(&p), Some(&p)],
                    &x,
                    n_rows,
                )
                .unwrap();
                let mut want = vec![f32::NAN; n_rows * m];
                matmul_packed(&be, &mut want, &view, Some(&p), &x, n_rows).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&want), "{ty} {n_rows} rows, first output");
                assert_eq!(bits(&b), bits(&want), "{ty} {n_rows} rows, second output");
            }
        }
    }
}
