//! CPU KV cache storage and causal attention.
//!
//! Layout: for each of K and V, one contiguous array indexed `[layer][slot][pos][kv_head][head_dim]`, in f32 or
//! f16. A slot's positions are contiguous so a query's scan over `0..=pos` reads one linear run per kv head.
//!
//! Attention runs one task per (row, kv head), covering the query heads that share it; per query head: scores `q·k_t · scale` for `t = 0..=pos` in order, a max-shifted
//! softmax summed in order, then `Σ p_t v_t` in order. Nothing depends on the other rows of the batch, so a row
//! gets the same bits alone, in a decode batch or in a prefill chunk (batch invariance).

use super::{CpuBackend, MAX_HEAD_DIM};
use crate::backend::{AttnParams, AttnRow, BlockAttn, KvLayout, KvType};
use crate::error::{Error, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::cell::RefCell;

/// KV element storage.
enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// The CPU KV cache (see the module docs for the layout).
pub struct CpuKv {
    layout: KvLayout,
    k: KvData,
    v: KvData,
}

impl CpuKv {
    pub(crate) fn new(layout: &KvLayout) -> Result<CpuKv> {
        let n = layout
            .n_layer
            .checked_mul(layout.n_slots)
            .and_then(|x| x.checked_mul(layout.slot_ctx))
            .and_then(|x| x.checked_mul(layout.n_head_kv * layout.head_dim))
            .ok_or_else(|| Error::Config(format!("KV cache {layout:?} overflows")))?;
        let make = || match layout.ty {
            KvType::F32 => KvData::F32(vec![0.0; n]),
            KvType::F16 => KvData::F16(vec![f16::ZERO; n]),
        };
        Ok(CpuKv {
            layout: *layout,
            k: make(),
            v: make(),
        })
    }

    /// Element offset of `(layer, slot, pos)`.
    fn offset(&self, layer: usize, slot: usize, pos: usize) -> usize {
        let l = &self.layout;
        ((layer * l.n_slots + slot) * l.slot_ctx + pos) * l.n_head_kv * l.head_dim
    }
}

fn store(dst: &mut KvData, off: usize, src: &[f32]) {
    match dst {
        KvData::F32(d) => d[off..off + src.len()].copy_from_slice(src),
        KvData::F16(d) => d[off..off + src.len()].convert_from_f32_slice(src),
    }
}

/// Stores row `i`'s K and V at `(rows[i].slot, rows[i].pos)` of layer `layer` (positions already checked).
fn store_rows(kv: &mut CpuKv, layer: usize, k: &[f32], v: &[f32], rows: &[AttnRow], kvd: usize) {
    for (i, r) in rows.iter().enumerate() {
        let off = kv.offset(layer, r.slot, r.pos);
        store(&mut kv.k, off, &k[i * kvd..(i + 1) * kvd]);
        store(&mut kv.v, off, &v[i * kvd..(i + 1) * kvd]);
    }
}

/// [`crate::backend::Backend::kv_store`] on the CPU.
pub(crate) fn kv_store(
    kv: &mut CpuKv,
    layer: usize,
    k: &[f32],
    v: &[f32],
    rows: &[AttnRow],
) -> Result<()> {
    let l = kv.layout;
    let kvd = l.n_head_kv * l.head_dim;
    if layer >= l.n_layer || k.len() < rows.len() * kvd || v.len() < rows.len() * kvd {
        return Err(Error::Batch(format!(
            "kv_store of {} rows into layer {layer} of {l:?}: buffers too small or no such layer",
            rows.len()
        )));
    }
    if let Some(r) = rows
        .iter()
        .find(|r| r.slot >= l.n_slots || r.pos >= l.slot_ctx)
    {
        return Err(Error::ContextFull {
            slot: r.slot,
            pos: r.pos,
            n_ctx: l.slot_ctx,
        });
    }
    store_rows(kv, layer, k, v, rows, kvd);
    Ok(())
}

/// Reads `buf.len()` elements at `off` as f32.
#[inline(always)]
fn load<'a>(src: &'a KvData, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
    match src {
        KvData::F32(d) => &d[off..off + buf.len()],
        KvData::F16(d) => {
            d[off..off + buf.len()].convert_to_f32_slice(buf);
            buf
        }
    }
}

/// [`load`] with f16 rows widened 8 at a time by `vcvtph2ps`, instead of the `half` crate's conversion that
/// re-checks CPU features on every call (~5% of a Q4_K prefill was spent there). f16 to f32 is exact, so the
/// bits are those of [`load`].
///
/// # Safety
/// The CPU must support F16C and AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_f16c<'a>(src: &'a KvData, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
    match src {
        KvData::F32(d) => &d[off..off + buf.len()],
        KvData::F16(d) => {
            // SAFETY: F16C/AVX2 guaranteed by the caller.
            unsafe { widen_f16c(&d[off..off + buf.len()], buf) };
            buf
        }
    }
}

/// `dst[i] = src[i]` as f32. A separate feature-enabled function (not inlined into generic code) so the
/// conversion intrinsics inline into it: inlined into code without the features they stay calls.
///
/// # Safety
/// The CPU must support F16C and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: elements i..i+8 are in bounds of both slices.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for (o, h) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *o = h.to_f32();
    }
}

/// A dot product with sixteen independent accumulators (vectorizes to two AVX registers or one AVX-512
/// register; fixed order, so the same inputs always give the same bits).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let ca = a.chunks_exact(L);
    let cb = b.chunks_exact(L);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    // Pairwise tree over the lanes.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0] + s
}

/// Most query heads per kv head (GQA group) the CPU attention supports.
pub(crate) const MAX_GROUP: usize = 64;

thread_local! {
    /// Per-thread score buffer, grown to the longest context seen, so attention allocates nothing per token.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    be: &CpuBackend,
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv: &mut CpuKv,
    layer: usize,
    rows: &[AttnRow],
    visible: Option<(usize, BlockAttn)>,
    p: &AttnParams,
) -> Result<()> {
    let l = kv.layout;
    let hd = p.head_dim;
    let kvd = p.n_head_kv * hd;
    let qd = p.n_head * hd;
    if hd != l.head_dim
        || p.n_head_kv != l.n_head_kv
        || layer >= l.n_layer
        || hd > MAX_HEAD_DIM
        || !p.n_head.is_multiple_of(p.n_head_kv)
        || p.n_head / p.n_head_kv > MAX_GROUP
    {
        return Err(Error::Batch(format!(
            "attention parameters {p:?} (layer {layer}) do not match the KV cache {l:?}"
        )));
    }
    let n = rows.len();
    if q.len() < n * qd || k.len() < n * kvd || v.len() < n * kvd || out.len() < n * qd {
        return Err(Error::Batch("attention buffers too small".into()));
    }
    for r in rows {
        if r.slot >= l.n_slots || r.pos >= l.slot_ctx {
            return Err(Error::ContextFull {
                slot: r.slot,
                pos: r.pos,
                n_ctx: l.slot_ctx,
            });
        }
        if visible.is_some_and(|(n, _)| {
            r.pos >= n || n > l.slot_ctx || rows.last().map(|l| l.pos + 1) != Some(n)
        }) {
            return Err(Error::Batch(format!(
                "attention over {visible:?} positions for a row at {} of a {}-position slot",
                r.pos, l.slot_ctx
            )));
        }
    }
    // 1. Store every row's K and V first, so a row sees the earlier rows of its own chunk.
    store_rows(kv, layer, k, v, rows, kvd);
    // 2. One task per (row, kv head): the query heads sharing that kv head are computed together, so each
    //    K/V row is loaded (and converted from f16) once per group instead of once per query head. Each query
    //    head's arithmetic is the same as if it ran alone.
    let group = p.n_head / p.n_head_kv;
    let task = Task {
        q,
        rows,
        visible,
        kv: &*kv,
        layer,
        p,
        group,
        hd,
        kvd,
        qd,
        prefetch: be.flags.cpu_attn_prefetch,
    };
    #[cfg(target_arch = "x86_64")]
    let wide = be.isa != kiln_quant::dot::Isa::Scalar
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("f16c");
    be.pool.install(|| {
        out[..n * qd]
            .par_chunks_mut(group * hd)
            .enumerate()
            .for_each(|(i, o)| {
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: AVX2 support was detected above.
                    unsafe { run_avx2(&task, i, o) };
                    return;
                }
                task.run::<false>(i, o);
            })
    });
    Ok(())
}

/// Everything one attention task reads.
struct Task<'a> {
    q: &'a [f32],
    rows: &'a [AttnRow],
    /// One past the block's last position and what its rows see; `None`: causal (`0..=pos`).
    visible: Option<(usize, BlockAttn)>,
    kv: &'a CpuKv,
    layer: usize,
    p: &'a AttnParams,
    group: usize,
    hd: usize,
    kvd: usize,
    qd: usize,
    /// The AVX2 kernels prefetch K/V rows ahead ([`Flags::cpu_attn_prefetch`](crate::Flags)).
    prefetch: bool,
}

impl Task<'_> {
    /// Task `i` = (row `i / n_head_kv`, kv head `i % n_head_kv`), writing that group's heads to `o`.
    /// `F16C`: f16 K/V rows are widened with [`load_f16c`] (only from [`run_avx2`]).
    #[inline(always)]
    fn run<const F16C: bool>(&self, i: usize, o: &mut [f32]) {
        let Task {
            q,
            rows,
            visible: t_visible,
            kv: kv_ref,
            layer,
            p,
            group,
            hd,
            kvd,
            qd,
            prefetch: _,
        } = *self;
        let (ri, kh) = (i / p.n_head_kv, i % p.n_head_kv);
        let row = rows[ri];
        let q0 = ri * qd + kh * group * hd;
        let qs = &q[q0..q0 + group * hd];
        let (lo, len) = span(t_visible, row.pos);
        let base = kv_ref.offset(layer, row.slot, lo) + kh * hd;
        let mut tmp = [0f32; MAX_HEAD_DIM];
        let tmp = &mut tmp[..hd];
        // The buffer is taken out of the thread-local for the duration, not used inside `SCORES.with`'s closure:
        // a closure does not get the target features of the function it sits in, so inside one the AVX2
        // build's vector code stayed calls to the intrinsics (measured: over half of a prefill's time).
        let mut s = SCORES.with(|s| s.take());
        if s.len() < group * len {
            s.resize(group * len, 0.0);
        }
        {
            // scores[g * len + t]: query head g of the group against position t.
            let scores = &mut s[..group * len];
            for t in 0..len {
                let kt = load_row::<F16C>(&kv_ref.k, base + t * kvd, tmp);
                for g in 0..group {
                    scores[g * len + t] = dot(&qs[g * hd..(g + 1) * hd], kt) * p.scale;
                }
            }
            let mut inv = [0f32; MAX_GROUP];
            for g in 0..group {
                let sg = &mut scores[g * len..(g + 1) * len];
                let max = sg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for sc in sg.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                inv[g] = 1.0 / sum;
            }
            o.fill(0.0);
            for t in 0..len {
                let vt = load_row::<F16C>(&kv_ref.v, base + t * kvd, tmp);
                for g in 0..group {
                    let w = scores[g * len + t];
                    for (od, &vd) in o[g * hd..(g + 1) * hd].iter_mut().zip(vt) {
                        *od += w * vd;
                    }
                }
            }
            for g in 0..group {
                for od in o[g * hd..(g + 1) * hd].iter_mut() {
                    *od *= inv[g];
                }
            }
        }
        SCORES.with(|c| c.replace(s));
    }
}

/// The first position a row at `pos` sees and how many it sees.
#[inline(always)]
fn span(visible: Option<(usize, BlockAttn)>, pos: usize) -> (usize, usize) {
    let (lo, hi) = match visible {
        None => (0, pos + 1),
        Some((end, attn)) => attn.span(pos, end),
    };
    (lo, hi - lo)
}

/// [`load`], or [`load_f16c`] when `F16C` (set only by [`run_avx2`], whose caller checked the CPU).
#[inline(always)]
fn load_row<'a, const F16C: bool>(src: &'a KvData, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: `F16C` is true only inside `run_avx2`, entered after F16C and AVX2 were detected.
        return unsafe { load_f16c(src, off, buf) };
    }
    load(src, off, buf)
}

/// [`Task::run`] compiled for AVX2 and F16C: the same code and the same operation order (Rust never contracts a
/// multiply and an add into an FMA), so the bits equal the portable build's, only the vectors are wider.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn run_avx2(t: &Task, i: usize, o: &mut [f32]) {
    macro_rules! tiled {
        ($g:literal) => {
            match (&t.kv.k, &t.kv.v) {
                (KvData::F16(k), KvData::F16(v)) => x86::run::<$g, _>(t, i, o, k, v),
                (KvData::F32(k), KvData::F32(v)) => x86::run::<$g, _>(t, i, o, k, v),
                _ => t.run::<true>(i, o),
            }
        };
    }
    // Head widths of whole 16-lane chunks take the explicit kernels; the rest the compiled generic code.
    if !t.hd.is_multiple_of(16) {
        return t.run::<true>(i, o);
    }
    match t.group {
        1 => tiled!(1),
        2 => tiled!(2),
        3 => tiled!(3),
        4 => tiled!(4),
        8 => tiled!(8),
        _ => t.run::<true>(i, o),
    }
}

/// [`Task::run`] written with AVX2 intrinsics for head widths of whole 16-element chunks and GQA groups of
/// `G`: each K row is widened once (in registers) for the group's `G` dot products, and each 64-wide slice of a
/// head's output stays in registers over all positions instead of being loaded and stored per position. Every
/// element goes through the operations of [`Task::run`] in the same order (the 16-lane `dot` with its pairwise
/// tree, separate multiply and add, the same softmax code), so the bits are the portable build's, which the
/// tests check.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Task, SCORES};
    use half::f16;
    use std::arch::x86_64::*;

    /// A K/V element type the kernels widen to f32.
    pub(super) trait Elem: Copy {
        /// 8 elements at `p` as f32 (exact).
        unsafe fn load8(p: *const Self) -> __m256;
    }
    impl Elem for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        }
    }
    impl Elem for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
    }

    /// Positions ahead of the one multiplied whose K and V rows are prefetched.
    const PREFETCH_AHEAD: usize = 8;

    /// Prefetches the cache lines of the `bytes` at `p` (a K or V head row, not always line-aligned) into L1.
    #[inline(always)]
    unsafe fn prefetch_row(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast());
            o += 64;
        }
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes - 1).cast());
    }

    /// `dot`'s pairwise tree over 16 lanes held as (lanes 0..8, lanes 8..16), plus its (empty) remainder sum.
    #[inline(always)]
    unsafe fn tree(a0: __m256, a1: __m256) -> f32 {
        let a = _mm256_add_ps(a0, a1);
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        let d = _mm_add_ss(c, _mm_movehdup_ps(c));
        _mm_cvtss_f32(d) + 0.0
    }

    /// # Safety
    /// AVX2 and F16C (checked by `run_avx2`'s caller); `t.hd` a multiple of 16 and `t.group == G`; `k`/`v` the
    /// cache's K and V arrays.
    #[inline(always)]
    pub(super) unsafe fn run<const G: usize, E: Elem>(
        t: &Task,
        i: usize,
        o: &mut [f32],
        k: &[E],
        v: &[E],
    ) {
        let Task {
            q,
            rows,
            visible: t_visible,
            kv,
            layer,
            p,
            hd,
            kvd,
            qd,
            ..
        } = *t;
        let (ri, kh) = (i / p.n_head_kv, i % p.n_head_kv);
        let row = rows[ri];
        let q0 = ri * qd + kh * G * hd;
        let qs = &q[q0..q0 + G * hd];
        let (lo, len) = super::span(t_visible, row.pos);
        let base = kv.offset(layer, row.slot, lo) + kh * hd;
        // The last row read: every K/V access below stays under it.
        assert!(base + (len - 1) * kvd + hd <= k.len().min(v.len()) && o.len() >= G * hd);
        // Out of the thread-local, as in `Task::run`: inside `SCORES.with`'s closure the intrinsics would not
        // inline.
        let mut s = SCORES.with(|s| s.take());
        if s.len() < G * len {
            s.resize(G * len, 0.0);
        }
        {
            let scores = &mut s[..G * len];
            // A row's K and V lie `kvd` elements apart per position, and across a pass the cache is read from
            // memory (the weights streamed in between evict it): fetch a few positions ahead, V too, which
            // the second loop reads.
            let row_bytes = hd * std::mem::size_of::<E>();
            let ahead = if t.prefetch { PREFETCH_AHEAD } else { 0 };
            for tt in 0..len.min(ahead) {
                prefetch_row(k.as_ptr().add(base + tt * kvd).cast(), row_bytes);
                prefetch_row(v.as_ptr().add(base + tt * kvd).cast(), row_bytes);
            }
            for tt in 0..len {
                let kt = k.as_ptr().add(base + tt * kvd);
                if ahead > 0 && tt + ahead < len {
                    let at = base + (tt + ahead) * kvd;
                    prefetch_row(k.as_ptr().add(at).cast(), row_bytes);
                    prefetch_row(v.as_ptr().add(at).cast(), row_bytes);
                }
                let mut acc = [[_mm256_setzero_ps(); 2]; G];
                for c in (0..hd).step_by(16) {
                    let k0 = E::load8(kt.add(c));
                    let k1 = E::load8(kt.add(c + 8));
                    for (g, a) in acc.iter_mut().enumerate() {
                        let qg = qs.as_ptr().add(g * hd + c);
                        a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(_mm256_loadu_ps(qg), k0));
                        a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(_mm256_loadu_ps(qg.add(8)), k1));
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    scores[g * len + tt] = tree(a[0], a[1]) * p.scale;
                }
            }
            let mut inv = [0f32; G];
            for (g, inv) in inv.iter_mut().enumerate() {
                let sg = &mut scores[g * len..(g + 1) * len];
                let max = sg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for sc in sg.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                *inv = 1.0 / sum;
            }
            for g in 0..G {
                let sg = &scores[g * len..(g + 1) * len];
                let invg = _mm256_set1_ps(inv[g]);
                for d0 in (0..hd).step_by(64) {
                    let nv = ((hd - d0) / 8).min(8);
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for (tt, &w) in sg.iter().enumerate() {
                        let vt = v.as_ptr().add(base + tt * kvd + d0);
                        let w = _mm256_set1_ps(w);
                        for (j, a) in acc.iter_mut().enumerate().take(nv) {
                            *a = _mm256_add_ps(*a, _mm256_mul_ps(w, E::load8(vt.add(8 * j))));
                        }
                    }
                    for (j, a) in acc.iter().enumerate().take(nv) {
                        let dst = o.as_mut_ptr().add(g * hd + d0 + 8 * j);
                        _mm256_storeu_ps(dst, _mm256_mul_ps(*a, invg));
                    }
                }
            }
        }
        SCORES.with(|c| c.replace(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Flags;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Runs a 7-row prefill of one slot; returns the attention output.
    fn run(flags: Flags, ty: KvType, p: &AttnParams) -> Vec<f32> {
        run_rows(flags, ty, p, 7)
    }

    /// Runs an `n`-row prefill of one slot; returns the attention output.
    fn run_rows(flags: Flags, ty: KvType, p: &AttnParams, n: usize) -> Vec<f32> {
        let be = CpuBackend::new(2, flags).unwrap();
        let mut kv = CpuKv::new(&KvLayout {
            n_layer: 1,
            n_slots: 2,
            slot_ctx: n.max(16),
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            ty,
        })
        .unwrap();
        let q = rand_vec(n * p.n_head * p.head_dim, 1);
        let k = rand_vec(n * p.n_head_kv * p.head_dim, 2);
        let v = rand_vec(n * p.n_head_kv * p.head_dim, 3);
        let rows: Vec<AttnRow> = (0..n).map(|pos| AttnRow { slot: 1, pos }).collect();
        let mut out = vec![f32::NAN; n * p.n_head * p.head_dim];
        attention(&be, &mut out, &q, &k, &v, &mut kv, 0, &rows, None, p).unwrap();
        out
    }

    /// The explicit AVX2 kernels (head widths of whole 16-lane chunks, groups 1..=4 and 8) give the portable
    /// build's bits, for both KV types, widths with a partial 64-wide output slice, and long rows; with their
    /// K/V prefetch and without it (KILN_NO_CPU_ATTN_PREFETCH).
    #[test]
    fn explicit_simd_kernels_give_the_portable_bits() {
        for (n_head, n_head_kv, head_dim) in [
            (4, 2, 128),
            (9, 3, 64),
            (3, 3, 32),
            (8, 1, 48),
            (16, 4, 80),
            (10, 2, 16),
        ] {
            let p = AttnParams {
                n_head,
                n_head_kv,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
            };
            for ty in [KvType::F32, KvType::F16] {
                let fast = run_rows(Flags::default(), ty, &p, 70);
                let scalar = run_rows(Flags::reference(), ty, &p, 70);
                assert!(fast.iter().all(|x| x.is_finite()), "unwritten output");
                let no_prefetch = Flags {
                    cpu_attn_prefetch: false,
                    ..Flags::default()
                };
                let plain: Vec<u32> = run_rows(no_prefetch, ty, &p, 70)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                let bits: Vec<u32> = fast.iter().map(|x| x.to_bits()).collect();
                assert_eq!(bits, plain, "{p:?} {ty:?}: without the prefetch");
                for (i, (f, s)) in fast.iter().zip(&scalar).enumerate() {
                    assert_eq!(
                        f.to_bits(),
                        s.to_bits(),
                        "{p:?} {ty:?} element {i}: {f} vs {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_build_gives_the_same_bits_and_matches_a_naive_softmax() {
        let p = AttnParams {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 40,
            scale: 0.3,
        };
        for ty in [KvType::F32, KvType::F16] {
            let fast = run(Flags::default(), ty, &p);
            let scalar = run(Flags::reference(), ty, &p);
            assert!(fast.iter().all(|x| x.is_finite()), "unwritten output");
            let fb: Vec<u32> = fast.iter().map(|x| x.to_bits()).collect();
            let sb: Vec<u32> = scalar.iter().map(|x| x.to_bits()).collect();
            assert_eq!(fb, sb, "{ty:?}");
        }
        // Row 0 attends only to itself: its output is exactly v[0] of its kv head (up to rounding).
        let out = run(Flags::default(), KvType::F32, &p);
        let v = rand_vec(7 * 2 * 40, 3);
        for h in 0..6 {
            let kh = h / 3;
            for d in 0..40 {
                assert!((out[h * 40 + d] - v[kh * 40 + d]).abs() < 1e-6);
            }
        }
    }
}
