// Element-wise and per-row ops. Reductions use block_sum/block_max (fixed order), one block per row.

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w. out may equal x (QK-norm in place). grid.x = rows.
extern "C" __global__ void rms_norm(float* out, const float* x, const float* w, int width, float eps) {
    wait_prior_kernel();
    __shared__ float sh[32];
    long long base = (long long)blockIdx.x * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += x[base + i] * x[base + i];
    ss = block_sum(ss, sh);
    float scale = 1.0f / sqrtf(ss / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) out[base + i] = x[base + i] * scale * w[i];
}

// Rotates n_heads heads of head_dim in row blockIdx.x at positions[row]. neox: pairs (i, i + d/2), else (2i, 2i+1).
extern "C" __global__ void rope(float* x, const int* positions, int n_heads, int head_dim, float theta,
                                float freq_scale, int neox) {
    wait_prior_kernel();
    int r = blockIdx.x;
    int half = head_dim / 2;
    float p = (float)positions[r] * freq_scale;
    float* row = x + (long long)r * n_heads * head_dim;
    for (int t = threadIdx.x; t < n_heads * half; t += blockDim.x) {
        int h = t / half, i = t % half;
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float a = p * inv;
        float c = cosf(a), s = sinf(a);
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half : 2 * i + 1;
        float* hp = row + h * head_dim;
        float x0 = hp[ia], x1 = hp[ib];
        hp[ia] = x0 * c - x1 * s;
        hp[ib] = x0 * s + x1 * c;
    }
}

extern "C" __global__ void swiglu(float* out, const float* gate, const float* up, long long n) {
    wait_prior_kernel();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" __global__ void add_inplace(float* x, const float* y, long long n) {
    wait_prior_kernel();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// out[r] = x[rows[r]] (grid.x = output rows).
extern "C" __global__ void gather_rows(float* out, const float* x, const int* rows, int width) {
    wait_prior_kernel();
    long long src = (long long)rows[blockIdx.x] * width, dst = (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) out[dst + i] = x[src + i];
}

// The quantized activations (codes, scales, code sums) of rows `rows[s]` into row s (MoE grouping: slot order).
// Each row's shadow is a function of that row alone (blocks of `sblk` = 32 or 256 never cross a row: width is a
// multiple), so this equals quantizing the gathered f32 rows, done once per token instead of once per choice.
// Codes: width bytes a row (width % 16 == 0); scales: width / sblk words a row; sums: width / 32 words a row (4-byte
// floats or ints, copied as bits). grid.x = output rows, block = 256.
extern "C" __global__ void gather_quant(signed char* q, u32* sc, u32* su, const signed char* xq, const u32* xsc,
                                        const u32* xsu, const int* rows, int width, int sblk) {
    wait_prior_kernel();
    long long src = rows[blockIdx.x], dst = blockIdx.x;
    const int4* a = (const int4*)(xq + src * width);
    int4* b = (int4*)(q + dst * width);
    for (int i = threadIdx.x; i < width / 16; i += blockDim.x) b[i] = a[i];
    int ns = width / sblk, nu = width / 32;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) sc[dst * ns + i] = xsc[src * ns + i];
    for (int i = threadIdx.x; i < nu; i += blockDim.x) su[dst * nu + i] = xsu[src * nu + i];
}

// Greedy argmax (the engine's greedy_argmax: lowest index on ties, NaN never chosen, index 0 when nothing is
// above -inf) in two kernels: argmax_part splits each row into gridDim.y parts over as many multiprocessors (one
// block reading a 151,936-wide row alone is a chain of ~150 loads a thread), argmax_final reduces a row's parts.
// (v, i) beats (bv, bi) when v is larger, or equal with a lower index: the winner is the same in any order, so
// the split changes nothing.
__device__ __forceinline__ void am_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

__device__ __forceinline__ void am_warp(float& bv, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, bv, o);
        int i = __shfl_xor_sync(0xffffffffu, bi, o);
        am_take(bv, bi, v, i);
    }
}

// grid = (rows, parts), block = 256: block (r, p) takes elements p * chunk .. of row r and writes its best to
// part_v / part_i [r * parts + p] (index 0x7fffffff: nothing above -inf).
extern "C" __global__ void __launch_bounds__(256) argmax_part(float* part_v, int* part_i, const float* x, int width) {
    wait_prior_kernel();
    __shared__ float sv[8];
    __shared__ int si[8];
    int r = blockIdx.x, p = blockIdx.y, parts = gridDim.y;
    int chunk = (width + parts - 1) / parts;
    int lo = p * chunk, hi = min(lo + chunk, width);
    const float* row = x + (long long)r * width;
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    // Strictly larger only: a thread's indices ascend, and -inf or NaN is never taken.
#pragma unroll 4
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = row[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    am_warp(bv, bi);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < 8 ? sv[lane] : __int_as_float(0xff800000);
        bi = lane < 8 ? si[lane] : 0x7fffffff;
        am_warp(bv, bi);
        if (lane == 0) {
            part_v[r * parts + p] = bv;
            part_i[r * parts + p] = bi;
        }
    }
}

// grid = rows, block = 32: the best of row r's parts into out[r].
extern "C" __global__ void argmax_final(int* out, const float* part_v, const int* part_i, int parts) {
    wait_prior_kernel();
    int r = blockIdx.x;
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += 32) am_take(bv, bi, part_v[r * parts + p], part_i[r * parts + p]);
    am_warp(bv, bi);
    if (threadIdx.x == 0) out[r] = bi == 0x7fffffff ? 0 : bi;
}

extern "C" __global__ void copy_f32(float* dst, const float* src, long long n) {
    wait_prior_kernel();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// dst[r * dst_stride + i] = src[r * src_stride + i] for i < width, row r = blockIdx.y (strides and width in
// elements). grid = (ceil(width / 256), rows), block = 256.
extern "C" __global__ void copy_rows_f32(float* dst, long long dst_stride, const float* src, long long src_stride,
                                         int width) {
    wait_prior_kernel();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) dst[blockIdx.y * dst_stride + i] = src[blockIdx.y * src_stride + i];
}

// Fused Q8 quantization: lane j of a warp holds element j of one 32-element block `blk`; writes the quant, the
// block scale and scale * sum(quants). Same math as quantize_q8 (exact max, roundf, integer sum), so the bits match.
__device__ __forceinline__ void q8_warp(float v, signed char* xq, float* xd, float* xs, long long blk) {
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)roundf(v * id);
    int sum = q;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int lane = threadIdx.x & 31;
    xq[blk * 32 + lane] = (signed char)q;
    if (lane == 0) {
        xd[blk] = d;
        xs[blk] = d * (float)sum;
    }
}

// Fused K8 quantization (quantize_k8's math) in two phases around one barrier: each warp publishes the amax of
// its 32 elements, then the 8 warps of a 256-element K8 block read their 8 entries (max is exact in any order,
// so the scale's bits match quantize_k8) and write codes, per-32 sums and the scale.
__device__ __forceinline__ void k8_publish(float y, bool act, float* slot) {
    float am = act ? fabsf(y) : 0.0f;
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if ((threadIdx.x & 31) == 0) *slot = am;
}

// `group` points at the block's 8 published maxima; element e of the data; `lead`: the block's first warp.
// With kp non-null also the code sums packed as the K8 block kernels' min-term mma reads them (16 bytes a
// K8 block: the low 6 bits of its 8 sums, then bits 6..13 as signed bytes; gemv16.cu's B16_PACKED_SUMS).
__device__ __forceinline__ void k8_write(float y, const float* group, signed char* kq, float* kd, int* ks,
                                         unsigned char* kp, long long e, bool lead) {
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) amax = fmaxf(amax, group[k]);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)roundf(y * id);
    kq[e] = (signed char)q;
    int sum = q;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int lane = threadIdx.x & 31;
    if (lane == 0) ks[e / 32] = sum;
    if (lane == 0 && kp) k8_pack_sum(kp, e / 32, sum);
    if (lane == 0 && lead) kd[e / 256] = d;
}

// rms_norm that also writes the Q8 blocks of its output (width % 32 == 0). grid = (rows, parts), block = 256.
// Every block sums its row's squares in one order (thread t: float4s t, t + 256, ..., then block_sum), so the
// scale's bits do not depend on `parts`. With parts > 1 (a decode row or a verify block: parts = ceil(width / 256))
// block p writes elements 256 p .. 256 p + 255, whose loads it issues with the sum's, so a row costs one memory
// latency spread over many multiprocessors; with one part the block writes the whole row. With kq non-null
// (width % 256 == 0: a part is one K8 block) it also writes the K8 shadow; with xq null it skips the Q8 blocks.
// (It was one 1,024-thread block per 1,024 elements: 3.70 us a 4,096-wide row in a graph, where SwiGLU takes 1.76.)
extern "C" __global__ void __launch_bounds__(256) rms_norm_q8(float* out, signed char* xq, float* xd, float* xs,
                                                               signed char* kq, float* kd, int* ks,
                                                               unsigned char* kp, const float* x, const float* w,
                                                               int width, float eps) {
    wait_prior_kernel();
    __shared__ float sh[32], sk[8];
    long long base = (long long)blockIdx.x * width;
    const float* xr = x + base;
    bool whole = gridDim.y == 1;
    int own = blockIdx.y * 256 + threadIdx.x;
    float xo = 0.0f, wo = 0.0f;
    if (!whole && own < width) {
        xo = xr[own];
        wo = w[own];
    }
    float ss = 0.0f;
    const float4* x4 = (const float4*)xr;
#pragma unroll 4
    for (int i = threadIdx.x; i < width / 4; i += 256) {
        float4 v = x4[i];
        ss += v.x * v.x;
        ss += v.y * v.y;
        ss += v.z * v.z;
        ss += v.w * v.w;
    }
    ss = block_sum(ss, sh);
    float scale = 1.0f / sqrtf(ss / (float)width + eps);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int p0 = whole ? 0 : blockIdx.y, p1 = whole ? (width + 255) / 256 : blockIdx.y + 1;
    for (int p = p0; p < p1; p++) { // block-uniform trip count
        int i = p * 256 + threadIdx.x;
        if (whole) {
            xo = i < width ? xr[i] : 0.0f;
            wo = i < width ? w[i] : 0.0f;
        }
        float y = xo * scale * wo;
        bool act = i - lane < width; // whole warps (width % 32 == 0)
        if (act) {
            out[base + i] = y;
            if (xq) q8_warp(y, xq, xd, xs, (base + i) / 32);
        }
        if (kq) {
            k8_publish(y, act, &sk[warp]);
            __syncthreads();
            if (act) k8_write(y, sk, kq, kd, ks, kp, base + i, warp == 0);
            __syncthreads();
        }
    }
}

// swiglu over n elements (n % 32 == 0) that also writes the Q8 blocks (unless xq is null). One warp per block of
// 32, 256 threads a block; with kq non-null (n % 256 == 0: a block is all in or all out) also the K8 shadow.
extern "C" __global__ void swiglu_q8(float* out, signed char* xq, float* xd, float* xs, signed char* kq, float* kd,
                                     int* ks, unsigned char* kp, const float* gate, const float* up, long long n) {
    wait_prior_kernel();
    __shared__ float sk[32];
    long long blk = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk * 32 >= n) return;
    long long i = blk * 32 + (threadIdx.x & 31);
    float g = gate[i];
    float v = g / (1.0f + expf(-g)) * up[i];
    out[i] = v;
    if (xq) q8_warp(v, xq, xd, xs, blk);
    if (kq) {
        int warp = threadIdx.x >> 5;
        k8_publish(v, true, &sk[warp]);
        __syncthreads();
        k8_write(v, &sk[warp & ~7], kq, kd, ks, kp, i, (warp & 7) == 0);
    }
}

// Q8 blocks of n elements (n % 32 == 0), one warp per block (the standalone form of the fused writers).
extern "C" __global__ void quantize_q8_warp(signed char* xq, float* xd, float* xs, const float* x, long long n) {
    wait_prior_kernel();
    long long blk = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk * 32 >= n) return;
    q8_warp(x[blk * 32 + (threadIdx.x & 31)], xq, xd, xs, blk);
}
