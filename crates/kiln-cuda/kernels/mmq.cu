// The prefill matmul: int8 tensor cores (mma.sync m16n8k16, s8 x s8 -> s32) on Q8 activation blocks against
// weights in the GEMV layout (gemv.cu's header), decoded to int8 in shared memory one 256-element slice at a time.
//
// A 32-element block contributes t = dx * (s_lo * lo + s_hi * hi) + mn * sx, where lo/hi are the exact integer
// dots of its two 16-element halves, dx/sx the activation block's scale and scale * sum, s_lo/s_hi the weight's
// half scales (equal for Q4_K and Q8_0; Q6_K has one per 16) and mn the weight block's offset (Q4_K's -dmin * m).
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
// Q6_K: [ql 128][qh 64][scales 16] with the f16 d of every super-block after all rows; Q8_0: 32 quants per block
// with the f16 d of every block after all rows.
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
    } else { // T_Q8_0
        int nb = nsb * 8;
        for (int u = tid; u < MQ_BN * 16; u += blockDim.x) {
            int o = u >> 4, c = u & 15;
            int4 v = make_int4(0, 0, 0, 0);
            if (o0 + o < n_out) v = ldg16(w + (long long)(o0 + o) * nb * 32 + sb * 256 + 16 * c);
            *(int4*)(sw + o * MQ_LD + 16 * c) = v;
        }
        const u16* dd = (const u16*)(w + (long long)n_out * nb * 32);
        for (int u = tid; u < MQ_BN * 8; u += blockDim.x) {
            int o = u >> 3, j = u & 7;
            float d = o0 + o < n_out ? h2f(dd[(long long)(o0 + o) * nb + sb * 8 + j]) : 0.0f;
            sc[o * MQ_SC + 2 * j] = sc[o * MQ_SC + 2 * j + 1] = d;
            mn[o * MQ_MN + j] = 0.0f;
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

// Stages K8 activations of slice `sb`: the codes of rows r0 .. r0 + 63 into sa (as mq_stage_codes) and each
// row's scale of the slice into sdx (zeros past n_rows).
__device__ __forceinline__ void mq_stage_k8(signed char* sa, float* sdx, const signed char* kq, const float* kd,
                                            int width, int sb, int r0, int n_rows) {
    mq_stage_codes(sa, kq, width, sb, r0, n_rows);
    int nsb = width / MQ_K;
    for (int r = threadIdx.x; r < MQ_BM; r += blockDim.x)
        sdx[r] = r0 + r < n_rows ? kd[(long long)(r0 + r) * nsb + sb] : 0.0f;
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

// ---- Q6_K on K8 activations (gemv.cu's K8 section): per super-block the sub-block-scaled integer dots are summed
// exactly (int32) and one float step k8_step is taken per (row, output, super-block), ascending super-block order
// (its own bits, like the per-32 body; rows stay independent of the tile). ----

// Q6_K weights of slice `sb` as int8 codes (as mq_load_weights) plus integer scales per 16 elements (isc[o][16])
// and the float d of each output.
__device__ __forceinline__ void mq_load_q6k_k8(signed char* sw, int* isc, float* sd, const u8* w, int sb, int nsb,
                                               int o0, int n_out) {
    mq_load_codes<T_Q6_K>(sw, w, sb, nsb, o0, n_out);
    for (int o = threadIdx.x; o < MQ_BN; o += blockDim.x) {
        u32 sw4[4];
        sd[o] = mq_q6k_scales(w, sb, nsb, o0 + o, n_out, sw4);
        for (int i = 0; i < 16; i++) isc[o * MQ_SC + i] = (signed char)byte_of(sw4[i >> 2], i & 3);
    }
}

// out[r * n_out + o] (+)= W[o] . x[r] for Q6_K weights on K8 activations (kq codes, kd scale per 256; Q6_K has
// no min term, so the K8 code sums are not read). Rows, grid and block as mmq_body.
__device__ __forceinline__ void mmq_q6_k8_body(float* out, const u8* w, const signed char* kq, const float* kd,
                                               int width, int n_out, int n_rows, int accumulate, int r0) {
    __shared__ __align__(16) signed char sa[MQ_BM * MQ_LD];
    __shared__ __align__(16) signed char sw[MQ_BN * MQ_LD];
    __shared__ float sdx[MQ_BM];
    __shared__ int sisc[MQ_BN * MQ_SC];
    __shared__ float sd[MQ_BN];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * MQ_BN;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K;
    float acc[2][4][4];
    mq_zero(acc);

    for (int sb = 0; sb < nsb; sb++) {
        mq_stage_k8(sa, sdx, kq, kd, width, sb, r0, n_rows);
        mq_load_q6k_k8(sw, sisc, sd, w, sb, nsb, o0, n_out);
        __syncthreads();
        int isum[2][4][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) isum[mi][ni][e] = 0;
#pragma unroll 1
        for (int kb = 0; kb < 8; kb++) {
            int a[2][2][2], b[4][2]; // [mi][half][reg], [ni][half]
            mq_fragments(a, b, sa, sw, wm, wn, kb, g, t);
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int slo[2], shi[2];
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                    int o = wn + 8 * ni + 2 * t + cc;
                    slo[cc] = sisc[o * MQ_SC + 2 * kb];
                    shi[cc] = sisc[o * MQ_SC + 2 * kb + 1];
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    int lo[4], hi[4];
                    mma_s8_16816(lo, a[mi][0][0], a[mi][0][1], b[ni][0]);
                    mma_s8_16816(hi, a[mi][1][0], a[mi][1][1], b[ni][1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) isum[mi][ni][e] += slo[e & 1] * lo[e] + shi[e & 1] * hi[e];
                }
            }
        }
        // One float step per (row, output) for this super-block.
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = wm + 16 * mi + g + 8 * (e >> 1), o = wn + 8 * ni + 2 * t + (e & 1);
                    acc[mi][ni][e] = __fadd_rn(acc[mi][ni][e], k8_step(sd[o], 0.0f, sdx[r], isum[mi][ni][e], 0));
                }
        __syncthreads();
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// `ks` (the K8 code sums) keeps the argument list of the other prefill kernels.
extern "C" __global__ void __launch_bounds__(128) mmq_q6_k8(float* out, const u8* w, const signed char* kq,
                                                            const float* kd, const int* ks, int width, int n_out,
                                                            int n_rows, int accumulate) {
    mmq_q6_k8_body(out, w, kq, kd, width, n_out, n_rows, accumulate, blockIdx.y * MQ_BM);
}

// ---- Q4_K on K8 activations. Per 32-element sub-block j the two 16-element mma halves are chained into one exact
// dot, scaled by the integer sub-block scale into isum; the min term sum_j m_j (sum of the sub-block's codes) runs
// on the tensor cores too, as an mma of the activation codes against each output's mins replicated over their 32
// elements, chained through the super-block into imin. One float step k8_step per (row, output, super-block), in
// ascending super-block order (the prefill kernel's own bits; rows independent of the tile). A warp takes its two
// 16-row halves in turn, so the integer sums cost 32 registers, not 64. ----

// Q4_K weights of slice `sb` as int8 codes (as mq_load_weights) plus each output's integer scales per 32 elements
// (isc[j][o]) and its mins replicated into all four bytes (imn[j][o], an mma B word), sub-block-major so that a
// lane's two C columns are adjacent; and each output's float d and dmin.
__device__ __forceinline__ void mq_load_q4k_k8(signed char* sw, int* isc, int* imn, float* sd, float* sdm,
                                               const u8* w, int sb, int nsb, int o0, int n_out) {
    mq_load_codes<T_Q4_K>(sw, w, sb, nsb, o0, n_out);
    for (int o = threadIdx.x; o < MQ_BN; o += blockDim.x) {
        float d, dmin;
        u32 s0, s1, s2;
        mq_q4k_header(w, sb, nsb, o0 + o, n_out, d, dmin, s0, s1, s2);
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            k4_sm(s0, s1, s2, j, scj, mj);
            isc[j * MQ_BN + o] = scj;
            imn[j * MQ_BN + o] = mj * 0x01010101;
        }
        sd[o] = d;
        sdm[o] = dmin;
    }
}

// out[r * n_out + o] (+)= W[o] . x[r] for Q4_K weights on K8 activations (kq codes, kd scale per 256; the min
// term comes from the codes themselves, so the K8 code sums are not read). Rows, grid and block as mmq_body.
__device__ __forceinline__ void mmq_q4_k8_body(float* out, const u8* w, const signed char* kq, const float* kd,
                                               int width, int n_out, int n_rows, int accumulate, int r0) {
    __shared__ __align__(16) signed char sa[MQ_BM * MQ_LD];
    __shared__ __align__(16) signed char sw[MQ_BN * MQ_LD];
    __shared__ float sdx[MQ_BM];
    __shared__ __align__(8) int sisc[8 * MQ_BN];
    __shared__ int simn[8 * MQ_BN];
    __shared__ float sd[MQ_BN], sdm[MQ_BN];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * MQ_BN;
    int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
    int nsb = width / MQ_K;
    float acc[2][4][4];
    mq_zero(acc);

    for (int sb = 0; sb < nsb; sb++) {
        mq_stage_k8(sa, sdx, kq, kd, width, sb, r0, n_rows);
        mq_load_q4k_k8(sw, sisc, simn, sd, sdm, w, sb, nsb, o0, n_out);
        __syncthreads();
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            int isum[4][4], imin[4][4];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) isum[ni][e] = imin[ni][e] = 0;
#pragma unroll 1
            for (int kb = 0; kb < 8; kb++) {
                int a[2][2]; // [half][reg] of rows wm + 16 mi ..
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const signed char* p = sa + (wm + 16 * mi + g) * MQ_LD + 32 * kb + 16 * hh + 4 * t;
                    a[hh][0] = *(const int*)p;
                    a[hh][1] = *(const int*)(p + 8 * MQ_LD);
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const signed char* q = sw + (wn + 8 * ni + g) * MQ_LD + 32 * kb + 4 * t;
                    int b_lo = *(const int*)q, b_hi = *(const int*)(q + 16);
                    // This lane's B column is output wn + 8 ni + g: its min, in all four bytes.
                    int b_min = simn[kb * MQ_BN + wn + 8 * ni + g];
                    int dot[4];
                    mma_s8_16816(dot, a[0][0], a[0][1], b_lo);
                    mma_s8_16816_acc(dot, a[1][0], a[1][1], b_hi);
                    mma_s8_16816_acc(imin[ni], a[0][0], a[0][1], b_min);
                    mma_s8_16816_acc(imin[ni], a[1][0], a[1][1], b_min);
                    int2 sc = *(const int2*)(sisc + kb * MQ_BN + wn + 8 * ni + 2 * t);
#pragma unroll
                    for (int e = 0; e < 4; e++) isum[ni][e] += ((e & 1) ? sc.y : sc.x) * dot[e];
                }
            }
            // One float step per (row, output) for this super-block: acc += dx (d isum - dmin imin), with explicit
            // roundings (this kernel's own order; 5 operations where k8_step takes 8).
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = wm + 16 * mi + g + 8 * (e >> 1), o = wn + 8 * ni + 2 * t + (e & 1);
                    float v = __fmaf_rn(-sdm[o], (float)imin[ni][e], __fmul_rn(sd[o], (float)isum[ni][e]));
                    acc[mi][ni][e] = __fmaf_rn(sdx[r], v, acc[mi][ni][e]);
                }
        }
        __syncthreads();
    }
    mq_store(out, acc, r0 + wm, o0 + wn, g, t, n_rows, n_out, accumulate);
}

// `ks` (the K8 code sums) keeps the argument list of the other prefill kernels.
extern "C" __global__ void __launch_bounds__(128) mmq_q4_k8(float* out, const u8* w, const signed char* kq,
                                                            const float* kd, const int* ks, int width, int n_out,
                                                            int n_rows, int accumulate) {
    mmq_q4_k8_body(out, w, kq, kd, width, n_out, n_rows, accumulate, blockIdx.y * MQ_BM);
}

#define MMQ_KERNEL(NAME, TY)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128) NAME(float* out, const u8* w, const signed char* xq,      \
                                                           const float* xd, const float* xs, int width,          \
                                                           int n_out, int n_rows, int accumulate) {             \
        mmq_body<TY>(out, w, xq, xd, xs, width, n_out, n_rows, accumulate, blockIdx.y * MQ_BM);                \
    }
MMQ_KERNEL(mmq_q4_k, T_Q4_K)
MMQ_KERNEL(mmq_q6_k, T_Q6_K)
MMQ_KERNEL(mmq_q8_0, T_Q8_0)
