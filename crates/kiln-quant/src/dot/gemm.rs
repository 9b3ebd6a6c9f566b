//! The tiled prefill kernel for Q4_K and Q6_K weights: weight rows packed into groups of 8
//! ([`GemmKernel::pack`]), then multiplied with many activation rows at once ([`GemmKernel::run`]).
//!
//! Every output is bit-identical to [`super::DotKernel::dot`] on the same (weight row, activation row) for any
//! ISA, including the scalar reference: the kernel adds the same exact per-block integers and applies the same
//! f32 operations per pair (see the x86 module), so a caller may pick this kernel or the row-by-row one by
//! speed alone without breaking batch invariance.

use super::{vec_dot_type, Isa};
use crate::GgmlType;

/// A tiled kernel chosen once per matmul ([`gemm_kernel`]). Use: [`GemmKernel::pack`] a few weight rows
/// (up to [`GemmKernel::GROUP_ROWS`] per group, several groups back to back) into a scratch buffer of
/// [`GemmKernel::packed_len`] bytes, then [`GemmKernel::run`] it against any number of activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmKernel {
    q6: bool,
    vnni: bool,
}

/// The tiled kernel for weight type `w` on `isa`, or `None` where there is none (only Q4_K and Q6_K on AVX2
/// and AVX-512 VNNI have one): callers then use [`super::dot_kernel`].
pub fn gemm_kernel(w: GgmlType, isa: Isa) -> Option<GemmKernel> {
    if !cfg!(target_arch = "x86_64") || !isa.is_available() {
        return None;
    }
    let q6 = match w {
        GgmlType::Q4_K => false,
        GgmlType::Q6_K => true,
        _ => return None,
    };
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => Some(GemmKernel { q6, vnni: false }),
        Isa::Avx512Vnni => Some(GemmKernel { q6, vnni: true }),
    }
}

impl GemmKernel {
    /// Weight rows per packed group.
    pub const GROUP_ROWS: usize = 8;

    /// The weight type.
    pub fn weight_type(&self) -> GgmlType {
        if self.q6 {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        }
    }

    /// Bytes of `rows` packed weight rows of `n` elements (whole groups of [`Self::GROUP_ROWS`]).
    pub fn packed_len(&self, n: usize, rows: usize) -> usize {
        rows.div_ceil(Self::GROUP_ROWS) * (n / 256) * imp::block_bytes(self.q6)
    }

    /// Packs `rows` weight rows of `n` elements, row `i` at byte `i * row_stride` of `w`, into `out`
    /// ([`Self::packed_len`] bytes); a last partial group is padded with zero rows.
    ///
    /// # Panics
    /// If `n` is not a whole number of 256-element blocks, `w` does not hold the rows or `out` is too short:
    /// the caller validates shapes once (at model load), so a mismatch is a bug in the caller.
    pub fn pack(&self, n: usize, w: &[u8], row_stride: usize, rows: usize, out: &mut [u8]) {
        let wt = self.weight_type();
        let row = super::row_len(wt, n).expect("gemm pack: n is whole blocks");
        assert!(
            rows == 0 || w.len() >= (rows - 1) * row_stride + row,
            "gemm pack {wt}: {rows} rows of {row} bytes (stride {row_stride}) need more than {} bytes",
            w.len()
        );
        let len = self.packed_len(n, rows);
        assert!(
            out.len() >= len,
            "gemm pack {wt}: {len} bytes needed, {}",
            out.len()
        );
        let group = (n / 256) * imp::block_bytes(self.q6);
        for (g, r0) in (0..rows).step_by(Self::GROUP_ROWS).enumerate() {
            let nr = (rows - r0).min(Self::GROUP_ROWS);
            // SAFETY: the asserts above bound every row read and the group written; `gemm_kernel` only
            // builds a GemmKernel on a CPU with the AVX2 feature set the packer needs.
            unsafe {
                imp::pack(
                    self.q6,
                    n / 256,
                    w.as_ptr().add(r0 * row_stride),
                    row_stride,
                    nr,
                    out.as_mut_ptr().add(g * group),
                )
            };
        }
    }

    /// `out[j * rows + i]` = packed weight row `i` · activation row `j` for `i < rows`, `j < n_act`, activation
    /// row `j` at byte `j * a_stride` of `a` (Q8_K, as [`super::quantize_activation`] writes it).
    ///
    /// # Panics
    /// As [`Self::pack`], when `packed`, `a` or `out` is too short for the shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        n: usize,
        packed: &[u8],
        rows: usize,
        a: &[u8],
        a_stride: usize,
        n_act: usize,
        out: &mut [f32],
    ) {
        assert!(
            out.len() >= n_act * rows,
            "gemm run {}: output of {} for {rows} x {n_act}",
            self.weight_type(),
            out.len()
        );
        self.run_with(n, packed, rows, a, a_stride, n_act, |j, r0, vals| {
            let o = j * rows + r0;
            out[o..o + vals.len()].copy_from_slice(vals);
        });
    }

    /// [`Self::run`] handing each result run to `emit(j, i0, values)`: `values[k]` = packed weight row `i0 + k`
    /// · activation row `j`, runs of up to [`Self::GROUP_ROWS`] values, every (row, activation) pair exactly
    /// once. Lets a caller store straight into a strided or shared output.
    ///
    /// # Panics
    /// As [`Self::pack`], when `packed` or `a` is too short for the shapes.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn run_with(
        &self,
        n: usize,
        packed: &[u8],
        rows: usize,
        a: &[u8],
        a_stride: usize,
        n_act: usize,
        mut emit: impl FnMut(usize, usize, &[f32]),
    ) {
        let at = vec_dot_type(self.weight_type());
        let arow = super::row_len(at, n).expect("gemm run: n is whole blocks");
        assert!(
            packed.len() >= self.packed_len(n, rows)
                && (n_act == 0 || a.len() >= (n_act - 1) * a_stride + arow),
            "gemm run {}: buffers too short for {rows} x {n_act} of {n}",
            self.weight_type()
        );
        let nb = n / 256;
        let group = nb * imp::block_bytes(self.q6);
        let step = imp::max_act_rows(self.vnni);
        let mut tmp = [0f32; 8 * Self::GROUP_ROWS];
        for (g, r0) in (0..rows).step_by(Self::GROUP_ROWS).enumerate() {
            let nr = (rows - r0).min(Self::GROUP_ROWS);
            for j0 in (0..n_act).step_by(step) {
                let nj = (n_act - j0).min(step);
                // SAFETY: the assert above bounds the group and the activation rows read; `gemm_kernel` checked
                // the CPU's features for this ISA.
                unsafe {
                    imp::gemm(
                        self.q6,
                        self.vnni,
                        nb,
                        packed.as_ptr().add(g * group),
                        a.as_ptr().add(j0 * a_stride),
                        a_stride,
                        nj,
                        &mut tmp,
                    )
                };
                for (jj, t) in tmp.chunks_exact(Self::GROUP_ROWS).take(nj).enumerate() {
                    emit(j0 + jj, r0, &t[..nr]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    pub(super) use crate::dot::x86::gemm::{gemm, max_act_rows, pack};

    pub(super) const fn block_bytes(q6: bool) -> usize {
        crate::dot::x86::gemm::packed_block_bytes(q6)
    }
}

/// No tiled kernel off x86: [`gemm_kernel`] returns `None`, so nothing here runs.
#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(super) const fn block_bytes(_q6: bool) -> usize {
        1
    }
    pub(super) const fn max_act_rows(_vnni: bool) -> usize {
        1
    }
    pub(super) unsafe fn pack(_: bool, _: usize, _: *const u8, _: usize, _: usize, _: *mut u8) {
        unreachable!("no tiled kernel on this architecture")
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        _: bool,
        _: bool,
        _: usize,
        _: *const u8,
        _: *const u8,
        _: usize,
        _: usize,
        _: &mut [f32],
    ) {
        unreachable!("no tiled kernel on this architecture")
    }
}
