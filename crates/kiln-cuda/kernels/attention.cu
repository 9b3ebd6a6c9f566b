// KV cache append and decode attention. Cache layout per K and V: [layer][slot][pos][n_head_kv][head_dim],
// elements f16 (raw bits) or f32.

__device__ __forceinline__ float kv_load(const void* c, int f16, long long i) {
    return f16 ? h2f(((const u16*)c)[i]) : ((const float*)c)[i];
}

// Stores row blockIdx.x's k/v at (layer, slots[r], positions[r]).
extern "C" __global__ void kv_append(void* kc, void* vc, const float* k, const float* v, const int* slots,
                                     const int* positions, int layer, int n_slots, int slot_ctx, int kv_dim,
                                     int f16) {
    int r = blockIdx.x;
    long long dst = (((long long)layer * n_slots + slots[r]) * slot_ctx + positions[r]) * kv_dim;
    long long src = (long long)r * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        if (f16) {
            ((u16*)kc)[dst + i] = f2h(k[src + i]);
            ((u16*)vc)[dst + i] = f2h(v[src + i]);
        } else {
            ((float*)kc)[dst + i] = k[src + i];
            ((float*)vc)[dst + i] = v[src + i];
        }
    }
}

// One block per (head, row): softmax(q . K[0..=pos] * scale) . V over the row's slot. `scores` is scratch of
// rows x n_head x slot_ctx floats. Each position's score is a serial dot product, the softmax sum a fixed tree,
// each output element a serial sum over positions: the result does not depend on the other rows.
extern "C" __global__ void attn_decode(float* out, const float* q, const void* kc, const void* vc, float* scores,
                                       const int* slots, const int* positions, int layer, int n_slots,
                                       int slot_ctx, int n_head, int n_head_kv, int head_dim, float scale,
                                       int f16) {
    __shared__ float sh[32];
    __shared__ float qs[512];
    int h = blockIdx.x, r = blockIdx.y;
    int kvh = h / (n_head / n_head_kv);
    int kv_dim = n_head_kv * head_dim;
    int n_pos = positions[r] + 1;
    long long base = ((long long)layer * n_slots + slots[r]) * slot_ctx * kv_dim + (long long)kvh * head_dim;
    const float* qr = q + ((long long)r * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    float* sc = scores + ((long long)r * n_head + h) * slot_ctx;
    float mx = __int_as_float(0xff800000);
    for (int t = threadIdx.x; t < n_pos; t += blockDim.x) {
        long long kb = base + (long long)t * kv_dim;
        float s = 0.0f;
        for (int d = 0; d < head_dim; d++) s += qs[d] * kv_load(kc, f16, kb + d);
        s *= scale;
        sc[t] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n_pos; t += blockDim.x) {
        float e = expf(sc[t] - mx);
        sc[t] = e;
        sum += e;
    }
    sum = block_sum(sum, sh);
    float inv = 1.0f / sum;
    float* orow = out + ((long long)r * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n_pos; t++) acc += sc[t] * kv_load(vc, f16, base + (long long)t * kv_dim + d);
        orow[d] = acc * inv;
    }
}

// ---- The fused decode path: attn_prep, then attn_split + attn_merge ("flash decoding"). ----

#define AT_MAXG 8

__device__ __forceinline__ long long kv_row(int layer, int slot, int pos, int n_slots, int slot_ctx, int kv_dim) {
    return (((long long)layer * n_slots + slot) * slot_ctx + pos) * kv_dim;
}

// One warp per (row, head) (grid = (rows, n_head + n_head_kv), block = 32): QK-norm (when the weights are given)
// and RoPE of a query head in place, or of a key head into the cache at (layer, slots[r], positions[r]) together
// with the same head's V. Every load of a head is issued before the first use. head_dim <= 256.
extern "C" __global__ void __launch_bounds__(32) attn_prep(float* q, float* k, const float* v, void* kc, void* vc,
                                                           const float* q_norm, const float* k_norm,
                                                           const int* slots, const int* positions, int layer,
                                                           int n_slots, int slot_ctx, int n_head, int n_head_kv,
                                                           int head_dim, float eps, float theta, float freq_scale,
                                                           int neox, int f16) {
    __shared__ float hb[256];
    int r = blockIdx.x, hh = blockIdx.y, lane = threadIdx.x;
    int kv_dim = n_head_kv * head_dim, half = head_dim / 2;
    bool is_q = hh < n_head;
    int h = is_q ? hh : hh - n_head;
    float* src = is_q ? q + ((long long)r * n_head + h) * head_dim : k + ((long long)r * n_head_kv + h) * head_dim;
    const float* nw = is_q ? q_norm : k_norm;
    long long dst = kv_row(layer, slots[r], positions[r], n_slots, slot_ctx, kv_dim) + (long long)h * head_dim;
    float xv[8], wv[8], vv[8];
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int i = lane + 32 * t;
        bool in = i < head_dim;
        xv[t] = in ? src[i] : 0.0f;
        wv[t] = in && nw ? nw[i] : 1.0f;
        vv[t] = in && !is_q ? v[(long long)r * kv_dim + h * head_dim + i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) ss += xv[t] * xv[t];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float scale = nw ? 1.0f / sqrtf(ss / (float)head_dim + eps) : 1.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int i = lane + 32 * t;
        if (i < head_dim) hb[i] = nw ? xv[t] * scale * wv[t] : xv[t];
    }
    __syncwarp();
    float p = (float)positions[r] * freq_scale;
    for (int i = lane; i < half; i += 32) {
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float s, c;
        sincosf(p * inv, &s, &c);
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half : 2 * i + 1;
        float x0 = hb[ia], x1 = hb[ib];
        float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        if (is_q) {
            src[ia] = y0;
            src[ib] = y1;
        } else if (f16) {
            ((u16*)kc)[dst + ia] = f2h(y0);
            ((u16*)kc)[dst + ib] = f2h(y1);
        } else {
            ((float*)kc)[dst + ia] = y0;
            ((float*)kc)[dst + ib] = y1;
        }
    }
    if (is_q) return;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int i = lane + 32 * t;
        if (i < head_dim) {
            if (f16)
                ((u16*)vc)[dst + i] = f2h(vv[t]);
            else
                ((float*)vc)[dst + i] = vv[t];
        }
    }
}

__device__ __forceinline__ void kv_load8(const void* c, int f16, long long i, float* out) {
    if (f16) {
        int4 raw = __ldg((const int4*)((const u16*)c + i));
        u32 w[4] = {(u32)raw.x, (u32)raw.y, (u32)raw.z, (u32)raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            out[2 * j] = h2f((u16)(w[j] & 0xFFFF));
            out[2 * j + 1] = h2f((u16)(w[j] >> 16));
        }
    } else {
        float4 a = __ldg((const float4*)((const float*)c + i)), b = __ldg((const float4*)((const float*)c + i) + 1);
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    }
}

// One block (4 warps) per (KV head, row, split of `chunk` positions): the partial softmax state of every query head
// of the KV head's group over positions [split * chunk, min(split * chunk + chunk, pos + 1)). A group of
// head_dim / 8 lanes takes one position (8 elements a lane, one 16-byte load of K and of V), 32 / (head_dim / 8)
// positions a warp at a time, with an online softmax per lane group; the groups' states are merged in a fixed
// order. Writes (acc[head_dim], max, sum) per (row, query head, split) to `ws`. head_dim in {32, 64, 128, 256}.
extern "C" __global__ void __launch_bounds__(128) attn_split(float* ws, const float* q, const void* kc, const void* vc,
                                                            const int* slots, const int* positions, int layer,
                                                            int n_slots, int slot_ctx, int n_head, int n_head_kv,
                                                            int head_dim, float scale, int chunk, int n_splits,
                                                            int f16) {
    __shared__ float sacc[AT_MAXG * 1024];
    __shared__ float sm[AT_MAXG * 32], sl[AT_MAXG * 32];
    int g = blockIdx.x, r = blockIdx.y, sp = blockIdx.z;
    int n_pos = positions[r] + 1;
    int start = sp * chunk;
    if (start >= n_pos) return;
    int end = min(start + chunk, n_pos);
    int G = n_head / n_head_kv;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int LP = head_dim / 8, PPW = 32 / LP, NS = 4 * PPW;
    int sub = lane % LP, grp = lane / LP;
    int kv_dim = n_head_kv * head_dim;
    long long base = kv_row(layer, slots[r], 0, n_slots, slot_ctx, kv_dim) + (long long)g * head_dim + sub * 8;
    float qv[AT_MAXG][8], acc[AT_MAXG][8], m[AT_MAXG], l[AT_MAXG];
#pragma unroll
    for (int gi = 0; gi < AT_MAXG; gi++) {
        m[gi] = __int_as_float(0xff800000);
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            acc[gi][e] = 0.0f;
            qv[gi][e] = gi < G ? q[((long long)r * n_head + g * G + gi) * head_dim + sub * 8 + e] : 0.0f;
        }
    }
    for (int t0 = start + warp * PPW; t0 < end; t0 += 4 * PPW) {
        int t = t0 + grp;
        bool valid = t < end;
        float kf[8], vf[8];
        if (valid) {
            kv_load8(kc, f16, base + (long long)t * kv_dim, kf);
            kv_load8(vc, f16, base + (long long)t * kv_dim, vf);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) kf[e] = vf[e] = 0.0f;
        }
#pragma unroll
        for (int gi = 0; gi < AT_MAXG; gi++) {
            if (gi < G) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) s += qv[gi][e] * kf[e];
                for (int o = LP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                s *= scale;
                if (valid) {
                    float mn = fmaxf(m[gi], s);
                    float corr = expf(m[gi] - mn), pr = expf(s - mn);
                    l[gi] = l[gi] * corr + pr;
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[gi][e] = acc[gi][e] * corr + pr * vf[e];
                    m[gi] = mn;
                }
            }
        }
    }
    int st = warp * PPW + grp;
#pragma unroll
    for (int gi = 0; gi < AT_MAXG; gi++) {
        if (gi < G) {
            if (sub == 0) {
                sm[gi * 32 + st] = m[gi];
                sl[gi * 32 + st] = l[gi];
            }
#pragma unroll
            for (int e = 0; e < 8; e++) sacc[(gi * NS + st) * head_dim + sub * 8 + e] = acc[gi][e];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * head_dim; idx += blockDim.x) {
        int gi = idx / head_dim, e = idx % head_dim;
        float M = __int_as_float(0xff800000);
        for (int s = 0; s < NS; s++) M = fmaxf(M, sm[gi * 32 + s]);
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < NS; s++) {
            float ms = sm[gi * 32 + s];
            if (ms == __int_as_float(0xff800000)) continue;
            float f = expf(ms - M);
            L += sl[gi * 32 + s] * f;
            A += sacc[(gi * NS + s) * head_dim + e] * f;
        }
        float* out = ws + (((long long)r * n_head + g * G + gi) * n_splits + sp) * (head_dim + 2);
        out[e] = A;
        if (e == 0) {
            out[head_dim] = M;
            out[head_dim + 1] = L;
        }
    }
}

// Merges the splits of each (query head, row) in split order: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// grid = (n_head, rows), block = head_dim threads; with `xq` non-null also writes the Q8 blocks of the output.
extern "C" __global__ void attn_merge(float* out, signed char* xq, float* xd, float* xs, const float* ws,
                                      const int* positions, int n_head, int head_dim, int chunk, int n_splits) {
    int h = blockIdx.x, r = blockIdx.y, e = threadIdx.x;
    int n_act = (positions[r] + chunk) / chunk;
    const float* p = ws + ((long long)r * n_head + h) * n_splits * (head_dim + 2);
    float M = __int_as_float(0xff800000);
    for (int s = 0; s < n_act; s++) M = fmaxf(M, p[s * (head_dim + 2) + head_dim]);
    float L = 0.0f, A = 0.0f;
    for (int s = 0; s < n_act; s++) {
        const float* ps = p + s * (head_dim + 2);
        float f = expf(ps[head_dim] - M);
        L += ps[head_dim + 1] * f;
        A += ps[e] * f;
    }
    float v = A * (1.0f / L);
    long long i = ((long long)r * n_head + h) * head_dim + e;
    out[i] = v;
    if (xq) q8_warp(v, xq, xd, xs, i / 32);
}
