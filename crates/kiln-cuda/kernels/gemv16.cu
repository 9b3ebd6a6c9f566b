// The decode-path matmul for blocks of rows (a speculative verify block, several slots decoding) on int8 tensor
// cores, giving every row the exact bits of the one-row GEMV (gemv.cu).
//
// The GEMV computes an output with 32 lanes: each lane sums, in a fixed order, float terms of exact integer dots
// (q4k_term / q6k_add / q8_term), and an xor-shuffle tree adds the lanes. Here one block computes 8 outputs for
// 16 rows: an mma.sync m16n8k16 yields, for all 16 x 8 pairs at once, the integer dot one GEMV lane takes for
// one piece of its weight row; the lane's float steps are replayed on those integers in the same order (one
// running sum per GEMV lane and C element). Warp w replays GEMV lanes 8w .. 8w + 7, so the four warps walk
// disjoint parts of the weight row at once; the 32 lane sums of every C element then meet in shared memory and
// are added in the xor tree's pairing (lane L with L + 16, + 8, + 4, + 2, + 1). Integer dots are exact and every
// float operation is the same explicitly rounded one, so the bits match; the self-test checks it (a row alone
// through gemv_r1 against the same row in a block here). Activation fragments come straight from global memory
// (the block's 16 rows stay in L1 and L2: every block reads them).

// Each warp stages the activations of the 256 elements it works on next, for the block's 16 rows, in its own
// shared memory (16-byte loads, two rows a load; zeros past n_rows): Q8 codes with rows padded to 272 bytes (the
// fragment reads below hit distinct banks) and the 8 blocks' scales and sums with rows padded to 12 floats.
#define G16_LD 272
#define G16_XS 12
struct G16Stage {
    signed char x[16 * G16_LD];
    float d[16 * G16_XS], s[16 * G16_XS];
};

// Stages elements col0 .. col0 + 255 (col0 a multiple of 32) of rows r0 .. r0 + 15.
__device__ __forceinline__ void g16_stage(G16Stage& st, const signed char* xq, const float* xd, const float* xs,
                                          int width, long long col0, int r0, int n_rows) {
    int lane = threadIdx.x & 31, nb = width / 32;
    __syncwarp();
#pragma unroll
    for (int m = 0; m < 8; m++) {
        int u = lane + 32 * m, r = u >> 4, c = u & 15;
        int4 v = r0 + r < n_rows ? ldg16(xq + (long long)(r0 + r) * width + col0 + 16 * c) : make_int4(0, 0, 0, 0);
        *(int4*)(st.x + r * G16_LD + 16 * c) = v;
    }
    int r = lane >> 1, h = lane & 1;
    long long b = (long long)(r0 + r) * nb + col0 / 32 + 4 * h;
    bool in = r0 + r < n_rows;
    float4 dv = in ? *(const float4*)(xd + b) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 sv = in ? *(const float4*)(xs + b) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *(float4*)(st.d + r * G16_XS + 4 * h) = dv;
    *(float4*)(st.s + r * G16_XS + 4 * h) = sv;
    __syncwarp();
}

// A fragment (rows g and g + 8, 4 bytes at byte `col` of the staged 256) of the staged activations `sx`.
__device__ __forceinline__ void g16_a(const signed char* sx, int col, int& a0, int& a1) {
    int g = (threadIdx.x & 31) >> 2;
    a0 = *(const int*)(sx + g * G16_LD + col);
    a1 = *(const int*)(sx + (g + 8) * G16_LD + col);
}

// Shared memory for the lane sums: [GEMV lane][C element][thread of the warp].
#define G16_RED (32 * 4 * 32)

// Publishes this warp's 8 GEMV lanes' sums (s[l][e] for GEMV lane 8 warp + l), adds all 32 in the xor tree's
// pairing and stores C element e = threadIdx.x / 32 of warp-thread threadIdx.x % 32: row g + 8 (e / 2), output
// 2 t + e % 2 of the block's 8. The caller's block has 128 threads.
__device__ __forceinline__ void g16_finish(float* red, const float (&s)[8][4], float* out, int o0, int r0, int n_out,
                                           int n_rows, int accumulate) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int l = 0; l < 8; l++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[((8 * warp + l) * 4 + e) * 32 + lane] = s[l][e];
    __syncthreads();
    int e = threadIdx.x >> 5, tl = lane;
    float v[32];
#pragma unroll
    for (int L = 0; L < 32; L++) v[L] = red[(L * 4 + e) * 32 + tl];
#pragma unroll
    for (int lv = 4; lv >= 0; lv--)
#pragma unroll
        for (int L = 0; L < (1 << lv); L++) v[L] = __fadd_rn(v[L], v[L + (1 << lv)]);
    int g = tl >> 2, t = tl & 3;
    int r = r0 + g + 8 * (e >> 1), o = o0 + 2 * t + (e & 1);
    if (r < n_rows && o < n_out) {
        float* p = out + (long long)r * n_out + o;
        *p = accumulate ? *p + v[0] : v[0];
    }
}

// Q4_K super-block `sb` for a block kernel lane: the two C columns' d, dmin and packed scale words (from their
// 16-byte headers) and the lane's B words, 4 bytes of each 16-byte quant chunk of output o0 + g.
__device__ __forceinline__ void g16_q4k_weights(const u8* wg, const u8* const* wc, int sb, int t, float* d,
                                                float* dmin, u32 (*sw)[3], u32* q) {
#pragma unroll
    for (int cc = 0; cc < 2; cc++) {
        int4 h = wc[cc] ? ldg16(wc[cc] + (long long)sb * 144) : make_int4(0, 0, 0, 0);
        d[cc] = h2f((u16)(h.x & 0xFFFF));
        dmin[cc] = h2f((u16)((u32)h.x >> 16));
        sw[cc][0] = (u32)h.y;
        sw[cc][1] = (u32)h.z;
        sw[cc][2] = (u32)h.w;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = wg ? __ldg((const u32*)(wg + (long long)sb * 144 + 16 + 16 * i + 4 * t)) : 0u;
}

// Q4_K. GEMV lane 8a + i takes chunk i (sub-blocks j0 = 2 (i / 2), j0 + 1, elements 16 (i % 2) ..) of super-blocks
// a, a + 4, a + 8, ...: warp w replays a = w.
// grid = (ceil(n_out / 8), ceil(n_rows / 16)), block = 128.
extern "C" __global__ void __launch_bounds__(128) gemv16_q4k(float* out, const u8* w, const signed char* xq,
                                                             const float* xd, const float* xs, int width,
                                                             int n_out, int n_rows, int accumulate) {
    __shared__ float red[G16_RED];
    __shared__ __align__(16) G16Stage stage[4];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, a = threadIdx.x >> 5;
    G16Stage& st = stage[a];
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    // This lane's B row (output o0 + g) and C columns (outputs o0 + 2t, o0 + 2t + 1).
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 144 : nullptr;
    const u8* wc[2];
#pragma unroll
    for (int cc = 0; cc < 2; cc++) wc[cc] = o0 + 2 * t + cc < n_out ? w + (long long)(o0 + 2 * t + cc) * nsb * 144 : nullptr;
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    for (int sb = a; sb < nsb; sb += 4) {
        g16_stage(st, xq, xd, xs, width, (long long)sb * 256, r0, n_rows);
        // Scales of the two C columns (d, dmin, the 12 packed scale bytes) and this lane's B words.
        float d[2], dmin[2];
        u32 sw[2][3], q[8];
        g16_q4k_weights(wg, wc, sb, t, d, dmin, sw, q);
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            int j0 = 2 * jp;
            // Activation scales and sums of sub-blocks j0, j0 + 1 for rows g, g + 8: [row half][j].
            float dx[4], sm[4];
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                float2 dv = *(const float2*)(st.d + (g + 8 * rh) * G16_XS + j0);
                float2 sv = *(const float2*)(st.s + (g + 8 * rh) * G16_XS + j0);
                dx[2 * rh] = dv.x;
                dx[2 * rh + 1] = dv.y;
                sm[2 * rh] = sv.x;
                sm[2 * rh + 1] = sv.y;
            }
            float s0[2], s1[2], mn0[2], mn1[2];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                int sc0, m0, sc1, m1;
                k4_sm(sw[cc][0], sw[cc][1], sw[cc][2], j0, sc0, m0);
                k4_sm(sw[cc][0], sw[cc][1], sw[cc][2], j0 + 1, sc1, m1);
                s0[cc] = d[cc] * (float)sc0;
                s1[cc] = d[cc] * (float)sc1;
                mn0[cc] = -dmin[cc] * (float)m0;
                mn1[cc] = -dmin[cc] * (float)m1;
            }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int i = 2 * jp + hf, half = hf * 16;
                float mk = half ? 0.0f : 1.0f;
                int blo = (int)(q[i] & 0x0F0F0F0Fu), bhi = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
                int col = j0 * 32 + half + 4 * t;
                int alo0, alo1, ahi0, ahi1;
                g16_a(st.x, col, alo0, alo1);
                g16_a(st.x, col + 32, ahi0, ahi1);
                int lo[4], hi[4];
                mma_s8_16816(lo, alo0, alo1, blo);
                mma_s8_16816(hi, ahi0, ahi1, bhi);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int rh = e >> 1, cc = e & 1;
                    acc[i][e] = __fadd_rn(acc[i][e], q4k_term(lo[e], hi[e], dx[2 * rh], dx[2 * rh + 1], s0[cc],
                                                              s1[cc], mn0[cc], mn1[cc], sm[2 * rh], sm[2 * rh + 1],
                                                              mk));
                }
            }
        }
    }
    g16_finish(red, acc, out, o0, r0, n_out, n_rows, accumulate);
}

// Q6_K. GEMV lane 4 G + u takes unit u (half h = u / 2, column half c = u % 2) of super-blocks G, G + 8, ...;
// per super-block its sum starts at 0 and adds the pieces k = 0..3 (sub-block 4 h + k, elements 16 c ..): warp w
// replays G = 2w and 2w + 1. grid and block as gemv16_q4k.
extern "C" __global__ void __launch_bounds__(128) gemv16_q6k(float* out, const u8* w, const signed char* xq,
                                                             const float* xd, const float* xs, int width,
                                                             int n_out, int n_rows, int accumulate) {
    __shared__ float red[G16_RED];
    __shared__ __align__(16) G16Stage stage[4];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    G16Stage& st = stage[warp];
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 208 : nullptr;
    const u16* dd = (const u16*)(w + (long long)n_out * nsb * 208);
    int oc[2] = {o0 + 2 * t, o0 + 2 * t + 1};
    float acc[8][4]; // [4 (G - 2 warp) + u][e]
#pragma unroll
    for (int l = 0; l < 8; l++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[l][e] = 0.0f;
#pragma unroll
    for (int gg = 0; gg < 2; gg++) {
        int G = 2 * warp + gg;
        for (int sb = G; sb < nsb; sb += 8) {
            g16_stage(st, xq, xd, xs, width, (long long)sb * 256, r0, n_rows);
            float d[2];
            u32 scw[2][4];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                bool in = oc[cc] < n_out;
                int4 s4 = in ? ldg16(w + ((long long)oc[cc] * nsb + sb) * 208 + 192) : make_int4(0, 0, 0, 0);
                d[cc] = in ? h2f(dd[(long long)oc[cc] * nsb + sb]) : 0.0f;
                scw[cc][0] = (u32)s4.x;
                scw[cc][1] = (u32)s4.y;
                scw[cc][2] = (u32)s4.z;
                scw[cc][3] = (u32)s4.w;
            }
            const u8* p = wg ? wg + (long long)sb * 208 : nullptr;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int h = u >> 1, c = u & 1;
                u32 qa = p ? __ldg((const u32*)(p + 64 * h + 16 * c + 4 * t)) : 0u;
                u32 qb = p ? __ldg((const u32*)(p + 64 * h + 32 + 16 * c + 4 * t)) : 0u;
                u32 qh = p ? __ldg((const u32*)(p + 128 + 32 * h + 16 * c + 4 * t)) : 0u;
                // Sub-blocks 4h + k: k = 0, 1 from the low nibbles of qa, qb; k = 2, 3 from their high nibbles.
                u32 nib[4] = {qa & 0x0F0F0F0Fu, qb & 0x0F0F0F0Fu, (qa >> 4) & 0x0F0F0F0Fu, (qb >> 4) & 0x0F0F0F0Fu};
                float dx[2][4]; // [row half][k]
#pragma unroll
                for (int rh = 0; rh < 2; rh++) {
                    float4 v = *(const float4*)(st.d + (g + 8 * rh) * G16_XS + 4 * h);
                    dx[rh][0] = v.x;
                    dx[rh][1] = v.y;
                    dx[rh][2] = v.z;
                    dx[rh][3] = v.w;
                }
                float psum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 v = nib[k] | (((qh >> (2 * k)) & 0x03030303u) << 4);
                    int b = (int)__vsub4(v, 0x20202020u);
                    int a0, a1;
                    g16_a(st.x, (4 * h + k) * 32 + 16 * c + 4 * t, a0, a1);
                    int dot[4];
                    mma_s8_16816(dot, a0, a1, b);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int cc = e & 1;
                        float s = d[cc] * (float)(signed char)byte_of(scw[cc][(8 * h + 2 * k + c) >> 2],
                                                                      (8 * h + 2 * k + c) & 3);
                        psum[e] = q6k_add(psum[e], dot[e], dx[e >> 1][k], s);
                    }
                }
#pragma unroll
                for (int e = 0; e < 4; e++) acc[4 * gg + u][e] = __fadd_rn(acc[4 * gg + u][e], psum[e]);
            }
        }
    }
    g16_finish(red, acc, out, o0, r0, n_out, n_rows, accumulate);
}

// Q8_0. GEMV lane L takes blocks L, L + 32, L + 64, ...: warp w replays L = 8w .. 8w + 7, walking its blocks 8
// at a time (blocks 8w + 32k .. 8w + 32k + 7 are 256 consecutive elements; each lane's sum still adds its own
// blocks in order). grid and block as gemv16_q4k.
extern "C" __global__ void __launch_bounds__(128) gemv16_q8_0(float* out, const u8* w, const signed char* xq,
                                                              const float* xd, const float* xs, int width,
                                                              int n_out, int n_rows, int accumulate) {
    __shared__ float red[G16_RED];
    __shared__ __align__(16) G16Stage stage[4];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    G16Stage& st = stage[warp];
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nb = width / 32; // a multiple of 8
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nb * 32 : nullptr;
    const u16* dd = (const u16*)(w + (long long)n_out * nb * 32);
    int oc[2] = {o0 + 2 * t, o0 + 2 * t + 1};
    float acc[8][4];
#pragma unroll
    for (int l = 0; l < 8; l++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[l][e] = 0.0f;
    for (int b0 = 8 * warp; b0 < nb; b0 += 32) {
        g16_stage(st, xq, xd, xs, width, (long long)b0 * 32, r0, n_rows);
        u32 q[8][2];
#pragma unroll
        for (int l = 0; l < 8; l++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) q[l][hh] = wg ? __ldg((const u32*)(wg + (b0 + l) * 32 + 16 * hh + 4 * t)) : 0u;
#pragma unroll
        for (int l = 0; l < 8; l++) {
            // The block's two 16-element halves chained in the mma: its exact dot.
            int dot[4], a0, a1;
            g16_a(st.x, 32 * l + 4 * t, a0, a1);
            mma_s8_16816(dot, a0, a1, (int)q[l][0]);
            g16_a(st.x, 32 * l + 16 + 4 * t, a0, a1);
            mma_s8_16816_acc(dot, a0, a1, (int)q[l][1]);
            float d[2], dx[2];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) d[cc] = oc[cc] < n_out ? h2f(dd[(long long)oc[cc] * nb + b0 + l]) : 0.0f;
#pragma unroll
            for (int rh = 0; rh < 2; rh++) dx[rh] = st.d[(g + 8 * rh) * G16_XS + l];
#pragma unroll
            for (int e = 0; e < 4; e++) acc[l][e] = __fadd_rn(acc[l][e], q8_term(dot[e], dx[e >> 1], d[e & 1]));
        }
    }
    g16_finish(red, acc, out, o0, r0, n_out, n_rows, accumulate);
}

// ---- K-quants on K8 activations (gemv.cu's gemv_q4k8_body / gemv_q6k8_body, the same integers and float steps) ----
// Per super-block and C element the warp sums the sub-block-scaled integer dots of the 8 chunks (Q4_K) or 4 units
// (Q6_K) exactly, as the GEMV's lane group does by shuffles, then takes the one float step k8_step. So each lane
// carries one running sum per group and C element, and the groups meet in shared memory in the xor tree's pairing.

struct G16StageK8 {
    signed char x[16 * G16_LD];
    float d[16]; // each row's scale of this super-block
    int s[16 * 4]; // each row's 8 per-32 code sums as 4 pairs of int16 (|sum| <= 32 * 127)
};

// A lane's part of the K8 staging, fixed for the whole block: rows r0 + lane / 16 + 2m (m = 0 .. 7), 16 bytes at
// 16 (lane % 16) of each 256-wide slice; bit m of `in` says whether that row exists.
struct G16SrcK8 {
    const signed char* x;
    long long step;
    unsigned in;
};

__device__ __forceinline__ G16SrcK8 g16_src_k8(const signed char* kq, int width, int r0, int n_rows) {
    int lane = threadIdx.x & 31, r = r0 + (lane >> 4);
    G16SrcK8 src{kq + (long long)r * width + 16 * (lane & 15), 2LL * width, 0u};
#pragma unroll
    for (int m = 0; m < 8; m++) src.in |= (r + 2 * m < n_rows ? 1u : 0u) << m;
    return src;
}

__device__ __forceinline__ void g16_stage_k8(G16StageK8& st, const G16SrcK8& src, const float* kd, const int* ks,
                                             int width, int sb, int r0, int n_rows) {
    int lane = threadIdx.x & 31, nsb = width / 256;
    __syncwarp();
    const signed char* p = src.x + sb * 256;
    signed char* d = st.x + (lane >> 4) * G16_LD + 16 * (lane & 15);
#pragma unroll
    for (int m = 0; m < 8; m++) {
        int4 v = (src.in >> m) & 1u ? ldg16(p) : make_int4(0, 0, 0, 0);
        *(int4*)(d + 2 * m * G16_LD) = v;
        p += src.step;
    }
    int r = lane >> 1, h = lane & 1;
    bool in = r0 + r < n_rows;
    int4 sv = in ? *(const int4*)(ks + ((long long)(r0 + r) * nsb + sb) * 8 + 4 * h) : make_int4(0, 0, 0, 0);
    int2 pairs = make_int2((int)__byte_perm(sv.x, sv.y, 0x5410), (int)__byte_perm(sv.z, sv.w, 0x5410));
    *(int2*)(st.s + r * 4 + 2 * h) = pairs;
    if (lane < 16) st.d[lane] = r0 + lane < n_rows ? kd[(long long)(r0 + lane) * nsb + sb] : 0.0f;
    __syncwarp();
}

// Adds the per-group sums v[g][e] (group g of NG = 4 or 8, in smem) in the xor tree's pairing over the group bits
// and stores C element e of this warp-thread. Called by warp 0 after the exchange.
template <int NG>
__device__ __forceinline__ float g16_group_tree(const float* ex, int e, int lane) {
    float a[NG];
#pragma unroll
    for (int g = 0; g < NG; g++) a[g] = ex[(g * 4 + e) * 32 + lane];
#pragma unroll
    for (int half = NG / 2; half >= 1; half >>= 1)
#pragma unroll
        for (int g = 0; g < half; g++) a[g] = __fadd_rn(a[g], a[g + half]);
    return a[0];
}

__device__ __forceinline__ void g16_store_one(float* out, float v, int e, int o0, int r0, int n_out, int n_rows,
                                              int accumulate) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r = r0 + g + 8 * (e >> 1), o = o0 + 2 * t + (e & 1);
    if (r < n_rows && o < n_out) {
        float* p = out + (long long)r * n_out + o;
        *p = accumulate ? *p + v : v;
    }
}

// Q4_K, K8 activations: warp a replays the GEMV's group a (super-blocks a, a + 4, ...).
// grid = (ceil(n_out / 8), ceil(n_rows / 16)), block = 128.
extern "C" __global__ void __launch_bounds__(128) gemv16_q4k8(float* out, const u8* w, const signed char* kq,
                                                              const float* kd, const int* ks, int width, int n_out,
                                                              int n_rows, int accumulate) {
    __shared__ __align__(16) G16StageK8 stage[4];
    __shared__ float ex[4 * 4 * 32];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, a = threadIdx.x >> 5;
    G16StageK8& st = stage[a];
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 144 : nullptr;
    const u8* wc[2];
#pragma unroll
    for (int cc = 0; cc < 2; cc++) wc[cc] = o0 + 2 * t + cc < n_out ? w + (long long)(o0 + 2 * t + cc) * nsb * 144 : nullptr;
    G16SrcK8 src = g16_src_k8(kq, width, r0, n_rows);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int sb = a; sb < nsb; sb += 4) {
        g16_stage_k8(st, src, kd, ks, width, sb, r0, n_rows);
        // Scales of the two C columns (d, dmin, the 12 packed scale bytes) and this lane's B words.
        float d[2], dmin[2];
        u32 sw[2][3], q[8];
        g16_q4k_weights(wg, wc, sb, t, d, dmin, sw, q);
        int is[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            int j0 = 2 * jp;
            int sc0[2], m0[2], sc1[2], m1[2];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                k4_sm(sw[cc][0], sw[cc][1], sw[cc][2], j0, sc0[cc], m0[cc]);
                k4_sm(sw[cc][0], sw[cc][1], sw[cc][2], j0 + 1, sc1[cc], m1[cc]);
            }
            // Each sub-block's two 16-element halves chained in the mma: one exact dot per sub-block.
            int dot0[4], dot1[4];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int i = 2 * jp + hf;
                int blo = (int)(q[i] & 0x0F0F0F0Fu), bhi = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
                int col = j0 * 32 + hf * 16 + 4 * t;
                int a0, a1;
                g16_a(st.x, col, a0, a1);
                if (hf == 0)
                    mma_s8_16816(dot0, a0, a1, blo);
                else
                    mma_s8_16816_acc(dot0, a0, a1, blo);
                g16_a(st.x, col + 32, a0, a1);
                if (hf == 0)
                    mma_s8_16816(dot1, a0, a1, bhi);
                else
                    mma_s8_16816_acc(dot1, a0, a1, bhi);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) is[e] += sc0[e & 1] * dot0[e] + sc1[e & 1] * dot1[e];
            // The min term of sub-blocks j0, j0 + 1 (the GEMV's half-0 lane of this chunk pair): one dp2a of the
            // rows' code-sum pair against the column's two mins.
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int sp = st.s[(g + 8 * (e >> 1)) * 4 + jp];
                im[e] = __dp2a_lo(sp, m0[e & 1] | m1[e & 1] << 8, im[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[e] = __fadd_rn(acc[e], k8_step(d[e & 1], dmin[e & 1], st.d[g + 8 * (e >> 1)], is[e], im[e]));
    }
#pragma unroll
    for (int e = 0; e < 4; e++) ex[(a * 4 + e) * 32 + lane] = acc[e];
    __syncthreads();
    if (a != 0) return;
#pragma unroll
    for (int e = 0; e < 4; e++) g16_store_one(out, g16_group_tree<4>(ex, e, lane), e, o0, r0, n_out, n_rows, accumulate);
}

// Q6_K, K8 activations: warp w replays the GEMV's groups G = 2w and 2w + 1 (super-blocks G, G + 8, ...).
// grid and block as gemv16_q4k8.
extern "C" __global__ void __launch_bounds__(128) gemv16_q6k8(float* out, const u8* w, const signed char* kq,
                                                              const float* kd, const int* ks, int width, int n_out,
                                                              int n_rows, int accumulate) {
    __shared__ __align__(16) G16StageK8 stage[4];
    __shared__ float ex[8 * 4 * 32];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    G16StageK8& st = stage[warp];
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 208 : nullptr;
    const u16* dd = (const u16*)(w + (long long)n_out * nsb * 208);
    int oc[2] = {o0 + 2 * t, o0 + 2 * t + 1};
    G16SrcK8 src = g16_src_k8(kq, width, r0, n_rows);
#pragma unroll
    for (int gg = 0; gg < 2; gg++) {
        int G = 2 * warp + gg;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int sb = G; sb < nsb; sb += 8) {
            g16_stage_k8(st, src, kd, ks, width, sb, r0, n_rows);
            float d[2];
            u32 scw[2][4];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                bool in = oc[cc] < n_out;
                int4 s4 = in ? ldg16(w + ((long long)oc[cc] * nsb + sb) * 208 + 192) : make_int4(0, 0, 0, 0);
                d[cc] = in ? h2f(dd[(long long)oc[cc] * nsb + sb]) : 0.0f;
                scw[cc][0] = (u32)s4.x;
                scw[cc][1] = (u32)s4.y;
                scw[cc][2] = (u32)s4.z;
                scw[cc][3] = (u32)s4.w;
            }
            const u8* p = wg ? wg + (long long)sb * 208 : nullptr;
            int is[4] = {0, 0, 0, 0};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int h = u >> 1, c = u & 1;
                u32 qa = p ? __ldg((const u32*)(p + 64 * h + 16 * c + 4 * t)) : 0u;
                u32 qb = p ? __ldg((const u32*)(p + 64 * h + 32 + 16 * c + 4 * t)) : 0u;
                u32 qh = p ? __ldg((const u32*)(p + 128 + 32 * h + 16 * c + 4 * t)) : 0u;
                u32 nib[4] = {qa & 0x0F0F0F0Fu, qb & 0x0F0F0F0Fu, (qa >> 4) & 0x0F0F0F0Fu, (qb >> 4) & 0x0F0F0F0Fu};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 v = nib[k] | (((qh >> (2 * k)) & 0x03030303u) << 4);
                    int b = (int)__vsub4(v, 0x20202020u);
                    int a0, a1, dot[4];
                    g16_a(st.x, (4 * h + k) * 32 + 16 * c + 4 * t, a0, a1);
                    mma_s8_16816(dot, a0, a1, b);
                    int sbi = 8 * h + 2 * k + c;
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        is[e] += (int)(signed char)byte_of(scw[e & 1][sbi >> 2], sbi & 3) * dot[e];
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[e] = __fadd_rn(acc[e], k8_step(d[e & 1], 0.0f, st.d[g + 8 * (e >> 1)], is[e], 0));
        }
#pragma unroll
        for (int e = 0; e < 4; e++) ex[(G * 4 + e) * 32 + lane] = acc[e];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int e = 0; e < 4; e++) g16_store_one(out, g16_group_tree<8>(ex, e, lane), e, o0, r0, n_out, n_rows, accumulate);
}
