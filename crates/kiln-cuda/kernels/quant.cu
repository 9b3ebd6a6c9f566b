// Weight decoding and the quantized matmul (GEMV for one row, the same kernel for N rows).
//
// Every weight type is decoded 32 elements at a time into int8 quants q[32], two scales and two offsets (one
// per 16-element half; equal for types with one per 32): x[i] = s[i / 16] * q[i] + mn[i / 16]. Activations are
// quantized to Q8 blocks of 32 (scale dx, and sx = dx * sum(qx)), so a block's dot product is
//   dx * (s0 * sum_{i<16} q[i] qx[i] + s1 * sum_{i>=16} q[i] qx[i]) + mn * sx
// (with per-half offsets, as Q2_K has, the offset term is dx * (mn0 * sum_{i<16} qx[i] + mn1 * sum_{i>=16} qx[i])).
// with exact integer sums (dp4a). Each thread owns a fixed set of blocks and the block-level reduction is a
// fixed tree, so an output row's bits do not depend on how many activation rows share the launch.

// ggml type ids.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ2_XXS 16
#define T_BF16 30

// Activation rows processed per thread pass (grid.y covers the rest).
#define MM_ROWS 8

__device__ __forceinline__ void k4_scale_min(const u8* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Decodes 32-element block `b` of a quantized row (mn: the two halves' offsets). Returns false for a type it does
// not know.
__device__ bool wq32(int ty, const u8* row, int b, signed char* q, float* s, float* mn) {
    mn[0] = mn[1] = 0.0f;
    switch (ty) {
    case T_Q4_0: {
        const u8* blk = row + b * 18;
        float d = h2f(ld16(blk));
        const u8* qs = blk + 2;
        for (int j = 0; j < 16; j++) {
            q[j] = (signed char)((qs[j] & 15) - 8);
            q[j + 16] = (signed char)((qs[j] >> 4) - 8);
        }
        s[0] = s[1] = d;
        return true;
    }
    case T_Q4_1: {
        const u8* blk = row + b * 20;
        float d = h2f(ld16(blk));
        mn[0] = mn[1] = h2f(ld16(blk + 2));
        const u8* qs = blk + 4;
        for (int j = 0; j < 16; j++) {
            q[j] = (signed char)(qs[j] & 15);
            q[j + 16] = (signed char)(qs[j] >> 4);
        }
        s[0] = s[1] = d;
        return true;
    }
    case T_Q5_0: {
        const u8* blk = row + b * 22;
        float d = h2f(ld16(blk));
        u32 qh = ld32(blk + 2);
        const u8* qs = blk + 6;
        for (int j = 0; j < 16; j++) {
            q[j] = (signed char)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - 16);
            q[j + 16] = (signed char)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        s[0] = s[1] = d;
        return true;
    }
    case T_Q5_1: {
        const u8* blk = row + b * 24;
        float d = h2f(ld16(blk));
        mn[0] = mn[1] = h2f(ld16(blk + 2));
        u32 qh = ld32(blk + 4);
        const u8* qs = blk + 8;
        for (int j = 0; j < 16; j++) {
            q[j] = (signed char)((qs[j] & 15) | (((qh >> j) & 1) << 4));
            q[j + 16] = (signed char)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        s[0] = s[1] = d;
        return true;
    }
    case T_Q8_0: {
        const u8* blk = row + b * 34;
        float d = h2f(ld16(blk));
        for (int j = 0; j < 32; j++) q[j] = (signed char)blk[2 + j];
        s[0] = s[1] = d;
        return true;
    }
    case T_Q4_K: {
        int sub = b & 7;
        const u8* blk = row + (b >> 3) * 144;
        float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
        int sc, m;
        k4_scale_min(blk + 4, sub, sc, m);
        const u8* qs = blk + 16 + 32 * (sub >> 1);
        int sh = (sub & 1) * 4;
        for (int j = 0; j < 32; j++) q[j] = (signed char)((qs[j] >> sh) & 15);
        s[0] = s[1] = d * (float)sc;
        mn[0] = mn[1] = -dmin * (float)m;
        return true;
    }
    case T_Q5_K: {
        int sub = b & 7;
        const u8* blk = row + (b >> 3) * 176;
        float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
        int sc, m;
        k4_scale_min(blk + 4, sub, sc, m);
        const u8* qh = blk + 16;
        const u8* qs = blk + 48 + 32 * (sub >> 1);
        int sh = (sub & 1) * 4;
        for (int j = 0; j < 32; j++)
            q[j] = (signed char)(((qs[j] >> sh) & 15) | (((qh[j] >> sub) & 1) << 4));
        s[0] = s[1] = d * (float)sc;
        mn[0] = mn[1] = -dmin * (float)m;
        return true;
    }
    case T_Q6_K: {
        int sub = b & 7;
        const u8* blk = row + (b >> 3) * 210;
        int h = sub >> 2, k = sub & 3;
        const u8* ql = blk + 64 * h + (k & 1) * 32;
        const u8* qh = blk + 128 + 32 * h;
        const signed char* scales = (const signed char*)(blk + 192) + 8 * h + 2 * k;
        float d = h2f(ld16(blk + 208));
        int nsh = k >= 2 ? 4 : 0;
        for (int j = 0; j < 32; j++) {
            int lo = (ql[j] >> nsh) & 15;
            int hi = (qh[j] >> (2 * k)) & 3;
            q[j] = (signed char)((lo | (hi << 4)) - 32);
        }
        s[0] = d * (float)scales[0];
        s[1] = d * (float)scales[1];
        return true;
    }
    case T_Q2_K: {
        // [scales 16][qs 64][d][dmin]; block b: 2-bit field `b % 4` of qs[32 * (b / 4) + j], sub-blocks of 16
        // with scale (low nibble) and min (high nibble) at scales[2b], scales[2b + 1].
        int sub = b & 7;
        const u8* blk = row + (b >> 3) * 84;
        float d = h2f(ld16(blk + 80)), dmin = h2f(ld16(blk + 82));
        const u8* qs = blk + 16 + 32 * (sub >> 2);
        int sh = 2 * (sub & 3);
        for (int j = 0; j < 32; j++) q[j] = (signed char)((qs[j] >> sh) & 3);
        for (int h = 0; h < 2; h++) {
            u8 sc = blk[2 * sub + h];
            s[h] = d * (float)(sc & 15);
            mn[h] = -dmin * (float)(sc >> 4);
        }
        return true;
    }
    case T_IQ2_XXS: {
        // [d][qs: 4 u16 per block]: four 8-bit grid indices (8 magnitudes each from IQ2XXS_GRID), four 7-bit
        // sign groups (the eighth sign is the group's parity) and a 4-bit scale.
        const u8* blk = row + (b >> 3) * 66;
        float d = h2f(ld16(blk));
        const u8* qs = blk + 2 + 8 * (b & 7);
        u32 aux0 = ld32(qs), aux1 = ld32(qs + 4);
        float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            unsigned long long g = IQ2XXS_GRID[(aux0 >> (8 * l)) & 0xFF];
            u32 sg = (aux1 >> (7 * l)) & 127;
            sg |= (u32)(__popc(sg) & 1) << 7;
            for (int j = 0; j < 8; j++) {
                int v = (int)((g >> (8 * j)) & 0xFF);
                q[8 * l + j] = (signed char)(((sg >> j) & 1) ? -v : v);
            }
        }
        s[0] = s[1] = db;
        return true;
    }
    default:
        return false;
    }
}

// Block-sums each row's accumulator (fixed tree) and stores (or adds) it.
__device__ void mm_store(float* out, const float* acc, float* sh, int o, int r0, int nr, int n_out, int accumulate) {
    for (int r = 0; r < nr; r++) {
        float v = block_sum(acc[r], sh);
        if (threadIdx.x == 0) {
            float* p = out + (long long)(r0 + r) * n_out + o;
            *p = accumulate ? *p + v : v;
        }
    }
}

__device__ __forceinline__ int pack4(const signed char* q) {
    return (int)((u32)(u8)q[0] | ((u32)(u8)q[1] << 8) | ((u32)(u8)q[2] << 16) | ((u32)(u8)q[3] << 24));
}

// A decoded weight block (wq32, its quants packed 4 to a word in `wp`) times a Q8 activation block (8 words `xp`,
// scale dx, sx = dx * sum(qx)).
__device__ __forceinline__ float q8_block_dot(const int* wp, const float* s, const float* mn, const int* xp,
                                              float dx, float sx) {
    int lo = 0, hi = 0;
    for (int j = 0; j < 4; j++) lo = __dp4a(wp[j], xp[j], lo);
    for (int j = 4; j < 8; j++) hi = __dp4a(wp[j], xp[j], hi);
    float v = dx * (s[0] * (float)lo + s[1] * (float)hi);
    if (mn[0] == mn[1]) return v + mn[0] * sx;
    int slo = 0, shi = 0;
    for (int j = 0; j < 4; j++) slo = __dp4a(0x01010101, xp[j], slo);
    for (int j = 4; j < 8; j++) shi = __dp4a(0x01010101, xp[j], shi);
    return v + dx * (mn[0] * (float)slo + mn[1] * (float)shi);
}

// Float weight element `i` of a row (F32/F16/BF16).
__device__ __forceinline__ float wf(int ty, const u8* row, int i) {
    if (ty == T_F32) return ((const float*)row)[i];
    if (ty == T_F16) return h2f(((const u16*)row)[i]);
    return bf2f(((const u16*)row)[i]);
}

__device__ __forceinline__ bool is_float_type(int ty) {
    return ty == T_F32 || ty == T_F16 || ty == T_BF16;
}

// out[r * width + i] = dequantized row tokens[r] of the table (grid.x = rows, any block size).
extern "C" __global__ void embed_rows(float* out, const u8* w, long long row_bytes, int ty, const u32* tokens,
                                      int width) {
    wait_prior_kernel();
    int r = blockIdx.x;
    const u8* row = w + (long long)tokens[r] * row_bytes;
    float* o = out + (long long)r * width;
    if (is_float_type(ty)) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = wf(ty, row, i);
        return;
    }
    signed char q[32];
    float s[2], mn[2];
    for (int b = threadIdx.x; b < width / 32; b += blockDim.x) {
        if (!wq32(ty, row, b, q, s, mn)) return;
        for (int j = 0; j < 32; j++) o[b * 32 + j] = s[j >> 4] * (float)q[j] + mn[j >> 4];
    }
}

// Q8 activation blocks: xq (rows x width int8), xd and xs (rows x width/32 floats). grid.x = rows.
// Rounds half away from zero (roundf), like ggml's reference quantize_row_q8_1.
extern "C" __global__ void quantize_q8(signed char* xq, float* xd, float* xs, const float* x, int width) {
    wait_prior_kernel();
    int r = blockIdx.x;
    int nb = width / 32;
    const float* xr = x + (long long)r * width;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xr[b * 32 + j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)roundf(xr[b * 32 + j] * id);
            xq[(long long)r * width + b * 32 + j] = (signed char)v;
            sum += v;
        }
        xd[(long long)r * nb + b] = d;
        xs[(long long)r * nb + b] = d * (float)sum;
    }
}

// out[r * n_out + o] = W[o] . x[r] for quantized W. grid = (n_out, ceil(n_rows / MM_ROWS)), block = MM_THREADS.
extern "C" __global__ void matmul_q8(float* out, const u8* w, long long row_bytes, int ty, const signed char* xq,
                                     const float* xd, const float* xs, int width, int n_out, int n_rows,
                                     int accumulate) {
    wait_prior_kernel();
    __shared__ float sh[32];
    int o = blockIdx.x;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n_rows - r0);
    int nb = width / 32;
    const u8* row = w + (long long)o * row_bytes;
    float acc[MM_ROWS];
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    signed char q[32];
    float s[2], mn[2];
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        if (!wq32(ty, row, b, q, s, mn)) break;
        int wp[8];
        for (int j = 0; j < 8; j++) wp[j] = pack4(q + 4 * j);
        for (int r = 0; r < nr; r++) {
            const int* xp = (const int*)(xq + (long long)(r0 + r) * width + b * 32);
            long long xb = (long long)(r0 + r) * nb + b;
            acc[r] += q8_block_dot(wp, s, mn, xp, xd[xb], xs[xb]);
        }
    }
    mm_store(out, acc, sh, o, r0, nr, n_out, accumulate);
}

// The same for F32/F16/BF16 weights on f32 activations (no activation quantization; any width).
extern "C" __global__ void matmul_f(float* out, const u8* w, long long row_bytes, int ty, const float* x, int width,
                                    int n_out, int n_rows, int accumulate) {
    wait_prior_kernel();
    __shared__ float sh[32];
    int o = blockIdx.x;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n_rows - r0);
    const u8* row = w + (long long)o * row_bytes;
    float acc[MM_ROWS];
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float wv = wf(ty, row, i);
        for (int r = 0; r < nr; r++) acc[r] += wv * x[(long long)(r0 + r) * width + i];
    }
    mm_store(out, acc, sh, o, r0, nr, n_out, accumulate);
}

// The reference (f32-activation) matmul: quantized weights dequantized 32 at a time, multiplied with f32
// activations (the CUDA side of KILN_NO_QUANT_ACT). Same grid as matmul_q8.
extern "C" __global__ void matmul_deq(float* out, const u8* w, long long row_bytes, int ty, const float* x, int width,
                                      int n_out, int n_rows, int accumulate) {
    wait_prior_kernel();
    __shared__ float sh[32];
    int o = blockIdx.x;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n_rows - r0);
    const u8* row = w + (long long)o * row_bytes;
    float acc[MM_ROWS];
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    signed char q[32];
    float s[2], mn[2];
    for (int b = threadIdx.x; b < width / 32; b += blockDim.x) {
        if (!wq32(ty, row, b, q, s, mn)) break;
        for (int r = 0; r < nr; r++) {
            const float* xr = x + (long long)(r0 + r) * width + b * 32;
            float a = 0.0f;
            for (int j = 0; j < 32; j++) a += (s[j >> 4] * (float)q[j] + mn[j >> 4]) * xr[j];
            acc[r] += a;
        }
    }
    mm_store(out, acc, sh, o, r0, nr, n_out, accumulate);
}

// K8 activations (for K-quant weights on the GEMV and block kernels): per 256 elements one scale d = amax / 127
// and codes roundf(x / d) (the same float steps as quantize_q8, over 256 instead of 32), plus the integer sum of
// the codes of every 32 (and, with kp non-null, those sums packed: k8_pack_sum). One warp per 256 elements (8 a
// lane); n a multiple of 256. grid = ceil(n / 256 / 8), block = 256.
extern "C" __global__ void quantize_k8(signed char* kq, float* kd, int* ks, u8* kp, const float* x, long long n) {
    wait_prior_kernel();
    long long blk = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk * 256 >= n) return;
    int lane = threadIdx.x & 31;
    const float* xb = x + blk * 256 + 8 * lane;
    float4 va = *(const float4*)xb, vb = *(const float4*)(xb + 4);
    float v[8] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    u32 packed[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int q = (int)roundf(v[j] * id);
        sum += q;
        packed[j >> 2] |= ((u32)(q & 0xFF)) << (8 * (j & 3));
    }
    *(uint2*)(kq + blk * 256 + 8 * lane) = make_uint2(packed[0], packed[1]);
    // Lanes 4m .. 4m + 3 hold the 32 elements of sub-block m.
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) ks[blk * 8 + (lane >> 2)] = sum;
    if ((lane & 3) == 0 && kp) k8_pack_sum(kp, blk * 8 + (lane >> 2), sum);
    if (lane == 0) kd[blk] = d;
}

// f32 -> bf16 bits, rounded to nearest even (NaN kept a NaN). Written out so it needs no header and no sm_80.
__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// The dense copy of a quantized or F16 weight for the prefill GEMM on cuBLAS (`prefill_blas`): every element
// decoded by wq32 (the GGUF layout) as s * q + mn in f32, or an F16 element as it is, then rounded to bf16. out is
// rows x width, row-major. One thread per 32-element block; grid.x covers rows * width / 32 blocks.
extern "C" __global__ void dequant_bf16(u16* out, const u8* w, long long row_bytes, int ty, int width, int rows) {
    wait_prior_kernel();
    long long nb = width / 32;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nb * rows) return;
    long long r = i / nb;
    int b = (int)(i % nb);
    u32 v[16];
    if (is_float_type(ty)) {
        for (int j = 0; j < 16; j++) {
            u32 lo = f2bf(wf(ty, w + r * row_bytes, b * 32 + 2 * j));
            u32 hi = f2bf(wf(ty, w + r * row_bytes, b * 32 + 2 * j + 1));
            v[j] = lo | (hi << 16);
        }
    } else {
        signed char q[32];
        float s[2], mn[2];
        if (!wq32(ty, w + r * row_bytes, b, q, s, mn)) __trap();
        for (int j = 0; j < 16; j++) {
            u32 lo = f2bf(s[(2 * j) >> 4] * (float)q[2 * j] + mn[(2 * j) >> 4]);
            u32 hi = f2bf(s[(2 * j + 1) >> 4] * (float)q[2 * j + 1] + mn[(2 * j + 1) >> 4]);
            v[j] = lo | (hi << 16);
        }
    }
    uint4* o = (uint4*)(out + r * width + b * 32);
    for (int j = 0; j < 4; j++) o[j] = make_uint4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
}

// Activations as bf16 for the prefill GEMM: out[i] = bf16(x[i]) for n elements (n % 8 == 0), 8 a thread.
extern "C" __global__ void to_bf16(u16* out, const float* x, long long n) {
    wait_prior_kernel();
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float4 a = *(const float4*)(x + i), b = *(const float4*)(x + i + 4);
    uint4 v;
    v.x = (u32)f2bf(a.x) | ((u32)f2bf(a.y) << 16);
    v.y = (u32)f2bf(a.z) | ((u32)f2bf(a.w) << 16);
    v.z = (u32)f2bf(b.x) | ((u32)f2bf(b.y) << 16);
    v.w = (u32)f2bf(b.z) | ((u32)f2bf(b.w) << 16);
    *(uint4*)(out + i) = v;
}
