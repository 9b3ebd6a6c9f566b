//! The interleaved kernels: a weight is repacked once ([`RepackKernel::pack`]) into groups of rows whose quants
//! interleave 4 bytes at a time (one 32-bit lane of a vector per row), then multiplied with any number of
//! activation rows ([`RepackKernel::run_with`]), decode and prefill alike. The lanes are the outputs, so no
//! horizontal sums are needed and a block's quants are unpacked once for every activation row of the call.
//!
//! - Q4_0, Q4_1 and Q8_0: groups of 8 rows; AVX2 code, and on AVX-512 VNNI two groups per call (`x86::repack`).
//! - Q4_K, Q5_K and Q6_K: groups of 16 rows, AVX-512 VNNI or AVX2 (two halves of 8 rows; `x86::krepack`). Their
//!   per-pair arithmetic is the scalar reference's (exact integer super-block sums, then the same f32 steps lane
//!   by lane), so their results equal [`super::DotKernel::dot`] and the tiled prefill kernel bit for bit, and
//!   [`repacked_dot_reference`] is the scalar dot kernel.
//!
//! The legacy formats' row-by-row kernels keep 8 float lanes of partial sums per (weight row, activation row)
//! pair, so they cannot be tiled over several weight rows; their repacked kernel defines its own per-pair
//! arithmetic instead, one f32 chain over the blocks in order:
//!
//! ```text
//! acc = fma(f32(d_w) * f32(d_a), f32(isum_b), acc)      for b = 0, 1, ... (isum_b: the block's exact integer dot)
//! min = fma(f32(m_w), f32(s_a), min)                     (Q4_1 only)
//! dot = acc + min                                        (Q4_1), or acc
//! ```
//!
//! [`repacked_dot_reference`] is that arithmetic in scalar code, and the kernel equals it bit for bit however
//! many activation rows share a call, so the engine's batch invariance holds as long as every matmul on a
//! weight uses this kernel (the CPU backend repacks a weight once and then always reads the repacked copy).

use super::{vec_dot_type, Isa};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK, QK_K};
use crate::GgmlType;
use half::f16;

/// The repacked kernel for one weight type ([`repack_kernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepackKernel {
    ty: GgmlType,
    /// The AVX-512 VNNI form (else the AVX2 one).
    vnni: bool,
}

/// The repacked kernel for `w` on `isa`, or `None`: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K on AVX2 and on AVX-512 VNNI
/// (bench/README.md has each form against the row kernels).
pub fn repack_kernel(w: GgmlType, isa: Isa) -> Option<RepackKernel> {
    if !cfg!(target_arch = "x86_64") || !isa.is_available() {
        return None;
    }
    let ok = match w {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && Isa::Avx2.is_available()
        }
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            matches!(isa, Isa::Avx2 | Isa::Avx512Vnni)
        }
        _ => false,
    };
    ok.then_some(RepackKernel {
        ty: w,
        vnni: isa == Isa::Avx512Vnni,
    })
}

/// Whether `ty` is one of the K-quants (16-row groups, the scalar reference's arithmetic).
const fn is_k(ty: GgmlType) -> bool {
    k_quant(ty).is_some()
}

/// The K-quant a packed group holds (the layouts are `x86::krepack`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KQuant {
    Q4,
    Q5,
    Q6,
}

/// The packed layout of a K-quant.
const fn k_quant(ty: GgmlType) -> Option<KQuant> {
    match ty {
        GgmlType::Q4_K => Some(KQuant::Q4),
        GgmlType::Q5_K => Some(KQuant::Q5),
        GgmlType::Q6_K => Some(KQuant::Q6),
        _ => None,
    }
}

/// Bytes of one block of a packed group of 8 rows: the quants (4 or 8 vectors of 32 bytes) and the f16 scales
/// (8 `d`, and 8 `m` for Q4_1). A group holds all its blocks' quants first, then all `d`, then all `m`.
const fn quant_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 8 * QK,
        _ => 4 * QK,
    }
}

const fn scale_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 32,
        _ => 16,
    }
}

impl RepackKernel {
    /// The weight type.
    pub fn weight_type(&self) -> GgmlType {
        self.ty
    }

    /// Whether this kernel is the faster choice only for one or two activation rows: the K-quants' AVX2 form
    /// (single thread, weights from memory: 1.3-1.5x the AVX2 row kernels for one row, 0.5-0.9x the tiled kernel
    /// for 16, Q5_K 0.7x its row kernel). Its results equal the row and tiled kernels', so a caller may take
    /// either by row count.
    pub fn decode_only(&self) -> bool {
        is_k(self.ty) && !self.vnni
    }

    /// Weight rows per packed group: 8, or 16 for the K-quants.
    pub fn group_rows(&self) -> usize {
        if is_k(self.ty) {
            16
        } else {
            8
        }
    }

    /// Bytes of one packed group of rows of `n` elements.
    pub fn group_len(&self, n: usize) -> usize {
        match k_quant(self.ty) {
            Some(q) => (n / QK_K) * imp::block_len(q),
            None => (n / QK) * (quant_bytes(self.ty) + scale_bytes(self.ty)),
        }
    }

    /// Bytes of `rows` packed weight rows of `n` elements (whole groups of [`Self::group_rows`]).
    pub fn packed_len(&self, n: usize, rows: usize) -> usize {
        rows.div_ceil(self.group_rows()) * self.group_len(n)
    }

    /// Packs `rows` weight rows of `n` elements, row `i` at byte `i * row_stride` of `w`, into `out`
    /// ([`Self::packed_len`] bytes); a last partial group is padded with zero rows.
    ///
    /// # Panics
    /// If `n` is not a whole number of blocks, `w` does not hold the rows or `out` is too short: the caller
    /// validates shapes once (at model load), so a mismatch is a bug in the caller.
    pub fn pack(&self, n: usize, w: &[u8], row_stride: usize, rows: usize, out: &mut [u8]) {
        let row = super::row_len(self.ty, n).expect("repack: n is whole blocks");
        assert!(
            rows == 0 || w.len() >= (rows - 1) * row_stride + row,
            "repack {}: {rows} rows of {row} bytes (stride {row_stride}) need more than {} bytes",
            self.ty,
            w.len()
        );
        let len = self.packed_len(n, rows);
        assert!(
            out.len() >= len,
            "repack {}: {len} bytes needed, {}",
            self.ty,
            out.len()
        );
        out[..len].fill(0);
        let group = self.group_len(n);
        if is_k(self.ty) {
            for r in 0..rows {
                let (g, l) = (r / 16, r % 16);
                let (src, dst) = (&w[r * row_stride..][..row], &mut out[g * group..][..group]);
                match self.ty {
                    GgmlType::Q4_K => imp::pack_q4_k_row(n / QK_K, src, l, dst),
                    GgmlType::Q5_K => imp::pack_q5_k_row(n / QK_K, src, l, dst),
                    _ => imp::pack_q6_k_row(n / QK_K, src, l, dst),
                }
            }
            return;
        }
        let (nb, qb) = (n / QK, quant_bytes(self.ty));
        let wb = row / nb;
        for r in 0..rows {
            let (g, l) = (r / 8, r % 8);
            let dst = &mut out[g * group..(g + 1) * group];
            for b in 0..nb {
                let blk = &w[r * row_stride + b * wb..r * row_stride + (b + 1) * wb];
                // The f16 header(s) first in every one of these formats; the quants after them.
                let (hdr, qs) = blk.split_at(if self.ty == GgmlType::Q4_1 { 4 } else { 2 });
                let d = nb * qb + b * 16 + 2 * l;
                dst[d..d + 2].copy_from_slice(&hdr[..2]);
                if self.ty == GgmlType::Q4_1 {
                    let m = nb * qb + nb * 16 + b * 16 + 2 * l;
                    dst[m..m + 2].copy_from_slice(&hdr[2..4]);
                }
                // Vector c of the block, lane l: this row's quant bytes 4c..4c+4 (for the 4-bit formats, byte j
                // holds elements j and j + 16, so vector c's low nibbles are elements 4c.. and its high ones
                // 16 + 4c..).
                for (c, q) in qs.chunks_exact(4).enumerate() {
                    let o = b * qb + c * 32 + 4 * l;
                    dst[o..o + 4].copy_from_slice(q);
                }
            }
        }
    }

    /// Floats [`Self::act_scales`] writes for `n_act` activation rows of `n` elements.
    pub fn scales_len(&self, n: usize, n_act: usize) -> usize {
        n_act * self.scales_per_row(n)
    }

    /// The K-quants need none: their kernel reads the activations' f32 scales and per-16 sums in place.
    fn scales_per_row(&self, n: usize) -> usize {
        if is_k(self.ty) {
            0
        } else {
            imp::scales_per_row(self.ty, n / QK)
        }
    }

    /// The f16 block scales of `n_act` activation rows (row `j` at byte `j * a_stride` of `a`) as f32, the form
    /// [`Self::run_with`] reads: converted once per matmul instead of once per group of weight rows.
    ///
    /// # Panics
    /// If `a` or `out` ([`Self::scales_len`]) is too short.
    pub fn act_scales(&self, n: usize, a: &[u8], a_stride: usize, n_act: usize, out: &mut [f32]) {
        let arow =
            super::row_len(vec_dot_type(self.ty), n).expect("repack scales: n is whole blocks");
        assert!(
            (n_act == 0 || a.len() >= (n_act - 1) * a_stride + arow)
                && out.len() >= self.scales_len(n, n_act),
            "repack scales {}: buffers too short for {n_act} rows of {n}",
            self.ty
        );
        if is_k(self.ty) {
            return;
        }
        // SAFETY: the assert above bounds the rows read and the scales written; `repack_kernel` checked the
        // CPU's features.
        unsafe {
            imp::act_scales(
                self.ty,
                a.as_ptr(),
                a_stride,
                n / QK,
                n_act,
                out.as_mut_ptr(),
                self.scales_per_row(n),
            )
        };
    }

    /// Multiplies the first `rows` rows of `packed` (from [`Self::pack`]) with `n_act` activation rows (row `j`
    /// at byte `j * a_stride` of `a`, in [`vec_dot_type`] of the weight; `ys` their [`Self::act_scales`]),
    /// handing each result run to `emit(j, i0, values)`: `values[k]` = weight row `i0 + k` · activation row `j`,
    /// runs of up to [`Self::group_rows`], every pair exactly once, each bit-identical to
    /// [`repacked_dot_reference`].
    ///
    /// # Panics
    /// As [`Self::pack`], when `packed`, `a` or `ys` is too short for the shapes.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn run_with(
        &self,
        n: usize,
        packed: &[u8],
        rows: usize,
        a: &[u8],
        a_stride: usize,
        ys: &[f32],
        n_act: usize,
        mut emit: impl FnMut(usize, usize, &[f32]),
    ) {
        let arow = super::row_len(vec_dot_type(self.ty), n).expect("repack run: n is whole blocks");
        assert!(
            packed.len() >= self.packed_len(n, rows)
                && (n_act == 0 || a.len() >= (n_act - 1) * a_stride + arow)
                && ys.len() >= self.scales_len(n, n_act),
            "repack run {}: buffers too short for {rows} x {n_act} of {n}",
            self.ty
        );
        let group = self.group_len(n);
        if let Some(q) = k_quant(self.ty) {
            let mut tmp = [[0f32; 16]; imp::K_MAX_ACT];
            for j0 in (0..n_act).step_by(imp::K_MAX_ACT) {
                let nj = (n_act - j0).min(imp::K_MAX_ACT);
                for (g, r0) in (0..rows).step_by(16).enumerate() {
                    let nr = (rows - r0).min(16);
                    // SAFETY: the assert above bounds the group and the activation rows read (`next` is only
                    // prefetched); `repack_kernel` only hands out a K-quant kernel on a CPU with its ISA.
                    unsafe {
                        imp::run_group_k(
                            self.vnni,
                            q,
                            n / QK_K,
                            packed.as_ptr().add(g * group),
                            packed.as_ptr().wrapping_add((g + 1) * group),
                            a.as_ptr().add(j0 * a_stride),
                            a_stride,
                            nj,
                            &mut tmp,
                        )
                    };
                    for (jj, t) in tmp.iter().take(nj).enumerate() {
                        emit(j0 + jj, r0, &t[..nr]);
                    }
                }
            }
            return;
        }
        let (nb, per_row) = (n / QK, self.scales_per_row(n));
        let mut tmp = [[0f32; 8]; imp::MAX_ACT];
        if self.vnni {
            // Two groups per AVX-512 call; a last group alone runs the AVX2 body (same bits).
            let mut pair = [[0f32; 16]; imp::PAIR_MAX_ACT];
            let at = |g: usize| packed.as_ptr().wrapping_add(g * group);
            for j0 in (0..n_act).step_by(imp::PAIR_MAX_ACT) {
                let nj = (n_act - j0).min(imp::PAIR_MAX_ACT);
                let (aj, yj) = (a.as_ptr().wrapping_add(j0 * a_stride), &ys[j0 * per_row..]);
                for r0 in (0..rows).step_by(16) {
                    let (g, nr) = (r0 / 8, (rows - r0).min(16));
                    // SAFETY: the assert above bounds the groups (both whole when nr > 8), the activation rows
                    // and their scales; `next` is only prefetched; `repack_kernel` made a `vnni` kernel only on
                    // a CPU with AVX-512 VNNI (and AVX2, FMA, F16C).
                    unsafe {
                        if nr > 8 {
                            let groups = (at(g), at(g + 1), at(g + 2));
                            let y = yj.as_ptr();
                            imp::run_pair(
                                self.ty, nb, groups, aj, a_stride, y, per_row, nj, &mut pair,
                            );
                        } else {
                            let y = yj.as_ptr();
                            imp::run_group(
                                self.ty,
                                nb,
                                at(g),
                                aj,
                                a_stride,
                                y,
                                per_row,
                                nj,
                                &mut tmp,
                            );
                            for (p, t) in pair.iter_mut().zip(&tmp).take(nj) {
                                p[..8].copy_from_slice(t);
                            }
                        }
                    }
                    for (jj, t) in pair.iter().take(nj).enumerate() {
                        emit(j0 + jj, r0, &t[..nr]);
                    }
                }
            }
            return;
        }
        let step = imp::act_rows(self.ty);
        for j0 in (0..n_act).step_by(step) {
            let nj = (n_act - j0).min(step);
            for (g, r0) in (0..rows).step_by(8).enumerate() {
                let nr = (rows - r0).min(8);
                // SAFETY: the assert above bounds the group, the activation rows and their scales read;
                // `repack_kernel` only hands out a kernel on a CPU with AVX2, FMA and F16C.
                unsafe {
                    imp::run_group(
                        self.ty,
                        nb,
                        packed.as_ptr().add(g * group),
                        a.as_ptr().add(j0 * a_stride),
                        a_stride,
                        ys.as_ptr().add(j0 * per_row),
                        per_row,
                        nj,
                        &mut tmp,
                    )
                };
                for (jj, t) in tmp.iter().take(nj).enumerate() {
                    emit(j0 + jj, r0, &t[..nr]);
                }
            }
        }
    }
}

/// The repacked kernel's arithmetic for one weight row `w` (GGUF layout, `n` elements of `ty`: Q4_0, Q4_1,
/// Q8_0, Q4_K, Q5_K or Q6_K) and one activation row `a` (its [`vec_dot_type`]), in scalar code (see the module header;
/// for the K-quants, the scalar dot kernel).
///
/// # Panics
/// If `ty` is not one of those six or a row is shorter than `n` elements.
pub fn repacked_dot_reference(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    if is_k(ty) {
        let (w, a) = super::rows(ty, vec_dot_type(ty), n, w, a);
        return super::scalar::kernel(ty).expect("K-quants have a scalar kernel")(n, w, a);
    }
    let (w, a) = super::rows(ty, vec_dot_type(ty), n, w, a);
    let nb = n / QK;
    let (mut acc, mut min) = (0f32, 0f32);
    let f = |h: f16| h.to_f32();
    for b in 0..nb {
        let (dw, mw, dy, sy, isum) = match ty {
            GgmlType::Q4_0 => {
                let x: BlockQ4_0 = bytemuck::pod_read_unaligned(&w[b * 18..(b + 1) * 18]);
                let y: BlockQ8_0 = bytemuck::pod_read_unaligned(&a[b * 34..(b + 1) * 34]);
                let isum: i32 = (0..QK)
                    .map(|j| (nibble(&x.qs, j) as i32 - 8) * y.qs[j] as i32)
                    .sum();
                (f(x.d), 0.0, f(y.d), 0.0, isum)
            }
            GgmlType::Q4_1 => {
                let x: BlockQ4_1 = bytemuck::pod_read_unaligned(&w[b * 20..(b + 1) * 20]);
                let y: BlockQ8_1 = bytemuck::pod_read_unaligned(&a[b * 36..(b + 1) * 36]);
                let isum: i32 = (0..QK)
                    .map(|j| nibble(&x.qs, j) as i32 * y.qs[j] as i32)
                    .sum();
                (f(x.d), f(x.m), f(y.d), f(y.s), isum)
            }
            GgmlType::Q8_0 => {
                let x: BlockQ8_0 = bytemuck::pod_read_unaligned(&w[b * 34..(b + 1) * 34]);
                let y: BlockQ8_0 = bytemuck::pod_read_unaligned(&a[b * 34..(b + 1) * 34]);
                let isum: i32 = (0..QK).map(|j| x.qs[j] as i32 * y.qs[j] as i32).sum();
                (f(x.d), 0.0, f(y.d), 0.0, isum)
            }
            other => panic!("repacked_dot_reference: {other} has no repacked kernel"),
        };
        acc = (dw * dy).mul_add(isum as f32, acc);
        if ty == GgmlType::Q4_1 {
            min = mw.mul_add(sy, min);
        }
    }
    if ty == GgmlType::Q4_1 {
        acc + min
    } else {
        acc
    }
}

/// Element `j` of a 4-bit block's quants (low nibbles are elements 0..16, high nibbles 16..32).
fn nibble(qs: &[u8; QK / 2], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0xF
    } else {
        qs[j - QK / 2] >> 4
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    pub(super) use crate::dot::x86::krepack::{
        block_len, pack_q4_k_row, pack_q5_k_row, pack_q6_k_row, run_group as run_group_k,
        MAX_ACT as K_MAX_ACT,
    };
    pub(super) use crate::dot::x86::repack::{
        act_rows, act_scales, run_group, run_pair, scales_per_row, MAX_ACT, PAIR_MAX_ACT,
    };
}

/// No repacked kernel off x86: [`repack_kernel`] returns `None`, so nothing here runs.
#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use crate::GgmlType;
    pub(super) const MAX_ACT: usize = 1;
    pub(super) const PAIR_MAX_ACT: usize = 1;
    pub(super) const K_MAX_ACT: usize = 1;
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run_pair(
        _: GgmlType,
        _: usize,
        _: (*const u8, *const u8, *const u8),
        _: *const u8,
        _: usize,
        _: *const f32,
        _: usize,
        _: usize,
        _: &mut [[f32; 16]; PAIR_MAX_ACT],
    ) {
        unreachable!("no repacked kernel on this architecture")
    }
    pub(super) const fn block_len(_: super::KQuant) -> usize {
        0
    }
    pub(super) fn pack_q4_k_row(_: usize, _: &[u8], _: usize, _: &mut [u8]) {
        unreachable!("no repacked kernel on this architecture")
    }
    pub(super) fn pack_q5_k_row(_: usize, _: &[u8], _: usize, _: &mut [u8]) {
        unreachable!("no repacked kernel on this architecture")
    }
    pub(super) fn pack_q6_k_row(_: usize, _: &[u8], _: usize, _: &mut [u8]) {
        unreachable!("no repacked kernel on this architecture")
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run_group_k(
        _: bool,
        _: super::KQuant,
        _: usize,
        _: *const u8,
        _: *const u8,
        _: *const u8,
        _: usize,
        _: usize,
        _: &mut [[f32; 16]; K_MAX_ACT],
    ) {
        unreachable!("no repacked kernel on this architecture")
    }
    pub(super) fn act_rows(_: GgmlType) -> usize {
        1
    }
    pub(super) fn scales_per_row(_: GgmlType, _: usize) -> usize {
        0
    }
    pub(super) unsafe fn act_scales(
        _: GgmlType,
        _: *const u8,
        _: usize,
        _: usize,
        _: usize,
        _: *mut f32,
        _: usize,
    ) {
        unreachable!("no repacked kernel on this architecture")
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run_group(
        _: GgmlType,
        _: usize,
        _: *const u8,
        _: *const u8,
        _: usize,
        _: *const f32,
        _: usize,
        _: usize,
        _: &mut [[f32; 8]; MAX_ACT],
    ) {
        unreachable!("no repacked kernel on this architecture")
    }
}
