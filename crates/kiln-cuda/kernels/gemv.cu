// The decode-path matmul (GEMV for one activation row, the same kernels for groups of up to 8 rows) on weights repacked at upload so every quant load is an aligned 16-byte vector (LDG.E.128):
//   Q4_K  native 144-byte super-blocks (already 16-byte multiples): [d, dmin, scales[12]][qs 128]
//   Q6_K  [ql 128][qh 64][scales 16] per super-block (208 bytes), the f16 `d` of every super-block after all rows
//   Q8_0  32 quants per block, the f16 `d` of every block after all rows
//   Q4_0  16 bytes of nibbles per block, then the f16 `d` of every block
//   Q4_1  16 bytes of nibbles per block, then the f16 (d, m) pair of every block
// One warp per output feature, GV_WARPS features per block; each lane owns a fixed set of 16-byte chunks of the
// weight row, sums exact integer dot products (dp4a) against the Q8 activation blocks, and adds them into one
// float accumulator per activation row in a fixed order; a fixed xor-shuffle tree then sums the lanes. So an
// output's bits depend only on its weight row and its own activation row, never on how many rows share the launch.

#define GV_WARPS 4
// Device-only constants may be overridden for a tuning run (KILN_CUDA_DEFINES, compile.rs), as may the one-row
// kernels' blocks a multiprocessor (GV_MINB1: their register budget is 65536 / (128 GV_MINB1)).
// Weight chunks whose loads a lane issues before using any (Q6_K lanes load 64 bytes a chunk, so fewer).
#ifndef GV_U
#define GV_U 4
#endif
#ifndef GV_U6
#define GV_U6 2
#endif
#ifndef GV_MINB1
#define GV_MINB1 8
#endif

__device__ __forceinline__ int4 ldg16(const void* p) {
    return __ldg((const int4*)p);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int dot16(int4 w, int4 x, int acc) {
    acc = __dp4a(w.x, x.x, acc);
    acc = __dp4a(w.y, x.y, acc);
    acc = __dp4a(w.z, x.z, acc);
    return __dp4a(w.w, x.w, acc);
}

__device__ __forceinline__ int4 nib_lo(int4 v) {
    return make_int4(v.x & 0x0F0F0F0F, v.y & 0x0F0F0F0F, v.z & 0x0F0F0F0F, v.w & 0x0F0F0F0F);
}

__device__ __forceinline__ int4 nib_hi(int4 v) {
    return make_int4((v.x >> 4) & 0x0F0F0F0F, (v.y >> 4) & 0x0F0F0F0F, (v.z >> 4) & 0x0F0F0F0F,
                     (v.w >> 4) & 0x0F0F0F0F);
}

// Byte-wise v - b (mod 256): unsigned codes to signed quants.
__device__ __forceinline__ int4 sub_bytes(int4 v, int b) {
    return make_int4(__vsub4(v.x, b), __vsub4(v.y, b), __vsub4(v.z, b), __vsub4(v.w, b));
}

__device__ __forceinline__ int byte_of(u32 w, int n) {
    return (int)((w >> (8 * n)) & 0xFF);
}

// The float part of each lane's step, with every rounding explicit (no FMA contraction): the tensor-core kernels
// for several rows (gemv16.cu) call the same functions on the same integer dots, so their bits match these.
// Q4_K, one 16-byte chunk: halves of sub-blocks j0 (lo) and j0 + 1 (hi); the min term only on the half-0 lane.
__device__ __forceinline__ float q4k_term(int lo, int hi, float dx0, float dx1, float s0, float s1, float mn0,
                                          float mn1, float sx0, float sx1, float mk) {
    float p = __fadd_rn(__fmul_rn(dx0, __fmul_rn(s0, (float)lo)), __fmul_rn(dx1, __fmul_rn(s1, (float)hi)));
    return __fadd_rn(p, __fmul_rn(mk, __fadd_rn(__fmul_rn(mn0, sx0), __fmul_rn(mn1, sx1))));
}

// Q8_0, one 32-element block: its integer dot `s`, the activation scale `dx` and the weight scale `d`.
__device__ __forceinline__ float q8_term(int s, float dx, float d) {
    return __fmul_rn(dx, __fmul_rn(d, (float)s));
}

// Q6_K, one of a lane's four 16-element pieces, added to the step's sum `p` (which starts at 0).
__device__ __forceinline__ float q6k_add(float p, int dot, float dx, float s) {
    return __fadd_rn(p, __fmul_rn(dx, __fmul_rn(s, (float)dot)));
}

// Q4_K 6-bit scale and min of sub-block j from the 12 scale bytes held in three words. Branch-free: lanes of
// one warp take different sub-blocks, and a branch on j would split the warp.
__device__ __forceinline__ void k4_sm(u32 s0, u32 s1, u32 s2, int j, int& sc, int& m) {
    int jj = j & 3;
    int a = byte_of(s0, jj), b = byte_of(s1, jj), c = byte_of(s2, jj);
    bool hi = j >= 4;
    sc = hi ? (c & 0xF) | ((a >> 6) << 4) : a & 63;
    m = hi ? (c >> 4) | ((b >> 6) << 4) : b & 63;
}

template <int R>
__device__ __forceinline__ void gv_store(float* out, float* acc, int o, int r0, int nr, int n_out, int accumulate) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < nr) {
            float v = warp_sum(acc[r]);
            if ((threadIdx.x & 31) == 0) {
                float* p = out + (long long)(r0 + r) * n_out + o;
                *p = accumulate ? *p + v : v;
            }
        }
    }
}

// Common prologue: which output feature this warp computes and which activation rows.
#define GV_PROLOGUE                                    \
    int lane = threadIdx.x & 31;                       \
    int o = blk * GV_WARPS + (threadIdx.x >> 5);        \
    if (o >= n_out) return;                            \
    int r0 = blockIdx.y * R;                           \
    int nr = min(R, n_rows - r0);                      \
    int nb = width / 32;                               \
    float acc[R];                                      \
    _Pragma("unroll") for (int r = 0; r < R; r++) acc[r] = 0.0f;

// out[r * n_out + o] (+)= W[o] . x[r] for activation rows r0..r0 + R. grid = (ceil(n_out / GV_WARPS),
// ceil(n_rows / R)), block = 32 * GV_WARPS.
template <int R>
__device__ __forceinline__ void gemv_q4k_body(int blk, float* out, const u8* w, const signed char* xq, const float* xd,
                                                const float* xs, int width, int n_out, int n_rows, int accumulate) {
    GV_PROLOGUE
    int nsb = width / 256;
    const u8* row = w + (long long)o * nsb * 144;
    int i = lane & 7;           // 16-byte chunk of the super-block's quants
    int j0 = 2 * (i >> 1);      // the chunk holds sub-blocks j0 (low nibbles) and j0 + 1 (high nibbles)
    int half = (i & 1) * 16;    // elements half..half+15 of each
    float mk = half ? 0.0f : 1.0f;
    // Loads for GV_U super-blocks per lane are issued before any is used (bytes in flight hide HBM latency);
    // the accumulation order is still ascending super-block per lane.
    for (int sb0 = lane >> 3; sb0 < nsb; sb0 += 4 * GV_U) {
        int4 hdr[GV_U], qv[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; u++) {
            int sb = sb0 + 4 * u;
            if (sb < nsb) {
                const u8* sbp = row + (long long)sb * 144;
                hdr[u] = ldg16(sbp);
                qv[u] = ldg16(sbp + 16 + 16 * i);
            }
        }
#pragma unroll
        for (int u = 0; u < GV_U; u++) {
            int sb = sb0 + 4 * u;
            if (sb >= nsb) break;
            float d = h2f((u16)(hdr[u].x & 0xFFFF)), dmin = h2f((u16)((u32)hdr[u].x >> 16));
            int sc0, m0, sc1, m1;
            k4_sm((u32)hdr[u].y, (u32)hdr[u].z, (u32)hdr[u].w, j0, sc0, m0);
            k4_sm((u32)hdr[u].y, (u32)hdr[u].z, (u32)hdr[u].w, j0 + 1, sc1, m1);
            float s0 = d * (float)sc0, s1 = d * (float)sc1;
            float mn0 = -dmin * (float)m0, mn1 = -dmin * (float)m1;
            int4 wl = nib_lo(qv[u]), wh = nib_hi(qv[u]);
            int b0 = sb * 8 + j0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    const signed char* xr = xq + (long long)(r0 + r) * width + b0 * 32 + half;
                    int lo = dot16(wl, ldg16(xr), 0);
                    int hi = dot16(wh, ldg16(xr + 32), 0);
                    long long xb = (long long)(r0 + r) * nb + b0; // even: one 8-byte load per scale pair
                    float2 dx = *(const float2*)(xd + xb), sx = *(const float2*)(xs + xb);
                    // The min term belongs to whole blocks: the half-0 lane adds it (mk = 1), the other adds 0.
                    acc[r] = __fadd_rn(acc[r], q4k_term(lo, hi, dx.x, dx.y, s0, s1, mn0, mn1, sx.x, sx.y, mk));
                }
            }
        }
    }
    gv_store<R>(out, acc, o, r0, nr, n_out, accumulate);
}

// A Q6_K lane's four pieces as signed codes: low nibbles of qa, qb and high nibbles of qa, qb (sub-blocks k = 0..3),
// each with its 2 high bits from qh at shift 2k, minus 32.
__device__ __forceinline__ void q6k_unpack(int4 qa, int4 qb, int4 qh, int4* q) {
    int4 al = nib_lo(qa), ah = nib_hi(qa), bl = nib_lo(qb), bh = nib_hi(qb);
#define Q6_HI(v, sh) (((v) >> (sh)) & 0x03030303)
    q[0] = sub_bytes(make_int4(al.x | (Q6_HI(qh.x, 0) << 4), al.y | (Q6_HI(qh.y, 0) << 4),
                               al.z | (Q6_HI(qh.z, 0) << 4), al.w | (Q6_HI(qh.w, 0) << 4)), 0x20202020);
    q[1] = sub_bytes(make_int4(bl.x | (Q6_HI(qh.x, 2) << 4), bl.y | (Q6_HI(qh.y, 2) << 4),
                               bl.z | (Q6_HI(qh.z, 2) << 4), bl.w | (Q6_HI(qh.w, 2) << 4)), 0x20202020);
    q[2] = sub_bytes(make_int4(ah.x | (Q6_HI(qh.x, 4) << 4), ah.y | (Q6_HI(qh.y, 4) << 4),
                               ah.z | (Q6_HI(qh.z, 4) << 4), ah.w | (Q6_HI(qh.w, 4) << 4)), 0x20202020);
    q[3] = sub_bytes(make_int4(bh.x | (Q6_HI(qh.x, 6) << 4), bh.y | (Q6_HI(qh.y, 6) << 4),
                               bh.z | (Q6_HI(qh.z, 6) << 4), bh.w | (Q6_HI(qh.w, 6) << 4)), 0x20202020);
#undef Q6_HI
}

// Q6_K, repacked. Each lane takes 16 values of l (half c of 32) in one half h of a super-block: elements
// 128h + 32k + 16c + t of the four sub-blocks k, from ql[64h + 16c], ql[64h + 32 + 16c] and qh[32h + 16c].
template <int R>
__device__ __forceinline__ void gemv_q6k_body(int blk, float* out, const u8* w, const signed char* xq, const float* xd,
                                                const float* xs, int width, int n_out, int n_rows, int accumulate) {
    GV_PROLOGUE
    int nsb = width / 256;
    const u8* row = w + (long long)o * nsb * 208;
    const u16* dd = (const u16*)(w + (long long)n_out * nsb * 208) + (long long)o * nsb;
    int unit = lane & 3;
    int h = unit >> 1, c = unit & 1;
    for (int sb0 = lane >> 2; sb0 < nsb; sb0 += 8 * GV_U6) {
        int4 qa_[GV_U6], qb_[GV_U6], qh_[GV_U6], sc_[GV_U6];
#pragma unroll
        for (int u = 0; u < GV_U6; u++) {
            int sb = sb0 + 8 * u;
            if (sb < nsb) {
                const u8* sbp = row + (long long)sb * 208;
                qa_[u] = ldg16(sbp + 64 * h + 16 * c);
                qb_[u] = ldg16(sbp + 64 * h + 32 + 16 * c);
                qh_[u] = ldg16(sbp + 128 + 32 * h + 16 * c);
                sc_[u] = ldg16(sbp + 192);
            }
        }
#pragma unroll
        for (int u = 0; u < GV_U6; u++) {
        int sb = sb0 + 8 * u;
        if (sb >= nsb) break;
        int4 qa = qa_[u], qb = qb_[u], qh = qh_[u], scv = sc_[u];
        float d = h2f(dd[sb]);
        // Scale bytes 8h + 2k + c for k = 0..3 (signed).
        u32 sw0 = (u32)(h ? scv.z : scv.x), sw1 = (u32)(h ? scv.w : scv.y);
        float s[4];
        s[0] = d * (float)(signed char)byte_of(sw0, c);
        s[1] = d * (float)(signed char)byte_of(sw0, 2 + c);
        s[2] = d * (float)(signed char)byte_of(sw1, c);
        s[3] = d * (float)(signed char)byte_of(sw1, 2 + c);
        int4 q[4];
        q6k_unpack(qa, qb, qh, q);
        int b0 = sb * 8 + 4 * h;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                const signed char* xr = xq + (long long)(r0 + r) * width + b0 * 32 + 16 * c;
                long long xb = (long long)(r0 + r) * nb + b0;
                float p = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) p = q6k_add(p, dot16(q[k], ldg16(xr + 32 * k), 0), xd[xb + k], s[k]);
                acc[r] = __fadd_rn(acc[r], p);
            }
        }
            }
    }
    gv_store<R>(out, acc, o, r0, nr, n_out, accumulate);
}

// Q8_0, repacked: one 32-quant block per lane per step.
template <int R>
__device__ __forceinline__ void gemv_q8_0_body(int blk, float* out, const u8* w, const signed char* xq, const float* xd,
                                                const float* xs, int width, int n_out, int n_rows, int accumulate) {
    GV_PROLOGUE
    const u8* row = w + (long long)o * nb * 32;
    const u16* dd = (const u16*)(w + (long long)n_out * nb * 32) + (long long)o * nb;
    for (int b0 = lane; b0 < nb; b0 += 32 * GV_U) {
        int4 w0[GV_U], w1[GV_U];
        u16 dh[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; u++) {
            int b = b0 + 32 * u;
            if (b < nb) {
                w0[u] = ldg16(row + b * 32);
                w1[u] = ldg16(row + b * 32 + 16);
                dh[u] = dd[b];
            }
        }
#pragma unroll
        for (int u = 0; u < GV_U; u++) {
            int b = b0 + 32 * u;
            if (b >= nb) break;
            float d = h2f(dh[u]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    const signed char* xr = xq + (long long)(r0 + r) * width + b * 32;
                    int s = dot16(w1[u], ldg16(xr + 16), dot16(w0[u], ldg16(xr), 0));
                    acc[r] = __fadd_rn(acc[r], q8_term(s, xd[(long long)(r0 + r) * nb + b], d));
                }
            }
        }
    }
    gv_store<R>(out, acc, o, r0, nr, n_out, accumulate);
}

// Q4_0 (has_min = 0) and Q4_1 (has_min = 1), repacked: one block per lane per step; byte j holds elements j
// (low nibble) and j + 16 (high nibble).
template <int R>
__device__ __forceinline__ void gemv_q4_legacy(int blk, float* out, const u8* w, const signed char* xq,
                                               const float* xd, const float* xs, int width, int n_out, int n_rows,
                                               int accumulate, int has_min) {
    GV_PROLOGUE
    const u8* row = w + (long long)o * nb * 16;
    const u16* meta = (const u16*)(w + (long long)n_out * nb * 16) + (long long)o * nb * (1 + has_min);
    for (int b0 = lane; b0 < nb; b0 += 32 * GV_U) {
        int4 qv_[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; u++)
            if (b0 + 32 * u < nb) qv_[u] = ldg16(row + (b0 + 32 * u) * 16);
#pragma unroll
        for (int u = 0; u < GV_U; u++) {
        int b = b0 + 32 * u;
        if (b >= nb) break;
        int4 qv = qv_[u];
        float d = h2f(meta[b * (1 + has_min)]);
        float m = has_min ? h2f(meta[b * 2 + 1]) : 0.0f;
        int4 lo = nib_lo(qv), hi = nib_hi(qv);
        if (!has_min) {
            lo = sub_bytes(lo, 0x08080808);
            hi = sub_bytes(hi, 0x08080808);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                const signed char* xr = xq + (long long)(r0 + r) * width + b * 32;
                int s = dot16(hi, ldg16(xr + 16), dot16(lo, ldg16(xr), 0));
                long long xb = (long long)(r0 + r) * nb + b;
                acc[r] += xd[xb] * (d * (float)s) + m * xs[xb];
            }
        }
        }
    }
    gv_store<R>(out, acc, o, r0, nr, n_out, accumulate);
}

// ---- K-quants on Q8_K-style activations ("K8": one scale per 256 elements, int8 codes, per-32 code sums) ----
// A lane's integer dots are scaled by the sub-block scales in integers and summed over the lanes that share a
// super-block (exact), so the float work is one step per super-block: f = (d dx) isum - (dmin dx) imin, added to
// the group's running sum in ascending super-block order; the groups are then added in the xor tree's pairing.
// The block kernel (gemv16.cu) computes the same integers with mma and the same float steps.

// One super-block's float step (every rounding explicit; gemv16.cu calls the same function).
__device__ __forceinline__ float k8_step(float d, float dmin, float dx, int isum, int imin) {
    return __fsub_rn(__fmul_rn(__fmul_rn(d, dx), (float)isum), __fmul_rn(__fmul_rn(dmin, dx), (float)imin));
}

// Adds lane groups in the xor tree's pairing from `first` down to `last` (powers of two) and stores lane 0's sum.
template <int R>
__device__ __forceinline__ void gv_store_groups(float* out, float* acc, int o, int r0, int nr, int n_out,
                                                int accumulate, int first, int last) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < nr) {
            float v = acc[r];
            for (int m = first; m >= last; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
            if ((threadIdx.x & 31) == 0) {
                float* p = out + (long long)(r0 + r) * n_out + o;
                *p = accumulate ? *p + v : v;
            }
        }
    }
}

// The K8 bodies (the decode path's GEMVs) issue their first round of weight loads before waiting for the kernel
// before them (programmatic dependent launch, common.cu): weights never change while kernels run, so reading them
// early is safe, and their latency overlaps the previous kernel's tail instead of following it. Everything else
// (activations, outputs) comes after the wait. ptxas hoists the wait above loads it sees as independent of it; an
// L2 prefetch (of the lane's next round, which is a memory operation it keeps in order) pins the loads before it,
// and tools/check-kernels.sh checks the SASS for that order. GV_EARLY_W=0 (KILN_CUDA_DEFINES) waits first.
#ifndef GV_EARLY_W
#define GV_EARLY_W 1
#endif
#define GV_FIRST_WEIGHTS(LOAD, NEXT)                                           \
    do {                                                                       \
        if (!GV_EARLY_W) wait_prior_kernel();                                  \
        LOAD;                                                                  \
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const void*)(NEXT)) : "memory"); \
        if (GV_EARLY_W) wait_prior_kernel();                                   \
    } while (0)

#ifndef GV_Q4K8_LANES
#define GV_Q4K8_LANES 4 // lanes a super-block in the Q4_K K8 GEMV (2 measured slower: 0.78x at 8B tg128)
#endif
static_assert(GV_Q4K8_LANES == 4 || GV_Q4K8_LANES == 2, "GV_Q4K8_LANES: 4 or 2");

// The one-row Q4_K K8 GEMV stages its activation row (codes, sums per 32, scales per 256) in shared memory once
// a block: read through L1 by every warp, the activations were 2 / 3 of the kernel's L1 traffic (a 16-byte load
// of a warp touched 16 lines for 32 bytes each), and ncu had L1 at 86 % of its peak with DRAM at 57 %. Rows up
// from GV_STAGE_MINW to GV_STAGE_MAXW wide (MAXW 0 turns it off); others read global memory as before. Same
// integers, same bits. Narrower rows lose by it (0.6B-shape tg128 1,091 -> 1,050 staging 1,024- and 3,072-wide
// rows): there the kernel is latency-bound and the copy and barrier come before any product.
#ifndef GV_STAGE_MAXW
#define GV_STAGE_MAXW 12288
#endif
#ifndef GV_STAGE_MINW
#define GV_STAGE_MINW 4096
#endif
// Launches of fewer blocks than this do not stage (a tuning knob: ncu has a one-wave launch such as the 8B's
// o-proj, 1,024 blocks, bound by one warp's chain of loads, copy, barrier and products rather than by L1; 1100,
// o-proj and down unstaged, measured 0.969x on the 8B's decode, so 0 stages every launch).
#ifndef GV_STAGE_MINBLOCKS
#define GV_STAGE_MINBLOCKS 0
#endif
#define GV_STAGE_CHUNKS ((GV_STAGE_MAXW + GV_STAGE_MAXW / 8 + GV_STAGE_MAXW / 64) / 16)
// 16-byte chunk c of the staged codes sits at chunk c ^ g(c / 8): in a shared load's phase of 8 lanes, two
// sub-groups read super-blocks 4 apart (rows 8 apart) and their lanes 64-byte pieces (rows and columns 4 apart),
// all on the same banks unless each 128-byte row is permuted by its bits 0, 3 and 4.
__device__ __forceinline__ int gv_swz(int c) {
    int row = c >> 3;
    return c ^ ((row & 1) | ((row >> 2) & 6));
}
// The Q6_K body's phase of 8 lanes: two groups on adjacent super-blocks (row bit 1), each lane a half (row bit 0)
// and a column pair; rows 0..3 of every 4 are permuted by 0, 2, 4, 6.
__device__ __forceinline__ int gv_swz6(int c) {
    return c ^ (((c >> 3) & 3) << 1);
}
// The Q6_K one-row GEMV stages its row too (GV_STAGE6=0 turns that off: 8B Q4_K_M tg128 0.987x without).
#ifndef GV_STAGE6
#define GV_STAGE6 1
#endif

// The staging buffer: one per block, shared by the Q4_K and Q6_K bodies (a function's __shared__ variable has one
// instance a block however often it is inlined).
__device__ __forceinline__ int4* gv_stage_buf() {
    __shared__ int4 buf[GV_STAGE_CHUNKS > 0 ? GV_STAGE_CHUNKS : 1]; // GV_STAGE_MAXW=0: never used
    return buf;
}

// Copies activation row r0 into `stage` as [codes (16-byte chunk c at gv_swz(c), gv_swz6(c) for Q6_K) | sums per
// 32 (not for Q6_K, which has no min term) | scales per 256], by the block's `live` threads (the warps not past
// n_out), who then meet at named barrier 1.
template <bool Q6>
__device__ __forceinline__ void gv_stage_row(int4* stage, const signed char* kq, const int* ks, const float* kd,
                                             int width, int r0, int live) {
    const int4* codes = (const int4*)(kq + (long long)r0 * width);
    // A plain loop: four loads in flight a thread before their stores measured 3.5 % slower (8B tg128).
    for (int c = threadIdx.x; c < width / 16; c += live) stage[Q6 ? gv_swz6(c) : gv_swz(c)] = ldg16(codes + c);
    if (!Q6) {
        const int4* src = (const int4*)(ks + (long long)r0 * (width / 32));
        for (int c = threadIdx.x; c < width / 128; c += live) stage[width / 16 + c] = ldg16(src + c);
    }
    float* scales = (float*)(stage + width / 16 + width / 128);
    for (int c = threadIdx.x; c < width / 256; c += live) scales[c] = kd[(long long)r0 * (width / 256) + c];
    asm volatile("bar.sync 1, %0;" ::"r"(live) : "memory");
}

// Q4_K on K8 activations (kq codes, kd scale per 256, ks int sums per 32). Group a = lane / 8 owns super-blocks
// a, a + 4, a + 8, ... and adds their float steps in ascending order, the block kernel's order (gemv16.cu), so
// the bits are its bits. Within a group, L lanes take a super-block (4 / L whole sub-block pairs, 128 / L quant
// bytes each): the per-super-block work (header, activation scale and code-sum loads, address math, shuffles) is
// paid once per 128 / L bytes. The group's S = 8 / L sub-groups take S consecutive ones of its super-blocks a
// round; a sub-group sums its integers (exact) and takes the float step of its super-block, and every lane of the
// group fetches the S steps (shuffles) and adds them in order. Rounds a loop: GV_U L / 8 (GV_U 16-byte chunks in
// flight a lane, as the other bodies). L = 4 rather than 8 lanes a super-block: 544 -> 376 SASS instructions for
// the same bytes in gemv_k8_r1's Q4_K path; 8B Q4_K_M tg128 1.044x, 0.6B 1.037x.
// A lane whose super-block is past the row reads the last one and drops its result: every lane reaches every
// shuffle, so they are whole-warp shuffles without divergence handling.
template <int R, int L, bool STAGED>
__device__ __forceinline__ void gemv_q4k8_body(int blk, float* out, const u8* w, const signed char* kq,
                                                  const float* kd, const int* ks, int width, int n_out, int n_rows,
                                                  int accumulate) {
    static_assert(!STAGED || R == 1, "one activation row is staged");
    GV_PROLOGUE
    constexpr int S = 8 / L, PP = 4 / L, U = GV_U * L / 8 > 0 ? GV_U * L / 8 : 1;
    int nsb = width / 256;
    const u8* row = w + (long long)o * nsb * 144;
    int a = lane >> 3, sg = (lane & 7) / L, p = lane % L;
    int4 hdr[U], qv[U][2 * PP];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const u8* sbp = row + (long long)min(base + a + 4 * (S * u + sg), nsb - 1) * 144;
            hdr[u] = ldg16(sbp);
#pragma unroll
            for (int c = 0; c < 2 * PP; c++) qv[u][c] = ldg16(sbp + 16 + 32 * PP * p + 16 * c);
        }
    };
    GV_FIRST_WEIGHTS(load(0), row + (long long)min(4 * S * U + a + 4 * sg, nsb - 1) * 144);
    // Staged (gv_stage_row): copied by the block's live warps; those past n_out have returned.
    int4* stage = nullptr;
    if constexpr (STAGED) stage = gv_stage_buf();
    const int* st_sums = (const int*)(stage + width / 16);
    const float* st_scales = (const float*)(stage + width / 16 + width / 128);
    if constexpr (STAGED)
        gv_stage_row<false>(stage, kq, ks, kd, width, r0, 32 * min(GV_WARPS, n_out - blk * GV_WARPS));
    for (int base = 0; base < nsb; base += 4 * S * U) {
        if (base > 0) load(base);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int first = base + 4 * S * u; // group 0's first super-block this round
            if (first >= nsb) break;      // warp-uniform
            int sb = min(first + a + 4 * sg, nsb - 1);
            float d = h2f((u16)(hdr[u].x & 0xFFFF)), dmin = h2f((u16)((u32)hdr[u].x >> 16));
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    const signed char* xs = kq + (long long)(r0 + r) * width + sb * 256;
                    const int* kr = ks + (long long)(r0 + r) * nb + sb * 8;
                    int is = 0, im = 0;
#pragma unroll
                    for (int q = 0; q < PP; q++) {
                        int j0 = 2 * (PP * p + q);
                        int sc0, m0, sc1, m1;
                        k4_sm((u32)hdr[u].y, (u32)hdr[u].z, (u32)hdr[u].w, j0, sc0, m0);
                        k4_sm((u32)hdr[u].y, (u32)hdr[u].z, (u32)hdr[u].w, j0 + 1, sc1, m1);
                        int4 q0 = qv[u][2 * q], q1 = qv[u][2 * q + 1];
                        int4 x[4];
                        int2 sm;
                        if constexpr (STAGED) {
#pragma unroll
                            for (int k = 0; k < 4; k++) x[k] = stage[gv_swz(16 * sb + 2 * j0 + k)];
                            sm = *(const int2*)(st_sums + sb * 8 + j0);
                        } else {
#pragma unroll
                            for (int k = 0; k < 4; k++) x[k] = ldg16(xs + j0 * 32 + 16 * k);
                            sm = *(const int2*)(kr + j0);
                        }
                        int lo = dot16(nib_lo(q1), x[1], dot16(nib_lo(q0), x[0], 0));
                        int hi = dot16(nib_hi(q1), x[3], dot16(nib_hi(q0), x[2], 0));
                        is += sc0 * lo + sc1 * hi;
                        im += m0 * sm.x + m1 * sm.y;
                    }
#pragma unroll
                    for (int m = 1; m < L; m <<= 1) {
                        is += __shfl_xor_sync(0xffffffffu, is, m);
                        im += __shfl_xor_sync(0xffffffffu, im, m);
                    }
                    float dx = STAGED ? st_scales[sb] : kd[(long long)(r0 + r) * nsb + sb];
                    float own = k8_step(d, dmin, dx, is, im);
#pragma unroll
                    for (int t = 0; t < S; t++) {
                        float step = __shfl_sync(0xffffffffu, own, (lane & ~7) + L * t);
                        if (first + a + 4 * t < nsb) acc[r] = __fadd_rn(acc[r], step);
                    }
                }
            }
        }
    }
    gv_store_groups<R>(out, acc, o, r0, nr, n_out, accumulate, 16, 8);
}

// Q6_K on K8 activations. Lanes as gemv_q6k_body: group G = lane / 4 takes super-blocks G, G + 8, ...; unit
// u = lane % 4 its quarter. Per super-block and row: isum = sum over k of sc(8h + 2k + c) dot_k, summed over the
// group's 4 lanes; no min term (dmin = 0).
template <int R, bool STAGED>
__device__ __forceinline__ void gemv_q6k8_body(int blk, float* out, const u8* w, const signed char* kq,
                                                 const float* kd, const int* ks, int width, int n_out, int n_rows,
                                                 int accumulate) {
    static_assert(!STAGED || R == 1, "one activation row is staged");
    GV_PROLOGUE
    (void)ks;
    int nsb = width / 256;
    const u8* row = w + (long long)o * nsb * 208;
    const u16* dd = (const u16*)(w + (long long)n_out * nsb * 208) + (long long)o * nsb;
    int unit = lane & 3;
    int h = unit >> 1, c = unit & 1;
    // As gemv_q4k8_body: the warp walks the super-blocks together, so the group shuffles are whole-warp ones.
    int4 qa_[GV_U6], qb_[GV_U6], qh_[GV_U6], sc_[GV_U6];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < GV_U6; u++) {
            const u8* sbp = row + (long long)min(base + (lane >> 2) + 8 * u, nsb - 1) * 208;
            qa_[u] = ldg16(sbp + 64 * h + 16 * c);
            qb_[u] = ldg16(sbp + 64 * h + 32 + 16 * c);
            qh_[u] = ldg16(sbp + 128 + 32 * h + 16 * c);
            sc_[u] = ldg16(sbp + 192);
        }
    };
    GV_FIRST_WEIGHTS(load(0), row + (long long)min(8 * GV_U6 + (lane >> 2), nsb - 1) * 208);
    int4* stage = nullptr;
    if constexpr (STAGED) stage = gv_stage_buf();
    const float* st_scales = (const float*)(stage + width / 16 + width / 128);
    if constexpr (STAGED)
        gv_stage_row<true>(stage, kq, ks, kd, width, r0, 32 * min(GV_WARPS, n_out - blk * GV_WARPS));
    for (int base = 0; base < nsb; base += 8 * GV_U6) {
        if (base > 0) load(base);
#pragma unroll
        for (int u = 0; u < GV_U6; u++) {
            if (base + 8 * u >= nsb) break; // no group has a super-block here (warp-uniform)
            int sb = base + (lane >> 2) + 8 * u;
            bool valid = sb < nsb;
            sb = min(sb, nsb - 1);
            int4 qa = qa_[u], qb = qb_[u], qh = qh_[u], scv = sc_[u];
            float d = h2f(dd[sb]);
            u32 sw0 = (u32)(h ? scv.z : scv.x), sw1 = (u32)(h ? scv.w : scv.y);
            int s[4] = {(signed char)byte_of(sw0, c), (signed char)byte_of(sw0, 2 + c),
                        (signed char)byte_of(sw1, c), (signed char)byte_of(sw1, 2 + c)};
            int4 q[4];
            q6k_unpack(qa, qb, qh, q);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    const signed char* xr = kq + (long long)(r0 + r) * width + sb * 256 + 128 * h + 16 * c;
                    int is = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        int4 x = STAGED ? stage[gv_swz6(16 * sb + 8 * h + c + 2 * k)] : ldg16(xr + 32 * k);
                        is += s[k] * dot16(q[k], x, 0);
                    }
                    is += __shfl_xor_sync(0xffffffffu, is, 1);
                    is += __shfl_xor_sync(0xffffffffu, is, 2);
                    float dx = STAGED ? st_scales[sb] : kd[(long long)(r0 + r) * nsb + sb];
                    if (valid) acc[r] = __fadd_rn(acc[r], k8_step(d, 0.0f, dx, is, 0));
                }
            }
        }
    }
    gv_store_groups<R>(out, acc, o, r0, nr, n_out, accumulate, 16, 4);
}

// Pseudo type ids for K-quant weights read against K8 activations (the xq/xd/xs arguments then carry kq, kd, ks).
#define K8_Q4_K (T_Q4_K + 1000)
#define K8_Q6_K (T_Q6_K + 1000)

// ggml type ids the GEMV bodies handle (as in quant.cu). K8 kernels are separate instantiations (the K8 bodies
// would otherwise share the one-row kernel's 64-register budget with the per-32 ones).
template <int R, bool K8>
__device__ __forceinline__ void gemv_dispatch(int ty, int blk, float* out, const u8* w, const signed char* xq,
                                              const float* xd, const float* xs, int width, int n_out, int n_rows,
                                              int accumulate) {
    if constexpr (K8) {
        if (ty == K8_Q4_K) {
            // Only the one-row kernels instantiate the staged body (and so hold its shared memory).
            if constexpr (R == 1 && GV_STAGE_MAXW > 0) {
                if (width >= GV_STAGE_MINW && width <= GV_STAGE_MAXW && gridDim.x >= GV_STAGE_MINBLOCKS) {
                    gemv_q4k8_body<1, GV_Q4K8_LANES, true>(blk, out, w, xq, xd, (const int*)xs, width, n_out,
                                                            n_rows, accumulate);
                    return;
                }
            }
            gemv_q4k8_body<R, GV_Q4K8_LANES, false>(blk, out, w, xq, xd, (const int*)xs, width, n_out, n_rows,
                                                     accumulate);
        }
        if (ty == K8_Q6_K) {
            if constexpr (R == 1 && GV_STAGE_MAXW > 0 && GV_STAGE6) {
                if (width >= GV_STAGE_MINW && width <= GV_STAGE_MAXW && gridDim.x >= GV_STAGE_MINBLOCKS) {
                    gemv_q6k8_body<1, true>(blk, out, w, xq, xd, (const int*)xs, width, n_out, n_rows, accumulate);
                    return;
                }
            }
            gemv_q6k8_body<R, false>(blk, out, w, xq, xd, (const int*)xs, width, n_out, n_rows, accumulate);
        }
        return;
    }
    switch (ty) {
    case T_Q4_K: gemv_q4k_body<R>(blk, out, w, xq, xd, xs, width, n_out, n_rows, accumulate); break;
    case T_Q6_K: gemv_q6k_body<R>(blk, out, w, xq, xd, xs, width, n_out, n_rows, accumulate); break;
    case T_Q8_0: gemv_q8_0_body<R>(blk, out, w, xq, xd, xs, width, n_out, n_rows, accumulate); break;
    case T_Q4_0: gemv_q4_legacy<R>(blk, out, w, xq, xd, xs, width, n_out, n_rows, accumulate, 0); break;
    case T_Q4_1: gemv_q4_legacy<R>(blk, out, w, xq, xd, xs, width, n_out, n_rows, accumulate, 1); break;
    default: break;
    }
}

// One block's share of out (+)= W . x. The K8 bodies wait for the kernel before them themselves, after their
// first weight loads (GV_FIRST_WEIGHTS); the others wait first, as every kernel does.
template <int R, bool K8>
__device__ __forceinline__ void gemv_block(Job j, const signed char* xq, const float* xd, const float* xs, int width,
                                           int n_rows, int accumulate) {
    if (!K8) wait_prior_kernel();
    gemv_dispatch<R, K8>(j.ty, j.tile, j.out, j.w, xq, xd, xs, width, j.n_out, n_rows, accumulate);
}

// out (+)= W . x for one repacked weight of type `ty`, activation rows in groups of R. The one-row kernel is
// held to 64 registers (8 blocks, 32 warps an SM: bytes in flight are what a memory-bound GEMV needs); every
// instantiation runs the same per-row arithmetic, so a row's bits do not depend on which one computed it.
#define GEMV_KERNEL(NAME, R, MINB, K8)                                                                          \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                    \
        NAME(int ty, float* out, const u8* w, const signed char* xq, const float* xd, const float* xs, int width, \
             int n_out, int n_rows, int accumulate, L2PF_ARGS) {                                              \
        l2_prefetch_share(pf0, pn0, pf1, pn1);                                                                 \
        gemv_block<R, K8>(Job{ty, out, w, n_out, (int)blockIdx.x}, xq, xd, xs, width, n_rows, accumulate);     \
    }
GEMV_KERNEL(gemv_r1, 1, GV_MINB1, false)
GEMV_KERNEL(gemv_r8, 8, 4, false)
GEMV_KERNEL(gemv_k8_r1, 1, GV_MINB1, true)
GEMV_KERNEL(gemv_k8_r8, 8, 4, true)

// Up to three weights that read the same activations (Q/K/V, gate/up) in one launch (JOB_ARGS, common.cu).
// Both forms issue the L2 prefetch the host attached to the launch (l2_prefetch_share) before anything else.
#define GEMV3_KERNEL(NAME, R, MINB, K8)                                                                         \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                    \
        NAME(const signed char* xq, const float* xd, const float* xs, int width, int n_rows, int accumulate,    \
             JOB_ARGS) {                                                                                        \
        l2_prefetch_share(pf0, pn0, pf1, pn1);                                                                 \
        gemv_block<R, K8>(JOB_PICK, xq, xd, xs, width, n_rows, accumulate);                                    \
    }
GEMV3_KERNEL(gemv3_r1, 1, GV_MINB1, false)
GEMV3_KERNEL(gemv3_r8, 8, 4, false)
GEMV3_KERNEL(gemv3_k8_r1, 1, GV_MINB1, true)
GEMV3_KERNEL(gemv3_k8_r8, 8, 4, true)
