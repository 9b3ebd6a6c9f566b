//! The kernel sweep: every kernel against a host reference on odd shapes (partial matmul row groups, rows
//! that are not a multiple of the block size), plus batch invariance (a row computed alone and among others
//! must be bit-identical). `kiln selftest --device cuda` prints its [`Check`]s; on a GPU the crate's
//! integration test runs it too.

use crate::device::{AttnShape, DBuf, DKv, Device, MoeShape, BLAS_MIN_ROWS, MMQ_MIN_ROWS};
use crate::error::{Error, Result};
use kiln_quant::{dequantize, quantize, GgmlType};

/// One comparison.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was compared.
    pub name: String,
    /// Largest absolute difference, relative to the reference's RMS (0 for bit-equality checks that passed).
    pub err: f64,
    /// The tolerance it was held to.
    pub tol: f64,
}

impl Check {
    /// Whether it passed.
    pub fn ok(&self) -> bool {
        self.err <= self.tol
    }
}

/// Deterministic pseudo-random values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// RMSNorm of each row of `x` (rows as wide as `w`) times `w`, in f64.
fn host_rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|r| {
            let ss = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
            let s = 1.0 / (ss / w.len() as f64 + eps as f64).sqrt();
            r.iter().zip(w).map(move |(&v, &w)| v as f64 * s * w as f64)
        })
        .collect()
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64)
        .sqrt()
        .max(1e-30);
    let max = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g.is_finite() {
                (g as f64 - w).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max);
    max / rms
}

fn bits_differ(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count() as f64
}

/// Host activation quantization in blocks of `block` (32: the `quantize_q8` kernel; 256: `quantize_k8`), the
/// same rounding: values `d * q`.
fn q8_values(x: &[f32], block: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for b in x.chunks(block) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(b.iter().map(|&v| (v * id).round() as f64 * d as f64));
    }
    out
}

/// `rows × cols` weights of `ty` dequantized on the host.
fn dequantize_rows(ty: GgmlType, wq: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    let row_bytes = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
    let mut wd = vec![0f32; rows * cols];
    for r in 0..rows {
        dequantize(
            ty,
            &wq[r * row_bytes..(r + 1) * row_bytes],
            &mut wd[r * cols..(r + 1) * cols],
        )
        .map_err(quant_err)?;
    }
    Ok(wd)
}

/// `W · x[r]` in f64 for `n` rows: `wq` (`rows × cols` of `ty`) dequantized on the host, `x` as the kernels see
/// it (Q8 blocks when `q8`, else f32).
/// `act_block`: the activations quantized in blocks of this many (32 or 256), or 0 for f32 activations.
fn reference_matmul(
    ty: GgmlType,
    wq: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    act_block: usize,
) -> Result<Vec<f64>> {
    let wd = dequantize_rows(ty, wq, rows, cols)?;
    let mut want = vec![0f64; n * rows];
    for i in 0..n {
        let xr = &x[i * cols..(i + 1) * cols];
        let xv: Vec<f64> = if act_block > 0 {
            q8_values(xr, act_block)
        } else {
            xr.iter().map(|&v| v as f64).collect()
        };
        for o in 0..rows {
            want[i * rows + o] = wd[o * cols..(o + 1) * cols]
                .iter()
                .zip(&xv)
                .map(|(&w, &v)| w as f64 * v)
                .sum();
        }
    }
    Ok(want)
}

fn quant_err(e: kiln_quant::Error) -> Error {
    Error::Shape {
        op: "selftest",
        detail: e.to_string(),
    }
}

/// `rows × cols` random values quantized row by row to `ty` (GGUF bytes). IQ2_XXS, which kiln cannot quantize:
/// random codes (every bit pattern is a valid block) under a small random scale.
fn random_weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
    if ty == GgmlType::IQ2_XXS {
        let mut wq: Vec<u8> = (0..rows * rb).map(|_| (rng.next() >> 24) as u8).collect();
        for blk in wq.chunks_exact_mut(66) {
            let d = half::f16::from_f32(0.002 + 0.005 * (rng.f() + 1.0));
            blk[..2].copy_from_slice(&d.to_le_bytes());
        }
        return Ok(wq);
    }
    let wf = rng.vec(rows * cols);
    let mut wq = vec![0u8; rows * rb];
    for (src, dst) in wf.chunks_exact(cols).zip(wq.chunks_exact_mut(rb)) {
        quantize(ty, src, dst).map_err(quant_err)?;
    }
    Ok(wq)
}

/// Runs every check on `dev`.
pub fn run(dev: &Device) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    let mut rng = Rng(0x6b696c6e);
    use GgmlType::*;
    for ty in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, F16, BF16, F32,
    ] {
        // Two K-quant super-blocks; then nine (a partial step of the GEMV lanes).
        for cols in [512, 2304] {
            matmul_check(dev, &mut rng, ty, cols, &mut checks)?;
        }
    }
    // The one-row Q4_K and Q6_K GEMVs stage rows 4,096 to 12,288 wide in shared memory
    // (GV_STAGE_MINW / MAXW in gemv.cu), and read wider ones from global memory.
    for ty in [Q4_K, Q6_K] {
        for cols in [4096, 12544] {
            matmul_check(dev, &mut rng, ty, cols, &mut checks)?;
        }
    }
    for ty in [Q4_K, Q6_K, Q8_0] {
        mmq_check(dev, &mut rng, ty, &mut checks)?;
    }
    // Its own random stream: whether a dense copy exists (it is skipped without one) leaves the later checks' data
    // the same in every mode.
    let mut dense_rng = Rng(0x5eed_dea5e);
    for ty in [Q4_K, Q6_K, Q8_0, Q5_K, Q4_0, F32, BF16, F16] {
        dense_check(dev, &mut dense_rng, ty, &mut checks)?;
    }
    ops_checks(dev, &mut rng, &mut checks)?;
    shadow_checks(dev, &mut rng, &mut checks)?;
    many_check(dev, &mut rng, &mut checks)?;
    moe_check(dev, &mut rng, &mut checks)?;
    for f16 in [true, false] {
        for fused in [false, true] {
            attention_check(dev, &mut rng, f16, fused, 6, 64, &mut checks)?;
        }
        // 8 heads of 64: a K8 block spans 4 heads, so the merge takes 4 heads a block (with a K-quant loaded).
        attention_check(dev, &mut rng, f16, true, 8, 64, &mut checks)?;
        // Qwen3's head_dim (the split kernel's 128-wide instantiations, prep inside it for one-row passes).
        attention_check(dev, &mut rng, f16, true, 8, 128, &mut checks)?;
        // A DFlash drafter's block: head_dim 64 (the 0.6B-shape drafters) and 128 (z-lab's 8B drafter).
        for hd in [64, 128] {
            visible_attention_check(dev, &mut rng, f16, hd, &mut checks)?;
        }
    }
    flash_attention_check(dev, &mut rng, &mut checks)?;
    graph_check(dev, &mut rng, &mut checks)?;
    // Its own random stream, last: it leaves every other check's data as it was.
    q8_blocks_check(dev, &mut Rng(0x0a8b_10c5), &mut checks)?;
    copy_rows_check(dev, &mut Rng(0x7a95), &mut checks)?;
    Ok(checks)
}

/// `copy_rows` as a DFlash round uses it: rows 3..10 of a pass's tapped hidden states (`taps × 11 rows × 300`,
/// the buffer of another device on the same GPU, as the target's is the drafter's) into a feature buffer of rows
/// × taps × 300 in another tap order, past rows the copy must leave alone. Bit-exact.
fn copy_rows_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    let (taps, pass_rows, width, start, rows) = (5usize, 11usize, 300usize, 3usize, 7usize);
    let slot_of = [2usize, 0, 4, 1, 3]; // the tap buffer's slot of each feature tap
    let other = Device::open(dev.context().ordinal(), dev.options())?;
    let src_host = rng.vec(taps * pass_rows * width);
    let src = other.upload(&src_host)?;
    dev.wait_for(&other)?; // as the drafter waits for its target's pass
    let fw = taps * width;
    let mut want = rng.vec(16 * fw);
    let mut dst = dev.upload(&want)?;
    for (t, &s) in slot_of.iter().enumerate() {
        let at = (s * pass_rows + start) * width;
        dev.copy_rows(&mut dst, t * width, fw, &src, at, width, rows, width)?;
        for r in 0..rows {
            want[r * fw + t * width..][..width]
                .copy_from_slice(&src_host[at + r * width..][..width]);
        }
    }
    let mut got = vec![0f32; want.len()];
    dev.read(&dst, &mut got)?;
    checks.push(Check {
        name: format!("copy_rows: {rows} of {pass_rows} tapped rows x {taps} taps of {width}, from another device's buffer"),
        err: bits_differ(&got, &want),
        tol: 0.0,
    });
    Ok(())
}

/// A DFlash drafter's Q8_0 block kernel ([`Device::set_q8_blocks`]: `gemv16_q8d`, and its one-tile form up to 8
/// rows) against the host product on K8 activations: partial output tiles (37 outputs), super-blocks shared
/// unevenly by the warps (9), partial row tiles (6, 11, 20 rows), the residual form, and three weights in one
/// launch each with its own launch's bits.
fn q8_blocks_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    let ty = GgmlType::Q8_0;
    dev.set_pass(&[], &[], &[], false)?;
    dev.set_q8_blocks(true);
    for cols in [512usize, 2304] {
        let rows = 37;
        let wq = random_weight(rng, ty, rows, cols)?;
        let w = dev.upload_weight("test.q8_blocks", ty, cols, rows, &wq, true)?;
        if !dev.reads_k8(&w) {
            break; // not in this configuration (the reference mode, no K8 or no block kernels)
        }
        for n in [4usize, 6, 8, 11, 16, 20] {
            let x = rng.vec(n * cols);
            let xb = dev.upload(&x)?;
            let want = reference_matmul(ty, &wq, rows, cols, &x, n, 256)?;
            let mut out = dev.alloc(n * rows)?;
            dev.matmul(&mut out, &w, &xb, n, false)?;
            let mut got = vec![0f32; n * rows];
            dev.read(&out, &mut got)?;
            checks.push(Check {
                name: format!(
                    "drafter Q8_0 blocks {rows}x{cols}, {n} rows vs host on K8 activations"
                ),
                err: rel_err(&got, &want),
                tol: 1e-4,
            });
            let y = rng.vec(n * rows);
            let mut acc = dev.upload(&y)?;
            dev.matmul(&mut acc, &w, &xb, n, true)?;
            let mut ga = vec![0f32; n * rows];
            dev.read(&acc, &mut ga)?;
            let sum: Vec<f32> = y.iter().zip(&got).map(|(a, b)| a + b).collect();
            checks.push(Check {
                name: format!("drafter Q8_0 blocks {cols}, {n} rows accumulate"),
                err: bits_differ(&ga, &sum),
                tol: 0.0,
            });
        }
        // Three weights of 37, 21 and 64 outputs in one launch: each as its own matmul.
        let n = 11;
        let x = rng.vec(n * cols);
        let xb = dev.upload(&x)?;
        let ws: Vec<_> = [37usize, 21, 64]
            .iter()
            .map(|&r| {
                let q = random_weight(rng, ty, r, cols)?;
                dev.upload_weight("test.q8_blocks.job", ty, cols, r, &q, true)
            })
            .collect::<Result<_>>()?;
        let mut outs: Vec<DBuf> = ws
            .iter()
            .map(|w| dev.alloc(n * w.rows))
            .collect::<Result<_>>()?;
        {
            let mut refs: Vec<&mut DBuf> = outs.iter_mut().collect();
            let wr: Vec<&crate::DWeight> = ws.iter().collect();
            dev.matmul_many(&mut refs, &wr, &xb, n)?;
        }
        let mut differ = 0.0;
        for (w, o) in ws.iter().zip(&outs) {
            let mut one = dev.alloc(n * w.rows)?;
            dev.matmul(&mut one, w, &xb, n, false)?;
            let (mut a, mut b) = (vec![0f32; n * w.rows], vec![0f32; n * w.rows]);
            dev.read(o, &mut a)?;
            dev.read(&one, &mut b)?;
            differ += bits_differ(&a, &b);
        }
        checks.push(Check {
            name: format!("drafter Q8_0 blocks {cols}, three weights in one launch == each alone"),
            err: differ,
            tol: 0.0,
        });
    }
    dev.set_q8_blocks(false);
    Ok(())
}

/// The tensor-core prefill matmul (prefill passes of more than 16 rows; mmq.cu): against the host reference on
/// partial tiles of rows and outputs, each row's bits independent of the rows around it (two tilings), the
/// residual form, and decode passes of the same size keeping the GEMV's bits.
fn mmq_check(dev: &Device, rng: &mut Rng, ty: GgmlType, checks: &mut Vec<Check>) -> Result<()> {
    if !dev.options().prefill_mma || dev.options().reference {
        return Ok(());
    }
    let (cols, rows, n) = (768usize, 130usize, 70usize);
    let wq = random_weight(rng, ty, rows, cols)?;
    let x = rng.vec(n * cols);
    // The prefill kernel reads K8 activations for the K-quants (with `prefill_k8`).
    let k8 = dev.options().k8
        && dev.options().prefill_k8
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
    let want = reference_matmul(ty, &wq, rows, cols, &x, n, if k8 { 256 } else { 32 })?;
    let mut w = dev.upload_weight(&format!("test.mmq.{ty}"), ty, cols, rows, &wq, true)?;
    // The int8 kernel itself, not cuBLAS on a dense copy (`dense_check`).
    w.drop_dense();
    let run = |xs: &[f32], m: usize, prefill: bool, init: Option<&[f32]>| -> Result<Vec<f32>> {
        dev.set_pass(&[], &[], &[], prefill)?;
        let xb = dev.upload(xs)?;
        let mut out = match init {
            Some(y) => dev.upload(y)?,
            None => dev.alloc(m * rows)?,
        };
        dev.matmul(&mut out, &w, &xb, m, init.is_some())?;
        let mut got = vec![0f32; m * rows];
        dev.read(&out, &mut got)?;
        Ok(got)
    };
    let got = run(&x, n, true, None)?;
    checks.push(Check {
        name: format!("mmq {ty} {rows}x{cols}, {n} rows"),
        err: rel_err(&got, &want),
        tol: 1e-4,
    });
    // Rows 3..23 on their own (another tile position for each): the same bits.
    let part = run(&x[3 * cols..23 * cols], 20, true, None)?;
    checks.push(Check {
        name: format!("mmq {ty} row independence (rows 3..23 alone)"),
        err: bits_differ(&part, &got[3 * rows..23 * rows]),
        tol: 0.0,
    });
    // Rows 64..69 are a 6-row tile among 70 (a warp's second 16 rows skipped: MQ_SKIP_DEAD) and rows 14..19 of
    // a 20-row tile here (computed): the same bits.
    let tail = run(&x[50 * cols..70 * cols], 20, true, None)?;
    checks.push(Check {
        name: format!("mmq {ty} row independence (rows 50..70 alone)"),
        err: bits_differ(&tail, &got[50 * rows..70 * rows]),
        tol: 0.0,
    });
    let y = rng.vec(n * rows);
    let acc = run(&x, n, true, Some(&y))?;
    let sum: Vec<f32> = y.iter().zip(&got).map(|(a, b)| a + b).collect();
    checks.push(Check {
        name: format!("mmq {ty} accumulate"),
        err: bits_differ(&acc, &sum),
        tol: 0.0,
    });
    // The same rows in a decode pass go through the GEMV: row 5's bits are those of row 5 alone.
    let dec = run(&x, n, false, None)?;
    let one = run(&x[5 * cols..6 * cols], 1, false, None)?;
    checks.push(Check {
        name: format!("mmq {ty}: decode passes keep the GEMV"),
        err: bits_differ(&one, &dec[5 * rows..6 * rows]),
        tol: 0.0,
    });
    dev.set_pass(&[], &[], &[], false)?;
    Ok(())
}

/// The prefill GEMM on cuBLAS against a weight's dense bf16 copy, or an F32/BF16 weight as uploaded
/// (`prefill_blas`, `prefill_blas_float`; prefill passes of more than 16 rows, and 16 rows as a DFlash drafter's
/// device runs them): against a host model of the same rounding (bf16 weights and activations, or f32 for F32
/// weights; f64 sums: only cuBLAS's f32 accumulation order differs) and the exact product, the residual form,
/// run-to-run bits, Q/K sharing one rounding of the activations, graph replay, and decode passes of the same size
/// keeping the non-cuBLAS kernel's bits.
fn dense_check(dev: &Device, rng: &mut Rng, ty: GgmlType, checks: &mut Vec<Check>) -> Result<()> {
    let (cols, rows) = (768usize, 130usize);
    let wq = random_weight(rng, ty, rows, cols)?;
    let w = dev.upload_weight(&format!("test.dense.{ty}"), ty, cols, rows, &wq, true)?;
    if !dev.takes_blas(&w, BLAS_MIN_ROWS) {
        return Ok(());
    }
    // F32 weights multiply in f32 (the host model is the exact product); the rest in bf16.
    let f32_math = ty == GgmlType::F32;
    let bf = |v: f32| {
        if f32_math {
            v
        } else {
            half::bf16::from_f32(v).to_f32()
        }
    };
    let (tol_model, tol_exact) = if f32_math { (1e-5, 1e-5) } else { (1e-3, 3e-2) };
    let wd = dequantize_rows(ty, &wq, rows, cols)?;
    let wb: Vec<f32> = wd.iter().map(|&v| bf(v)).collect();
    // 16 rows as on a DFlash drafter's device (cuBLAS from one row: `set_blas_min_rows`).
    for (n, min_rows) in [
        (16usize, 1usize),
        (20, BLAS_MIN_ROWS),
        (64, BLAS_MIN_ROWS),
        (133, BLAS_MIN_ROWS),
    ] {
        dev.set_blas_min_rows(min_rows);
        let x = rng.vec(n * cols);
        let xr: Vec<f32> = x.iter().map(|&v| bf(v)).collect();
        let model: Vec<f64> = (0..n * rows)
            .map(|i| {
                let (r, o) = (i / rows, i % rows);
                (0..cols)
                    .map(|c| wb[o * cols + c] as f64 * xr[r * cols + c] as f64)
                    .sum()
            })
            .collect();
        let exact = reference_matmul(ty, &wq, rows, cols, &x, n, 0)?;
        let xb = dev.upload(&x)?;
        let run = |prefill: bool, init: Option<&[f32]>| -> Result<Vec<f32>> {
            dev.set_pass(&[], &[], &[], prefill)?;
            let mut out = match init {
                Some(y) => dev.upload(y)?,
                None => dev.alloc(n * rows)?,
            };
            dev.matmul(&mut out, &w, &xb, n, init.is_some())?;
            let mut got = vec![0f32; n * rows];
            dev.read(&out, &mut got)?;
            Ok(got)
        };
        let got = run(true, None)?;
        checks.push(Check {
            name: format!("cuBLAS {ty} {rows}x{cols}, {n} rows vs host model of its rounding"),
            err: rel_err(&got, &model),
            tol: tol_model,
        });
        checks.push(Check {
            name: format!("cuBLAS {ty} {rows}x{cols}, {n} rows vs exact product"),
            err: rel_err(&got, &exact),
            tol: tol_exact,
        });
        checks.push(Check {
            name: format!("cuBLAS {ty} {n} rows run to run"),
            err: bits_differ(&run(true, None)?, &got),
            tol: 0.0,
        });
        let y = rng.vec(n * rows);
        let sum: Vec<f64> = y.iter().zip(&got).map(|(&a, &b)| (a + b) as f64).collect();
        checks.push(Check {
            name: format!("cuBLAS {ty} {n} rows accumulate"),
            err: rel_err(&run(true, Some(&y))?, &sum),
            tol: 1e-6,
        });
        // Two weights on one rounding of the activations: each as its own matmul.
        dev.set_pass(&[], &[], &[], true)?;
        let (mut o1, mut o2) = (dev.alloc(n * rows)?, dev.alloc(n * rows)?);
        dev.matmul_many(&mut [&mut o1, &mut o2], &[&w, &w], &xb, n)?;
        let (mut g1, mut g2) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        dev.read(&o1, &mut g1)?;
        dev.read(&o2, &mut g2)?;
        checks.push(Check {
            name: format!("cuBLAS {ty} {n} rows, two weights in one call"),
            err: bits_differ(&g1, &got) + bits_differ(&g2, &got),
            tol: 0.0,
        });
        // Captured in a graph and replayed: the eager bits.
        dev.reserve_dense(n)?;
        let mut out = dev.alloc(n * rows)?;
        let mut graphed = Vec::new();
        for _ in 0..2 {
            dev.set_pass(&[], &[], &[], true)?;
            dev.run_pass([8, n as u64, ty.id() as u64, 0, 0], true, &mut || {
                dev.matmul(&mut out, &w, &xb, n, false)
            })?;
            let mut g = vec![0f32; n * rows];
            dev.read(&out, &mut g)?;
            graphed.push(g);
        }
        checks.push(Check {
            name: format!("cuBLAS {ty} {n} rows in a graph, captured and replayed"),
            err: bits_differ(&graphed[0], &got) + bits_differ(&graphed[1], &got),
            tol: 0.0,
        });
        // Decode passes of the same rows stay on the GEMV family: row 5 as in a pass of its own.
        let dec = run(false, None)?;
        dev.set_pass(&[], &[], &[], false)?;
        let x5 = dev.upload(&x[5 * cols..6 * cols])?;
        let mut o5 = dev.alloc(rows)?;
        dev.matmul(&mut o5, &w, &x5, 1, false)?;
        let mut g5 = vec![0f32; rows];
        dev.read(&o5, &mut g5)?;
        checks.push(Check {
            name: format!("cuBLAS {ty}: decode passes keep the GEMV"),
            err: bits_differ(&g5, &dec[5 * rows..6 * rows]),
            tol: 0.0,
        });
    }
    dev.set_blas_min_rows(BLAS_MIN_ROWS);
    dev.set_pass(&[], &[], &[], false)?;
    Ok(())
}

fn matmul_check(
    dev: &Device,
    rng: &mut Rng,
    ty: GgmlType,
    cols: usize,
    checks: &mut Vec<Check>,
) -> Result<()> {
    // 37 output rows (a partial block of GEMV warps), 11 activation rows (one full and one partial group of 8).
    let (rows, n) = (37usize, 11usize);
    let wq = random_weight(rng, ty, rows, cols)?;
    let x = rng.vec(n * cols);
    use GgmlType::*;
    let q8 = !matches!(ty, F32 | F16 | BF16) && !dev.options().reference;
    let xb = dev.upload(&x)?;
    for gemv in [false, true] {
        let w = dev.upload_weight(&format!("test.{ty}"), ty, cols, rows, &wq, gemv)?;
        if gemv && !w.is_repacked() {
            continue;
        }
        let kind = if w.is_repacked() { "gemv" } else { "generic" };
        // Repacked K-quants read K8 activations (a scale per 256) when that path is on.
        let k8 = dev.options().k8 && w.is_repacked() && matches!(ty, Q4_K | Q6_K);
        let act_block = match (q8, k8) {
            (false, _) => 0,
            (true, false) => 32,
            (true, true) => 256,
        };
        let want = reference_matmul(ty, &wq, rows, cols, &x, n, act_block)?;
        let mut out = dev.alloc(n * rows)?;
        dev.matmul(&mut out, &w, &xb, n, false)?;
        let mut got = vec![0f32; n * rows];
        dev.read(&out, &mut got)?;
        checks.push(Check {
            name: format!("matmul {ty} {kind} {rows}x{cols}, {n} rows"),
            err: rel_err(&got, &want),
            tol: 1e-4,
        });
        // The residual form adds to what is there, in the same bits as a separate f32 add.
        let y = rng.vec(n * rows);
        let mut acc = dev.upload(&y)?;
        dev.matmul(&mut acc, &w, &xb, n, true)?;
        let mut ga = vec![0f32; n * rows];
        dev.read(&acc, &mut ga)?;
        let sum: Vec<f32> = y.iter().zip(&got).map(|(a, b)| a + b).collect();
        checks.push(Check {
            name: format!("matmul {ty} {kind} {cols} accumulate"),
            err: bits_differ(&ga, &sum),
            tol: 0.0,
        });
        // Batch invariance: rows 0 and 9 alone, and rows 0..3 and 0..6 as groups, give the bits they got among 11
        // (11 rows take the tensor-core block kernel where it applies, 6 its one-tile form, 3 the 8-row GEMV, 1
        // the one-row GEMV).
        for (r, m) in [(0usize, 3usize), (0, 6), (0, 1), (9, 1)] {
            let xm = dev.upload(&x[r * cols..(r + m) * cols])?;
            let mut om = dev.alloc(m * rows)?;
            dev.matmul(&mut om, &w, &xm, m, false)?;
            let mut gm = vec![0f32; m * rows];
            dev.read(&om, &mut gm)?;
            checks.push(Check {
                name: format!(
                    "matmul {ty} {kind} {cols} batch invariance, rows {r}..{}",
                    r + m
                ),
                err: bits_differ(&gm, &got[r * rows..(r + m) * rows]),
                tol: 0.0,
            });
        }
    }
    if cols != 512 {
        return Ok(());
    }
    // Embedding rows of the same table (GGUF layout), tokens from the pass metadata.
    let wd = dequantize_rows(ty, &wq, rows, cols)?;
    let w = dev.upload_weight(&format!("test.{ty}"), ty, cols, rows, &wq, false)?;
    let toks = [3u32, 0, 36, 3];
    dev.set_pass(&toks, &[], &[], false)?;
    let mut eo = dev.alloc(toks.len() * cols)?;
    dev.embed(&mut eo, &w, toks.len())?;
    let mut ge = vec![0f32; toks.len() * cols];
    dev.read(&eo, &mut ge)?;
    let we: Vec<f64> = toks
        .iter()
        .flat_map(|&t| {
            wd[t as usize * cols..(t as usize + 1) * cols]
                .iter()
                .map(|&v| v as f64)
        })
        .collect();
    checks.push(Check {
        name: format!("embed {ty}"),
        err: rel_err(&ge, &we),
        tol: 1e-6,
    });
    Ok(())
}

fn ops_checks(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    // RMSNorm against the host: 5 rows of 300 (not a multiple of 32: the plain kernel), then the fused kernel on 3
    // rows of 576 (parts of 256, the last one partial) and 4,096 (16 parts) and on 20 rows of 4,096 (one block a
    // row); then in place (QK-norm shape: 7 heads of 64).
    let eps = 1e-5f32;
    for (n, width) in [(5usize, 300usize), (3, 576), (3, 4096), (20, 4096)] {
        let x = rng.vec(n * width);
        let wv = rng.vec(width);
        let want = host_rms_norm(&x, &wv, eps);
        let (xb, wb) = (dev.upload(&x)?, dev.upload(&wv)?);
        let mut ob = dev.alloc(n * width)?;
        dev.rms_norm(&mut ob, &xb, &wb, n, width, eps)?;
        let mut got = vec![0f32; n * width];
        dev.read(&ob, &mut got)?;
        checks.push(Check {
            name: format!("rms_norm {n}x{width}"),
            err: rel_err(&got, &want),
            tol: 1e-5,
        });
    }
    let (heads, hd) = (7usize, 64usize);
    let xq = rng.vec(heads * hd);
    let wq = rng.vec(hd);
    let mut xqb = dev.upload(&xq)?;
    let wqb = dev.upload(&wq)?;
    dev.rms_norm_inplace(&mut xqb, &wqb, heads, hd, eps)?;
    let mut gq = vec![0f32; heads * hd];
    dev.read(&xqb, &mut gq)?;
    let wantq = host_rms_norm(&xq, &wq, eps);
    checks.push(Check {
        name: "rms_norm in place (QK-norm) 7x64".into(),
        err: rel_err(&gq, &wantq),
        tol: 1e-5,
    });

    // RoPE, both modes, 3 rows at scattered positions, 4 heads of 128.
    let positions = [0usize, 17, 4095];
    let (nh, hd) = (4usize, 128usize);
    for neox in [false, true] {
        let x = rng.vec(positions.len() * nh * hd);
        let mut want = vec![0f64; x.len()];
        for (r, &pos) in positions.iter().enumerate() {
            for h in 0..nh {
                let base = (r * nh + h) * hd;
                for i in 0..hd / 2 {
                    let inv = 1.0 / 10000f64.powf((2 * i) as f64 / hd as f64);
                    let a = pos as f64 * inv;
                    let (ia, ib) = if neox {
                        (i, i + hd / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (x[base + ia] as f64, x[base + ib] as f64);
                    want[base + ia] = x0 * a.cos() - x1 * a.sin();
                    want[base + ib] = x0 * a.sin() + x1 * a.cos();
                }
            }
        }
        let mut xb = dev.upload(&x)?;
        let rows: Vec<(usize, usize)> = positions.iter().map(|&p| (0, p)).collect();
        dev.set_pass(&[], &rows, &[], false)?;
        dev.rope(&mut xb, positions.len(), nh, hd, 10000.0, 1.0, neox)?;
        let mut got = vec![0f32; x.len()];
        dev.read(&xb, &mut got)?;
        // f32 angles at position 4095 carry ~4e-4 absolute error (the CPU backend computes them in f32 too).
        checks.push(Check {
            name: format!("rope {} 3x4x128", if neox { "neox" } else { "normal" }),
            err: rel_err(&got, &want),
            tol: 2e-3,
        });
    }

    // SwiGLU, add, gather, argmax on 1000 elements.
    let m = 1000usize;
    let (g, u) = (rng.vec(m), rng.vec(m));
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    let (gb, ub) = (dev.upload(&g)?, dev.upload(&u)?);
    let mut sb = dev.alloc(m)?;
    dev.swiglu(&mut sb, &gb, &ub, m)?;
    let mut got = vec![0f32; m];
    dev.read(&sb, &mut got)?;
    checks.push(Check {
        name: "swiglu 1000".into(),
        err: rel_err(&got, &want),
        tol: 1e-6,
    });
    let mut ab = dev.upload(&g)?;
    dev.add(&mut ab, &ub, m)?;
    dev.read(&ab, &mut got)?;
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| (a + b) as f64).collect();
    checks.push(Check {
        name: "add 1000".into(),
        err: rel_err(&got, &want),
        tol: 0.0,
    });
    let mut gout = dev.alloc(3 * 100)?;
    dev.set_pass(&[], &[], &[9, 0, 4], false)?;
    dev.gather_rows(&mut gout, &gb, 100)?;
    let mut got = vec![0f32; 300];
    dev.read(&gout, &mut got)?;
    let want: Vec<f64> = [9usize, 0, 4]
        .iter()
        .flat_map(|&r| g[r * 100..(r + 1) * 100].iter().map(|&v| v as f64))
        .collect();
    checks.push(Check {
        name: "gather_rows".into(),
        err: rel_err(&got, &want),
        tol: 0.0,
    });
    // The engine's greedy rule: lowest index on ties, NaN never chosen, 0 when nothing is above -inf.
    let w = 5003;
    let mut lg = rng.vec(4 * w);
    lg[4321] = 7.0;
    lg[w + 17] = 7.0;
    lg[w + 4999] = 7.0; // a tie: the first index wins
    lg[2 * w..3 * w].fill(f32::NAN);
    lg[3 * w..].fill(f32::NEG_INFINITY);
    lg[3 * w + 3] = f32::NAN;
    lg[3 * w + 10] = 5.0;
    lg[3 * w + 20] = 5.0;
    let am = dev.argmax(&dev.upload(&lg)?, 4, w)?;
    let want = [4321, 17, 0, 10];
    checks.push(Check {
        name: format!("argmax (got {am:?}, want {want:?})"),
        err: if am == want { 0.0 } else { 1.0 },
        tol: 0.0,
    });
    // A vocabulary-wide row (split over many parts): a tie between two parts, and a row whose best sits in the
    // last element of the last part.
    let w = 151_936;
    let mut lg = rng.vec(2 * w);
    lg[70_000] = 9.0;
    lg[140_000] = 9.0;
    lg[2 * w - 1] = 9.0;
    let am = dev.argmax(&dev.upload(&lg)?, 2, w)?;
    let want = [70_000, w as u32 - 1];
    checks.push(Check {
        name: format!("argmax {w} wide (got {am:?}, want {want:?})"),
        err: if am == want { 0.0 } else { 1.0 },
        tol: 0.0,
    });
    Ok(())
}

/// The Q8 activations written by the fused RMSNorm and SwiGLU kernels are the same bits as quantizing their f32
/// output separately: a matmul reading either gives the same bits.
fn shadow_checks(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    // Q8_0 reads the per-32 shadow; Q4_K on a 512-wide row the K8 one (when that path is on). A row of a
    // few-row call is split over blocks of 256: 320 and 576 end in a part block, 10240 takes 40 blocks.
    for (ty, width) in [
        (GgmlType::Q8_0, 320usize),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q4_K, 2560),
        (GgmlType::Q4_K, 10240),
    ] {
        shadow_check(dev, rng, ty, width, checks)?;
    }
    merge_shadow_check(dev, rng, checks)
}

/// `nh` query heads over `nkv` KV heads of `hd`, scale 1/sqrt(hd), NEOX RoPE with base 10000 (the host
/// mirror's `norm_rope`).
fn test_shape(nh: usize, nkv: usize, hd: usize, eps: f32) -> AttnShape {
    AttnShape {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        theta: 10000.0,
        freq_scale: 1.0,
        neox: true,
        eps,
    }
}

/// The attention's fused shadows (Q8 per head; K8 over 256 elements, written by the merge or by split kernel
/// blocks of 256 outputs, or of 128 in clusters of 2 that share the scale: 2 heads of 64 or 1 of 128 a block on
/// sm_90+ when every row is one split) are the bits of quantizing its output separately, for a Q8_0 and a Q4_K
/// o-proj, in passes of 10 rows and of one (QK-norm, RoPE and the K/V append in the split kernel), from position
/// 0 or 9 (one split), 120 (rows of one split and of two in a pass: some shadows written by the split kernel,
/// the rest by the merge) and 200.
fn merge_shadow_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    for (n, hd, first) in [
        (10usize, 64usize, 0usize),
        (10, 128, 0),
        (1, 128, 9),
        (10, 64, 120),
        (10, 128, 120),
        (1, 128, 200),
    ] {
        merge_shadow_case(dev, rng, n, hd, first, checks)?;
    }
    Ok(())
}

fn merge_shadow_case(
    dev: &Device,
    rng: &mut Rng,
    n: usize,
    hd: usize,
    first: usize,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let (nh, nkv, rows) = (8usize, 2usize, 24usize);
    let width = nh * hd;
    let shape = test_shape(nh, nkv, hd, 1e-6);
    let (qn, kn) = (dev.upload(&rng.vec(hd))?, dev.upload(&rng.vec(hd))?);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let w = dev.upload_weight(
            "test.oproj",
            ty,
            width,
            rows,
            &random_weight(rng, ty, rows, width)?,
            true,
        )?;
        // Rows at first..first + n, over the zeros of a fresh cache before them.
        let mut kv = dev.alloc_kv(1, 1, 256, nkv * hd, true)?;
        let pass: Vec<(usize, usize)> = (0..n).map(|p| (0, first + p)).collect();
        dev.set_pass(&[], &pass, &[], false)?;
        let (mut qb, mut kb) = (
            dev.upload(&rng.vec(n * width))?,
            dev.upload(&rng.vec(n * nkv * hd))?,
        );
        let vb = dev.upload(&rng.vec(n * nkv * hd))?;
        let mut ob = dev.alloc(n * width)?;
        dev.attention_fused(
            &mut ob,
            &mut qb,
            &mut kb,
            &vb,
            &mut kv,
            0,
            n,
            &shape,
            Some((&qn, &kn)),
            0,
        )?;
        checks.push(Check {
            name: format!(
                "attention shadow for {ty} ({n} rows from {first}, {nh}/{nkv}x{hd}) == quantized copy"
            ),
            err: shadow_differs(dev, &w, &ob, n)?,
            tol: 0.0,
        });
    }
    Ok(())
}

/// Bits that differ between `w` applied to `n` rows of `h` (reading the shadow a fused writer left) and to a
/// plain copy of `h` (quantized by the matmul itself).
fn shadow_differs(dev: &Device, w: &crate::DWeight, h: &DBuf, n: usize) -> Result<f64> {
    let mut hv = vec![0f32; n * w.cols];
    dev.read(h, &mut hv)?;
    let copy = dev.upload(&hv)?;
    let (mut a, mut b) = (dev.alloc(n * w.rows)?, dev.alloc(n * w.rows)?);
    dev.matmul(&mut a, w, h, n, false)?;
    dev.matmul(&mut b, w, &copy, n, false)?;
    let (mut ga, mut gb) = (vec![0f32; n * w.rows], vec![0f32; n * w.rows]);
    dev.read(&a, &mut ga)?;
    dev.read(&b, &mut gb)?;
    Ok(bits_differ(&ga, &gb))
}

fn shadow_check(
    dev: &Device,
    rng: &mut Rng,
    ty: GgmlType,
    width: usize,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let (n, rows) = (3usize, 40usize);
    let wq = random_weight(rng, ty, rows, width)?;
    let w = dev.upload_weight("test.shadow", ty, width, rows, &wq, true)?;
    let (x, nw, up) = (rng.vec(n * width), rng.vec(width), rng.vec(n * width));
    let (xb, nwb, upb) = (dev.upload(&x)?, dev.upload(&nw)?, dev.upload(&up)?);
    let mut h = dev.alloc(n * width)?;
    let mut hv = vec![0f32; n * width];
    for (name, swiglu) in [("rms_norm", false), ("swiglu", true)] {
        if swiglu {
            dev.swiglu(&mut h, &xb, &upb, n * width)?;
        } else {
            dev.rms_norm(&mut h, &xb, &nwb, n, width, 1e-6)?;
        }
        checks.push(Check {
            name: format!("{name} shadow for {ty} == quantized copy ({width} wide)"),
            err: shadow_differs(dev, &w, &h, n)?,
            tol: 0.0,
        });
    }
    // The RMSNorm of these rows inside a 20-row call (one block a row, not one per 256 elements): the same
    // output bits, and the same matmul bits through its shadow.
    let many = 20usize;
    let x20 = [x, rng.vec((many - n) * width)].concat();
    let x20b = dev.upload(&x20)?;
    let mut h20 = dev.alloc(many * width)?;
    dev.rms_norm(&mut h, &xb, &nwb, n, width, 1e-6)?;
    dev.rms_norm(&mut h20, &x20b, &nwb, many, width, 1e-6)?;
    let (mut a, mut b) = (dev.alloc(n * rows)?, dev.alloc(many * rows)?);
    dev.matmul(&mut a, &w, &h, n, false)?;
    dev.matmul(&mut b, &w, &h20, many, false)?;
    let (mut h20v, mut ga, mut gb) = (
        vec![0f32; many * width],
        vec![0f32; n * rows],
        vec![0f32; many * rows],
    );
    dev.read(&h, &mut hv)?;
    dev.read(&h20, &mut h20v)?;
    dev.read(&a, &mut ga)?;
    dev.read(&b, &mut gb)?;
    checks.push(Check {
        name: format!(
            "rms_norm {width} wide: {n} rows alone == inside {many} rows (output and {ty} matmul)"
        ),
        err: bits_differ(&hv, &h20v[..n * width]) + bits_differ(&ga, &gb[..n * rows]),
        tol: 0.0,
    });
    Ok(())
}

/// The MoE FFN (routing, the chosen experts' SwiGLU FFN, the weighted sum) against the same steps done by hand:
/// routing on the host from the device's router logits, each chosen expert uploaded as a matrix of its own
/// through the plain matmul and SwiGLU kernels, the weighted sum on the host; then every row alone (one GEMV per
/// choice, no grouping) gives the bits it got among all (grouped by expert, several tiles of 8 for some experts).
/// Q4_K gate/up with a Q6_K down (both K8 bodies on the fast path), and Q8_0 at odd sizes (partial tiles).
fn moe_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    use GgmlType::*;
    let shape = |n_exp, k, ff, width| MoeShape {
        n_exp,
        k,
        ff,
        width,
        norm_topk: true,
    };
    // Decode passes (each row alone vs among all), then prefill passes: tiles of up to 64 slots of one expert on
    // the tensor-core prefill kernel (~100 slots an expert at 300 rows: full and partial tiles), and the GEMV
    // tiles where a width is not a multiple of 256.
    let cases = [
        ((Q4_K, Q6_K), 20, shape(6, 2, 256, 512), false),
        ((Q8_0, Q8_0), 19, shape(5, 3, 96, 320), false),
        ((Q4_K, Q6_K), 300, shape(6, 2, 256, 512), true),
        ((Q8_0, Q8_0), 150, shape(5, 3, 256, 256), true),
        ((Q8_0, Q8_0), 40, shape(5, 3, 96, 320), true),
    ];
    for (types, n, m, prefill) in cases {
        moe_case(dev, rng, checks, types, n, m, prefill)?;
    }
    Ok(())
}

fn moe_case(
    dev: &Device,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
    (gt, dt): (GgmlType, GgmlType),
    n: usize,
    m: MoeShape,
    prefill: bool,
) -> Result<()> {
    let (d, ff, ne) = (m.width, m.ff, m.n_exp);
    // In a prefill pass of more than MMQ_MIN_ROWS rows the matmuls (by hand too) may take the prefill kernel.
    dev.set_pass(&[], &[], &[], prefill)?;
    let router_w: Vec<f32> = rng.vec(ne * d);
    let router_bytes: Vec<u8> = router_w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let router = dev.upload_weight(
        "test.moe.router",
        GgmlType::F32,
        d,
        ne,
        &router_bytes,
        false,
    )?;
    let gq = random_weight(rng, gt, ne * ff, d)?;
    let uq = random_weight(rng, gt, ne * ff, d)?;
    let dq = random_weight(rng, dt, ne * d, ff)?;
    let gate = dev.upload_experts("test.moe.gate", gt, d, ne * ff, ne, &gq)?;
    let up = dev.upload_experts("test.moe.up", gt, d, ne * ff, ne, &uq)?;
    let down = dev.upload_experts("test.moe.down", dt, ff, ne * d, ne, &dq)?;
    let x = rng.vec(n * d);
    let xb = dev.upload(&x)?;
    let mut out = dev.alloc(n * d)?;
    dev.moe_ffn(&mut out, &xb, n, &router, &gate, &up, &down, &m)?;
    let mut got = vec![0f32; n * d];
    dev.read(&out, &mut got)?;
    // Each expert's slices as matrices of their own, on the int8 kernels the experts use (no dense copy for cuBLAS).
    let slice = |name: &str, ty: GgmlType, bytes: &[u8], cols: usize, rows: usize, e: usize| {
        let per = bytes.len() / ne;
        let mut w =
            dev.upload_weight(name, ty, cols, rows, &bytes[e * per..(e + 1) * per], true)?;
        w.drop_dense();
        Ok::<_, Error>(w)
    };
    let mut experts = Vec::new();
    for e in 0..ne {
        experts.push((
            slice("test.moe.gate.e", gt, &gq, d, ff, e)?,
            slice("test.moe.up.e", gt, &uq, d, ff, e)?,
            slice("test.moe.down.e", dt, &dq, ff, d, e)?,
        ));
    }
    // Routing on the host (softmax, top-k with ties to the lower index, renormalised, by expert index).
    let mut logits = dev.alloc(n * ne)?;
    dev.matmul(&mut logits, &router, &xb, n, false)?;
    let mut lv = vec![0f32; n * ne];
    dev.read(&logits, &mut lv)?;
    let mut want = vec![0f64; n * d];
    let mut alone_bits = 0.0;
    // Each expert by hand: on every row at once in a prefill pass (the prefill kernel's rows are independent of
    // each other, so a row's product is the one the grouped tiles compute), else one row at a time.
    let by_hand = |e: usize, xr: &DBuf, rows: usize| -> Result<Vec<f32>> {
        let (ge, ue, de) = &experts[e];
        let (mut g, mut u, mut a, mut y) = (
            dev.alloc(rows * ff)?,
            dev.alloc(rows * ff)?,
            dev.alloc(rows * ff)?,
            dev.alloc(rows * d)?,
        );
        dev.matmul(&mut g, ge, xr, rows, false)?;
        dev.matmul(&mut u, ue, xr, rows, false)?;
        dev.swiglu(&mut a, &g, &u, rows * ff)?;
        dev.matmul(&mut y, de, &a, rows, false)?;
        let mut yv = vec![0f32; rows * d];
        dev.read(&y, &mut yv)?;
        Ok(yv)
    };
    let all_rows: Vec<Vec<f32>> = if prefill {
        (0..ne).map(|e| by_hand(e, &xb, n)).collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    for r in 0..n {
        let l = &lv[r * ne..(r + 1) * ne];
        let mx = l.iter().cloned().fold(f32::MIN, f32::max);
        let p: Vec<f32> = l.iter().map(|v| (v - mx).exp()).collect();
        let sum: f32 = p.iter().sum();
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut chosen: Vec<(usize, f32)> = order[..m.k].iter().map(|&e| (e, p[e] / sum)).collect();
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= total);
        chosen.sort_by_key(|c| c.0);
        let xr = dev.upload(&x[r * d..(r + 1) * d])?;
        for (e, wt) in chosen {
            let yv = if prefill {
                all_rows[e][r * d..(r + 1) * d].to_vec()
            } else {
                by_hand(e, &xr, 1)?
            };
            for (o, v) in want[r * d..(r + 1) * d].iter_mut().zip(&yv) {
                *o += wt as f64 * *v as f64;
            }
        }
        if !prefill {
            // The row alone through moe_ffn.
            let mut o1 = dev.alloc(d)?;
            dev.moe_ffn(&mut o1, &xr, 1, &router, &gate, &up, &down, &m)?;
            let mut g1 = vec![0f32; d];
            dev.read(&o1, &mut g1)?;
            alone_bits += bits_differ(&g1, &got[r * d..(r + 1) * d]);
        }
    }
    if prefill {
        // The first 17 rows on their own (other tiles, still the prefill kernel) against the same rows among n.
        let n1 = MMQ_MIN_ROWS + 1;
        let mut o1 = dev.alloc(n1 * d)?;
        dev.moe_ffn(&mut o1, &xb, n1, &router, &gate, &up, &down, &m)?;
        let mut g1 = vec![0f32; n1 * d];
        dev.read(&o1, &mut g1)?;
        alone_bits = bits_differ(&g1, &got[..n1 * d]);
    }
    dev.set_pass(&[], &[], &[], false)?;
    let pass = if prefill { "prefill, " } else { "" };
    checks.push(Check {
        name: format!(
            "moe_ffn ({pass}{gt} gate/up, {dt} down, {n} rows, {} of {ne} experts, ff {ff}) == experts by hand",
            m.k
        ),
        err: rel_err(&got, &want),
        tol: 1e-4,
    });
    checks.push(Check {
        name: if prefill {
            format!(
                "moe_ffn ({pass}{gt}/{dt}): the first {} rows alone == among {n}",
                MMQ_MIN_ROWS + 1
            )
        } else {
            format!("moe_ffn ({gt}/{dt}): each row alone == among {n} (grouped by expert)")
        },
        err: alone_bits,
        tol: 0.0,
    });
    Ok(())
}

/// Q/K/V-style matmuls of three weights (mixed types, odd output counts) in one call give every output row the
/// bits of that row through its own matmul: one row (the GEMV's job kernel), 6, 11 and 20 rows (Q4_K/Q6_K: the K8
/// block kernel's jobs, partial tiles of outputs and rows; with Q8_0: one matmul per weight) against each row
/// alone; 70 rows of a prefill pass (the prefill kernel's jobs: three weights of one type, or the first and last
/// in one launch and the other alone) against each weight on all rows alone (the prefill kernel's rows are
/// independent of each other).
fn many_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    use GgmlType::{Q4_K, Q6_K, Q8_0};
    let cols = 512usize;
    for (types, n, prefill) in [
        ([Q4_K, Q6_K, Q8_0], 11usize, false),
        ([Q4_K, Q6_K, Q4_K], 1, false),
        ([Q4_K, Q6_K, Q4_K], 11, false),
        ([Q6_K, Q4_K, Q6_K], 6, false),
        ([Q6_K, Q4_K, Q4_K], 20, false),
        ([Q4_K, Q4_K, Q4_K], 70, true),
        ([Q4_K, Q6_K, Q4_K], 70, true),
        ([Q6_K, Q6_K, Q6_K], 70, true),
        ([Q8_0, Q8_0, Q8_0], 70, true),
    ] {
        dev.set_pass(&[], &[], &[], prefill)?;
        let rows = [133usize, 20, 70];
        let mut ws = Vec::new();
        for (&ty, &r) in types.iter().zip(&rows) {
            let wq = random_weight(rng, ty, r, cols)?;
            let mut w = dev.upload_weight("test.many", ty, cols, r, &wq, true)?;
            // The prefill kernel's jobs, not cuBLAS on dense copies (`dense_check` has its two-weight call).
            w.drop_dense();
            ws.push(w);
        }
        let xh = rng.vec(n * cols);
        let x = dev.upload(&xh)?;
        let (mut a, mut b, mut c) = (
            dev.alloc(n * rows[0])?,
            dev.alloc(n * rows[1])?,
            dev.alloc(n * rows[2])?,
        );
        let refs: Vec<&crate::DWeight> = ws.iter().collect();
        // Every launch here carries an L2 prefetch of other weights (a hint: the bits are those of the launches
        // without, and under the sanitizer its ranges stay inside their buffers).
        dev.prefetch(&refs[1..]);
        dev.matmul_many(&mut [&mut a, &mut b, &mut c], &refs, &x, n)?;
        let mut err = 0.0;
        for (got, w) in [&a, &b, &c].into_iter().zip(&ws) {
            let mut g = vec![0f32; n * w.rows];
            dev.read(got, &mut g)?;
            // Rows alone, or (prefill) all rows through this weight alone.
            let parts: Vec<(usize, usize)> = if prefill {
                vec![(0, n)]
            } else {
                (0..n).map(|r| (r, 1)).collect()
            };
            for (r, m) in parts {
                let xr = dev.upload(&xh[r * cols..(r + m) * cols])?;
                let mut single = dev.alloc(m * w.rows)?;
                dev.prefetch(&[w, refs[0]]);
                dev.matmul(&mut single, w, &xr, m, false)?;
                let mut s = vec![0f32; m * w.rows];
                dev.read(&single, &mut s)?;
                err += bits_differ(&g[r * w.rows..(r + m) * w.rows], &s);
            }
        }
        checks.push(Check {
            name: format!(
                "matmul_many ({types:?}, {n} rows{}) == {}",
                if prefill { ", prefill" } else { "" },
                if prefill {
                    "each weight alone"
                } else {
                    "each row alone"
                }
            ),
            err,
            tol: 0.0,
        });
    }
    dev.set_pass(&[], &[], &[], false)?;
    Ok(())
}

/// How far a key the device normalized, rotated and stored may be from the host's f64 one, for a head whose
/// largest |element| is `m`: f16 rounds an element of at most m by at most m 2^-10; the device's f32 norm and
/// RoPE (powf, sincosf; angles up to 200 radians) stay far inside m 2^-12 (`f32_keys_stay_inside_the_bound`). A
/// bound relative to each element fails on the small ones, where the rotation cancels (the first GPU run of the
/// check: up to 6.4 f16 steps and 5,807 f32 ones).
fn stored_key_bound(m: f64, f16: bool) -> f64 {
    if f16 {
        m * (2f64.powi(-10) + 2f64.powi(-12))
    } else {
        m * 2f64.powi(-12)
    }
}

/// Host RMSNorm (with `w`) then NEOX RoPE (theta 10000) of one head, in f64.
fn norm_rope(x: &[f32], w: Option<&[f32]>, pos: usize, eps: f32) -> Vec<f64> {
    let hd = x.len();
    let mut v: Vec<f64> = x.iter().map(|&a| a as f64).collect();
    if let Some(w) = w {
        let ss = v.iter().map(|a| a * a).sum::<f64>();
        let s = 1.0 / (ss / hd as f64 + eps as f64).sqrt();
        for (a, &b) in v.iter_mut().zip(w) {
            *a *= s * b as f64;
        }
    }
    let mut out = v.clone();
    for i in 0..hd / 2 {
        let a = pos as f64 / 10000f64.powf((2 * i) as f64 / hd as f64);
        let (x0, x1) = (v[i], v[i + hd / 2]);
        out[i] = x0 * a.cos() - x1 * a.sin();
        out[i + hd / 2] = x0 * a.sin() + x1 * a.cos();
    }
    out
}

/// Device output, reference, and the q/k/v that produced them.
type AttnRun = (Vec<f32>, Vec<f64>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Runs attention over `rows` on the device (plain: q/k as given; fused: QK-norm + RoPE inside).
#[allow(clippy::too_many_arguments)]
fn attn_call(
    dev: &Device,
    fused: bool,
    shape: &AttnShape,
    norms: (&DBuf, &DBuf),
    kv: &mut DKv,
    layer: usize,
    rows: &[(usize, usize)],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Result<Vec<f32>> {
    let n = rows.len();
    dev.set_pass(&[], rows, &[], false)?;
    let (mut qb, mut kb, vb) = (dev.upload(q)?, dev.upload(k)?, dev.upload(v)?);
    let mut ob = dev.alloc(n * shape.n_head * shape.head_dim)?;
    if fused {
        dev.attention_fused(
            &mut ob,
            &mut qb,
            &mut kb,
            &vb,
            kv,
            layer,
            n,
            shape,
            Some(norms),
            0,
        )?;
    } else {
        let (nh, nkv, hd, sc) = (shape.n_head, shape.n_head_kv, shape.head_dim, shape.scale);
        dev.attention(&mut ob, &qb, &kb, &vb, kv, layer, n, nh, nkv, hd, sc)?;
    }
    let mut got = vec![0f32; n * shape.n_head * shape.head_dim];
    dev.read(&ob, &mut got)?;
    Ok(got)
}

/// softmax(q · K[0..n_pos] · scale) · V for one query head, over host caches of `kvd` values a position whose
/// KV head starts at `off`.
fn host_attention(
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    kvd: usize,
    off: usize,
    n_pos: usize,
    scale: f32,
) -> Vec<f64> {
    let hd = q.len();
    let sc: Vec<f64> = (0..n_pos)
        .map(|t| {
            let kr = &kc[t * kvd + off..t * kvd + off + hd];
            q.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>() * scale as f64
        })
        .collect();
    let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..hd)
        .map(|d| {
            (0..n_pos)
                .map(|t| e[t] * vc[t * kvd + off + d])
                .sum::<f64>()
                / sum
        })
        .collect()
}

fn attention_check(
    dev: &Device,
    rng: &mut Rng,
    f16: bool,
    fused: bool,
    nh: usize,
    hd: usize,
    checks: &mut Vec<Check>,
) -> Result<()> {
    // 2 layers, 2 slots of 200 positions (several splits), `nh` query heads over 2 KV heads of `hd`. Slot 1 is filled
    // by a prefill of 133 rows in one call, then one decode row; slot 0 gets 5 rows one by one, then blocks of rows. The attention of
    // the decode rows must match the reference and be bit-identical when recomputed inside a batch. The fused
    // form also applies QK-norm and NEOX RoPE, mirrored on the host in f64: each key the device stored must be
    // within one rounding step of the cache's type of the host's, and the reference then attends over the keys as
    // stored (a key the device computed in f32 may round to the f16 neighbour of the host's rounding; attention over
    // the other neighbour differs by up to ~4e-4 of the output's rms with random data).
    let (n_layer, n_slots, ctx, nkv) = (2usize, 2usize, 200usize, 2usize);
    let layer = 1usize;
    let (qd, kvd) = (nh * hd, nkv * hd);
    let eps = 1e-6f32;
    let shape = test_shape(nh, nkv, hd, eps);
    let (qn, kn) = (rng.vec(hd), rng.vec(hd));
    let (qnb, knb) = (dev.upload(&qn)?, dev.upload(&kn)?);
    let mut kv = dev.alloc_kv(n_layer, n_slots, ctx, kvd, f16)?;
    let round = |v: f64| {
        if f16 {
            half::f16::from_f32(v as f32).to_f32() as f64
        } else {
            v as f32 as f64
        }
    };
    // Host mirror of the cache for the reference.
    let mut hk = vec![vec![0f64; ctx * kvd]; n_slots];
    let mut hv = vec![vec![0f64; ctx * kvd]; n_slots];
    // The largest |stored key - host key| over what a key may be off by ([`stored_key_bound`]; ≤ 1 passes).
    let mut key_err = 0f64;
    let step = |m: f64| stored_key_bound(m, f16);
    let mut run = |rows: &[(usize, usize)], rng: &mut Rng, kv: &mut DKv| -> Result<AttnRun> {
        let n = rows.len();
        let (q, k, v) = (rng.vec(n * qd), rng.vec(n * kvd), rng.vec(n * kvd));
        let head = |x: &[f32], w: &[f32], pos: usize| -> Vec<f64> {
            if fused {
                norm_rope(x, Some(w), pos, eps)
            } else {
                x.iter().map(|&a| a as f64).collect()
            }
        };
        let got = attn_call(
            dev,
            fused,
            &shape,
            (&qnb, &knb),
            kv,
            layer,
            rows,
            &q,
            &k,
            &v,
        )?;
        let mut stored: Vec<Option<Vec<f32>>> = vec![None; n_slots];
        for (i, &(s, p)) in rows.iter().enumerate() {
            if fused && stored[s].is_none() {
                stored[s] = Some(dev.read_kv_keys(kv, layer, s)?);
            }
            for g in 0..nkv {
                let kr = head(&k[i * kvd + g * hd..i * kvd + (g + 1) * hd], &kn, p);
                let bound = step(kr.iter().fold(1e-30, |m, x| x.abs().max(m)));
                for j in 0..hd {
                    let at = p * kvd + g * hd + j;
                    hk[s][at] = match &stored[s] {
                        Some(keys) => {
                            key_err = key_err.max((keys[at] as f64 - kr[j]).abs() / bound);
                            keys[at] as f64
                        }
                        None => round(kr[j]),
                    };
                    hv[s][at] = round(v[i * kvd + g * hd + j] as f64);
                }
            }
        }
        let mut want = vec![0f64; n * qd];
        for (i, &(s, p)) in rows.iter().enumerate() {
            for h in 0..nh {
                let kh = h / (nh / nkv);
                let qh = head(&q[i * qd + h * hd..i * qd + (h + 1) * hd], &qn, p);
                let o = host_attention(&qh, &hk[s], &hv[s], kvd, kh * hd, p + 1, shape.scale);
                want[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&o);
            }
        }
        Ok((got, want, q, k, v))
    };
    let prefill: Vec<(usize, usize)> = (0..133).map(|p| (1, p)).collect();
    let (got, want, ..) = run(&prefill, rng, &mut kv)?;
    let mut err = rel_err(&got, &want);
    for p in 0..5 {
        let (g, w, ..) = run(&[(0, p)], rng, &mut kv)?;
        err = err.max(rel_err(&g, &w));
    }
    // Blocks of rows of one slot, as a DFlash verify has: 16 rows at 5..21 (one split), the slot filled to 120,
    // then 16 rows at 120..136, across the split boundary at 128.
    let mut last = None;
    for (a, b) in [(5usize, 21usize), (21, 120), (120, 136)] {
        let rows: Vec<(usize, usize)> = (a..b).map(|p| (0, p)).collect();
        let (g, w, q, k, v) = run(&rows, rng, &mut kv)?;
        err = err.max(rel_err(&g, &w));
        last = Some((g, q, k, v));
    }
    let (gb, qb, kb, vb) = last.unwrap_or_default();
    let (gd, wd, q, k, v) = run(&[(1, 133)], rng, &mut kv)?;
    err = err.max(rel_err(&gd, &wd));
    let kvn = if f16 { "f16" } else { "f32" };
    let form = if fused {
        "fused norm+rope+append"
    } else {
        "plain"
    };
    checks.push(Check {
        name: format!("attention {form} {kvn} KV (prefill 133, decode, GQA {nh}/2x{hd})"),
        err,
        tol: if fused { 1e-4 } else { 1e-5 },
    });
    if fused {
        checks.push(Check {
            name: format!("attention {form} {kvn} {nh}/2x{hd} stored keys near the host's"),
            err: key_err,
            tol: 1.0,
        });
    }
    // The last block's last row (slot 0, position 135) alone: the bits it got in the block. Before the batch
    // invariance check below, which rewrites slot 0's position 5 inside this row's span.
    let r = 15;
    let one = attn_call(
        dev,
        fused,
        &shape,
        (&qnb, &knb),
        &mut kv,
        layer,
        &[(0, 135)],
        &qb[r * qd..(r + 1) * qd],
        &kb[r * kvd..(r + 1) * kvd],
        &vb[r * kvd..(r + 1) * kvd],
    )?;
    checks.push(Check {
        name: format!("attention {form} {kvn} {nh}/2x{hd}: a 16-row block's last row alone"),
        err: bits_differ(&one, &gb[r * qd..(r + 1) * qd]),
        tol: 0.0,
    });
    // Batch invariance: the same decode row (slot 1, pos 133, same q/k/v) recomputed next to a slot-0 row.
    let (q0, k0, v0) = (rng.vec(qd), rng.vec(kvd), rng.vec(kvd));
    let cat = |a: &[f32], b: &[f32]| [a, b].concat();
    let g2 = attn_call(
        dev,
        fused,
        &shape,
        (&qnb, &knb),
        &mut kv,
        layer,
        &[(0, 5), (1, 133)],
        &cat(&q0, &q),
        &cat(&k0, &k),
        &cat(&v0, &v),
    )?;
    checks.push(Check {
        name: format!("attention {form} {kvn} {nh}/2x{hd} batch invariance"),
        err: bits_differ(&g2[qd..], &gd),
        tol: 0.0,
    });
    Ok(())
}

/// Prefill flash attention (prefill passes of more than 16 rows over an f16 cache): two sequences' prompt chunks
/// in one pass (100 + 70 rows: a 64-row block holds rows of both), then a second chunk of the first sequence on
/// top of its cache, against the host reference (f16 queries and probabilities: a looser tolerance); the second
/// sequence's rows recomputed alone give the same bits as next to the first's.
fn flash_attention_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    if !dev.options().flash_attn || dev.options().reference {
        return Ok(());
    }
    for (nh, nkv, hd) in [(6usize, 2usize, 64usize), (8, 2, 128)] {
        let (n_layer, n_slots, ctx, layer) = (2usize, 2usize, 300usize, 1usize);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut kv = dev.alloc_kv(n_layer, n_slots, ctx, kvd, true)?;
        let mut hk = vec![vec![0f64; ctx * kvd]; n_slots];
        let mut hv = vec![vec![0f64; ctx * kvd]; n_slots];
        let f16r = |v: f32| half::f16::from_f32(v).to_f32() as f64;
        let mut run = |rows: &[(usize, usize)],
                       qkv: Option<(&[f32], &[f32], &[f32])>,
                       rng: &mut Rng,
                       kv: &mut DKv|
         -> Result<AttnRun> {
            let n = rows.len();
            let (q, k, v) = match qkv {
                Some((q, k, v)) => (q.to_vec(), k.to_vec(), v.to_vec()),
                None => (rng.vec(n * qd), rng.vec(n * kvd), rng.vec(n * kvd)),
            };
            for (i, &(s, p)) in rows.iter().enumerate() {
                for j in 0..kvd {
                    hk[s][p * kvd + j] = f16r(k[i * kvd + j]);
                    hv[s][p * kvd + j] = f16r(v[i * kvd + j]);
                }
            }
            let mut want = vec![0f64; n * qd];
            for (i, &(s, p)) in rows.iter().enumerate() {
                for h in 0..nh {
                    let kh = h / (nh / nkv);
                    let qh: Vec<f64> = q[i * qd + h * hd..i * qd + (h + 1) * hd]
                        .iter()
                        .map(|&a| a as f64)
                        .collect();
                    let o = host_attention(&qh, &hk[s], &hv[s], kvd, kh * hd, p + 1, scale);
                    want[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&o);
                }
            }
            dev.set_pass(&[], rows, &[], true)?;
            let (qb, kb, vb) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
            let mut ob = dev.alloc(n * qd)?;
            dev.attention(&mut ob, &qb, &kb, &vb, kv, layer, n, nh, nkv, hd, scale)?;
            let mut got = vec![0f32; n * qd];
            dev.read(&ob, &mut got)?;
            Ok((got, want, q, k, v))
        };
        let mut both: Vec<(usize, usize)> = (0..100).map(|p| (0, p)).collect();
        both.extend((0..70).map(|p| (1, p)));
        let (got, want, q, k, v) = run(&both, None, rng, &mut kv)?;
        let mut err = rel_err(&got, &want);
        let chunk2: Vec<(usize, usize)> = (100..181).map(|p| (0, p)).collect();
        let (g2, w2, ..) = run(&chunk2, None, rng, &mut kv)?;
        err = err.max(rel_err(&g2, &w2));
        checks.push(Check {
            name: format!(
                "flash attention prefill {nh}/{nkv}x{hd} (2 sequences in a pass, 2nd chunk)"
            ),
            err,
            tol: 4e-3,
        });
        // Sequence 1 alone (same q/k/v): the bits of its rows in the shared pass.
        let alone: Vec<(usize, usize)> = (0..70).map(|p| (1, p)).collect();
        let (ga, ..) = run(
            &alone,
            Some((&q[100 * qd..], &k[100 * kvd..], &v[100 * kvd..])),
            rng,
            &mut kv,
        )?;
        checks.push(Check {
            name: format!("flash attention prefill {nh}/{nkv}x{hd} batch invariance"),
            err: bits_differ(&ga, &got[100 * qd..]),
            tol: 0.0,
        });
    }
    Ok(())
}

/// A DFlash drafter's attention: a context stored with `kv_store` (no attention), then a block of 16 rows at the
/// positions after it, every row attending to the whole context and block (`attention_visible`), against the host
/// reference; the last row recomputed alone gives the same bits.
fn visible_attention_check(
    dev: &Device,
    rng: &mut Rng,
    f16: bool,
    hd: usize,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let (ctx, nh, nkv, n_ctx, n) = (300usize, 8usize, 2usize, 100usize, 16usize);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut kv = dev.alloc_kv(1, 1, ctx, kvd, f16)?;
    dev.reserve_attention(n, nh, hd, ctx)?;
    let round = |v: f32| {
        if f16 {
            half::f16::from_f32(v).to_f32() as f64
        } else {
            v as f64
        }
    };
    let (kc, vc) = (rng.vec(n_ctx * kvd), rng.vec(n_ctx * kvd));
    let rows: Vec<(usize, usize)> = (0..n_ctx).map(|p| (0, p)).collect();
    dev.set_pass(&[], &rows, &[], false)?;
    dev.kv_store(&mut kv, &dev.upload(&kc)?, &dev.upload(&vc)?, 0, n_ctx)?;
    let (q, kb, vb) = (rng.vec(n * qd), rng.vec(n * kvd), rng.vec(n * kvd));
    let block: Vec<(usize, usize)> = (0..n).map(|i| (0, n_ctx + i)).collect();
    let visible = n_ctx + n;
    let keys: Vec<f64> = kc.iter().chain(&kb).map(|&v| round(v)).collect();
    let vals: Vec<f64> = vc.iter().chain(&vb).map(|&v| round(v)).collect();
    let mut want = vec![0f64; n * qd];
    for i in 0..n {
        for h in 0..nh {
            let g = h / (nh / nkv);
            let qh: Vec<f64> = q[i * qd + h * hd..i * qd + (h + 1) * hd]
                .iter()
                .map(|&a| a as f64)
                .collect();
            let o = host_attention(&qh, &keys, &vals, kvd, g * hd, visible, scale);
            want[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&o);
        }
    }
    let call = |rows: &[(usize, usize)],
                q: &[f32],
                k: &[f32],
                v: &[f32],
                kv: &mut DKv|
     -> Result<Vec<f32>> {
        dev.set_pass(&[], rows, &[], false)?;
        let mut out = dev.alloc(rows.len() * qd)?;
        let (qb, kb, vb) = (dev.upload(q)?, dev.upload(k)?, dev.upload(v)?);
        dev.attention_visible(
            &mut out,
            &qb,
            &kb,
            &vb,
            kv,
            0,
            rows.len(),
            nh,
            nkv,
            hd,
            scale,
            visible,
        )?;
        let mut got = vec![0f32; rows.len() * qd];
        dev.read(&out, &mut got)?;
        Ok(got)
    };
    let got = call(&block, &q, &kb, &vb, &mut kv)?;
    let kvn = if f16 { "f16" } else { "f32" };
    checks.push(Check {
        name: format!(
            "attention over a visible span {kvn} KV (context 100 by kv_store, block of 16, GQA 8/2x{hd})"
        ),
        err: rel_err(&got, &want),
        tol: 1e-5,
    });
    // The last row alone (its span still ends at itself) gets the bits it got in the block.
    let r = n - 1;
    let one = call(
        &block[r..r + 1],
        &q[r * qd..(r + 1) * qd],
        &kb[r * kvd..(r + 1) * kvd],
        &vb[r * kvd..(r + 1) * kvd],
        &mut kv,
    )?;
    checks.push(Check {
        name: format!("attention over a visible span {kvn} KV 8/2x{hd}: the last row alone"),
        err: bits_differ(&one, &got[r * qd..(r + 1) * qd]),
        tol: 0.0,
    });
    // The fused form (QK-norm, RoPE and the K/V store in attn_prep, as a GPU drafter runs its block) over the same
    // context in a fresh cache: as in `attention_case`, each key the device stored must be within a rounding step
    // of the host's f64 norm + RoPE, and the reference attends over the keys as stored.
    let eps = 1e-6f32;
    let (qn, kn) = (rng.vec(hd), rng.vec(hd));
    let mut kv = dev.alloc_kv(1, 1, ctx, kvd, f16)?;
    dev.set_pass(&[], &rows, &[], false)?;
    dev.kv_store(&mut kv, &dev.upload(&kc)?, &dev.upload(&vc)?, 0, n_ctx)?;
    dev.set_pass(&[], &block, &[], false)?;
    let (mut qb, mut kbb, vbb) = (dev.upload(&q)?, dev.upload(&kb)?, dev.upload(&vb)?);
    let mut out = dev.alloc(n * qd)?;
    dev.attention_fused(
        &mut out,
        &mut qb,
        &mut kbb,
        &vbb,
        &mut kv,
        0,
        n,
        &test_shape(nh, nkv, hd, eps),
        Some((&dev.upload(&qn)?, &dev.upload(&kn)?)),
        visible,
    )?;
    let mut got = vec![0f32; n * qd];
    dev.read(&out, &mut got)?;
    let stored = dev.read_kv_keys(&kv, 0, 0)?;
    let (mut keys, mut key_err) = (keys, 0f64);
    for i in 0..n {
        for g in 0..nkv {
            let kr = norm_rope(
                &kb[i * kvd + g * hd..i * kvd + (g + 1) * hd],
                Some(&kn),
                n_ctx + i,
                eps,
            );
            let bound = stored_key_bound(kr.iter().fold(1e-30, |m, x| x.abs().max(m)), f16);
            for (j, want) in kr.iter().enumerate() {
                let at = (n_ctx + i) * kvd + g * hd + j;
                key_err = key_err.max((stored[at] as f64 - want).abs() / bound);
                keys[at] = stored[at] as f64;
            }
        }
    }
    for i in 0..n {
        for h in 0..nh {
            let g = h / (nh / nkv);
            let qh = norm_rope(
                &q[i * qd + h * hd..i * qd + (h + 1) * hd],
                Some(&qn),
                n_ctx + i,
                eps,
            );
            let o = host_attention(&qh, &keys, &vals, kvd, g * hd, visible, scale);
            want[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&o);
        }
    }
    checks.push(Check {
        name: format!(
            "attention fused norm+rope+store over a visible span {kvn} KV (block of 16, 8/2x{hd})"
        ),
        err: rel_err(&got, &want),
        tol: 1e-5,
    });
    checks.push(Check {
        name: format!(
            "attention fused over a visible span {kvn} KV 8/2x{hd}: stored keys within a rounding step"
        ),
        err: key_err,
        tol: 1.0,
    });
    // The context's keys normed and rotated on their way into the cache (`kv_prep`, a drafter's context rows).
    let mut kv = dev.alloc_kv(1, 1, ctx, kvd, f16)?;
    dev.set_pass(&[], &rows, &[], false)?;
    let (mut kcb, vcb) = (dev.upload(&kc)?, dev.upload(&vc)?);
    let shape = test_shape(nh, nkv, hd, eps);
    dev.kv_prep(
        &mut kv,
        &mut kcb,
        &vcb,
        0,
        n_ctx,
        &shape,
        Some(&dev.upload(&kn)?),
    )?;
    let stored = dev.read_kv_keys(&kv, 0, 0)?;
    let mut key_err = 0f64;
    for p in 0..n_ctx {
        for g in 0..nkv {
            let kr = norm_rope(
                &kc[p * kvd + g * hd..p * kvd + (g + 1) * hd],
                Some(&kn),
                p,
                eps,
            );
            let bound = stored_key_bound(kr.iter().fold(1e-30, |m, x| x.abs().max(m)), f16);
            for (j, want) in kr.iter().enumerate() {
                let got = stored[p * kvd + g * hd + j] as f64;
                key_err = key_err.max((got - want).abs() / bound);
            }
        }
    }
    checks.push(Check {
        name: format!(
            "kv_prep {kvn} KV (100 context rows, 2x{hd}): stored keys within a rounding step"
        ),
        err: key_err,
        tol: 1.0,
    });
    Ok(())
}

/// A captured pass replayed with new metadata gives the bits of running it eagerly.
fn graph_check(dev: &Device, rng: &mut Rng, checks: &mut Vec<Check>) -> Result<()> {
    let (nh, nkv, hd, width) = (4usize, 2usize, 64usize, 256usize);
    let shape = AttnShape {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        scale: 0.125,
        theta: 10000.0,
        freq_scale: 1.0,
        neox: true,
        eps: 1e-6,
    };
    let rows_out = nh * hd;
    let wq = random_weight(rng, GgmlType::Q4_K, rows_out, width)?;
    let w = dev.upload_weight("test.graph", GgmlType::Q4_K, width, rows_out, &wq, true)?;
    let n = 3usize;
    let (xb, nwb) = (
        dev.upload(&rng.vec(n * width))?,
        dev.upload(&rng.vec(width))?,
    );
    let (qn, kn) = (dev.upload(&rng.vec(hd))?, dev.upload(&rng.vec(hd))?);
    let mut kv = dev.alloc_kv(1, 2, 96, nkv * hd, true)?;
    dev.reserve_attention(n, nh, hd, 96)?;
    let mut xn = dev.alloc(n * width)?;
    let mut q = dev.alloc(n * rows_out)?;
    let mut k = dev.alloc(n * nkv * hd)?;
    let v = dev.upload(&rng.vec(n * nkv * hd))?;
    let mut att = dev.alloc(n * rows_out)?;
    let mut out = dev.alloc(n * rows_out)?;
    let mut pass = |graph: bool, rows: &[(usize, usize)]| -> Result<Vec<f32>> {
        dev.set_pass(&[], rows, &[], false)?;
        let mut f = || -> Result<()> {
            dev.rms_norm(&mut xn, &xb, &nwb, n, width, 1e-6)?;
            dev.matmul(&mut q, &w, &xn, n, false)?;
            dev.copy(&mut k, 0, &q, n * nkv * hd)?;
            dev.attention_fused(
                &mut att,
                &mut q,
                &mut k,
                &v,
                &mut kv,
                0,
                n,
                &shape,
                Some((&qn, &kn)),
                0,
            )?;
            dev.matmul(&mut out, &w, &att, n, false)
        };
        dev.run_pass([7, n as u64, 0, 0, 0], graph, &mut f)?;
        let mut got = vec![0f32; n * rows_out];
        dev.read(&out, &mut got)?;
        Ok(got)
    };
    let a: Vec<(usize, usize)> = vec![(0, 0), (1, 0), (0, 1)];
    let b: Vec<(usize, usize)> = vec![(1, 1), (0, 2), (1, 2)];
    let eager_a = pass(false, &a)?;
    let eager_b = pass(false, &b)?;
    let graph_a = pass(true, &a)?; // captured
    let graph_b = pass(true, &b)?; // replayed with new positions
    let graph_b2 = pass(true, &b)?;
    checks.push(Check {
        name: "graph capture == eager".into(),
        err: bits_differ(&graph_a, &eager_a),
        tol: 0.0,
    });
    checks.push(Check {
        name: "graph replay, new metadata == eager".into(),
        err: bits_differ(&graph_b, &eager_b) + bits_differ(&graph_b2, &eager_b),
        tol: 0.0,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{host_attention, norm_rope, stored_key_bound, Rng};

    /// The device's QK-norm and RoPE as attention.cu computes them in f32 (1 / powf(theta, 2i / hd), sincosf
    /// of position times that, NEOX pairs), on the host.
    fn norm_rope_f32(x: &[f32], w: &[f32], pos: usize, eps: f32) -> Vec<f32> {
        let hd = x.len();
        let ss: f32 = x.iter().map(|a| a * a).sum();
        let s = 1.0 / (ss / hd as f32 + eps).sqrt();
        let v: Vec<f32> = x.iter().zip(w).map(|(a, b)| a * s * b).collect();
        let mut out = v.clone();
        for i in 0..hd / 2 {
            let inv = 1.0 / 10000f32.powf((2 * i) as f32 / hd as f32);
            let (sn, cs) = (pos as f32 * inv).sin_cos();
            out[i] = v[i] * cs - v[i + hd / 2] * sn;
            out[i + hd / 2] = v[i] * sn + v[i + hd / 2] * cs;
        }
        out
    }

    #[test]
    fn f32_keys_stay_inside_the_bound() {
        // f32 against f64 over random heads at the self-test's positions: within a tenth of the f32 bound, so a
        // device whose powf or sincosf is a few ulps off still passes; a wrong rotation is off by ~m.
        let mut rng = Rng(7);
        let mut worst = 0f64;
        for hd in [64usize, 128] {
            for _ in 0..200 {
                let (x, w) = (rng.vec(hd), rng.vec(hd));
                for pos in [0usize, 5, 60, 133, 199] {
                    let want = norm_rope(&x, Some(&w), pos, 1e-6);
                    let got = norm_rope_f32(&x, &w, pos, 1e-6);
                    let m = want.iter().fold(0f64, |m, a| m.max(a.abs()));
                    for (g, w) in got.iter().zip(&want) {
                        worst = worst.max((*g as f64 - w).abs() / stored_key_bound(m, false));
                    }
                }
            }
        }
        assert!(worst < 0.1, "f32 keys off by {worst} of the bound");
        // A rotation by the next position is far outside it.
        let (x, w) = (rng.vec(64), rng.vec(64));
        let want = norm_rope(&x, Some(&w), 60, 1e-6);
        let m = want.iter().fold(0f64, |m, a| m.max(a.abs()));
        let off = norm_rope_f32(&x, &w, 61, 1e-6)
            .iter()
            .zip(&want)
            .fold(0f64, |e, (g, w)| e.max((*g as f64 - w).abs()));
        assert!(off > 10.0 * stored_key_bound(m, true), "{off}");
    }

    #[test]
    fn host_attention_weights_positions_by_softmax() {
        // Two KV heads of 2 (kvd 4), 3 positions; the query reads head 1 (offset 2).
        let kc = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let vc = [9.0, 9.0, 1.0, 2.0, 9.0, 9.0, 3.0, 4.0, 9.0, 9.0, 5.0, 6.0];
        // A zero query: equal scores, the mean of the first two positions' V.
        let o = host_attention(&[0.0, 0.0], &kc, &vc, 4, 2, 2, 1.0);
        assert_eq!(o, vec![2.0, 3.0]);
        // Score ln 2 at position 0 and 0 elsewhere: weights 2:1:1 over three positions.
        let o = host_attention(&[2f64.ln(), 0.0], &kc, &vc, 4, 2, 3, 1.0);
        let want = [(2.0 + 3.0 + 5.0) / 4.0, (4.0 + 4.0 + 6.0) / 4.0];
        assert!(
            o.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{o:?}"
        );
    }
}
