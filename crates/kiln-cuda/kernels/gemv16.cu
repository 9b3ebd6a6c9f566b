// The decode-path matmul for blocks of rows (a speculative verify block, several slots decoding) on int8 tensor
// cores, giving every row the exact bits of the one-row GEMV (gemv.cu).
//
// The GEMV computes an output with 32 lanes: each lane sums, in a fixed order, float terms of exact integer dots
// (q4k_term / q6k_add), and an xor-shuffle tree adds the lanes. Here one warp computes 8 outputs for 16 rows: an
// mma.sync m16n8k16 yields, for all 16 x 8 pairs at once, the integer dot one GEMV lane takes for one piece of
// one super-block; the lane's float steps are then replayed on those integers in the same order (one running sum
// per GEMV lane and C element) and the partial sums are combined in the xor tree's pairing. Integer dots are
// exact and every float operation is the same explicitly rounded one, so the bits match; the self-test checks
// it (a row alone through gemv_r1 against the same row in a block here).
//
// One block = 4 warps = 32 outputs of the same 16 rows; the rows' Q8 activations for the current super-block
// are staged in shared memory (rows padded to 272 bytes: conflict-free fragment loads).

#define G16_LD 272
#define G16_XS 9

__device__ __forceinline__ void g16_stage(signed char* sx, float* sdx, float* ssx, const signed char* xq,
                                          const float* xd, const float* xs, int sb, int width, int r0, int n_rows) {
    int nb = width / 32;
    for (int u = threadIdx.x; u < 16 * 16; u += blockDim.x) {
        int r = u >> 4, c = u & 15;
        int4 v = make_int4(0, 0, 0, 0);
        if (r0 + r < n_rows) v = ldg16(xq + (long long)(r0 + r) * width + sb * 256 + 16 * c);
        *(int4*)(sx + r * G16_LD + 16 * c) = v;
    }
    for (int u = threadIdx.x; u < 16 * 8; u += blockDim.x) {
        int r = u >> 3, j = u & 7;
        bool in = r0 + r < n_rows;
        long long xb = (long long)(r0 + r) * nb + sb * 8 + j;
        sdx[r * G16_XS + j] = in ? xd[xb] : 0.0f;
        ssx[r * G16_XS + j] = in ? xs[xb] : 0.0f;
    }
}

// A fragment (rows g and g + 8, 4 bytes at column `col`) of the staged activations.
__device__ __forceinline__ void g16_a(const signed char* sx, int col, int& a0, int& a1) {
    int g = (threadIdx.x & 31) >> 2;
    a0 = *(const int*)(sx + g * G16_LD + col);
    a1 = *(const int*)(sx + (g + 8) * G16_LD + col);
}

// Stores the final sums (C element e: row g + 8 (e / 2), output 2 t + e % 2 of the warp's 8).
__device__ __forceinline__ void g16_store(float* out, const float* v, int o0, int r0, int n_out, int n_rows,
                                          int accumulate) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int r = r0 + g + 8 * (e >> 1), o = o0 + 2 * t + (e & 1);
        if (r < n_rows && o < n_out) {
            float* p = out + (long long)r * n_out + o;
            *p = accumulate ? *p + v[e] : v[e];
        }
    }
}

// Q4_K. GEMV lane 8a + i takes chunk i (sub-blocks j0 = 2 (i / 2), j0 + 1, elements 16 (i % 2) ..) of super-blocks
// a, a + 4, a + 8, ...; its tree pairs a with a ^ 2, then a ^ 1, then i ^ 4, i ^ 2, i ^ 1.
// grid = (ceil(n_out / 32), ceil(n_rows / 16)), block = 128.
extern "C" __global__ void __launch_bounds__(128) gemv16_q4k(float* out, const u8* w, const signed char* xq,
                                                             const float* xd, const float* xs, int width,
                                                             int n_out, int n_rows, int accumulate) {
    __shared__ __align__(16) signed char sx[16 * G16_LD];
    __shared__ float sdx[16 * G16_XS], ssx[16 * G16_XS];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * 32 + 8 * (threadIdx.x >> 5), r0 = blockIdx.y * 16;
    int nsb = width / 256;
    // This lane's B rows (output o0 + g) and C columns (outputs o0 + 2t, o0 + 2t + 1).
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 144 : nullptr;
    const u8* wc[2];
#pragma unroll
    for (int cc = 0; cc < 2; cc++) wc[cc] = o0 + 2 * t + cc < n_out ? w + (long long)(o0 + 2 * t + cc) * nsb * 144 : nullptr;
    // v0: group 0, then (0 + 2), then the tree's first two levels; v1: group 1.
    float v0[8][4], v1[8][4], acc[8][4];
    const int order[4] = {0, 2, 1, 3};
#pragma unroll 1
    for (int oi = 0; oi < 4; oi++) {
        int a = order[oi];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
        for (int sb = a; sb < nsb; sb += 4) {
            __syncthreads();
            g16_stage(sx, sdx, ssx, xq, xd, xs, sb, width, r0, n_rows);
            __syncthreads();
            // Scales of the two C columns: d, dmin and the 12 packed scale bytes.
            float d[2], dmin[2];
            u32 sw[2][3];
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
            for (int i = 0; i < 8; i++) {
                int j0 = 2 * (i >> 1), half = (i & 1) * 16;
                float mk = half ? 0.0f : 1.0f;
                u32 q = wg ? *(const u32*)(wg + (long long)sb * 144 + 16 + 16 * i + 4 * t) : 0u;
                int blo = (int)(q & 0x0F0F0F0Fu), bhi = (int)((q >> 4) & 0x0F0F0F0Fu);
                int alo0, alo1, ahi0, ahi1;
                g16_a(sx, j0 * 32 + half + 4 * t, alo0, alo1);
                g16_a(sx, (j0 + 1) * 32 + half + 4 * t, ahi0, ahi1);
                int lo[4], hi[4];
                mma_s8_16816(lo, alo0, alo1, blo);
                mma_s8_16816(hi, ahi0, ahi1, bhi);
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
                for (int e = 0; e < 4; e++) {
                    int r = g + 8 * (e >> 1), cc = e & 1;
                    const float* dx = sdx + r * G16_XS + j0;
                    const float* sm = ssx + r * G16_XS + j0;
                    acc[i][e] = __fadd_rn(acc[i][e], q4k_term(lo[e], hi[e], dx[0], dx[1], s0[cc], s1[cc], mn0[cc],
                                                              mn1[cc], sm[0], sm[1], mk));
                }
            }
        }
        // Pairings of the tree's first two levels: (a, a ^ 2), then the two pairs.
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (a == 0) v0[i][e] = acc[i][e];
                else if (a == 2) v0[i][e] = __fadd_rn(v0[i][e], acc[i][e]);
                else if (a == 1) v1[i][e] = acc[i][e];
                else v0[i][e] = __fadd_rn(v0[i][e], __fadd_rn(v1[i][e], acc[i][e]));
            }
    }
    // Levels i ^ 4, i ^ 2, i ^ 1.
    float res[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float (*T)[4] = v0;
        res[e] = __fadd_rn(__fadd_rn(__fadd_rn(T[0][e], T[4][e]), __fadd_rn(T[2][e], T[6][e])),
                           __fadd_rn(__fadd_rn(T[1][e], T[5][e]), __fadd_rn(T[3][e], T[7][e])));
    }
    g16_store(out, res, o0, r0, n_out, n_rows, accumulate);
}

// Q6_K. GEMV lane 4 G + u takes unit u (half h = u / 2, column half c = u % 2) of super-blocks G, G + 8, ...;
// per super-block its sum starts at 0 and adds the pieces k = 0..3 (sub-block 4 h + k, elements 16 c ..); the
// tree pairs G with G ^ 4, G ^ 2, G ^ 1, then u ^ 2, u ^ 1. grid and block as gemv16_q4k.
extern "C" __global__ void __launch_bounds__(128) gemv16_q6k(float* out, const u8* w, const signed char* xq,
                                                             const float* xd, const float* xs, int width,
                                                             int n_out, int n_rows, int accumulate) {
    __shared__ __align__(16) signed char sx[16 * G16_LD];
    __shared__ float sdx[16 * G16_XS], ssx[16 * G16_XS];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * 32 + 8 * (threadIdx.x >> 5), r0 = blockIdx.y * 16;
    int nsb = width / 256;
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nsb * 208 : nullptr;
    const u16* dd = (const u16*)(w + (long long)n_out * nsb * 208);
    int oc[2];
#pragma unroll
    for (int cc = 0; cc < 2; cc++) oc[cc] = o0 + 2 * t + cc;
    // Group sums by tree position: stack[0] = G0 + G4, stack[1] = (G0 + G4) + (G2 + G6), stack[2] = G1 + G5.
    float st0[4][4], st1[4][4], st2[4][4], acc[4][4];
    const int order[8] = {0, 4, 2, 6, 1, 5, 3, 7};
#pragma unroll 1
    for (int gi = 0; gi < 8; gi++) {
        int G = order[gi];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[u][e] = 0.0f;
        for (int sb = G; sb < nsb; sb += 8) {
            __syncthreads();
            g16_stage(sx, sdx, ssx, xq, xd, xs, sb, width, r0, n_rows);
            __syncthreads();
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
                u32 qa = p ? *(const u32*)(p + 64 * h + 16 * c + 4 * t) : 0u;
                u32 qb = p ? *(const u32*)(p + 64 * h + 32 + 16 * c + 4 * t) : 0u;
                u32 qh = p ? *(const u32*)(p + 128 + 32 * h + 16 * c + 4 * t) : 0u;
                // Sub-blocks 4h + k: k = 0, 1 from the low nibbles of qa, qb; k = 2, 3 from their high nibbles.
                u32 nib[4] = {qa & 0x0F0F0F0Fu, qb & 0x0F0F0F0Fu, (qa >> 4) & 0x0F0F0F0Fu, (qb >> 4) & 0x0F0F0F0Fu};
                float psum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 v = nib[k] | (((qh >> (2 * k)) & 0x03030303u) << 4);
                    int b = (int)__vsub4(v, 0x20202020u);
                    int a0, a1;
                    g16_a(sx, (4 * h + k) * 32 + 16 * c + 4 * t, a0, a1);
                    int dot[4];
                    mma_s8_16816(dot, a0, a1, b);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int r = g + 8 * (e >> 1), cc = e & 1;
                        float s = d[cc] * (float)(signed char)byte_of(scw[cc][(8 * h + 2 * k + c) >> 2],
                                                                      (8 * h + 2 * k + c) & 3);
                        psum[e] = q6k_add(psum[e], dot[e], sdx[r * G16_XS + 4 * h + k], s);
                    }
                }
#pragma unroll
                for (int e = 0; e < 4; e++) acc[u][e] = __fadd_rn(acc[u][e], psum[e]);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = acc[u][e];
                switch (G) {
                case 0: st0[u][e] = x; break;
                case 4: st0[u][e] = __fadd_rn(st0[u][e], x); break;
                case 2: st2[u][e] = x; break;
                case 6: st1[u][e] = __fadd_rn(st0[u][e], __fadd_rn(st2[u][e], x)); break;
                case 1: st0[u][e] = x; break;
                case 5: st0[u][e] = __fadd_rn(st0[u][e], x); break;
                case 3: st2[u][e] = x; break;
                default: st1[u][e] = __fadd_rn(st1[u][e], __fadd_rn(st0[u][e], __fadd_rn(st2[u][e], x))); break;
                }
            }
    }
    // Units: (u0 + u2) + (u1 + u3).
    float res[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
        res[e] = __fadd_rn(__fadd_rn(st1[0][e], st1[2][e]), __fadd_rn(st1[1][e], st1[3][e]));
    g16_store(out, res, o0, r0, n_out, n_rows, accumulate);
}

// Q8_0. GEMV lane L takes blocks L, L + 32, L + 64, ...; its tree pairs L with L ^ 16, ^ 8, ^ 4, ^ 2, ^ 1. The lanes
// are replayed in bit-reversed order (0, 16, 8, 24, 4, ...), so the tree is a running stack of pairwise sums:
// level j holds the sum of the last 2^j lanes (level 5: all 32). Activations come straight from global memory (L1-resident for
// the block's 16 rows). grid and block as gemv16_q4k.
extern "C" __global__ void __launch_bounds__(128) gemv16_q8_0(float* out, const u8* w, const signed char* xq,
                                                              const float* xd, const float* xs, int width,
                                                              int n_out, int n_rows, int accumulate) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * 32 + 8 * (threadIdx.x >> 5), r0 = blockIdx.y * 16;
    int nb = width / 32;
    const u8* wg = o0 + g < n_out ? w + (long long)(o0 + g) * nb * 32 : nullptr;
    const u16* dd = (const u16*)(w + (long long)n_out * nb * 32);
    int oc[2] = {o0 + 2 * t, o0 + 2 * t + 1};
    int rr[2] = {r0 + g, r0 + g + 8};
    float stack[6][4];
#pragma unroll 1
    for (int k = 0; k < 32; k++) {
        int L = (int)(__brev((unsigned)k) >> 27); // bit-reversed 5-bit index
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int b = L; b < nb; b += 32) {
            int a[2][2], bw[2];
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
#pragma unroll
                for (int i = 0; i < 2; i++)
                    a[hh][i] = rr[i] < n_rows
                                   ? *(const int*)(xq + (long long)rr[i] * width + b * 32 + 16 * hh + 4 * t)
                                   : 0;
                bw[hh] = wg ? *(const int*)(wg + b * 32 + 16 * hh + 4 * t) : 0;
            }
            int lo[4], hi[4];
            mma_s8_16816(lo, a[0][0], a[0][1], bw[0]);
            mma_s8_16816(hi, a[1][0], a[1][1], bw[1]);
            float d[2], dx[2];
#pragma unroll
            for (int cc = 0; cc < 2; cc++) d[cc] = oc[cc] < n_out ? h2f(dd[(long long)oc[cc] * nb + b]) : 0.0f;
#pragma unroll
            for (int i = 0; i < 2; i++) dx[i] = rr[i] < n_rows ? xd[(long long)rr[i] * nb + b] : 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) acc[e] = __fadd_rn(acc[e], q8_term(lo[e] + hi[e], dx[e >> 1], d[e & 1]));
        }
        // Push lane L: merge with the completed levels below (as many as k has trailing ones), store the sum at
        // the first free level; the 32nd lane's push leaves the whole tree at level 5.
        int ones = __ffs(~k) - 1;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = acc[e];
#pragma unroll
            for (int j = 0; j < 5; j++)
                if (j < ones) v = __fadd_rn(stack[j][e], v);
#pragma unroll
            for (int j = 0; j < 6; j++)
                if (j == ones) stack[j][e] = v;
        }
    }
    g16_store(out, stack[5], o0, r0, n_out, n_rows, accumulate);
}

