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
