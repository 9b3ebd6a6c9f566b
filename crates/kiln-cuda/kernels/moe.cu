// Mixture-of-experts FFN (Qwen3-MoE routing), correct first: routing on the device (so a pass stays one graph),
// one block per (output feature, chosen expert of a row) reading that expert's weight row.

// Per row (one warp): softmax over the router logits, the k largest (ties to the lower index), weights
// renormalised to sum to one when `norm`, then sorted by expert index. ids/wts are rows x k. A lane's
// probabilities of its first MR_CACHE experts (lane, lane + 32, ...) are computed once and kept in registers, the
// rest recomputed per pick (same expression, same bits); a lane scans its experts in ascending order either way.
#define MR_CACHE 16
extern "C" __global__ void moe_route(int* ids, float* wts, const float* logits, int n_exp, int k, int norm) {
    wait_prior_kernel();
    int r = blockIdx.x, lane = threadIdx.x;
    const float* lr = logits + (long long)r * n_exp;
    float mx = __int_as_float(0xff800000);
    for (int e = lane; e < n_exp; e += 32) mx = fmaxf(mx, lr[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < n_exp; e += 32) sum += expf(lr[e] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float pc[MR_CACHE];
#pragma unroll
    for (int i = 0; i < MR_CACHE; i++) {
        int e = lane + 32 * i;
        pc[i] = e < n_exp ? expf(lr[e] - mx) / sum : 0.0f;
    }
    unsigned taken_c = 0; // bit i: this lane's cached expert lane + 32 i is chosen
    int ci[16];
    float cw[16];
    float total = 0.0f;
    for (int j = 0; j < k; j++) {
        // The best expert not chosen yet: largest probability, then lowest index.
        float bv = __int_as_float(0xff800000);
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MR_CACHE; i++) {
            int e = lane + 32 * i;
            float p = pc[i];
            if (e < n_exp && !((taken_c >> i) & 1u) && (p > bv || (p == bv && e < bi))) {
                bv = p;
                bi = e;
            }
        }
        for (int e = lane + 32 * MR_CACHE; e < n_exp; e += 32) {
            bool taken = false;
            for (int t = 0; t < j; t++) taken |= ci[t] == e;
            float p = expf(lr[e] - mx) / sum;
            if (!taken && (p > bv || (p == bv && e < bi))) {
                bv = p;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        ci[j] = bi;
        cw[j] = bv;
        total += bv;
        if (bi < 32 * MR_CACHE && (bi & 31) == lane) taken_c |= 1u << (bi >> 5);
    }
    if (lane != 0) return;
    for (int j = 0; j < k; j++) {
        if (norm) cw[j] /= total;
    }
    // Insertion sort by expert index (k <= 16).
    for (int a = 1; a < k; a++) {
        int e = ci[a];
        float w = cw[a];
        int b = a - 1;
        while (b >= 0 && ci[b] > e) {
            ci[b + 1] = ci[b];
            cw[b + 1] = cw[b];
            b--;
        }
        ci[b + 1] = e;
        cw[b + 1] = w;
    }
    for (int j = 0; j < k; j++) {
        ids[r * k + j] = ci[j];
        wts[r * k + j] = cw[j];
    }
}

// out[c * n_out + o] = W_e[o] . x[a] for every choice c = row * k + j (grid.y), e = ids[c], a = c when
// `x_per_choice` else row. Q8 activations (xq/xd/xs), or f32 activations `xf` against dequantized weights when
// `ref`. W_e starts `expert_bytes` after W_{e-1}. grid = (n_out, rows * k), block = MM_THREADS.
extern "C" __global__ void moe_matmul(float* out, const u8* w, long long expert_bytes, long long row_bytes, int ty,
                                      const signed char* xq, const float* xd, const float* xs, const float* xf,
                                      int ref, const int* ids, int k, int x_per_choice, int width, int n_out) {
    wait_prior_kernel();
    __shared__ float sh[32];
    int o = blockIdx.x, c = blockIdx.y;
    int a = x_per_choice ? c : c / k;
    int nb = width / 32;
    const u8* row = w + (long long)ids[c] * expert_bytes + (long long)o * row_bytes;
    float acc = 0.0f;
    signed char q[32];
    float s[2], mn[2];
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        if (!wq32(ty, row, b, q, s, mn)) break;
        if (ref) {
            const float* xr = xf + (long long)a * width + b * 32;
            float t = 0.0f;
            for (int j = 0; j < 32; j++) t += (s[j >> 4] * (float)q[j] + mn[j >> 4]) * xr[j];
            acc += t;
        } else {
            int wp[8];
            for (int j = 0; j < 8; j++) wp[j] = pack4(q + 4 * j);
            long long xb = (long long)a * nb + b;
            acc += q8_block_dot(wp, s, mn, (const int*)(xq + (long long)a * width + b * 32), xd[xb], xs[xb]);
        }
    }
    float v = block_sum(acc, sh);
    if (threadIdx.x == 0) out[(long long)c * n_out + o] = v;
}

// out[r] = sum_j wts[r * k + j] * y[row of choice r * k + j], j ascending (grid.x = rows): the row is the choice
// itself, or slot_of[choice] when the expert outputs are in expert-grouped order. The row's k weights and source
// offsets are read once into shared memory; with width % 4 == 0 a thread sums 4 adjacent elements from 16-byte
// loads (each element's sum the same chain of fused multiply-adds in the same order).
extern "C" __global__ void moe_combine(float* out, const float* y, const float* wts, const int* slot_of, int k,
                                       int width) {
    wait_prior_kernel();
    __shared__ float sw[16];
    __shared__ long long so[16];
    int r = blockIdx.x;
    if (threadIdx.x < k) {
        int c = r * k + threadIdx.x;
        sw[threadIdx.x] = wts[c];
        so[threadIdx.x] = (long long)(slot_of ? slot_of[c] : c) * width;
    }
    __syncthreads();
    float* o = out + (long long)r * width;
    if (width % 4 == 0) {
        for (int i = 4 * threadIdx.x; i < width; i += 4 * blockDim.x) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int j = 0; j < k; j++) {
                float w = sw[j];
                float4 v = *(const float4*)(y + so[j] + i);
                acc.x += w * v.x;
                acc.y += w * v.y;
                acc.z += w * v.z;
                acc.w += w * v.w;
            }
            *(float4*)(o + i) = acc;
        }
        return;
    }
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += sw[j] * y[so[j] + i];
        o[i] = acc;
    }
}

// Grouping the n choices by expert, in two passes of one block per expert (deterministic, no atomics):
// moe_count: counts[e] = the choices of expert e.
extern "C" __global__ void moe_count(int* counts, const int* ids, int n) {
    wait_prior_kernel();
    int e = blockIdx.x, c = 0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        int i = c0 + threadIdx.x;
        c += __syncthreads_count(i < n && ids[i] == e);
    }
    if (threadIdx.x == 0) counts[e] = c;
}

// moe_place: slot_of[c] = the slot of choice c, the slots of expert e contiguous and in ascending choice order;
// src_row[slot] = the activation row of the slot's choice (c / k); tiles of up to `tile` slots of one expert as
// (expert, first slot, rows), expert by expert, their count in tiles[0]. grid = n_exp, block = up to 1024 (a
// multiple of 32; the placement does not depend on it).
extern "C" __global__ void moe_place(int* slot_of, int* src_row, int* tiles, const int* counts, const int* ids,
                                     int n, int k, int n_exp, int tile) {
    wait_prior_kernel();
    __shared__ int warp_hits[32];
    __shared__ int base, tile_base;
    int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (threadIdx.x == 0) {
        int b = 0, tb = 0;
        for (int i = 0; i < e; i++) {
            b += counts[i];
            tb += (counts[i] + tile - 1) / tile;
        }
        base = b;
        tile_base = tb;
        if (e == n_exp - 1) tiles[0] = tb + (counts[e] + tile - 1) / tile;
    }
    __syncthreads();
    int s = base;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        int c = c0 + threadIdx.x;
        bool hit = c < n && ids[c] == e;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(m);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < n_warps; w++) {
            before += w < warp ? warp_hits[w] : 0;
            total += warp_hits[w];
        }
        if (hit) {
            int slot = s + before + __popc(m & ((1u << lane) - 1u));
            slot_of[c] = slot;
            src_row[slot] = c / k;
        }
        s += total;
        __syncthreads();
    }
    int ce = counts[e];
    for (int t = threadIdx.x; t * tile < ce; t += blockDim.x) {
        int* tt = tiles + 1 + 3 * (tile_base + t);
        tt[0] = e;
        tt[1] = base + tile * t;
        tt[2] = min(tile, ce - tile * t);
    }
}

// The expert matmuls over expert-grouped slots: tile blockIdx.z (moe_place with tile 8) multiplies its expert's matrix
// with up to 8 consecutive slots' activations through the 8-row GEMV body, reading each weight once for them; a
// slot's bits are those of the one-row GEMV (the body's batch invariance), so grouping changes no result.
// grid = (ceil(n_out / GV_WARPS), 1, max tiles), block = 128; blocks past tiles[0] exit.
template <bool K8>
__device__ __forceinline__ void moe_gemv_tiles_body(int ty, float* out, const u8* w, long long expert_bytes,
                                                    const signed char* xq, const float* xd, const float* xs,
                                                    const int* tiles, int width, int n_out) {
    if ((int)blockIdx.z >= tiles[0]) return;
    const int* tt = tiles + 1 + 3 * blockIdx.z;
    long long xo = (long long)tt[1] * width;
    gemv_dispatch<8, K8>(ty, blockIdx.x, out + (long long)tt[1] * n_out, w + (long long)tt[0] * expert_bytes,
                         xq + xo, xd + (K8 ? xo / 256 : xo / 32), xs + xo / 32, width, n_out, tt[2], 0);
}

#define MOE_TILES_KERNEL(NAME, K8)                                                                               \
    extern "C" __global__ void __launch_bounds__(128, 3)                                                        \
        NAME(int ty, float* out, const u8* w, long long expert_bytes, const signed char* xq, const float* xd,   \
             const float* xs, const int* tiles, int width, int n_out) {                                         \
        wait_prior_kernel();                                                                                    \
        moe_gemv_tiles_body<K8>(ty, out, w, expert_bytes, xq, xd, xs, tiles, width, n_out);                     \
    }
MOE_TILES_KERNEL(moe_gemv_tiles, false)
MOE_TILES_KERNEL(moe_gemv_tiles_k8, true)

// The expert matmuls on the GEMV kernels (experts repacked one by one at upload): out[c] = W_{ids[c]} . x[a] for
// every choice c = blockIdx.z (a = c when x_per_choice, else c / k), the one-row GEMV body over the chosen
// expert's matrix, so a choice's bits are those of a plain one-row matmul of that expert. xq/xd/xs are Q8 (per 32)
// or, for K8, codes / scales per 256 / int sums per 32. grid = (ceil(n_out / GV_WARPS), 1, rows * k), block = 128.
template <bool K8>
__device__ __forceinline__ void moe_gemv_body(int ty, float* out, const u8* w, long long expert_bytes,
                                              const signed char* xq, const float* xd, const float* xs,
                                              const int* ids, int k, int x_per_choice, int width, int n_out) {
    int c = blockIdx.z;
    long long xo = (long long)(x_per_choice ? c : c / k) * width;
    gemv_dispatch<1, K8>(ty, blockIdx.x, out + (long long)c * n_out, w + (long long)ids[c] * expert_bytes, xq + xo,
                         xd + (K8 ? xo / 256 : xo / 32), xs + xo / 32, width, n_out, 1, 0);
}

#define MOE_GEMV_KERNEL(NAME, K8)                                                                                \
    extern "C" __global__ void __launch_bounds__(128, 6)                                                        \
        NAME(int ty, float* out, const u8* w, long long expert_bytes, const signed char* xq, const float* xd,   \
             const float* xs, const int* ids, int k, int x_per_choice, int width, int n_out) {                 \
        wait_prior_kernel();                                                                                   \
        moe_gemv_body<K8>(ty, out, w, expert_bytes, xq, xd, xs, ids, k, x_per_choice, width, n_out);           \
    }
MOE_GEMV_KERNEL(moe_gemv, false)
MOE_GEMV_KERNEL(moe_gemv_k8, true)

// Gate and up in one launch (decode: one row a token): blocks [0, nb) compute expert matrix w0 into out0 and
// [nb, 2 nb) w1 into out1, each output by moe_gemv's body, so with its bits. grid = (2 nb, 1, rows * k) with
// nb = ceil(n_out / GV_WARPS), block = 128.
#define MOE_GATE_UP_KERNEL(NAME, K8)                                                                             \
    extern "C" __global__ void __launch_bounds__(128, 6)                                                        \
        NAME(int ty0, float* out0, const u8* w0, long long bytes0, int ty1, float* out1, const u8* w1,          \
             long long bytes1, const signed char* xq, const float* xd, const float* xs, const int* ids, int k,    \
             int width, int n_out, int nb) {                                                                    \
        wait_prior_kernel();                                                                                    \
        int c = blockIdx.z, second = (int)blockIdx.x >= nb;                                                     \
        long long xo = (long long)(c / k) * width;                                                              \
        gemv_dispatch<1, K8>(second ? ty1 : ty0, second ? blockIdx.x - nb : blockIdx.x,                        \
                             (second ? out1 : out0) + (long long)c * n_out,                                     \
                             (second ? w1 : w0) + (long long)ids[c] * (second ? bytes1 : bytes0), xq + xo,       \
                             xd + (K8 ? xo / 256 : xo / 32), xs + xo / 32, width, n_out, 1, 0);                 \
    }
MOE_GATE_UP_KERNEL(moe_gate_up, false)
MOE_GATE_UP_KERNEL(moe_gate_up_k8, true)

// Prefill: the expert matmuls over expert-grouped slots on the int8 tensor-core prefill kernel (mmq.cu): tile
// blockIdx.z (moe_place with tile 64) multiplies its expert's matrix with up to 64 consecutive slots. Each output
// is mmq's own sum over its row alone, so the grouping changes no result. xd/xs per 32 elements (kd per 256 for
// the K-quants on K8). grid = (ceil(n_out / 64), 1, max tiles), block = 128; blocks past tiles[0] exit.
#define MOE_MMQ_ARGS                                                                                             \
    float *out, const u8 *w, long long expert_bytes, const signed char *xq, const float *xd, const float *xs,   \
        const int *tiles, int width, int n_out
#define MOE_MMQ_TILE                                                                                             \
    if ((int)blockIdx.z >= tiles[0]) return;                                                                    \
    const int* tt = tiles + 1 + 3 * blockIdx.z;                                                                  \
    long long s0 = tt[1];                                                                                        \
    const u8* we = w + (long long)tt[0] * expert_bytes;
#define MOE_MMQ_KERNEL(NAME, TY)                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) NAME(MOE_MMQ_ARGS) {                                       \
        wait_prior_kernel();                                                                                     \
        MOE_MMQ_TILE                                                                                             \
        mmq_body<TY>(out + s0 * n_out, we, xq + s0 * width, xd + s0 * (width / 32), xs + s0 * (width / 32),     \
                     width, n_out, tt[2], 0, 0);                                                                 \
    }
MOE_MMQ_KERNEL(moe_mmq_q4_k, T_Q4_K)
MOE_MMQ_KERNEL(moe_mmq_q6_k, T_Q6_K)

// The pipelined bodies (mmq.cu; dynamic shared memory): Q8_0 on per-32 activations, the K-quants on K8 (Q4_K
// also reads the K8 code sums, passed as xs).
#define MOE_MP_KERNEL(NAME, BODY, XD)                                                                            \
    extern "C" __global__ void __launch_bounds__(128, 3) NAME(MOE_MMQ_ARGS) {                                    \
        wait_prior_kernel();                                                                                     \
        MOE_MMQ_TILE                                                                                             \
        BODY(out + s0 * n_out, we, xq + s0 * width, xd + s0 * (width / XD), width, n_out, tt[2], 0, 0,          \
             blockIdx.x * MQ_BN);                                                                              \
    }
MOE_MP_KERNEL(moe_mmq_q8_0, mmq_q8_0_body, 32)
MOE_MP_KERNEL(moe_mmq_q6_k8, mmq_q6_k8_body, 256)
extern "C" __global__ void __launch_bounds__(128, 3) moe_mmq_q4_k8(MOE_MMQ_ARGS) {
    wait_prior_kernel();
    MOE_MMQ_TILE
    mmq_q4_k8_body(out + s0 * n_out, we, xq + s0 * width, xd + s0 * (width / 256), (const int*)xs + s0 * (width / 32),
                   width, n_out, tt[2], 0, 0, blockIdx.x * MQ_BN);
}
