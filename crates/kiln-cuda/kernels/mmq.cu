// The prefill matmul: int8 tensor cores (mma.sync, s8 x s8 -> s32) on Q8 activation blocks against weights in
// the GEMV layout (gemv.cu's header). Two families: mmq_body (Q4_K / Q6_K on per-32 activations, decoded to int8 in
// shared memory one 256-element slice at a time) and the pipelined bodies further down (K-quants on K8, Q8_0).
//
// mmq_body: a 32-element block contributes t = dx * (s_lo * lo + s_hi * hi) + mn * sx, where lo/hi are the exact integer
// dots of its two 16-element halves, dx/sx the activation block's scale and scale * sum, s_lo/s_hi the weight's
// half scales (equal for Q4_K; Q6_K has one per 16) and mn the weight block's offset (Q4_K's -dmin * m).
// Each output is acc += t over the blocks in ascending order, so a row's result depends only on its own data,
// never on the tile it shares (rows of one prefill are independent of what else is in the call). The bits differ
// from the decode-path GEMV's (a different float order), which is why only prefill passes use this kernel.
//
// Tile: 64 activation rows x 64 outputs per block of 4 warps; warp w takes rows 32 * (w >> 1) .. + 32 and
// outputs 32 * (w & 1) .. + 32 (2 x 4 fragments of 16 x 8). Shared rows are padded to 272 bytes so the
// fragment loads (lanes 4g + t at row g, column 4t) hit 32 distinct banks.

#define MQ_BM 64
#define MQ_BN 64
#define MQ_K 256
#define MQ_LD 272
// Row strides of the per-row / per-output scale arrays, padded so a warp's reads spread over the banks.
#define MQ_XS 9
#define MQ_SC 17
#define MQ_MN 9
// The pipelined bodies skip the products of rows past a tile's last (the MoE expert tiles average 32 of 64 slots
// at prefill chunks of 512; those rows are never stored): a warp none of whose 32 rows exist (all three bodies),
// and a warp's second 16 rows when only its first exist (Q4_K and Q6_K on K8). Skipping warps still copy and reach
// every barrier. -DMQ_SKIP_DEAD=0 (KILN_CUDA_DEFINES) computes them, for the A/B; the same bits either way.
#ifndef MQ_SKIP_DEAD
#define MQ_SKIP_DEAD 1
#endif

__device__ __forceinline__ void mma_s8_16816(int* c, int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %8, %9, %10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// c += A x B (the same fragments as mma_s8_16816, accumulating in place).
__device__ __forceinline__ void mma_s8_16816_acc(int* c, int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// Output oc's Q4_K super-block `sb` header: d, dmin and the 12 scale/min bytes as 3 words (zeros past n_out).
__device__ __forceinline__ void mq_q4k_header(const u8* w, int sb, int nsb, int oc, int n_out, float& d, float& dmin,
                                              u32& s0, u32& s1, u32& s2) {
    d = dmin = 0.0f;
    s0 = s1 = s2 = 0;
    if (oc < n_out) {
        int4 h = ldg16(w + ((long long)oc * nsb + sb) * 144);
        d = h2f((u16)(h.x & 0xFFFF));
        dmin = h2f((u16)((u32)h.x >> 16));
        s0 = (u32)h.y;
        s1 = (u32)h.z;
        s2 = (u32)h.w;
    }
}

// The f16 scale d of output oc's Q6_K super-block `sb` (as a float) and its 16 signed scale bytes as 4 words
// (zeros past n_out).
__device__ __forceinline__ float mq_q6k_scales(const u8* w, int sb, int nsb, int oc, int n_out, u32* sw4) {
    int4 s4 = make_int4(0, 0, 0, 0);
    float d = 0.0f;
    if (oc < n_out) {
        d = h2f(((const u16*)(w + (long long)n_out * nsb * 208))[(long long)oc * nsb + sb]);
        s4 = ldg16(w + ((long long)oc * nsb + sb) * 208 + 192);
    }
    sw4[0] = (u32)s4.x;
    sw4[1] = (u32)s4.y;
    sw4[2] = (u32)s4.z;
    sw4[3] = (u32)s4.w;
    return d;
}

// The int8 codes of the 256-element slice `sb` of outputs o0 .. o0 + 63 into sw ([o][k], row stride MQ_LD) for
// Q4_K (64 outputs x 8 chunks of 16 quant bytes: chunk c holds sub-blocks 2 (c / 2) (low nibbles) and 2 (c / 2) + 1
// (high), elements 16 (c % 2) .. + 15) and Q6_K (64 outputs x 8 units (h, kk, c): ql[64 h + 32 kk + 16 c ..] gives
// sub-blocks 4 h + kk (low nibbles) and 4 h + kk + 2 (high), with 2-bit highs from qh[32 h + 16 c ..] at shifts
// 2 kk and 2 kk + 4).
template <int TY>
__device__ __forceinline__ void mq_load_codes(signed char* sw, const u8* w, int sb, int nsb, int o0, int n_out) {
    int tid = threadIdx.x;
    if (TY == T_Q4_K) {
        for (int u = tid; u < MQ_BN * 8; u += blockDim.x) {
            int o = u >> 3, c = u & 7;
            int4 v = make_int4(0, 0, 0, 0);
            if (o0 + o < n_out) v = ldg16(w + ((long long)(o0 + o) * nsb + sb) * 144 + 16 + 16 * c);
            int base = o * MQ_LD + 64 * (c >> 1) + 16 * (c & 1);
            *(int4*)(sw + base) = nib_lo(v);
            *(int4*)(sw + base + 32) = nib_hi(v);
        }
    } else {
        for (int u = tid; u < MQ_BN * 8; u += blockDim.x) {
            int o = u >> 3, h = (u >> 2) & 1, kk = (u >> 1) & 1, c = u & 1;
            int4 ql = make_int4(0, 0, 0, 0), qh = make_int4(0, 0, 0, 0);
            if (o0 + o < n_out) {
                const u8* p = w + ((long long)(o0 + o) * nsb + sb) * 208;
                ql = ldg16(p + 64 * h + 32 * kk + 16 * c);
                qh = ldg16(p + 128 + 32 * h + 16 * c);
            }
            int4 lo = nib_lo(ql), hi = nib_hi(ql);
            int s_a = 2 * kk, s_b = 2 * kk + 4;
#define Q6_MERGE(n, v, s) (((v).n | ((((qh.n) >> (s)) & 0x03030303) << 4)))
            int4 qa = sub_bytes(make_int4(Q6_MERGE(x, lo, s_a), Q6_MERGE(y, lo, s_a), Q6_MERGE(z, lo, s_a),
                                          Q6_MERGE(w, lo, s_a)), 0x20202020);
            int4 qb = sub_bytes(make_int4(Q6_MERGE(x, hi, s_b), Q6_MERGE(y, hi, s_b), Q6_MERGE(z, hi, s_b),
                                          Q6_MERGE(w, hi, s_b)), 0x20202020);
#undef Q6_MERGE
            int base = o * MQ_LD + 32 * (4 * h + kk) + 16 * c;
            *(int4*)(sw + base) = qa;
            *(int4*)(sw + base + 64) = qb;
        }
    }
}

// Decodes the 256-element slice `sb` of outputs o0 .. o0 + 63 into sw (int8, [o][k]), their half scales
// sc[o][16] (row stride MQ_SC) and block offsets mn[o][8] (row stride MQ_MN). Q4_K: the native super-block;
// Q6_K: [ql 128][qh 64][scales 16] with the f16 d of every super-block after all rows.
template <int TY>
__device__ __forceinline__ void mq_load_weights(signed char* sw, float* sc, float* mn, const u8* w, int sb, int nsb,
                                                int o0, int n_out) {
    int tid = threadIdx.x;
    if (TY == T_Q4_K) {
        mq_load_codes<T_Q4_K>(sw, w, sb, nsb, o0, n_out);
        for (int o = tid; o < MQ_BN; o += blockDim.x) {
            float d, dmin;
            u32 s0, s1, s2;
            mq_q4k_header(w, sb, nsb, o0 + o, n_out, d, dmin, s0, s1, s2);
            for (int j = 0; j < 8; j++) {
                int scj, mj;
                k4_sm(s0, s1, s2, j, scj, mj);
                sc[o * MQ_SC + 2 * j] = sc[o * MQ_SC + 2 * j + 1] = d * (float)scj;
                mn[o * MQ_MN + j] = -dmin * (float)mj;
            }
        }
    } else if (TY == T_Q6_K) {
        mq_load_codes<T_Q6_K>(sw, w, sb, nsb, o0, n_out);
        for (int o = tid; o < MQ_BN; o += blockDim.x) {
            u32 sw4[4];
            float d = mq_q6k_scales(w, sb, nsb, o0 + o, n_out, sw4);
            // Scale byte 8 h + 2 k + c belongs to sub-block 4 h + k, half c: index 2 (4 h + k) + c, the same.
            for (int i = 0; i < 16; i++) sc[o * MQ_SC + i] = d * (float)(signed char)byte_of(sw4[i >> 2], i & 3);
            for (int j = 0; j < 8; j++) mn[o * MQ_MN + j] = 0.0f;
        }
    }
}

// Stages the int8 codes of elements sb * 256 .. + 255 of rows r0 .. r0 + 63 into sa (row stride MQ_LD; zeros
// past n_rows).
__device__ __forceinline__ void mq_stage_codes(signed char* sa, const signed char* x, int width, int sb, int r0,
                                               int n_rows) {
    for (int u = threadIdx.x; u < MQ_BM * 16; u += blockDim.x) {
        int r = u >> 4, c = u & 15;
        int4 v = make_int4(0, 0, 0, 0);
        if (r0 + r < n_rows) v = ldg16(x + (long long)(r0 + r) * width + sb * MQ_K + 16 * c);
        *(int4*)(sa + r * MQ_LD + 16 * c) = v;
    }
}

// Zeroes a warp's 32 x 32 accumulators.
__device__ __forceinline__ void mq_zero(float (&acc)[2][4][4]) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
}

// A warp's mma fragments of 32-element block kb: A for its rows wm .. wm + 31 (two 16-row tiles, both 16-element
// halves), B for its outputs wn .. wn + 31 (four 8-output tiles).
__device__ __forceinline__ void mq_fragments(int (&a)[2][2][2], int (&b)[4][2], const signed char* sa,
                                             const signed char* sw, int wm, int wn, int kb, int g, int t) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const signed char* p = sa + (wm + 16 * mi + g) * MQ_LD + 32 * kb + 16 * hh + 4 * t;
            a[mi][hh][0] = *(const int*)p;
            a[mi][hh][1] = *(const int*)(p + 8 * MQ_LD);
        }
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
            b[ni][hh] = *(const int*)(sw + (wn + 8 * ni + g) * MQ_LD + 32 * kb + 16 * hh + 4 * t);
}

// Stores (or adds) a warp's 32 x 32 accumulators for rows from rw and outputs from ow (bounds-checked).
__device__ __forceinline__ void mq_store(float* out, const float (&acc)[2][4][4], int rw, int ow, int g, int t,
                                         int n_rows, int n_out, int accumulate) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = rw + 16 * mi + g + 8 * (e >> 1);
                int o = ow + 8 * ni + 2 * t + (e & 1);
                if (r < n_rows && o < n_out) {
                    float* p = out + (long long)r * n_out + o;
                    *p = accumulate ? *p + acc[mi][ni][e] : acc[mi][ni][e];
                }
            }
}

// out[r * n_out + o] (+)= W[o] . x[r] for rows r0 .. r0 + 63 (of n_rows) and outputs 64 blockIdx.x .. + 63.
// grid = (ceil(n_out / 64), ceil(n_rows / 64)) with r0 = 64 blockIdx.y, block = 128; width % 256 == 0.
template <int TY>
__device__ __forceinline__ void mmq_body(float* out, const u8* w, const signed char* xq, const float* xd,
                                         const float* xs, int width, int n_out, int n_rows, int accumulate, int r0) {
    __shared__ __align__(16) signed char sa[MQ_BM * MQ_LD];
    __shared__ __align__(16) signed char sw[MQ_BN * MQ_LD];
    __shared__ float sdx[MQ_BM * MQ_XS], ssx[MQ_BM * MQ_XS];
    __shared__ float ssc[MQ_BN * MQ_SC], smn[MQ_BN * MQ_MN];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * MQ_BN;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K, nb = width / 32;
    float acc[2][4][4];
    mq_zero(acc);

    for (int sb = 0; sb < nsb; sb++) {
        // Activations: 64 rows x 256 quants, then their 8 block scales and sums.
        mq_stage_codes(sa, xq, width, sb, r0, n_rows);
        for (int u = tid; u < MQ_BM * 8; u += blockDim.x) {
            int r = u >> 3, j = u & 7;
            bool in = r0 + r < n_rows;
            long long xb = (long long)(r0 + r) * nb + sb * 8 + j;
            sdx[r * MQ_XS + j] = in ? xd[xb] : 0.0f;
            ssx[r * MQ_XS + j] = in ? xs[xb] : 0.0f;
        }
        mq_load_weights<TY>(sw, ssc, smn, w, sb, nsb, o0, n_out);
        __syncthreads();
#pragma unroll 1
        for (int kb = 0; kb < 8; kb++) {
            int a[2][2][2], b[4][2]; // [mi][half][reg], [ni][half]
            mq_fragments(a, b, sa, sw, wm, wn, kb, g, t);
            float dx[2][2], sx[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    int r = wm + 16 * mi + g + 8 * rr;
                    dx[mi][rr] = sdx[r * MQ_XS + kb];
                    sx[mi][rr] = ssx[r * MQ_XS + kb];
                }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                float slo[2], shi[2], m[2];
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                    int o = wn + 8 * ni + 2 * t + cc;
                    slo[cc] = ssc[o * MQ_SC + 2 * kb];
                    shi[cc] = ssc[o * MQ_SC + 2 * kb + 1];
                    m[cc] = smn[o * MQ_MN + kb];
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    int lo[4], hi[4];
                    mma_s8_16816(lo, a[mi][0][0], a[mi][0][1], b[ni][0]);
                    mma_s8_16816(hi, a[mi][1][0], a[mi][1][1], b[ni][1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int cc = e & 1, rr = e >> 1;
                        float v = dx[mi][rr] * (slo[cc] * (float)lo[e] + shi[cc] * (float)hi[e]);
                        acc[mi][ni][e] += v + m[cc] * sx[mi][rr];
                    }
                }
            }
        }
        __syncthreads();
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// ---- The pipelined prefill bodies: Q4_K and Q6_K on K8 activations (one scale per 256), Q8_0 on per-32
// activations. A stage is one 256-element slice of the tile's 64 rows and 64 outputs, copied raw from global to
// shared memory with cp.async (16 bytes a copy, zeros past the last row / output); two stages are in flight, so
// slice s + 1 loads while slice s multiplies. The weights stay in their GEMV-layout bytes in shared memory and each
// lane decodes its own mma B fragments from them (one Q4_K byte holds a code of two sub-blocks); fragments load
// with ldmatrix and a 32-element dot is one m16n8k32 mma (Q6_K: two m16n8k16, one scale per 16). A warp takes
// rows wm .. + 31 and outputs wn .. + 31 as mmq_body; rows stay independent of the tile.
//
// Q4_K / Q6_K: per super-block the sub-block-scaled dots are summed exactly in int32 (isum; Q4_K also its min
// term imin = sum_j m_j * (sum of the sub-block's codes)), then one float step per (row, output, super-block) in
// ascending order: Q6_K gemv.cu's k8_step, Q4_K acc += dx (d isum - dmin imin) in 5 roundings. Q8_0:
// acc += (dx_j d_j) dot_j per 32-element block j, in order. Shared memory is dynamic (MP_SMEM_*); the host sets
// each kernel's limit at load. ----

#define MP_LDA 272 // row stride (bytes) of staged activation codes and Q8_0 weight codes: conflict-free ldmatrix
#define MP_Q4 144  // a Q4_K super-block's GEMV-layout bytes (d, dmin, 12 scale bytes, 128 quant bytes)
#define MP_Q6 208  // a Q6_K super-block's (ql 128, qh 64, 16 scales; its f16 d is stored after all rows)
#define MP_XD 12   // row stride (floats) of staged per-32 activation scales: 8 used, padded against conflicts

extern __shared__ __align__(16) unsigned char mp_smem[];

// Dynamic shared memory of each pipelined body (bytes). The host reads these numbers from this source
// (compile.rs's dynamic_smem); the static_asserts tie them to the layouts the bodies carve.
#define MP_STAGE_A (MQ_BM * MP_LDA)
#define MP_SMEM_Q4K 64000
#define MP_SMEM_Q6K 66304
#define MP_SMEM_Q8 79872
static_assert(MP_SMEM_Q4K == 2 * (MP_STAGE_A + MQ_BN * MP_Q4 + MQ_BM * 4 + MQ_BM * 32) + 8 * MQ_BN * 8 + MQ_BN * 8 +
                                 MQ_BM * 16 + MQ_BN * 8,
              "MP_SMEM_Q4K: two stages (codes, super-blocks, row scales, code sums), {hi, lo}, mins, sums, d / dmin");
static_assert(MP_SMEM_Q6K == 2 * (MP_STAGE_A + MQ_BN * MP_Q6 + MQ_BM * 4) + 16 * MQ_BN * 4 + MQ_BN * 4,
              "MP_SMEM_Q6K: two stages (codes, super-blocks, row scales), scales as ints, d");
static_assert(MP_SMEM_Q8 == 2 * (MP_STAGE_A + MQ_BM * MP_XD * 4 + MQ_BN * MP_LDA + MQ_BN * 16) + 8 * MQ_BN * 4,
              "MP_SMEM_Q8: two stages (codes, their scales, weight codes, f16 d), d as floats");

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// `n` (16 or 4) bytes from global src to shared dst, asynchronously; zeros when !in (src stays a valid address).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool in) {
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                     "r"(in ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                     "r"(in ? 4 : 0)
                     : "memory");
}

__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for all of this thread's copies.
__device__ __forceinline__ void cp_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8 x 16-byte matrices from shared memory: lane l gives the address of row l % 8 of matrix l / 8 and gets
// bytes 4 (l % 4) .. + 3 of row l / 4 of each (an mma fragment register per matrix).
__device__ __forceinline__ void ldsm4(int (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// c += A x B, m16n8k32 (A: rows g / g + 8, elements 4t .. and 16 + 4t ..; B: output g, the same elements).
__device__ __forceinline__ void mma_s8_16832(int* c, const int (&a)[4], int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stops the kernel when launched with less dynamic shared memory than its body needs.
__device__ __forceinline__ void mp_check_smem(u32 need) {
    u32 have;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    if (have < need) __trap();
}

// Issues a stage's copies of 64 rows x 256 bytes into dst (row stride MP_LDA): this thread's rows tid / 16 + 8 i,
// chunk tid % 16. `src` is that chunk of the thread's first row in global memory (`stride` bytes a row); rows from
// `rows` on are zero-filled (their source address is `base`, never read).
__device__ __forceinline__ void mp_copy_rows(signed char* dst, const signed char* src, long long stride, int rows,
                                             const void* base) {
    int t = threadIdx.x;
    dst += (t >> 4) * MP_LDA + 16 * (t & 15);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        bool in = (t >> 4) + 8 * i < rows;
        cp_async<16>(dst + 8 * i * MP_LDA, in ? src + 8 * i * stride : base, in);
    }
}

// Issues a stage's copies of the raw super-blocks `sb` (REC bytes each) of outputs o0 .. o0 + 63 into dst (row
// stride REC); consecutive threads take consecutive 16-byte chunks of a super-block (a per-thread-pair split of
// each super-block measured 10 % slower). Zeros past n_out.
template <int REC>
__device__ __forceinline__ void mp_copy_super(u8* dst, const u8* w, int sb, int nsb, int o0, int n_out) {
    for (int u = threadIdx.x; u < MQ_BN * (REC / 16); u += 128) {
        int o = u / (REC / 16), c = u - o * (REC / 16);
        bool in = o0 + o < n_out;
        cp_async<16>(dst + o * REC + 16 * c, w + ((long long)(in ? o0 + o : 0) * nsb + sb) * REC + 16 * c, in);
    }
}

// The A fragments (rows wm + 16 mi .., 32 elements from byte k) of a warp's first MI 16-row halves (both by default).
template <int MI = 2>
__device__ __forceinline__ void mp_frag_a(int (&a)[2][4], const signed char* sa, int wm, int k, int lane) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
        ldsm4(a[mi], sa + (wm + 16 * mi + (lane & 7) + 8 * ((lane >> 3) & 1)) * MP_LDA + k + 16 * (lane >> 4));
}

// Q4_K scales of sub-blocks 4 jh .. 4 jh + 3 of the raw super-block `rec` in shared memory: each sub-block's
// scale as {hi, lo} (sc = 8 hi + lo) into shl[j * stride], and the four 6-bit mins packed as bytes (returned).
__device__ __forceinline__ u32 mp_q4k_scales(const u8* rec, int jh, int2* shl, int stride) {
    const u32* h = (const u32*)rec;
    u32 s0 = h[1], s1 = h[2], s2 = h[3], mw = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int j = 4 * jh + i, scj, mj;
        k4_sm(s0, s1, s2, j, scj, mj);
        shl[j * stride] = make_int2(scj >> 3, scj & 7);
        mw |= (u32)mj << (8 * i);
    }
    return mw;
}

// A row's 8 sub-block code sums `v` (shared memory, 16-byte aligned; |S| <= 32 * 127) as mma A bytes: half 0
// the low 6 bits (S_lo), half 1 the rest (S_hi, S = 64 S_hi + S_lo), sub-blocks 0..3 in w0 and 4..7 in w1.
// Two vector loads, packed in registers and stored once (w0, w1 are shared memory too: packing through them
// stored every step).
__device__ __forceinline__ void mp_pack_sums(const int* v, int hi, u32& w0, u32& w1) {
    int4 a = *(const int4*)v, b = *(const int4*)(v + 4);
    int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    u32 p0 = 0, p1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p0 |= (u32)(hi ? (x[i] >> 6) & 0xFF : x[i] & 63) << (8 * i);
        p1 |= (u32)(hi ? (x[4 + i] >> 6) & 0xFF : x[4 + i] & 63) << (8 * i);
    }
    w0 = p0;
    w1 = p1;
}

// Raw Q4_K quant words of sub-block pair p for the 32 outputs from `row0` (super-blocks of MP_Q4 bytes in shared
// memory): braw[ni][half], this lane's 4 bytes of elements 16 half + 4 t .. of output row0 + 8 ni + g; low
// nibbles are sub-block 2 p, high nibbles 2 p + 1. NI = 2 takes the first 16 outputs alone.
template <int NI = 4>
__device__ __forceinline__ void mp_q4k_raw(int (&braw)[NI][2], const u8* sw, int row0, int p, int lane) {
#pragma unroll
    for (int nq = 0; nq < NI / 2; nq++) {
        int r[4];
        ldsm4(r, sw + (row0 + 16 * nq + 8 * (lane >> 4) + (lane & 7)) * MP_Q4 + 16 + 32 * p + 16 * ((lane >> 3) & 1));
        braw[2 * nq][0] = r[0];
        braw[2 * nq][1] = r[1];
        braw[2 * nq + 1][0] = r[2];
        braw[2 * nq + 1][1] = r[3];
    }
}

// Raw Q6_K words of unit hk = 2 h + kk for the 32 outputs from `row0` (MP_Q6-byte super-blocks in shared memory):
// raw[ni] = {ql half 0, ql half 1, qh half 0, qh half 1}; ql[64 h + 32 kk ..] gives sub-blocks 4 h + kk (low
// nibbles) and 4 h + kk + 2 (high), with 2-bit highs at bits 2 kk and 2 kk + 4 of qh[32 h ..]. NI = 2: the first
// 16 outputs.
template <int NI = 4>
__device__ __forceinline__ void mp_q6k_raw(int (&raw)[NI][4], const u8* sw, int row0, int hk, int lane) {
    int h = hk >> 1, kk = hk & 1, m = lane >> 3;
    int off = m < 2 ? 64 * h + 32 * kk + 16 * m : 128 + 32 * h + 16 * (m - 2);
#pragma unroll
    for (int ni = 0; ni < NI; ni++) ldsm4(raw[ni], sw + (row0 + 8 * ni + (lane & 7)) * MP_Q6 + off);
}

// The two mma B words (elements 4 t .. and 16 + 4 t ..) of sub-block 4 h + kk + 2 s from one output's raw words:
// 6-bit codes 0..63 to quants -32..31, byte-wise (the high bit set first stops borrows).
__device__ __forceinline__ void mp_q6k_b(int (&b)[2], const int (&raw)[4], int kk, int s) {
    int sh = 2 * kk + 4 * s;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        int q = ((raw[c] >> (4 * s)) & 0x0F0F0F0F) | (((raw[2 + c] >> sh) & 0x03030303) << 4);
        b[c] = (int)((((u32)q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
    }
}

// One K slice of mmq_q4_k8_body for this warp's first MI m-tiles of 16 rows (MI = 1 when its other 16 rows are
// past the tile's: their products are skipped, the first tile's are the same operations in the same order).
template <int MI>
__device__ __forceinline__ void mp_q4k8_slice(float (&acc)[2][4][4], const signed char* sa, const u8* sw,
                                              const float* sdx, const int2* shl, const u32* smin, const u32* ssum,
                                              const float* sd, const float* sdm, int wm, int wn, int lane, int g,
                                              int t) {
    int hs[2][4][4], ls[2][4][4]; // sum_j hi_j dot_j, sum_j lo_j dot_j
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) hs[mi][ni][e] = ls[mi][ni][e] = 0;
#pragma unroll 1
    for (int p = 0; p < 4; p++) {
        int braw[4][2];
        mp_q4k_raw(braw, sw, wn, p, lane);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            int j = 2 * p + s;
            int a[2][4];
            mp_frag_a<MI>(a, sa, wm, 32 * j, lane);
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                // This lane's B column is output wn + 8 ni + g: its codes times hi_j and times lo_j.
                int2 hl = shl[j * MQ_BN + wn + 8 * ni + g];
                int b0 = (braw[ni][0] >> (4 * s)) & 0x0F0F0F0F, b1 = (braw[ni][1] >> (4 * s)) & 0x0F0F0F0F;
                int bh0 = b0 * hl.x, bh1 = b1 * hl.x, bl0 = b0 * hl.y, bl1 = b1 * hl.y;
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma_s8_16832(hs[mi][ni], a[mi], bh0, bh1);
                    mma_s8_16832(ls[mi][ni], a[mi], bl0, bl1);
                }
            }
        }
    }
    // The min term and the float step per (row, output).
    int as[2][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) as[mi][rr] = (int)ssum[4 * (wm + 16 * mi + g + 8 * rr) + t];
#pragma unroll
    for (int ni = 0; ni < 4; ni++) {
        int mw = (int)smin[2 * (wn + 8 * ni + g) + (t & 1)];
        int m_lo = t < 2 ? mw : 0, m_hi = t < 2 ? 0 : mw;
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            int c_lo[4] = {0, 0, 0, 0}, c_hi[4] = {0, 0, 0, 0};
            mma_s8_16816_acc(c_lo, as[mi][0], as[mi][1], m_lo);
            mma_s8_16816_acc(c_hi, as[mi][0], as[mi][1], m_hi);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = wm + 16 * mi + g + 8 * (e >> 1), o = wn + 8 * ni + 2 * t + (e & 1);
                int isum = 8 * hs[mi][ni][e] + ls[mi][ni][e], imin = c_lo[e] + 64 * c_hi[e];
                float v = __fmaf_rn(-sdm[o], (float)imin, __fmul_rn(sd[o], (float)isum));
                acc[mi][ni][e] = __fmaf_rn(sdx[r], v, acc[mi][ni][e]);
            }
        }
    }
}

// out[r * n_out + o] (+)= W[o] . x[r] for Q4_K weights on K8 activations (kq codes, kd scale per 256, ks code sums
// per 32). Rows, grid and block as mmq_body. Both integer sums of a super-block run on the tensor cores:
// - isum = sum_j sc_j dot_j with the 6-bit scale split as sc_j = 8 hi_j + lo_j (hi, lo <= 7): the codes times hi_j
//   and times lo_j still fit int8 (<= 105; one multiply per packed word, no carries between bytes), so two mma
//   chains through the whole super-block give H = sum_j hi_j dot_j and L = sum_j lo_j dot_j, and isum = 8 H + L;
// - imin = sum_j m_j S_j over the activation code sums S_j of the sub-blocks (K8's ks), S_j = 64 S_hi + S_lo split
//   into int8 halves: one m16n8k16 of [S_lo 0..7, S_hi 0..7] against [m, 0] and one against [0, m].
// The same integers as the codes-against-replicated-mins form, so the same bits; the float step is
// acc += dx (d isum - dmin imin) in 5 roundings, ascending super-blocks.
__device__ __forceinline__ void mmq_q4_k8_body(float* out, const u8* w, const signed char* kq, const float* kd,
                                               const int* ks, int width, int n_out, int n_rows, int accumulate,
                                               int r0, int o0) {
    mp_check_smem(MP_SMEM_Q4K);
    // A stage: activation codes [64][MP_LDA], raw super-blocks [64][MP_Q4], row scales [64], code sums [64][8].
    const int stage = MP_STAGE_A + MQ_BN * MP_Q4 + MQ_BM * 4 + MQ_BM * 32;
    int2* shl = (int2*)(mp_smem + 2 * stage);  // [j][o]: {hi, lo} of sc_j
    u32* smin = (u32*)(shl + 8 * MQ_BN);        // [o][2]: m_0..3, m_4..7 as bytes
    u32* ssum = smin + 2 * MQ_BN;               // [r][4]: S_lo 0..3, S_lo 4..7, S_hi 0..3, S_hi 4..7 as bytes
    float* sd = (float*)(ssum + 4 * MQ_BM);
    float* sdm = sd + MQ_BN;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K, nb = width / 32;
    // Each thread's sources, computed once; slice sb adds its offset.
    const signed char* xa = kq + (long long)(r0 + (tid >> 4)) * width + 16 * (tid & 15);
    bool d_in = tid < MQ_BM && r0 + tid < n_rows;
    const float* da = kd + (long long)(d_in ? r0 + tid : 0) * nsb;
    bool s_in = r0 + (tid >> 1) < n_rows;
    const int* sa_src = ks + (long long)(s_in ? r0 + (tid >> 1) : 0) * nb + 4 * (tid & 1);
    auto issue = [&](int sb) {
        unsigned char* s = mp_smem + (sb & 1) * stage;
        mp_copy_rows((signed char*)s, xa + sb * MQ_K, width, n_rows - r0, kq);
        mp_copy_super<MP_Q4>(s + MP_STAGE_A, w, sb, nsb, o0, n_out);
        unsigned char* sx = s + MP_STAGE_A + MQ_BN * MP_Q4;
        if (tid < MQ_BM) cp_async<4>(sx + 4 * tid, da + sb, d_in);
        cp_async<16>(sx + MQ_BM * 4 + 32 * (tid >> 1) + 16 * (tid & 1), sa_src + 8 * sb, s_in);
        cp_commit();
    };
    float acc[2][4][4];
    mq_zero(acc);
    issue(0);
    for (int sb = 0; sb < nsb; sb++) {
        cp_wait_all();
        __syncthreads(); // slice sb is in; every warp is done with slice sb - 1 (its buffer and the scales)
        if (sb + 1 < nsb) issue(sb + 1);
        const signed char* sa = (const signed char*)(mp_smem + (sb & 1) * stage);
        const u8* sw = (const u8*)sa + MP_STAGE_A;
        const float* sdx = (const float*)(sw + MQ_BN * MP_Q4);
        {
            // Thread (o, half) decodes sub-blocks 4 half .. + 3 of output o; thread (row, half) packs the row's sums.
            int o = tid & 63, hf = tid >> 6;
            smin[2 * o + hf] = mp_q4k_scales(sw + o * MP_Q4, hf, shl + o, MQ_BN);
            if (hf == 0) {
                u32 h0 = *(const u32*)(sw + o * MP_Q4);
                sd[o] = h2f((u16)(h0 & 0xFFFF));
                sdm[o] = h2f((u16)(h0 >> 16));
            }
            int r = tid >> 1, hi = tid & 1;
            mp_pack_sums((const int*)(sdx + MQ_BM) + 8 * r, hi, ssum[4 * r + 2 * hi], ssum[4 * r + 2 * hi + 1]);
        }
        __syncthreads();
        int live = n_rows - r0 - wm; // rows of this warp's 32 that exist
        if (MQ_SKIP_DEAD && live <= 0) continue;
        if (MQ_SKIP_DEAD && live <= 16)
            mp_q4k8_slice<1>(acc, sa, sw, sdx, shl, smin, ssum, sd, sdm, wm, wn, lane, g, t);
        else
            mp_q4k8_slice<2>(acc, sa, sw, sdx, shl, smin, ssum, sd, sdm, wm, wn, lane, g, t);
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// One K slice of mmq_q6_k8_body for this warp's first MI m-tiles of 16 rows (as mp_q4k8_slice).
template <int MI>
__device__ __forceinline__ void mp_q6k8_slice(float (&acc)[2][4][4], const signed char* sa, const u8* sw,
                                              const float* sdx, const int* sisc, const float* sd, int wm, int wn,
                                              int lane, int g, int t) {
    int isum[2][4][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) isum[mi][ni][e] = 0;
#pragma unroll 1
    for (int hk = 0; hk < 4; hk++) {
        int h = hk >> 1, kk = hk & 1;
        int raw[4][4];
        mp_q6k_raw(raw, sw, wn, hk, lane);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            int j = 4 * h + kk + 2 * s;
            int a[2][4];
            mp_frag_a<MI>(a, sa, wm, 32 * j, lane);
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int b[2];
                mp_q6k_b(b, raw[ni], kk, s);
                int2 slo = *(const int2*)(sisc + (2 * j) * MQ_BN + wn + 8 * ni + 2 * t);
                int2 shi = *(const int2*)(sisc + (2 * j + 1) * MQ_BN + wn + 8 * ni + 2 * t);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    int lo[4], hi[4];
                    mma_s8_16816(lo, a[mi][0], a[mi][1], b[0]);
                    mma_s8_16816(hi, a[mi][2], a[mi][3], b[1]);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        isum[mi][ni][e] += ((e & 1) ? slo.y : slo.x) * lo[e] + ((e & 1) ? shi.y : shi.x) * hi[e];
                }
            }
        }
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = wm + 16 * mi + g + 8 * (e >> 1), o = wn + 8 * ni + 2 * t + (e & 1);
                acc[mi][ni][e] = __fadd_rn(acc[mi][ni][e], k8_step(sd[o], 0.0f, sdx[r], isum[mi][ni][e], 0));
            }
}

// out[r * n_out + o] (+)= W[o] . x[r] for Q6_K weights on K8 activations (Q6_K has no min term). As mmq_q4_k8_body;
// the f16 d of each output's super-block (stored after all rows) is read a slice ahead into a register.
__device__ __forceinline__ void mmq_q6_k8_body(float* out, const u8* w, const signed char* kq, const float* kd,
                                               int width, int n_out, int n_rows, int accumulate, int r0, int o0) {
    mp_check_smem(MP_SMEM_Q6K);
    const int stage = MP_STAGE_A + MQ_BN * MP_Q6 + MQ_BM * 4;
    int* sisc = (int*)(mp_smem + 2 * stage); // [2 j + half][o]
    float* sd = (float*)(sisc + 16 * MQ_BN);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K;
    const u16* dw = (const u16*)(w + (long long)n_out * nsb * MP_Q6);
    int od = min(o0 + (tid & 63), n_out - 1);
    const signed char* xa = kq + (long long)(r0 + (tid >> 4)) * width + 16 * (tid & 15);
    bool d_in = tid < MQ_BM && r0 + tid < n_rows;
    const float* da = kd + (long long)(d_in ? r0 + tid : 0) * nsb;
    auto issue = [&](int sb) {
        unsigned char* s = mp_smem + (sb & 1) * stage;
        mp_copy_rows((signed char*)s, xa + sb * MQ_K, width, n_rows - r0, kq);
        mp_copy_super<MP_Q6>(s + MP_STAGE_A, w, sb, nsb, o0, n_out);
        if (tid < MQ_BM) cp_async<4>(s + MP_STAGE_A + MQ_BN * MP_Q6 + 4 * tid, da + sb, d_in);
        cp_commit();
    };
    float acc[2][4][4];
    mq_zero(acc);
    issue(0);
    u16 d_next = dw[(long long)od * nsb];
    for (int sb = 0; sb < nsb; sb++) {
        u16 d_cur = d_next;
        cp_wait_all();
        __syncthreads();
        if (sb + 1 < nsb) {
            issue(sb + 1);
            d_next = dw[(long long)od * nsb + sb + 1];
        }
        const signed char* sa = (const signed char*)(mp_smem + (sb & 1) * stage);
        const u8* sw = (mp_smem + (sb & 1) * stage) + MP_STAGE_A;
        const float* sdx = (const float*)(sw + MQ_BN * MP_Q6);
        {
            int o = tid & 63;
            for (int i = tid >> 6; i < 16; i += 2) sisc[i * MQ_BN + o] = (signed char)sw[o * MP_Q6 + 192 + i];
            if (tid < 64) sd[o] = o0 + o < n_out ? h2f(d_cur) : 0.0f;
        }
        __syncthreads();
        int live = n_rows - r0 - wm; // rows of this warp's 32 that exist
        if (MQ_SKIP_DEAD && live <= 0) continue;
        if (MQ_SKIP_DEAD && live <= 16)
            mp_q6k8_slice<1>(acc, sa, sw, sdx, sisc, sd, wm, wn, lane, g, t);
        else
            mp_q6k8_slice<2>(acc, sa, sw, sdx, sisc, sd, wm, wn, lane, g, t);
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// out[r * n_out + o] (+)= W[o] . x[r] for Q8_0 weights (codes per output, then the f16 d of every block after all
// rows) on per-32 activations (xq codes, xd scales; Q8_0 has no offset, so the sums are not read).
__device__ __forceinline__ void mmq_q8_0_body(float* out, const u8* w, const signed char* xq, const float* xd,
                                              int width, int n_out, int n_rows, int accumulate, int r0, int o0) {
    mp_check_smem(MP_SMEM_Q8);
    const int stage = MP_STAGE_A + MQ_BM * MP_XD * 4 + MQ_BN * MP_LDA + MQ_BN * 16;
    float* sdw = (float*)(mp_smem + 2 * stage); // [block][o]
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K, nb = width / 32;
    const u8* dw = w + (long long)n_out * nb * 32;
    // A stage: activation codes [64][MP_LDA], their scales [64][MP_XD], weight codes [64][MP_LDA], f16 d [64][8].
    // Each thread's sources, computed once; slice sb adds its offset.
    const signed char* xa = xq + (long long)(r0 + (tid >> 4)) * width + 16 * (tid & 15);
    bool xd_in = r0 + (tid >> 1) < n_rows;
    const float* xda = xd + (long long)(xd_in ? r0 + (tid >> 1) : 0) * nb + 4 * (tid & 1);
    const signed char* wa = (const signed char*)w + (long long)(o0 + (tid >> 4)) * nb * 32 + 16 * (tid & 15);
    bool d_in = tid < MQ_BN && o0 + tid < n_out;
    const u8* da = dw + 2 * (long long)(d_in ? o0 + tid : 0) * nb;
    auto issue = [&](int sb) {
        unsigned char* s = mp_smem + (sb & 1) * stage;
        mp_copy_rows((signed char*)s, xa + sb * MQ_K, width, n_rows - r0, xq);
        cp_async<16>(s + MP_STAGE_A + (tid >> 1) * MP_XD * 4 + 16 * (tid & 1), xda + sb * 8, xd_in);
        unsigned char* sw = s + MP_STAGE_A + MQ_BM * MP_XD * 4;
        mp_copy_rows((signed char*)sw, wa + sb * MQ_K, (long long)nb * 32, n_out - o0, w);
        if (tid < MQ_BN) cp_async<16>(sw + MQ_BN * MP_LDA + 16 * tid, da + 16 * sb, d_in);
        cp_commit();
    };
    float acc[2][4][4];
    mq_zero(acc);
    issue(0);
    for (int sb = 0; sb < nsb; sb++) {
        cp_wait_all();
        __syncthreads();
        if (sb + 1 < nsb) issue(sb + 1);
        const signed char* sa = (const signed char*)(mp_smem + (sb & 1) * stage);
        const float* sdx = (const float*)((mp_smem + (sb & 1) * stage) + MP_STAGE_A);
        const signed char* sw = (const signed char*)((mp_smem + (sb & 1) * stage) + MP_STAGE_A + MQ_BM * MP_XD * 4);
        {
            const u16* hd = (const u16*)(sw + MQ_BN * MP_LDA);
            int o = tid & 63;
            for (int j = tid >> 6; j < 8; j += 2) sdw[j * MQ_BN + o] = h2f(hd[o * 8 + j]);
        }
        __syncthreads();
        if (MQ_SKIP_DEAD && wm >= n_rows - r0) continue;
#pragma unroll 1
        for (int kb = 0; kb < 8; kb++) {
            int a[2][4];
            mp_frag_a(a, sa, wm, 32 * kb, lane);
            float dx[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) dx[mi][rr] = sdx[(wm + 16 * mi + g + 8 * rr) * MP_XD + kb];
#pragma unroll
            for (int nq = 0; nq < 2; nq++) {
                int b[4];
                ldsm4(b, sw + (wn + 16 * nq + 8 * (lane >> 4) + (lane & 7)) * MP_LDA + 32 * kb + 16 * ((lane >> 3) & 1));
#pragma unroll
                for (int n2 = 0; n2 < 2; n2++) {
                    int ni = 2 * nq + n2;
                    float2 d = *(const float2*)(sdw + kb * MQ_BN + wn + 8 * ni + 2 * t);
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        int dot[4] = {0, 0, 0, 0};
                        mma_s8_16832(dot, a[mi], b[2 * n2], b[2 * n2 + 1]);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mi][ni][e] = __fmaf_rn(__fmul_rn(dx[mi][e >> 1], (e & 1) ? d.y : d.x), (float)dot[e],
                                                       acc[mi][ni][e]);
                    }
                }
            }
        }
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// The pipelined prefill kernels take up to three weights of their type that read the same activations in one
// launch (JOB_ARGS, common.cu: Q/K/V, gate/up), each block a 64 x 64 tile of its weight; the small K/V then share
// the waves of Q. `ks` (the K8 code sums, as xs) is read by Q4_K only.
#define MP_KERNEL(NAME, CALL)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 3) NAME(const signed char* xq, const float* xd,          \
                                                              const float* xs, int width, int n_rows,            \
                                                              int accumulate, JOB_ARGS) {                        \
        wait_prior_kernel();                                                                                   \
        Job j = JOB_PICK;                                                                                      \
        CALL;                                                                                                  \
    }
MP_KERNEL(mmq_q4_k8, mmq_q4_k8_body(j.out, j.w, xq, xd, (const int*)xs, width, j.n_out, n_rows, accumulate,
                                    blockIdx.y * MQ_BM, j.tile * MQ_BN))
MP_KERNEL(mmq_q6_k8, mmq_q6_k8_body(j.out, j.w, xq, xd, width, j.n_out, n_rows, accumulate, blockIdx.y * MQ_BM,
                                    j.tile * MQ_BN))
MP_KERNEL(mmq_q8_0, mmq_q8_0_body(j.out, j.w, xq, xd, width, j.n_out, n_rows, accumulate, blockIdx.y * MQ_BM,
                                  j.tile * MQ_BN))

#define MMQ_KERNEL(NAME, TY)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128) NAME(float* out, const u8* w, const signed char* xq,      \
                                                           const float* xd, const float* xs, int width,          \
                                                           int n_out, int n_rows, int accumulate) {            \
        wait_prior_kernel();                                                                                   \
        mmq_body<TY>(out, w, xq, xd, xs, width, n_out, n_rows, accumulate, blockIdx.y * MQ_BM);                \
    }
MMQ_KERNEL(mmq_q4_k, T_Q4_K)
MMQ_KERNEL(mmq_q6_k, T_Q6_K)
