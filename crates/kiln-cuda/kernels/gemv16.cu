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
// through gemv_r1 against the same row in a block here). The per-32 Q4_K/Q6_K kernels stage each step's
// activations per warp; the Q8_0 kernel copies the next step's while this one multiplies (cp.async).
// The K8 kernel (gemv16_k8, bodies b16_q4k8 / b16_q6k8: the decode path's default for K-quant models) is built
// differently: B16_OUT outputs a block, cp.async-pipelined, its integers from the prefill kernels' tensor-core forms.

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
    wait_prior_kernel();
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
    wait_prior_kernel();
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

// A warp's copies of 16 activation rows x 256 bytes into a stage (row stride MP_LDA): consecutive lanes on
// consecutive 16-byte chunks (rows lane / 16 + 2 m, chunk lane % 16), so each instruction reads two rows' 512
// contiguous bytes; rows from n_rows on are zero-filled (from row r0). (A per-lane plan of 32-byte pieces worked
// out once a launch cut the SASS but ran 0.70x as fast end to end on the H100: measured and taken out.)
struct B16Acts {
    const signed char* x; // the activations, rows r0 .. r0 + rows - 1 of `width`
    int width, r0, rows;
    __device__ __forceinline__ B16Acts(const signed char* xq, int width_, int r0_, int n_rows)
        : x(xq), width(width_), r0(r0_), rows(n_rows - r0_) {}
    // The 256 bytes from element `at` of each row into stage st.
    __device__ __forceinline__ void copy(unsigned char* st, int at) const {
        int lane = threadIdx.x & 31;
        const signed char* s = x + (long long)(r0 + (lane >> 4)) * width + 16 * (lane & 15) + at;
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int r = (lane >> 4) + 2 * m;
            bool in = r < rows;
            cp_async<16>(st + r * MP_LDA + 16 * (lane & 15), in ? s + 2LL * m * width : x, in);
        }
    }
};

// Q8_0. GEMV lane L takes blocks L, L + 32, L + 64, ...: warp w replays L = 8w .. 8w + 7, walking its blocks 8
// at a time (blocks 8w + 32k .. 8w + 32k + 7 are 256 consecutive elements; each lane's sum still adds its own
// blocks in order). A block's exact dot is one m16n8k32 with its 32 elements permuted alike in A and B (lane t
// takes elements 8t .. 8t + 7 where the mma's layout says 4t .. 4t + 3 and 16 + 4t ..: the integer sum is the
// same), so a lane's B words for a block are one 8-byte load. Pipelined: while a step multiplies, the next one's
// activation codes and scales are copied into the warp's other buffer (cp.async) and its weight words and the
// 8 outputs' scales (one 16-byte load per output) are loaded into registers.
// grid = (ceil(n_out / 8), ceil(n_rows / 16)), block = 128.
#define Q8B_XS 12                            // row stride (floats) of the staged activation scales: distinct banks
#define Q8B_STAGE (16 * MP_LDA + 16 * Q8B_XS * 4) // codes [16][MP_LDA], scales [16][Q8B_XS]
static_assert(4 * 2 * Q8B_STAGE >= G16_RED * 4, "the lane sums reuse the stages");
extern "C" __global__ void __launch_bounds__(128) gemv16_q8_0(float* out, const u8* w, const signed char* xq,
                                                              const float* xd, const float* xs, int width,
                                                              int n_out, int n_rows, int accumulate) {
    wait_prior_kernel();
    (void)xs;
    __shared__ __align__(16) unsigned char smem[4 * 2 * Q8B_STAGE];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    unsigned char* base = smem + warp * 2 * Q8B_STAGE;
    int o0 = blockIdx.x * 8, r0 = blockIdx.y * 16;
    int nb = width / 32; // a multiple of 8
    bool g_in = o0 + g < n_out;
    const u8* wg = w + (long long)(g_in ? o0 + g : 0) * nb * 32 + 8 * t;
    const u16* dg = (const u16*)(w + (long long)n_out * nb * 32) + (long long)(g_in ? o0 + g : 0) * nb;
    // Activation sources: the codes (B16Acts), scales of row lane / 2 (half lane % 2).
    B16Acts xa(xq, width, r0, n_rows);
    bool s_in = r0 + (lane >> 1) < n_rows;
    const float* dsrc = xd + (long long)(s_in ? r0 + (lane >> 1) : 0) * nb + 4 * (lane & 1);
    int n_it = 8 * warp < nb ? (nb - 8 * warp + 31) / 32 : 0; // steps: blocks b0 = 8 warp + 32 it ..
    auto issue = [&](int it) {
        int b0 = 8 * warp + 32 * it;
        unsigned char* st = base + (it & 1) * Q8B_STAGE;
        xa.copy(st, b0 * 32);
        cp_async<16>(st + 16 * MP_LDA + (lane >> 1) * Q8B_XS * 4 + 16 * (lane & 1), dsrc + b0, s_in);
        cp_commit();
    };
    // This lane's weight words (output o0 + g, elements 8t .. 8t + 7 of each block) and output o0 + g's scales.
    auto load_w = [&](int it, uint2 (&q)[8], int4& dv) {
        int b0 = 8 * warp + 32 * it;
#pragma unroll
        for (int l = 0; l < 8; l++) q[l] = g_in ? __ldg((const uint2*)(wg + (long long)(b0 + l) * 32)) : make_uint2(0, 0);
        dv = g_in ? ldg16(dg + b0) : make_int4(0, 0, 0, 0);
    };
    float acc[8][4];
#pragma unroll
    for (int l = 0; l < 8; l++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[l][e] = 0.0f;
    uint2 qn[8];
    int4 dn = make_int4(0, 0, 0, 0);
    if (n_it > 0) {
        issue(0);
        load_w(0, qn, dn);
    }
    for (int it = 0; it < n_it; it++) {
        uint2 q[8];
#pragma unroll
        for (int l = 0; l < 8; l++) q[l] = qn[l];
        int4 dv = dn;
        cp_wait_all();
        __syncwarp(); // step it is in; every lane is done with step it - 1's buffer
        if (it + 1 < n_it) {
            issue(it + 1);
            load_w(it + 1, qn, dn);
        }
        const unsigned char* sa = base + (it & 1) * Q8B_STAGE;
        const float* sdx = (const float*)(sa + 16 * MP_LDA);
        // The C columns' outputs 2t, 2t + 1: their scale words from the lanes that loaded them.
        int dw[2][4];
#pragma unroll
        for (int cc = 0; cc < 2; cc++) {
            int src = 4 * (2 * t + cc);
            dw[cc][0] = __shfl_sync(0xffffffffu, dv.x, src);
            dw[cc][1] = __shfl_sync(0xffffffffu, dv.y, src);
            dw[cc][2] = __shfl_sync(0xffffffffu, dv.z, src);
            dw[cc][3] = __shfl_sync(0xffffffffu, dv.w, src);
        }
#pragma unroll
        for (int l = 0; l < 8; l++) {
            const unsigned char* pa = sa + g * MP_LDA + 32 * l + 8 * t;
            int2 lo = *(const int2*)pa, hi = *(const int2*)(pa + 8 * MP_LDA);
            int a[4] = {lo.x, hi.x, lo.y, hi.y};
            int dot[4] = {0, 0, 0, 0};
            mma_s8_16832(dot, a, (int)q[l].x, (int)q[l].y);
            float d[2], dx[2];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) d[cc] = h2f((u16)((u32)dw[cc][l >> 1] >> (16 * (l & 1))));
#pragma unroll
            for (int rh = 0; rh < 2; rh++) dx[rh] = sdx[(g + 8 * rh) * Q8B_XS + l];
#pragma unroll
            for (int e = 0; e < 4; e++) acc[l][e] = __fadd_rn(acc[l][e], q8_term(dot[e], dx[e >> 1], d[e & 1]));
        }
    }
    __syncthreads(); // every warp is done with its buffers: the lane sums reuse them
    g16_finish((float*)smem, acc, out, o0, r0, n_out, n_rows, accumulate);
}

// ---- K-quants on K8 activations (gemv.cu's gemv_q4k8_body / gemv_q6k8_body, the same integers and float steps) ----
// Per super-block and C element the warp computes the exact integers the GEMV's lane group sums by shuffles, then
// takes the one float step k8_step. So each lane carries one running sum per group and C element, and the groups
// meet in shared memory in the xor tree's pairing.

// The K8 block kernel comes in two tiles, OUT = 32 or 16 outputs a block (gemv16_k8, gemv16_k8_o16; the host
// picks one per launch). With 32, the 8B's o-proj and down (4,096 outputs) are 128 blocks, under one a
// multiprocessor, each warp a long dependent chain; 16 gives twice the blocks at about half the chain a warp (the
// same weight bytes; each block copies the 16 rows' activations again, from L2) and under 70 KB of shared memory,
// 3 blocks a multiprocessor. An output's float steps are the same in both (its own GEMV's).

// A warp's copies of one super-block (REC bytes) of outputs o0 .. o0 + OUT - 1 into sw (row stride REC),
// consecutive lanes on consecutive 16-byte chunks; outputs from n_out on are zero-filled.
template <int OUT, int REC> struct B16Supers {
    const u8* w;
    int nsb, o0, n_out;
    __device__ __forceinline__ B16Supers(const u8* w_, int nsb_, int o0_, int n_out_)
        : w(w_), nsb(nsb_), o0(o0_), n_out(n_out_) {}
    __device__ __forceinline__ void copy(unsigned char* sw, int sb) const {
        int lane = threadIdx.x & 31;
        constexpr int CH = REC / 16, N = OUT * CH; // chunks an output, chunks in all
#pragma unroll
        for (int k = 0; k < (N + 31) / 32; k++) {
            int u = lane + 32 * k, o = u / CH, c = u - CH * o;
            if (N % 32 == 0 || u < N) {
                bool in = o0 + o < n_out;
                cp_async<16>(sw + o * REC + 16 * c, w + ((long long)(in ? o0 + o : 0) * nsb + sb) * REC + 16 * c, in);
            }
        }
    }
};

// Adds NG groups' sums in the GEMV's xor-tree pairing (NG / 2 apart, then NG / 4, ...; 4 groups: (g0 + g2) +
// (g1 + g3)) and stores the result at row r, output o (or adds it there with `accumulate`).
template <int NG>
__device__ __forceinline__ void b16_tree_store(float (&v)[NG], float* out, int r, int o, int n_out, int n_rows,
                                               int accumulate) {
#pragma unroll
    for (int half = NG / 2; half >= 1; half >>= 1)
#pragma unroll
        for (int gr = 0; gr < half; gr++) v[gr] = __fadd_rn(v[gr], v[gr + half]);
    if (r < n_rows && o < n_out) {
        float* po = out + (long long)r * n_out + o;
        *po = accumulate ? *po + v[0] : v[0];
    }
}

// The end of a K8 block kernel body: warp w (of 4) stores OUT / 8 of the block's (n8 tile, C element) pairs,
// pair pe = OUT / 8 w + k being tile pe / 4, element pe % 4, adding the NG groups' sums in `ex`
// ([group][tile][e][lane]) in the GEMV's xor-tree pairing: groups NG / 2 apart, then NG / 4, ... (4 groups:
// (g0 + g2) + (g1 + g3)).
template <int OUT, int NG>
__device__ __forceinline__ void b16_store_groups(const float* ex, int w, float* out, int o0, int r0, int n_out,
                                                 int n_rows, int accumulate) {
    constexpr int NI = OUT / 8;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int k = 0; k < NI; k++) {
        int pe = NI * w + k, ni = pe >> 2, e = pe & 3;
        float v[NG];
#pragma unroll
        for (int gr = 0; gr < NG; gr++) v[gr] = ex[(gr * 4 * NI + pe) * 32 + lane];
        b16_tree_store<NG>(v, out, r0 + g + 8 * (e >> 1), o0 + 8 * ni + 2 * t + (e & 1), n_out, n_rows, accumulate);
    }
}

// Warps a block (4 or 8; the host reads it, KILN_CUDA_DEFINES may set it). With 4, warp a replays GEMV group a
// alone. With 8, warps a and a + 4 share group a: they take its super-blocks in turn (a + 4 (2k), a + 4 (2k + 1))
// at the same time, and warp a + 4 hands each of its float steps to warp a, which adds both in the group's
// ascending order (same steps, same order: the GEMV's bits). Measured on the H200 (8B Q4_K_M, 16-row block, 32
// outputs a block): 8 warps passed the self-test's bit equality but were not faster end to end (pp16 -b 16 3,034
// vs 3,046 tok/s with 4), so 4 stays the default.
#ifndef B16_WARPS
#define B16_WARPS 4
#endif
static_assert(B16_WARPS == 4 || B16_WARPS == 8, "B16_WARPS: 4 or 8");

// Q4_K, K8 activations, OUT outputs a block: warp a replays the GEMV's group a (super-blocks a, a + 4, ...) for
// all the block's outputs, pipelined like mmq.cu's prefill bodies: each super-block's activation codes, code
// sums, row scales and the outputs' raw super-blocks are copied into the warp's shared memory with cp.async, two
// in flight; fragments by ldmatrix. The integers are the GEMV's is and im exactly: per sub-block one m16n8k32 of
// the raw 4-bit codes, times the output's scale added into an int32 sum (is = sum of sc_j dot_j), and the min term
// from the code sums split into int8 halves; then the GEMV's float step k8_step per super-block in ascending
// order and the groups added in the xor tree's pairing. Output tile bx (outputs OUT bx ..), rows 16 blockIdx.y ..;
// 32 B16_WARPS threads, dynamic shared memory b16_smem<OUT>().
// The K8 block kernels (both kinds) read the code sums packed by the K8 writers (k8_pack_sum: 16 bytes a row and
// K8 block, the words the Q4_K min-term mma takes; the host then passes their pointer for `ks`) instead of packing
// the 16 rows' int sums in every warp (mp_pack_sums). A tuning define read by the host; same integers, same bits.
#ifndef B16_PACKED_SUMS
#define B16_PACKED_SUMS 0
#endif
template <int OUT> struct B16Q4 {
    static constexpr int STAGE = 16 * MP_LDA + OUT * MP_Q4 + 16 * 32 + 16 * 4; // codes, super-blocks, sums, scales
    static constexpr int DEC = 8 * OUT * 4 + OUT * 8 + 16 * 16 + OUT * 8;      // sc, packed mins and sums, d / dmin
    static constexpr int WARP = 2 * STAGE + DEC;
    static constexpr int EX = 4 * 4 * (OUT / 8) * 32;  // floats: the groups' sums, [group][tile][e][lane]
    static constexpr int XCH = 2 * 4 * 4 * (OUT / 8) * 32; // floats: handed-over steps, [slot][group][C elem][lane]
    static constexpr int NEED = B16_WARPS * WARP + 4 * EX + (B16_WARPS == 8 ? 4 * XCH : 0);
};
template <int OUT>
__device__ __forceinline__ void b16_q4k8(int bx, float* out, const u8* w, const signed char* kq, const float* kd,
                                         const int* ks, int width, int n_out, int n_rows, int accumulate) {
    using L = B16Q4<OUT>;
    // Group a; with 8 warps, h = which of its two warps this is (h = 1 hands its steps to h = 0).
    constexpr int S = B16_WARPS / 4, NI = OUT / 8;
    // h is a constant 0 with 4 warps: the compiler then drops the hand-over path (its stores made it reload the
    // scales of every step).
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wid = threadIdx.x >> 5, a = wid & 3;
    int h = B16_WARPS == 8 ? wid >> 2 : 0;
    unsigned char* base = mp_smem + wid * L::WARP;
    int* ssc = (int*)(base + 2 * L::STAGE); // [j][o]: sc_j
    u32* smin = (u32*)(ssc + 8 * OUT);      // [o][2]: m_0..3, m_4..7 as bytes
    u32* ssum = smin + 2 * OUT;             // [r][4]: S_lo 0..3, S_lo 4..7, S_hi 0..3, S_hi 4..7 as bytes
    float* sd = (float*)(ssum + 4 * 16);
    float* sdm = sd + OUT;
    float* ex = (float*)(mp_smem + B16_WARPS * L::WARP);
    float* xch = ex + L::EX;
    int o0 = bx * OUT, r0 = blockIdx.y * 16;
    int nsb = width / 256, nb = width / 32;
    // This lane's sources, computed once: the activation codes (B16Acts) and outputs' super-blocks (B16Supers),
    // the code sums of row lane / 2 (half lane % 2), the scale of row lane (lanes < 16).
    B16Acts xa(kq, width, r0, n_rows);
    B16Supers<OUT, MP_Q4> ws(w, nsb, o0, n_out);
    // (Packed sums: lanes < 16, row lane, 16 bytes a super-block.)
    bool s_in = B16_PACKED_SUMS ? lane < 16 && r0 + lane < n_rows : r0 + (lane >> 1) < n_rows;
    const int* ksrc = B16_PACKED_SUMS ? ks + (long long)(s_in ? r0 + lane : 0) * nsb * 4
                                       : ks + (long long)(s_in ? r0 + (lane >> 1) : 0) * nb + 4 * (lane & 1);
    bool d_in = lane < 16 && r0 + lane < n_rows;
    const float* dsrc = kd + (long long)(d_in ? r0 + lane : 0) * nsb;
    // Copies of this warp's it-th super-block (the group's (S it + h)-th: sb = a + 4 (S it + h)) into stage it % 2.
    auto issue = [&](int it) {
        int sb = a + 4 * (S * it + h);
        unsigned char* st = base + (it & 1) * L::STAGE;
        xa.copy(st, sb * 256);
        unsigned char* sw = st + 16 * MP_LDA;
        ws.copy(sw, sb);
        unsigned char* sx = sw + OUT * MP_Q4;
        if (B16_PACKED_SUMS) {
            if (lane < 16) cp_async<16>(sx + 16 * lane, ksrc + 4 * sb, s_in);
        } else {
            cp_async<16>(sx + 32 * (lane >> 1) + 16 * (lane & 1), ksrc + 8 * sb, s_in);
        }
        if (lane < 16) cp_async<4>(sx + 16 * 32 + 4 * lane, dsrc + sb, d_in);
        cp_commit();
    };
    float acc[NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[ni][e] = 0.0f;
    // The group's super-blocks, this warp's share, and the rounds both warps of the group take (one barrier each).
    int n_g = a < nsb ? (nsb - a + 3) / 4 : 0;
    int n_it = h < n_g ? (n_g - h + S - 1) / S : 0, n_rounds = (n_g + S - 1) / S;
    if (n_it > 0) issue(0);
    for (int it = 0; it < n_rounds; it++) {
        if (it < n_it) {
            cp_wait_all();
            __syncwarp(); // super-block it is in; every lane is done with it - 1 (its stage and the decoded scales)
            if (it + 1 < n_it) issue(it + 1);
            const signed char* sa = (const signed char*)(base + (it & 1) * L::STAGE);
            const u8* sw = (const u8*)sa + 16 * MP_LDA;
            const int* sks = (const int*)(sw + OUT * MP_Q4);
            const float* sdx = (const float*)(sks + 16 * 8);
            {
                // Lane (o, half) = (lane % OUT, lane / OUT) decodes output o's scales and packed mins of
                // sub-blocks 4 half .. (both halves when OUT is 32), lanes o < OUT its d and dmin; lane (row,
                // half) packs the row's code sums.
                int o = lane % OUT;
                const u8* rec = sw + o * MP_Q4;
                const u32* hw = (const u32*)rec;
                u32 s0 = hw[1], s1 = hw[2], s2 = hw[3];
#pragma unroll
                for (int jh = lane / OUT; jh < 2; jh += 32 / OUT) {
                    u32 mw = 0;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        int j = 4 * jh + i, scj, mj;
                        k4_sm(s0, s1, s2, j, scj, mj);
                        ssc[j * OUT + o] = scj;
                        mw |= (u32)mj << (8 * i);
                    }
                    smin[2 * o + jh] = mw;
                }
                if (lane < OUT) {
                    sd[o] = h2f((u16)(hw[0] & 0xFFFF));
                    sdm[o] = h2f((u16)(hw[0] >> 16));
                }
                if (!B16_PACKED_SUMS) {
                    int r = lane >> 1, hi = lane & 1;
                    mp_pack_sums(sks + 8 * r, hi, ssum[4 * r + 2 * hi], ssum[4 * r + 2 * hi + 1]);
                }
            }
            __syncwarp();
            int is[NI][4];
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) is[ni][e] = 0;
#pragma unroll 1
            for (int p = 0; p < 4; p++) {
                int braw[NI][2];
                mp_q4k_raw<NI>(braw, sw, 0, p, lane);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    int j = 2 * p + s;
                    int a4[4];
                    ldsm4(a4, sa + ((lane & 7) + 8 * ((lane >> 3) & 1)) * MP_LDA + 32 * j + 16 * (lane >> 4));
#pragma unroll
                    for (int ni = 0; ni < NI; ni++) {
                        int2 sc = *(const int2*)(ssc + j * OUT + 8 * ni + 2 * t); // C columns 2t, 2t + 1
                        int b0 = (braw[ni][0] >> (4 * s)) & 0x0F0F0F0F, b1 = (braw[ni][1] >> (4 * s)) & 0x0F0F0F0F;
                        int dot[4] = {0, 0, 0, 0};
                        mma_s8_16832(dot, a4, b0, b1);
#pragma unroll
                        for (int e = 0; e < 4; e++) is[ni][e] += ((e & 1) ? sc.y : sc.x) * dot[e];
                    }
                }
            }
            const u32* psum = B16_PACKED_SUMS ? (const u32*)sks : ssum; // [r][4]
            int as0 = (int)psum[4 * g + t], as1 = (int)psum[4 * (g + 8) + t];
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                int mw = (int)smin[2 * (8 * ni + g) + (t & 1)];
                int c_lo[4] = {0, 0, 0, 0}, c_hi[4] = {0, 0, 0, 0};
                mma_s8_16816_acc(c_lo, as0, as1, t < 2 ? mw : 0);
                mma_s8_16816_acc(c_hi, as0, as1, t < 2 ? 0 : mw);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = g + 8 * (e >> 1), o = 8 * ni + 2 * t + (e & 1);
                    int imin = c_lo[e] + 64 * c_hi[e];
                    float f = k8_step(sd[o], sdm[o], sdx[r], is[ni][e], imin);
                    if (h == 0) acc[ni][e] = __fadd_rn(acc[ni][e], f);
                    else xch[(((it & 1) * 4 + a) * 4 * NI + 4 * ni + e) * 32 + lane] = f;
                }
            }
        }
        if constexpr (S > 1) {
            // Warp h = 0 adds the partner's step of this round after its own (the group's next super-block). Slot
            // it % 2: the partner writes it again two rounds on, after the next barrier, which h = 0 passes only
            // once it has read it here.
            asm volatile("bar.sync %0, 64;" ::"r"(1 + a) : "memory");
            if (h == 0 && S * it + 1 < n_g) {
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[ni][e] = __fadd_rn(acc[ni][e], xch[(((it & 1) * 4 + a) * 4 * NI + 4 * ni + e) * 32 + lane]);
            }
        }
    }
    if (h == 0) {
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) ex[((a * NI + ni) * 4 + e) * 32 + lane] = acc[ni][e];
    }
    __syncthreads();
    if (h == 0) b16_store_groups<OUT, 4>(ex, a, out, o0, r0, n_out, n_rows, accumulate);
}

// Q6_K, K8 activations, OUT outputs a block: with 4 warps, warp w replays the GEMV's groups G = 2w and 2w + 1
// (super-blocks G, G + 8, ...; with 8 warps, group w alone) for all the block's outputs, one cp.async pipeline
// through both groups' super-blocks (as b16_q4k8; the f16 d of each super-block, stored after all rows, is read
// one super-block ahead into a register). Per super-block the integers of mmq_q6_k8_body (two m16n8k16 a
// sub-block, one scale per 16), which are the GEMV's is; its k8_step; the eight groups added in the xor tree's
// pairing. Output tile bx, rows 16 blockIdx.y ..; 32 B16_WARPS threads, dynamic shared memory b16_smem<OUT>().
template <int OUT> struct B16Q6 {
    static constexpr int STAGE = 16 * MP_LDA + OUT * MP_Q6 + 16 * 4;      // codes, super-blocks, row scales
    static constexpr int WARP = 2 * STAGE + 16 * OUT * 4 + OUT * 4;       // + the scales as ints [piece][o], d [o]
    static constexpr int NEED = B16_WARPS * WARP;                         // the groups' sums reuse the stages
    static_assert(8 * 4 * (OUT / 8) * 32 * 4 <= NEED, "the eight groups' sums fit in the stages");
};
template <int OUT>
__device__ __forceinline__ void b16_q6k8(int bx, float* out, const u8* w, const signed char* kq, const float* kd,
                                         int width, int n_out, int n_rows, int accumulate) {
    using L = B16Q6<OUT>;
    constexpr int NI = OUT / 8;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    unsigned char* base = mp_smem + warp * L::WARP;
    int* sisc = (int*)(base + 2 * L::STAGE); // [2 j + half][o]
    float* sd = (float*)(sisc + 16 * OUT);
    int o0 = bx * OUT, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u16* dw = (const u16*)(w + (long long)n_out * nsb * MP_Q6);
    int od = min(o0 + lane % OUT, n_out - 1);
    B16Acts xa(kq, width, r0, n_rows);
    B16Supers<OUT, MP_Q6> ws(w, nsb, o0, n_out);
    bool d_in = lane < 16 && r0 + lane < n_rows;
    const float* dsrc = kd + (long long)(d_in ? r0 + lane : 0) * nsb;
    // This warp's super-blocks: group G0 = GW warp (G0, G0 + 8, ..: n0 of them), then with 4 warps group G0 + 1 (n1).
    constexpr int GW = 8 / B16_WARPS;
    int G0 = GW * warp;
    int n0 = G0 < nsb ? (nsb - G0 + 7) / 8 : 0, n1 = GW == 2 && G0 + 1 < nsb ? (nsb - G0 + 6) / 8 : 0;
    auto sb_of = [&](int it) { return it < n0 ? G0 + 8 * it : G0 + 1 + 8 * (it - n0); };
    auto issue = [&](int it) {
        int sb = sb_of(it);
        unsigned char* st = base + (it & 1) * L::STAGE;
        xa.copy(st, sb * 256);
        unsigned char* sw = st + 16 * MP_LDA;
        ws.copy(sw, sb);
        if (lane < 16) cp_async<4>(sw + OUT * MP_Q6 + 4 * lane, dsrc + sb, d_in);
        cp_commit();
    };
    float acc0[NI][4], acc1[NI][4]; // groups G0 and G0 + 1
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc0[ni][e] = acc1[ni][e] = 0.0f;
    int n_it = n0 + n1;
    u16 d_next = 0;
    if (n_it > 0) {
        issue(0);
        d_next = dw[(long long)od * nsb + sb_of(0)];
    }
    for (int it = 0; it < n_it; it++) {
        u16 d_cur = d_next;
        cp_wait_all();
        __syncwarp(); // super-block it is in; every lane is done with it - 1 (its stage and the scales)
        if (it + 1 < n_it) {
            issue(it + 1);
            d_next = dw[(long long)od * nsb + sb_of(it + 1)];
        }
        const signed char* sa = (const signed char*)(base + (it & 1) * L::STAGE);
        const u8* sw = (const u8*)sa + 16 * MP_LDA;
        const float* sdx = (const float*)(sw + OUT * MP_Q6);
        // Lane (o, half) = (lane % OUT, lane / OUT): output o's scales i = half, half + 32 / OUT, .. as ints;
        // lanes o < OUT its d.
        {
            int o = lane % OUT;
#pragma unroll
            for (int k = 0; k < OUT / 2; k++) {
                int i = lane / OUT + (32 / OUT) * k;
                sisc[i * OUT + o] = (signed char)sw[o * MP_Q6 + 192 + i];
            }
            if (lane < OUT) sd[o] = o0 + o < n_out ? h2f(d_cur) : 0.0f;
        }
        __syncwarp();
        int isum[NI][4];
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) isum[ni][e] = 0;
#pragma unroll 1
        for (int hk = 0; hk < 4; hk++) {
            int h = hk >> 1, kk = hk & 1;
            int raw[NI][4];
            mp_q6k_raw<NI>(raw, sw, 0, hk, lane);
#pragma unroll
            for (int s = 0; s < 2; s++) {
                int j = 4 * h + kk + 2 * s;
                int a4[4];
                ldsm4(a4, sa + ((lane & 7) + 8 * ((lane >> 3) & 1)) * MP_LDA + 32 * j + 16 * (lane >> 4));
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    int b[2];
                    mp_q6k_b(b, raw[ni], kk, s);
                    int2 slo = *(const int2*)(sisc + (2 * j) * OUT + 8 * ni + 2 * t);
                    int2 shi = *(const int2*)(sisc + (2 * j + 1) * OUT + 8 * ni + 2 * t);
                    int lo[4], hi[4];
                    mma_s8_16816(lo, a4[0], a4[1], b[0]);
                    mma_s8_16816(hi, a4[2], a4[3], b[1]);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        isum[ni][e] += ((e & 1) ? slo.y : slo.x) * lo[e] + ((e & 1) ? shi.y : shi.x) * hi[e];
                }
            }
        }
        if (it < n0) {
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc0[ni][e] = __fadd_rn(acc0[ni][e], k8_step(sd[8 * ni + 2 * t + (e & 1)], 0.0f,
                                                                 sdx[g + 8 * (e >> 1)], isum[ni][e], 0));
        } else {
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc1[ni][e] = __fadd_rn(acc1[ni][e], k8_step(sd[8 * ni + 2 * t + (e & 1)], 0.0f,
                                                                 sdx[g + 8 * (e >> 1)], isum[ni][e], 0));
        }
    }
    __syncthreads(); // every warp is done with its stages: the groups' sums reuse them
    float* ex = (float*)mp_smem; // [group][tile][e][lane]
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            ex[((G0 * NI + ni) * 4 + e) * 32 + lane] = acc0[ni][e];
            if (GW == 2) ex[(((G0 + 1) * NI + ni) * 4 + e) * 32 + lane] = acc1[ni][e];
        }
    __syncthreads();
    if (warp < 4) b16_store_groups<OUT, 8>(ex, warp, out, o0, r0, n_out, n_rows, accumulate);
}

// The K8 block kernels: up to three weights that read the same activations (Q/K/V, gate/up; Q4_K and Q6_K may
// mix) in one launch (JOB_ARGS, common.cu), each block an OUT-output tile of its weight (pseudo type id K8_Q4_K or
// K8_Q6_K). A small weight (K/V) then shares the wave of a large one instead of leaving most multiprocessors idle
// in its own launch. Each output has the bits of the weight alone.
// B16_SMEM_K8_W<warps>_O<outputs> are read by the host (compile.rs's dynamic_smem): the larger of the two bodies'
// needs. grid = (total tiles, ceil(n_rows / 16)), block = 32 B16_WARPS.
#define B16_SMEM_K8_W4_O16 66304
#define B16_SMEM_K8_W8_O16 136192
#define B16_SMEM_K8_W4_O32 97280
#define B16_SMEM_K8_W8_O32 194560
template <int OUT> constexpr int b16_smem() {
    return OUT == 16 ? (B16_WARPS == 8 ? B16_SMEM_K8_W8_O16 : B16_SMEM_K8_W4_O16)
                     : (B16_WARPS == 8 ? B16_SMEM_K8_W8_O32 : B16_SMEM_K8_W4_O32);
}
template <int OUT> constexpr int b16_need() {
    return B16Q4<OUT>::NEED > B16Q6<OUT>::NEED ? B16Q4<OUT>::NEED : B16Q6<OUT>::NEED;
}
static_assert(b16_smem<16>() == b16_need<16>() && b16_smem<32>() == b16_need<32>(),
              "B16_SMEM_K8_W*_O*: the larger body's need");
template <int OUT>
__device__ __forceinline__ void b16_k8(const signed char* kq, const float* kd, const int* ks, int width, int n_rows,
                                       int accumulate, JOB_WEIGHTS) {
    wait_prior_kernel();
    mp_check_smem(b16_smem<OUT>());
    Job j = JOB_PICK;
    if (j.ty == K8_Q4_K) b16_q4k8<OUT>(j.tile, j.out, j.w, kq, kd, ks, width, j.n_out, n_rows, accumulate);
    else if (j.ty == K8_Q6_K) b16_q6k8<OUT>(j.tile, j.out, j.w, kq, kd, width, j.n_out, n_rows, accumulate);
}
// Blocks a multiprocessor the registers must allow: as many as the shared memory does (4 warps: 2 of 32 outputs,
// 3 of 16, so at most 168 registers a thread there).
extern "C" __global__ void __launch_bounds__(32 * B16_WARPS, 8 / B16_WARPS) gemv16_k8(
    const signed char* kq, const float* kd, const int* ks, int width, int n_rows, int accumulate, JOB_ARGS) {
    b16_k8<32>(kq, kd, ks, width, n_rows, accumulate, b1, b2, ty0, out0, w0, n0, ty1, out1, w1, n1, ty2, out2, w2, n2);
}
extern "C" __global__ void __launch_bounds__(32 * B16_WARPS, 12 / B16_WARPS) gemv16_k8_o16(
    const signed char* kq, const float* kd, const int* ks, int width, int n_rows, int accumulate, JOB_ARGS) {
    b16_k8<16>(kq, kd, ks, width, n_rows, accumulate, b1, b2, ty0, out0, w0, n0, ty1, out1, w1, n1, ty2, out2, w2, n2);
}

// ---- The K8 block kernel on direct fragments (gemv16_k8d: the host's pick for every K8 block launch) ----
// The same integers and float steps as b16_q4k8 / b16_q6k8 (so every row keeps the one-row GEMV's bits), with no
// shared-memory stages: every lane loads its own mma fragments from global memory into registers, the weights
// in the GEMV layout as they are, the K8 activations from L2. Kernels that stage through shared memory (the 4-warp
// one above; a block-shared one, measured and replaced by this, in git history) spend each stage's time on copies,
// ldmatrix and a barrier chain (their instruction count, not their bytes, sets their time); here the only barrier
// is the one where the groups' sums meet. End to end (H100, 16-row blocks, against the block-shared kernel for
// launches of few tiles and the 4-warp one for the rest): 8B Q4_K_M 1.10x, 0.6B 1.07x.
// The mma computes C^T = W X^T: its 16 A rows are 16 outputs, its 8 columns 8 activation rows (two n8 tiles for
// 16 rows). So the weights, which need unpacking anyway, are unpacked straight into the A registers, the
// activations are B fragments as loaded, and a lane's C rows are the outputs whose weights it loaded: their
// scales, mins and d need no exchange. A block is 4 warps over 16 outputs and 16 rows; warp a replays the GEMV's
// Q4_K group a (super-blocks a, a + 4, ..) or Q6_K groups 2a and 2a + 1 (super-blocks G, G + 8, ..), each in
// ascending order, the next super-block's fragments loading while this one multiplies.
// Fragments: an m16n8k32 may take its 32 k in any order A and B share, so lane t takes elements 8t .. 8t + 7 of
// a 32-element sub-block: one 8-byte load of an activation row, and of an output's Q4_K quant bytes (whose low
// and high nibbles are the sub-block pair 2i, 2i + 1). Q6_K has a scale per 16 elements: one m16n8k16 a half,
// lane t on elements 4t .. 4t + 3 of it. Outputs past n_out and rows past n_rows read the last ones (a C row
// depends only on its A row, a C column only on its B column) and are not stored.
// The direct kernel also asks L2 for the records of the super-block two ahead of the one it loads (a tuning
// define, off by default: 1 on): the register buffers cover one super-block's latency, L2 then holds the next.
#ifndef B16D_PREFETCH
#define B16D_PREFETCH 0
#endif
// An L2 prefetch of the lines of a record of `bytes` (144 or 208, 16-byte aligned) at rec: the lines of its
// 16-byte chunks 0, 8 and 12 (a record of at most 13 chunks meets at most three 128-byte lines, and those chunks
// lie one in each), one a lane of the output's four.
__device__ __forceinline__ void b16d_prefetch(const u8* rec, int bytes) {
    int t = threadIdx.x & 3, at = t == 0 ? 0 : t == 1 ? 128 : 192;
    if (at < bytes && t < 3) asm volatile("prefetch.global.L2 [%0];" ::"l"((const void*)(rec + at)));
}

// The groups' sums meet: ex holds [group][n8 tile][C element][lane]; warp w stores (tile, element) pairs 2w and
// 2w + 1 (pair = 4 tile + e), adding the NG groups in the GEMV's xor-tree pairing. C element e of lane (g, t) in
// tile nt is output o0 + g + 8 (e / 2), row r0 + 8 nt + 2t + e % 2. Tiles from NT on were not computed.
template <int NG, int NT>
__device__ __forceinline__ void b16d_store(const float* ex, float* out, int o0, int r0, int n_out, int n_rows,
                                           int accumulate) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int pe = 2 * w + k, nt = pe >> 2, e = pe & 3;
        if (NT < 2 && nt > 0) break; // warp-uniform (NT is 1 or 2)
        float v[NG];
#pragma unroll
        for (int gr = 0; gr < NG; gr++) v[gr] = ex[(gr * 8 + pe) * 32 + lane];
        b16_tree_store<NG>(v, out, r0 + 8 * nt + 2 * t + (e & 1), o0 + g + 8 * (e >> 1), n_out, n_rows, accumulate);
    }
}

// A warp's n_it super-blocks through two register buffers in turn (W: weights, X: activations): super-block
// it + 1 loads while step(it) multiplies. The first weights load before the wait for the kernel before this one
// (weights never change while kernels run), the activations after it. (Activations loaded at their own step
// instead, one register buffer fewer for 3 or 4 blocks a multiprocessor, lost 3.6-26 % on the 8B's 16-row
// block on the H100, with or without the weight ring below.)
template <class W, class X, class LoadW, class LoadX, class Step>
__device__ __forceinline__ void b16d_pipeline(int n_it, const LoadW& load_w, const LoadX& load_x,
                                              const Step& step) {
    W wa, wb;
    if (n_it > 0) load_w(wa, 0);
    wait_prior_kernel();
    X xa, xb;
    if (n_it > 0) load_x(xa, 0);
    for (int it = 0; it < n_it; it += 2) {
        if (it + 1 < n_it) {
            load_w(wb, it + 1);
            load_x(xb, it + 1);
        }
        step(wa, xa, it);
        if (it + 1 < n_it) {
            if (it + 2 < n_it) {
                load_w(wa, it + 2);
                load_x(xa, it + 2);
            }
            step(wb, xb, it + 1);
        }
    }
}

// With B16D_RING 1 (the default; 0 is the kill switch KILN_NO_CUDA_BLOCK_RING, b16d_pipeline above) each warp
// copies its weights into a ring of shared-memory stages of its own (cp.async, no block barrier: the ring is the
// warp's alone) several super-blocks ahead, Q4_K 3 and Q6_K 2 (its records are larger), instead of one
// super-block ahead in registers: more bytes in flight a warp. The ring is static shared memory (so the launch
// keeps its early start); the groups' sums reuse it at the end. H100, 16-row blocks: 8B Q4_K_M 1.076x, 0.6B
// 0.994x against the register pipeline.
#ifndef B16D_RING
#define B16D_RING 1
#endif
#define B16D_RING_BYTES 10176 // a warp's ring: 4 Q4_K stages (16 x 144 bytes) or 3 Q6_K stages (16 x 208 + 16 x 4)
static_assert(4 * 16 * MP_Q4 <= B16D_RING_BYTES && 3 * (16 * MP_Q6 + 16 * 4) <= B16D_RING_BYTES &&
                  8 * 2 * 4 * 32 * 4 <= 4 * B16D_RING_BYTES && B16D_RING_BYTES % 16 == 0,
              "a warp's ring holds its stages, and the block's rings the groups' sums");
template <int N> __device__ __forceinline__ void cp_wait_n() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// A warp's copies of one super-block's records of the block's 16 outputs (REC bytes each, at record `sb` of
// their rows) into a stage: chunk c = lane + 32 i of the 16 REC / 16, output c / (REC / 16), piece c % (REC / 16).
template <int REC> struct B16DRing {
    static constexpr int PIECES = REC / 16, NI = (16 * PIECES + 31) / 32;
    const u8* src[NI];
    int dst[NI];
    __device__ __forceinline__ B16DRing(const u8* w, int o0, int n_out, int nsb) {
        int lane = threadIdx.x & 31;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int c = min(lane + 32 * i, 16 * PIECES - 1), o = c / PIECES, k = c % PIECES;
            src[i] = w + (long long)min(o0 + o, n_out - 1) * nsb * REC + 16 * k;
            dst[i] = lane + 32 * i < 16 * PIECES ? o * REC + 16 * k : -1;
        }
    }
    __device__ __forceinline__ void issue(unsigned char* stage, int sb) const {
#pragma unroll
        for (int i = 0; i < NI; i++)
            if (dst[i] >= 0) cp_async<16>(stage + dst[i], src[i] + (long long)sb * REC, true);
    }
};
// b16d_pipeline with the weights through the warp's ring of S stages: issue(it) copies super-block it's weights
// into stage it % S (the first S - 1 before the wait for the kernel before this one), load_w reads them from there.
template <int S, class W, class X, class Issue, class LoadW, class LoadX, class Step>
__device__ __forceinline__ void b16d_ring(int n_it, const Issue& issue, const LoadW& load_w, const LoadX& load_x,
                                          const Step& step) {
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue(s);
        cp_commit();
    }
    wait_prior_kernel();
    X xn;
    if (n_it > 0) load_x(xn, 0);
#pragma unroll 2
    for (int it = 0; it < n_it; it++) {
        cp_wait_n<S - 2>(); // this lane's copies of stage it are in
        __syncwarp();       // and every lane's; every lane is done with stage it - 1, which the next issue refills
        if (it + S - 1 < n_it) issue(it + S - 1);
        cp_commit();
        W b;
        load_w(b, it);
        X x = xn;
        if (it + 1 < n_it) load_x(xn, it + 1);
        step(b, x, it);
    }
}

// One Q4_K super-block of outputs g and g + 8 (oh = 0, 1): the 16-byte header (d, dmin, 12 scale bytes) and the
// quant bytes 32 i + 8 t .. + 7 of each sub-block pair i.
struct B16DW4 {
    int4 h[2];
    int2 q[2][4];
};
// One Q4_K super-block's activations for rows g and 8 + g (tile nt): codes 32 j + 8 t .. + 7 of sub-block j, the
// packed code-sum word t (the min-term mma's B, as k8_pack_sum / mp_pack_sums pack it); the scales of rows
// 8 nt + 2 t + c (the lane's C columns).
template <int NT> struct B16DX4 {
    int2 x[NT][8];
    u32 s[NT];
    float dx[NT][2];
};

template <int NT>
__device__ __forceinline__ void b16d_q4k(int bx, float* out, const u8* w, const signed char* kq, const float* kd,
                                         const int* ks, int width, int n_out, int n_rows, int accumulate,
                                         float* ex) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, a = threadIdx.x >> 5;
    int o0 = bx * 16, r0 = blockIdx.y * 16;
    int nsb = width / 256, nb = width / 32;
    int n_it = a < nsb ? (nsb - a + 3) / 4 : 0; // the group's super-blocks a, a + 4, ..
    const u8* wrow[2] = {w + (long long)min(o0 + g, n_out - 1) * nsb * 144,
                         w + (long long)min(o0 + 8 + g, n_out - 1) * nsb * 144};
    auto load_w = [&](B16DW4& b, int it) {
        int sb = a + 4 * it;
#pragma unroll
        for (int oh = 0; oh < 2; oh++) {
            const u8* rec = wrow[oh] + (long long)sb * 144;
            b.h[oh] = ldg16(rec);
#pragma unroll
            for (int i = 0; i < 4; i++) b.q[oh][i] = __ldg((const int2*)(rec + 16 + 32 * i + 8 * t));
            if (B16D_PREFETCH && it + 2 < n_it) b16d_prefetch(rec + 8 * 144, 144);
        }
    };
    int rb[2] = {min(r0 + g, n_rows - 1), min(r0 + 8 + g, n_rows - 1)}; // B columns g of the two tiles
    int rc[2][2];                                                        // C columns 2t, 2t + 1 of each tile
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) rc[nt][c] = min(r0 + 8 * nt + 2 * t + c, n_rows - 1);
    auto load_x = [&](B16DX4<NT>& x, int it) {
        int sb = a + 4 * it;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const signed char* xr = kq + (long long)rb[nt] * width + sb * 256 + 8 * t;
#pragma unroll
            for (int j = 0; j < 8; j++) x.x[nt][j] = __ldg((const int2*)(xr + 32 * j));
            if (B16_PACKED_SUMS) {
                x.s[nt] = __ldg((const u32*)(ks + ((long long)rb[nt] * nsb + sb) * 4 + t));
            } else {
                int4 v = __ldg((const int4*)(ks + (long long)rb[nt] * nb + sb * 8 + 4 * (t & 1)));
                int e[4] = {v.x, v.y, v.z, v.w};
                u32 p = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) p |= (u32)(t >= 2 ? (e[i] >> 6) & 0xFF : e[i] & 63) << (8 * i);
                x.s[nt] = p;
            }
#pragma unroll
            for (int c = 0; c < 2; c++) x.dx[nt][c] = kd[(long long)rc[nt][c] * nsb + sb];
        }
    };
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
    auto step = [&](const B16DW4& b, const B16DX4<NT>& x, int) {
        // Outputs g, g + 8: scales and mins of sub-blocks 0..3 and 4..7 as bytes (k4_sm, four at a time).
        u32 sc[2][2], mn[2];
#pragma unroll
        for (int oh = 0; oh < 2; oh++) {
            u32 s0 = (u32)b.h[oh].y, s1 = (u32)b.h[oh].z, s2 = (u32)b.h[oh].w;
            sc[oh][0] = s0 & 0x3F3F3F3Fu;
            sc[oh][1] = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
            // The min-term mma's A word t: mins 0..3 (t = 0, 2) or 4..7 (t = 1, 3).
            mn[oh] = (t & 1) ? ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u) : s1 & 0x3F3F3F3Fu;
        }
        int is[NT][4] = {};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int sh = 4 * (j & 1);
            int a4[4] = {(b.q[0][j >> 1].x >> sh) & 0x0F0F0F0F, (b.q[1][j >> 1].x >> sh) & 0x0F0F0F0F,
                         (b.q[0][j >> 1].y >> sh) & 0x0F0F0F0F, (b.q[1][j >> 1].y >> sh) & 0x0F0F0F0F};
            int s0 = (int)__byte_perm(sc[0][j >> 2], 0, 0x4440 | (j & 3)); // one PRMT: byte j % 4, zero-extended
            int s1 = (int)__byte_perm(sc[1][j >> 2], 0, 0x4440 | (j & 3));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int dot[4] = {0, 0, 0, 0};
                mma_s8_16832(dot, a4, x.x[nt][j].x, x.x[nt][j].y);
                is[nt][0] += s0 * dot[0];
                is[nt][1] += s0 * dot[1];
                is[nt][2] += s1 * dot[2];
                is[nt][3] += s1 * dot[3];
            }
        }
        // The min term: k 0..7 of B are the rows' low code-sum bytes, 8..15 the high ones (sum = lo + 64 hi).
        int lo0 = t < 2 ? (int)mn[0] : 0, lo1 = t < 2 ? (int)mn[1] : 0;
        int hi0 = t < 2 ? 0 : (int)mn[0], hi1 = t < 2 ? 0 : (int)mn[1];
        float d[2], dmin[2];
#pragma unroll
        for (int oh = 0; oh < 2; oh++) {
            d[oh] = h2f((u16)((u32)b.h[oh].x & 0xFFFF));
            dmin[oh] = h2f((u16)((u32)b.h[oh].x >> 16));
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int c_lo[4] = {0, 0, 0, 0}, c_hi[4] = {0, 0, 0, 0};
            mma_s8_16816_acc(c_lo, lo0, lo1, (int)x.s[nt]);
            mma_s8_16816_acc(c_hi, hi0, hi1, (int)x.s[nt]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float f = k8_step(d[e >> 1], dmin[e >> 1], x.dx[nt][e & 1], is[nt][e], c_lo[e] + 64 * c_hi[e]);
                acc[nt][e] = __fadd_rn(acc[nt][e], f);
            }
        }
    };
    if (B16D_RING) {
        unsigned char* ring = (unsigned char*)ex + a * B16D_RING_BYTES;
        B16DRing<144> copies(w, o0, n_out, nsb);
        auto issue = [&](int it) { copies.issue(ring + (it & 3) * 16 * 144, a + 4 * it); };
        auto load_w_ring = [&](B16DW4& b, int it) {
#pragma unroll
            for (int oh = 0; oh < 2; oh++) {
                const unsigned char* rec = ring + (it & 3) * 16 * 144 + (g + 8 * oh) * 144;
                b.h[oh] = *(const int4*)rec;
#pragma unroll
                for (int i = 0; i < 4; i++) b.q[oh][i] = *(const int2*)(rec + 16 + 32 * i + 8 * t);
            }
        };
        b16d_ring<4, B16DW4, B16DX4<NT>>(n_it, issue, load_w_ring, load_x, step);
        __syncthreads(); // the groups' sums go where the rings were
    } else {
        b16d_pipeline<B16DW4, B16DX4<NT>>(n_it, load_w, load_x, step);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) ex[((a * 2 + nt) * 4 + e) * 32 + lane] = acc[nt][e];
    __syncthreads();
    b16d_store<4, NT>(ex, out, o0, r0, n_out, n_rows, accumulate);
}

// Byte n of w as a signed int in one PRMT (n is a constant after unrolling, so the selector is an immediate):
// selector nibble n copies the byte, 8 | n repeats its sign.
__device__ __forceinline__ int sbyte_of(u32 w, int n) {
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(n | (8 | n) << 4 | (8 | n) << 8 | (8 | n) << 12));
    return r;
}

// One Q6_K super-block of outputs g and g + 8 (oh): low-nibble words ql[oh][h][kk][c] (bytes 64 h + 32 kk + 16 c
// + 4 t ..), high-bit words qh[oh][h][c] (128 + 32 h + 16 c + 4 t ..), the 16 scales and the f16 d (stored after
// all rows).
struct B16DW6 {
    u32 ql[2][2][2][2], qh[2][2][2];
    int4 sc[2];
    u16 d[2];
};
// One Q6_K super-block's activations for rows g and 8 + g: words at elements 4t (x) and 16 + 4t (y) of each
// sub-block (the two halves' B), and the scales of the lane's C columns.
template <int NT> struct B16DX6 {
    int2 x[NT][8];
    float dx[NT][2];
};

template <int NT>
__device__ __forceinline__ void b16d_q6k(int bx, float* out, const u8* w, const signed char* kq, const float* kd,
                                         int width, int n_out, int n_rows, int accumulate, float* ex) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    int o0 = bx * 16, r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u16* dw = (const u16*)(w + (long long)n_out * nsb * MP_Q6);
    // Groups G0 = 2 warp (super-blocks G0, G0 + 8, ..: n0 of them), then G0 + 1 (n1).
    int G0 = 2 * warp;
    int n0 = G0 < nsb ? (nsb - G0 + 7) / 8 : 0, n1 = G0 + 1 < nsb ? (nsb - G0 + 6) / 8 : 0;
    int n_it = n0 + n1;
    auto sb_of = [&](int it) { return it < n0 ? G0 + 8 * it : G0 + 1 + 8 * (it - n0); };
    int ob[2] = {min(o0 + g, n_out - 1), min(o0 + 8 + g, n_out - 1)};
    auto load_w = [&](B16DW6& b, int it) {
        int sb = sb_of(it);
#pragma unroll
        for (int oh = 0; oh < 2; oh++) {
            const u8* rec = w + ((long long)ob[oh] * nsb + sb) * MP_Q6;
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
#pragma unroll
                    for (int kk = 0; kk < 2; kk++)
                        b.ql[oh][h][kk][c] = __ldg((const u32*)(rec + 64 * h + 32 * kk + 16 * c + 4 * t));
                    b.qh[oh][h][c] = __ldg((const u32*)(rec + 128 + 32 * h + 16 * c + 4 * t));
                }
            b.sc[oh] = ldg16(rec + 192);
            b.d[oh] = dw[(long long)ob[oh] * nsb + sb];
            if (B16D_PREFETCH && it + 2 < n_it)
                b16d_prefetch(w + ((long long)ob[oh] * nsb + sb_of(it + 2)) * MP_Q6, MP_Q6);
        }
    };
    int rb[2] = {min(r0 + g, n_rows - 1), min(r0 + 8 + g, n_rows - 1)};
    int rc[2][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) rc[nt][c] = min(r0 + 8 * nt + 2 * t + c, n_rows - 1);
    auto load_x = [&](B16DX6<NT>& x, int it) {
        int sb = sb_of(it);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const signed char* xr = kq + (long long)rb[nt] * width + sb * 256 + 4 * t;
#pragma unroll
            for (int j = 0; j < 8; j++)
                x.x[nt][j] = make_int2(__ldg((const int*)(xr + 32 * j)), __ldg((const int*)(xr + 32 * j + 16)));
#pragma unroll
            for (int c = 0; c < 2; c++) x.dx[nt][c] = kd[(long long)rc[nt][c] * nsb + sb];
        }
    };
    float acc0[NT][4], acc1[NT][4]; // groups G0 and G0 + 1
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc0[nt][e] = acc1[nt][e] = 0.0f;
    auto step = [&](const B16DW6& b, const B16DX6<NT>& x, int it) {
        int is[NT][4] = {};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int h = j >> 2, k = j & 3;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                int aw[2];
#pragma unroll
                for (int oh = 0; oh < 2; oh++) {
                    u32 v = ((b.ql[oh][h][k & 1][c] >> (4 * (k >> 1))) & 0x0F0F0F0Fu) |
                            (((b.qh[oh][h][c] >> (2 * k)) & 0x03030303u) << 4);
                    aw[oh] = (int)__vsub4(v, 0x20202020u);
                }
                int i = 8 * h + 2 * k + c; // the scale of elements 16 c .. of sub-block j
                int sw0 = (i >> 2) == 0 ? b.sc[0].x : (i >> 2) == 1 ? b.sc[0].y : (i >> 2) == 2 ? b.sc[0].z : b.sc[0].w;
                int sw1 = (i >> 2) == 0 ? b.sc[1].x : (i >> 2) == 1 ? b.sc[1].y : (i >> 2) == 2 ? b.sc[1].z : b.sc[1].w;
                int s0 = sbyte_of((u32)sw0, i & 3), s1 = sbyte_of((u32)sw1, i & 3);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    int dot[4];
                    mma_s8_16816(dot, aw[0], aw[1], c ? x.x[nt][j].y : x.x[nt][j].x);
                    is[nt][0] += s0 * dot[0];
                    is[nt][1] += s0 * dot[1];
                    is[nt][2] += s1 * dot[2];
                    is[nt][3] += s1 * dot[3];
                }
            }
        }
        float d[2] = {h2f(b.d[0]), h2f(b.d[1])};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float f = k8_step(d[e >> 1], 0.0f, x.dx[nt][e & 1], is[nt][e], 0);
                if (it < n0) acc0[nt][e] = __fadd_rn(acc0[nt][e], f);
                else acc1[nt][e] = __fadd_rn(acc1[nt][e], f);
            }
    };
    if (B16D_RING) {
        constexpr int STAGE = 16 * MP_Q6 + 16 * 4; // the records, then each output's d in its aligned 4-byte word
        unsigned char* ring = (unsigned char*)ex + warp * B16D_RING_BYTES;
        B16DRing<MP_Q6> copies(w, o0, n_out, nsb);
        int od = min(o0 + (lane & 15), n_out - 1);
        auto issue = [&](int it) {
            unsigned char* st = ring + (it % 3) * STAGE;
            int sb = sb_of(it);
            copies.issue(st, sb);
            if (lane < 16) cp_async<4>(st + 16 * MP_Q6 + 4 * lane, dw + (((long long)od * nsb + sb) & ~1LL), true);
        };
        // The same words as load_w, from the stage: a template shared by both added 144 SASS instructions to the
        // default kernel, so the two stay written out.
        auto load_w_ring = [&](B16DW6& b, int it) {
            const unsigned char* st = ring + (it % 3) * STAGE;
            int sb = sb_of(it);
#pragma unroll
            for (int oh = 0; oh < 2; oh++) {
                int o = g + 8 * oh;
                const unsigned char* rec = st + o * MP_Q6;
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
#pragma unroll
                        for (int kk = 0; kk < 2; kk++)
                            b.ql[oh][h][kk][c] = *(const u32*)(rec + 64 * h + 32 * kk + 16 * c + 4 * t);
                        b.qh[oh][h][c] = *(const u32*)(rec + 128 + 32 * h + 16 * c + 4 * t);
                    }
                b.sc[oh] = *(const int4*)(rec + 192);
                u32 dword = *(const u32*)(st + 16 * MP_Q6 + 4 * o);
                b.d[oh] = (u16)((((long long)ob[oh] * nsb + sb) & 1) ? dword >> 16 : dword & 0xFFFF);
            }
        };
        b16d_ring<3, B16DW6, B16DX6<NT>>(n_it, issue, load_w_ring, load_x, step);
        __syncthreads(); // the groups' sums go where the rings were
    } else {
        b16d_pipeline<B16DW6, B16DX6<NT>>(n_it, load_w, load_x, step);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            ex[((G0 * 2 + nt) * 4 + e) * 32 + lane] = acc0[nt][e];
            ex[(((G0 + 1) * 2 + nt) * 4 + e) * 32 + lane] = acc1[nt][e];
        }
    __syncthreads();
    b16d_store<8, NT>(ex, out, o0, r0, n_out, n_rows, accumulate);
}

// The direct kernel over up to three weights (JOB_ARGS), 16 outputs a block, NT n8 tiles of rows (2: up to 16
// rows; 1: up to 8, half the mma, activation loads and float steps of 2 on the same weights). Its launches issue
// the L2 prefetch the host attached, as the GEMVs' do.
template <int NT>
__device__ __forceinline__ void b16d_k8(const signed char* kq, const float* kd, const int* ks, int width, int n_rows,
                                        int accumulate, JOB_WEIGHTS) {
    // The groups' sums, [group][n8 tile][C element][lane]; with B16D_RING the space of the warps' rings first.
    __shared__ __align__(16) float ex[B16D_RING ? 4 * B16D_RING_BYTES / 4 : 8 * 2 * 4 * 32];
    Job j = JOB_PICK;
    if (j.ty == K8_Q4_K) b16d_q4k<NT>(j.tile, j.out, j.w, kq, kd, ks, width, j.n_out, n_rows, accumulate, ex);
    else if (j.ty == K8_Q6_K) b16d_q6k<NT>(j.tile, j.out, j.w, kq, kd, width, j.n_out, n_rows, accumulate, ex);
    else wait_prior_kernel(); // (no other type comes here; the wait keeps the launch chain whole)
}
// grid = (total tiles of 16 outputs, ceil(n_rows / 16)), block = 128; no dynamic shared memory. gemv16_k8d_n8
// takes launches of at most 8 rows (one row block: a verify of up to 7 drafts, up to 8 slots decoding); a row's
// bits are the same in both (its own tile's integers and float steps, the GEMV's). At 160 registers (174 if
// left free, no spills either way) the one-tile form fits three blocks a multiprocessor (B16D_N8_MINB, a tuning
// define) where the 16-row one fits two.
#ifndef B16D_N8_MINB
#define B16D_N8_MINB 3
#endif
#define B16D_KERNEL(NAME, NT, MINB)                                                                              \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                     \
        NAME(const signed char* kq, const float* kd, const int* ks, int width, int n_rows, int accumulate,      \
             JOB_ARGS) {                                                                                        \
        l2_prefetch_share(pf0, pn0, pf1, pn1);                                                                 \
        b16d_k8<NT>(kq, kd, ks, width, n_rows, accumulate, b1, b2, ty0, out0, w0, n0, ty1, out1, w1, n1, ty2, out2, \
                    w2, n2);                                                                                    \
    }
B16D_KERNEL(gemv16_k8d, 2, 1)
B16D_KERNEL(gemv16_k8d_n8, 1, B16D_N8_MINB)

// ---- Q8_0 blocks for a DFlash drafter (gemv16_q8d, gemv16_q8d_n8) ----
// A drafter's proposals only decide how many tokens a round accepts, never which, so its blocks of rows need no
// other path's bits: its Q8_0 weights are read against K8 activations (one scale per 256 elements), each block's
// exact integer dot times the block's scale summed over a super-block, then times the activation scale. The shape
// is the direct K8 kernel's: 16 outputs a block, warp a takes super-blocks a, a + 4, .., each lane loading its
// activation fragments from global memory; the weights go through the warp's ring of two shared-memory stages
// (16-byte cp.async, one super-block in flight while the other multiplies). A stage holds the 16 outputs'
// records of Q8D_REC bytes: 256 quants, the 8 blocks' f16 scales, then padding that puts output g's fragment
// words 8 g banks apart (no conflicts in a half warp's 8-byte reads). The host sends only such weights here
// (K8_Q8_0); the weights are repacked (gemv.cu's layout: every block's quants, then every block's scale).
#define K8_Q8_0 (T_Q8_0 + 1000)
#define Q8D_REC 288
#define Q8D_STAGE (16 * Q8D_REC)
static_assert(4 * 2 * 4 * 32 * 4 <= 4 * 2 * Q8D_STAGE, "the groups' sums fit where the rings were");

// One super-block of outputs g and g + 8 (oh): the quant words 32 j + 8 t .. + 7 of each block j, the 8 scales.
struct B16DW8 {
    int2 q[2][8];
    int4 d[2];
};
// One super-block's activations for rows g and 8 + g of each tile (codes 32 j + 8 t .. + 7 of block j) and the
// scales of the lane's C columns.
template <int NT> struct B16DX8 {
    int2 x[NT][8];
    float dx[NT][2];
};

template <int NT>
__device__ __forceinline__ void b16d_q8(int bx, float* out, const u8* w, const signed char* kq, const float* kd,
                                        int width, int n_out, int n_rows, int accumulate, unsigned char* smem) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, a = threadIdx.x >> 5;
    int o0 = bx * 16, r0 = blockIdx.y * 16;
    int nsb = width / 256, nb = width / 32;
    int n_it = a < nsb ? (nsb - a + 3) / 4 : 0; // super-blocks a, a + 4, ..
    const u8* wd = w + (long long)n_out * nb * 32;
    unsigned char* ring = smem + a * 2 * Q8D_STAGE;
    // Copies: 16 outputs x 17 chunks (16 of quants, 1 of scales), chunk c = lane + 32 i.
    auto issue = [&](int it) {
        unsigned char* st = ring + (it & 1) * Q8D_STAGE;
        long long blk0 = (long long)(a + 4 * it) * 8;
#pragma unroll
        for (int i = 0; i < 9; i++) {
            int c = lane + 32 * i;
            if (c < 16 * 17) {
                int o = c / 17, k = c % 17;
                long long b = (long long)min(o0 + o, n_out - 1) * nb + blk0;
                const u8* src = k < 16 ? w + b * 32 + 16 * k : wd + b * 2;
                cp_async<16>(st + o * Q8D_REC + 16 * k, src, true);
            }
        }
    };
    auto load_w = [&](B16DW8& b, int it) {
        const unsigned char* st = ring + (it & 1) * Q8D_STAGE;
#pragma unroll
        for (int oh = 0; oh < 2; oh++) {
            const unsigned char* rec = st + (g + 8 * oh) * Q8D_REC;
#pragma unroll
            for (int j = 0; j < 8; j++) b.q[oh][j] = *(const int2*)(rec + 32 * j + 8 * t);
            b.d[oh] = *(const int4*)(rec + 256);
        }
    };
    int rb[2] = {min(r0 + g, n_rows - 1), min(r0 + 8 + g, n_rows - 1)}; // B columns g of the two tiles
    int rc[2][2];                                                        // C columns 2t, 2t + 1 of each tile
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) rc[nt][c] = min(r0 + 8 * nt + 2 * t + c, n_rows - 1);
    auto load_x = [&](B16DX8<NT>& x, int it) {
        int sb = a + 4 * it;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const signed char* xr = kq + (long long)rb[nt] * width + sb * 256 + 8 * t;
#pragma unroll
            for (int j = 0; j < 8; j++) x.x[nt][j] = __ldg((const int2*)(xr + 32 * j));
#pragma unroll
            for (int c = 0; c < 2; c++) x.dx[nt][c] = kd[(long long)rc[nt][c] * nsb + sb];
        }
    };
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
    auto step = [&](const B16DW8& b, const B16DX8<NT>& x, int) {
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int a4[4] = {b.q[0][j].x, b.q[1][j].x, b.q[0][j].y, b.q[1][j].y};
            float d[2];
#pragma unroll
            for (int oh = 0; oh < 2; oh++) {
                int dw = (j >> 1) == 0 ? b.d[oh].x : (j >> 1) == 1 ? b.d[oh].y : (j >> 1) == 2 ? b.d[oh].z : b.d[oh].w;
                d[oh] = h2f((u16)((u32)dw >> (16 * (j & 1))));
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int dot[4] = {0, 0, 0, 0};
                mma_s8_16832(dot, a4, x.x[nt][j].x, x.x[nt][j].y);
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = fmaf(d[e >> 1], (float)dot[e], s[nt][e]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[nt][e] = fmaf(x.dx[nt][e & 1], s[nt][e], acc[nt][e]);
    };
    b16d_ring<2, B16DW8, B16DX8<NT>>(n_it, issue, load_w, load_x, step);
    __syncthreads(); // the groups' sums go where the rings were
    float* ex = (float*)smem;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) ex[((a * 2 + nt) * 4 + e) * 32 + lane] = acc[nt][e];
    __syncthreads();
    b16d_store<4, NT>(ex, out, o0, r0, n_out, n_rows, accumulate);
}

// One block of a Q8_0 job launch: its weight's tile, or (a type no launch sends here) just the wait, which
// keeps the launch chain whole.
template <int NT>
__device__ __forceinline__ void b16d_q8_job(const signed char* kq, const float* kd, int width, int n_rows,
                                            int accumulate, JOB_WEIGHTS) {
    __shared__ __align__(16) unsigned char smem[4 * 2 * Q8D_STAGE];
    Job j = JOB_PICK;
    if (j.ty == K8_Q8_0) b16d_q8<NT>(j.tile, j.out, j.w, kq, kd, width, j.n_out, n_rows, accumulate, smem);
    else wait_prior_kernel();
}
// grid = (total tiles of 16 outputs, ceil(n_rows / 16)), block = 128; no dynamic shared memory. gemv16_q8d_n8
// takes launches of at most 8 rows (one n8 tile). Arguments as gemv16_k8d's (the code sums `ks` are unused).
// Registers: the 16-row form 234 (two blocks a multiprocessor; bounded to three it spills), the one-tile form 128
// (four).
#define Q8D_KERNEL(NAME, NT, MINB)                                                                              \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                     \
        NAME(const signed char* kq, const float* kd, const int* ks, int width, int n_rows, int accumulate,      \
             JOB_ARGS) {                                                                                        \
        b16d_q8_job<NT>(kq, kd, width, n_rows, accumulate, b1, b2, ty0, out0, w0, n0, ty1, out1, w1, n1, ty2,   \
                        out2, w2, n2);                                                                          \
    }
// The 16-row form's blocks a multiprocessor as a launch bound (KILN_CUDA_DEFINES may set it for a tuning run): at
// 3 it spills, but an 8B-shape drafter's Q/K/V launch (384 tiles) would fill 132 multiprocessors in one wave
// instead of 1.45.
#ifndef Q8D_MINB
#define Q8D_MINB 1
#endif
Q8D_KERNEL(gemv16_q8d, 2, Q8D_MINB)
Q8D_KERNEL(gemv16_q8d_n8, 1, 4)
