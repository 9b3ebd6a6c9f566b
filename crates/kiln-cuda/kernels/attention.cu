// KV cache append and decode attention. Cache layout per K and V: [layer][slot][pos][n_head_kv][head_dim],
// elements f16 (raw bits) or f32.

__device__ __forceinline__ float kv_load(const void* c, int f16, long long i) {
    return f16 ? h2f(((const u16*)c)[i]) : ((const float*)c)[i];
}

// Stores row blockIdx.x's k/v at (layer, slots[r], positions[r]).
extern "C" __global__ void kv_append(void* kc, void* vc, const float* k, const float* v, const int* slots,
                                     const int* positions, int layer, int n_slots, int slot_ctx, int kv_dim,
                                     int f16) {
    wait_prior_kernel();
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

// Positions row r attends to: 0..=pos (causal, n_vis 0), or for every row up to the pass's last row (n_vis < 0:
// a DFlash drafter's block, whose rows see one another; read from the metadata, so a graph replays it right).
// grid.y is the row count in every attention kernel.
__device__ __forceinline__ int attn_len(const int* positions, int r, int n_vis) {
    return n_vis < 0 ? positions[gridDim.y - 1] + 1 : positions[r] + 1;
}

// One block per (head, row): softmax(q . K[0..=pos] * scale) . V over the row's slot. `scores` is scratch of
// rows x n_head x slot_ctx floats. Each position's score is a serial dot product, the softmax sum a fixed tree,
// each output element a serial sum over positions: the result does not depend on the other rows.
extern "C" __global__ void attn_decode(float* out, const float* q, const void* kc, const void* vc, float* scores,
                                       const int* slots, const int* positions, int layer, int n_slots,
                                       int slot_ctx, int n_head, int n_head_kv, int head_dim, float scale,
                                       int f16, int n_vis) {
    wait_prior_kernel();
    __shared__ float sh[32];
    __shared__ float qs[512];
    int h = blockIdx.x, r = blockIdx.y;
    int kvh = h / (n_head / n_head_kv);
    int kv_dim = n_head_kv * head_dim;
    int n_pos = attn_len(positions, r, n_vis);
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

__device__ __forceinline__ long long kv_row(int layer, int slot, int pos, int n_slots, int slot_ctx, int kv_dim) {
    return (((long long)layer * n_slots + slot) * slot_ctx + pos) * kv_dim;
}

// Where attn_split keeps query element i in shared memory: 16-byte chunk c at c ^ bit 3 of c. A phase of 8 lanes
// (sub = 0..7) reads chunks 2 sub (then 2 sub + 1), which sit on bank groups 0, 2, 4, 6, 0, 2, 4, 6 unrotated
// (2-way conflicts: every query load twice over); with the swap they are 8 different groups.
__device__ __forceinline__ int q_swz(int i) {
    return i ^ (((i >> 5) & 1) << 2);
}

// One warp's QK-norm (when `nw` is given) and RoPE of one head of head_dim <= 256, in two parts so that a warp
// with several heads waits for their loads once: prep_load reads the head from `src` (with its V from `vsrc` for a
// key head; lane l holds elements l + 32 t), prep_finish writes a query head to qdst[i] = y * qmul (qdst[q_swz(i)]
// with `swz`) or a key head into the cache at `dst` together with its V. `hb`: head_dim floats of shared memory of
// this warp's own; `rope`: rope_table's cos and sin for the row's position. attn_prep and attn_split (prep = 1)
// call the same three functions, so their bits are the same.
struct PrepIn {
    float x[8], w[8], v[8];
};

__device__ __forceinline__ void prep_load(PrepIn& in, const float* src, const float* nw, const float* vsrc, bool is_q,
                                          int head_dim) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int i = lane + 32 * t;
        bool ok = i < head_dim;
        in.x[t] = ok ? src[i] : 0.0f;
        in.w[t] = ok && nw ? nw[i] : 1.0f;
        in.v[t] = ok && !is_q ? vsrc[i] : 0.0f;
    }
}

// RoPE at position p (already times freq_scale): cos in rope[i], sin in rope[head_dim / 2 + i] for the pairs
// i = t, t + nt, ... (thread t of nt). Every head of a row uses the same table: it is computed once a block.
__device__ __forceinline__ void rope_table(float* rope, float p, float theta, int head_dim, int t, int nt) {
    int half = head_dim / 2;
    for (int i = t; i < half; i += nt) {
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float sn, cs;
        sincosf(p * inv, &sn, &cs);
        rope[i] = cs;
        rope[half + i] = sn;
    }
}

__device__ __forceinline__ void prep_finish(const PrepIn& in, float* hb, const float* rope, const float* nw, bool is_q,
                                            float* qdst, float qmul, void* kc, void* vc, long long dst, int head_dim,
                                            float eps, int neox, int f16, bool swz) {
    int lane = threadIdx.x & 31, half = head_dim / 2;
    float ss = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) ss += in.x[t] * in.x[t];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float scale = nw ? 1.0f / sqrtf(ss / (float)head_dim + eps) : 1.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int i = lane + 32 * t;
        if (i < head_dim) hb[i] = nw ? in.x[t] * scale * in.w[t] : in.x[t];
    }
    __syncwarp();
    for (int i = lane; i < half; i += 32) {
        float cs = rope[i], sn = rope[half + i];
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half : 2 * i + 1;
        float x0 = hb[ia], x1 = hb[ib];
        float y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
        if (is_q) {
            qdst[swz ? q_swz(ia) : ia] = y0 * qmul;
            qdst[swz ? q_swz(ib) : ib] = y1 * qmul;
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
                ((u16*)vc)[dst + i] = f2h(in.v[t]);
            else
                ((float*)vc)[dst + i] = in.v[t];
        }
    }
}

// One warp per (row, head), blockDim / 32 (up to 8) heads of one row a block (grid = (rows, ceil((n_head +
// n_head_kv) / warps))): a query head prepped in place, or a key head into the cache at (layer, slots[r],
// positions[r]) with its V. The block's warps share the row's RoPE table (the same values whoever computes them).
extern "C" __global__ void __launch_bounds__(256) attn_prep(float* q, float* k, const float* v, void* kc, void* vc,
                                                            const float* q_norm, const float* k_norm,
                                                            const int* slots, const int* positions, int layer,
                                                            int n_slots, int slot_ctx, int n_head, int n_head_kv,
                                                            int head_dim, float eps, float theta, float freq_scale,
                                                            int neox, int f16) {
    wait_prior_kernel();
    __shared__ float hb[8][256], rope[256];
    int r = blockIdx.x, warp = threadIdx.x >> 5;
    int hh = blockIdx.y * (blockDim.x >> 5) + warp;
    bool live = hh < n_head + n_head_kv;
    int kv_dim = n_head_kv * head_dim;
    bool is_q = hh < n_head;
    int h = is_q ? hh : hh - n_head;
    float* src = is_q ? q + ((long long)r * n_head + h) * head_dim : k + ((long long)r * n_head_kv + h) * head_dim;
    long long dst = kv_row(layer, slots[r], positions[r], n_slots, slot_ctx, kv_dim) + (long long)h * head_dim;
    const float* vsrc = is_q ? nullptr : v + (long long)r * kv_dim + h * head_dim;
    const float* nw = is_q ? q_norm : k_norm;
    PrepIn in;
    if (live) prep_load(in, src, nw, vsrc, is_q, head_dim);
    rope_table(rope, (float)positions[r] * freq_scale, theta, head_dim, threadIdx.x, blockDim.x);
    __syncthreads();
    if (!live) return;
    prep_finish(in, hb[warp], rope, nw, is_q, src, 1.0f, kc, vc, dst, head_dim, eps, neox, f16, false);
}

// 8 f16 cache elements (one 16-byte vector) as floats.
__device__ __forceinline__ void kv_unpack8(int4 raw, float* out) {
    u32 w[4] = {(u32)raw.x, (u32)raw.y, (u32)raw.z, (u32)raw.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        out[2 * j] = h2f((u16)(w[j] & 0xFFFF));
        out[2 * j + 1] = h2f((u16)(w[j] >> 16));
    }
}

// The most rows of a pass that attn_split preps itself (the host's PREP_MAX_ROWS; a multiple of 4).
#define PREP_MAX_ROWS 16

// Positions a lane group loads before using any (K and V of AT_U steps in flight per lane, plus the next tile's).
#ifndef AT_U
#define AT_U 4
#endif
#define NEG_INF __int_as_float(0xff800000)

// Positions per split for a row attending to n_pos positions when a slot allows n_splits splits: a multiple of 64,
// at least 128 (shorter splits cost more in per-block set-up and merging than they gain in parallelism), else as
// small as fits n_splits. It depends only on the row's own span, so a row's reduction order is the same alone or
// in any batch, and long and short spans alike spread over many blocks.
#ifndef AT_MIN_CHUNK
#define AT_MIN_CHUNK 128 // a multiple of 64 (KILN_CUDA_DEFINES may override it for a tuning run)
#endif
static_assert(AT_MIN_CHUNK % 64 == 0 && AT_MIN_CHUNK > 0, "AT_MIN_CHUNK: a positive multiple of 64");
__device__ __forceinline__ int attn_chunk(int n_pos, int n_splits) {
    int per = (n_pos + n_splits - 1) / n_splits;
    return max(AT_MIN_CHUNK, (per + 63) / 64 * 64);
}

// One block (4 warps) per (G query heads, row, split of attn_chunk positions) over an f16 cache: block x takes query
// heads G x .. G x + G - 1, which share one KV head (G is the whole group, or a part of it: then a KV head's K/V is
// read by several blocks, which spreads a short row's fixed work over more multiprocessors). The partial softmax state
// of the G query heads over positions [split * chunk, min(split * chunk + chunk, pos + 1)), in the log2 domain (q is
// pre-multiplied by scale * log2 e). A group of head_dim / 8 lanes takes one position (8 elements a lane), a warp takes
// 32 / (head_dim / 8) positions a step and AT_U steps a tile: the next tile's K/V loads are issued before the current
// tile's scores, one max per head for the whole warp, and the V sums. The lane groups' partial sums are combined by an
// xor-shuffle tree and the four warps in warp order: the result depends only on the row's own position and data. Writes
// (acc[head_dim], max, sum) per (row, query head, split) to `ws`, or, with `out` given, a one-split row's output and
// its Q8/K8 shadows (xq, kq: null to skip). With `prep` > 0 (a causal pass of that many rows) it does attn_prep's work
// for its heads and span first (k, v, the QK-norm weights and RoPE parameters are attn_prep's).
template <int G, int HD>
__device__ __forceinline__ void attn_split_body(float* ws, const float* q, const void* kc, const void* vc,
                                                const int* slots, const int* positions, int layer, int n_slots,
                                                int slot_ctx, int n_head, int n_head_kv, float scale, int n_splits,
                                                int n_vis, float* out, signed char* xq, float* xd, float* xs,
                                                signed char* kq, float* kd, int* ks, u8* kp, const float* k,
                                                const float* v, const float* q_norm, const float* k_norm, float eps,
                                                float theta, float freq_scale, int neox, int prep, int pair) {
    constexpr int head_dim = HD, LP = HD / 8, PPW = 32 / LP;
    __shared__ float sacc[4 * G * HD];
    __shared__ __align__(16) float qs[G * HD];
    __shared__ float sm[4 * G], sl[4 * G];
    int r = blockIdx.y, sp = blockIdx.z;
    int qh0 = blockIdx.x * G;           // the block's first query head
    int g = qh0 / (n_head / n_head_kv); // its KV head
    int n_pos = attn_len(positions, r, n_vis);
    int chunk = attn_chunk(n_pos, n_splits);
    int start = sp * chunk;
    if (start >= n_pos) return;
    int end = min(start + chunk, n_pos);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int sub = lane % LP, grp = lane / LP;
    int kv_dim = n_head_kv * head_dim;
    long long base = kv_row(layer, slots[r], 0, n_slots, slot_ctx, kv_dim) + (long long)g * head_dim + sub * 8;
    const int4* kb = (const int4*)((const u16*)kc + base);
    const int4* vb = (const int4*)((const u16*)vc + base);
    int pos_stride = kv_dim / 8; // in 16-byte vectors
    // The G query heads (adjacent in q) in shared memory (laid out by q_swz), scaled; registers go to the K/V loads
    // in flight.
    const float qscale = scale * 1.4426950408889634f;
    if (prep) {
        // attn_prep in this launch (a causal pass of `prep` rows; the host skips attn_prep): warp w preps query
        // heads w, w + 4, ... of the block straight into qs (attn_prep's bits, times qscale as below). Then the
        // block writes its KV head's K/V into the cache at every position of its span that a row of the pass
        // brings (row r's own in the split holding it; in a block of rows of one slot the earlier rows' too):
        // every block whose span holds such a position writes it, with the same bits, and reads it back below
        // after the barrier (so the K/V loads are plain ones: the non-coherent path need not see this launch's
        // writes). No block reads a position of the pass that it did not write itself.
        __shared__ float phb[4][HD], rope[HD], krope[4][HD];
        constexpr int NQ = (G + 3) / 4, NK = PREP_MAX_ROWS / 4;
        PrepIn in[NQ], kin[NK];
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            int hh = warp + 4 * j;
            if (hh >= G) break; // warp-uniform
            prep_load(in[j], q + ((long long)r * n_head + qh0 + hh) * HD, q_norm, nullptr, true, HD);
        }
        // The pass's positions in this span, in row order: warp w takes the w-th, (w + 4)-th, ... (at most NK: the
        // host launches passes of at most PREP_MAX_ROWS rows here). All loads are issued before any is used.
        int kvd = n_head_kv * HD, slot = slots[r], seen = 0, nk = 0, kj[NK];
        for (int j = 0; j < prep; j++) {
            int p = positions[j];
            if (slots[j] != slot || p < start || p >= end) continue; // block-uniform
            if ((seen++ & 3) != warp) continue;                      // warp-uniform
#pragma unroll
            for (int t = 0; t < NK; t++)
                if (t == nk) kj[t] = j; // (constant indices: kj stays in registers)
            nk++;
        }
#pragma unroll
        for (int t = 0; t < NK; t++) {
            if (t >= nk) break;
            long long at = (long long)kj[t] * kvd + g * HD;
            prep_load(kin[t], k + at, k_norm, v + at, false, HD);
        }
        rope_table(rope, (float)(n_pos - 1) * freq_scale, theta, HD, threadIdx.x, blockDim.x);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            int hh = warp + 4 * j;
            if (hh >= G) break;
            prep_finish(in[j], phb[warp], rope, q_norm, true, qs + hh * HD, qscale, nullptr, nullptr, 0, HD, eps,
                        neox, 1, true);
            __syncwarp();
        }
#pragma unroll
        for (int t = 0; t < NK; t++) {
            if (t >= nk) break;
            int p = positions[kj[t]];
            rope_table(krope[warp], (float)p * freq_scale, theta, HD, lane, 32);
            __syncwarp();
            prep_finish(kin[t], phb[warp], krope[warp], k_norm, false, nullptr, 1.0f, (void*)kc, (void*)vc,
                        kv_row(layer, slot, p, n_slots, slot_ctx, kvd) + (long long)g * HD, HD, eps, neox, 1, true);
            __syncwarp();
        }
    } else {
        const float* qg = q + ((long long)r * n_head + qh0) * head_dim;
        for (int i = threadIdx.x; i < G * head_dim; i += blockDim.x) qs[q_swz(i)] = qg[i] * qscale;
    }
    __syncthreads();
    float acc[G][8], m[G], l[G];
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        m[gi] = NEG_INF;
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[gi][e] = 0.0f;
    }
    int step = 4 * PPW;
    int4 kr[AT_U], vr[AT_U];
    int t0 = start + warp * PPW + grp;
#pragma unroll
    for (int u = 0; u < AT_U; u++) {
        int t = t0 + u * step;
        if (t < end) {
            kr[u] = kb[(long long)t * pos_stride];
            vr[u] = vb[(long long)t * pos_stride];
        }
    }
    for (; t0 - grp < end; t0 += AT_U * step) {
        // The next tile in flight while this one is computed.
        int4 kn[AT_U], vn[AT_U];
#pragma unroll
        for (int u = 0; u < AT_U; u++) {
            int t = t0 + (AT_U + u) * step;
            if (t < end) {
                kn[u] = kb[(long long)t * pos_stride];
                vn[u] = vb[(long long)t * pos_stride];
            }
        }
        float s[G][AT_U];
#pragma unroll
        for (int u = 0; u < AT_U; u++) {
            float kf[8];
            kv_unpack8(kr[u], kf);
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                const float4* qp = (const float4*)(qs + gi * head_dim); // head_dim % 64 == 0: q_swz per head
                int sw = (sub >> 2) & 1;
                float4 qa = qp[(2 * sub) ^ sw], qb = qp[(2 * sub + 1) ^ sw];
                float d = qa.x * kf[0];
                d += qa.y * kf[1];
                d += qa.z * kf[2];
                d += qa.w * kf[3];
                d += qb.x * kf[4];
                d += qb.y * kf[5];
                d += qb.z * kf[6];
                d += qb.w * kf[7];
                for (int o = LP / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                s[gi][u] = t0 + u * step < end ? d : NEG_INF;
            }
        }
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            float mt = s[gi][0];
#pragma unroll
            for (int u = 1; u < AT_U; u++) mt = fmaxf(mt, s[gi][u]);
            for (int o = LP; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
            float mn = fmaxf(m[gi], mt);
            if (mn == NEG_INF) continue; // nothing valid yet in this warp
            float corr = exp2f(m[gi] - mn);
            l[gi] *= corr;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[gi][e] *= corr;
            m[gi] = mn;
#pragma unroll
            for (int u = 0; u < AT_U; u++) s[gi][u] = exp2f(s[gi][u] - mn);
        }
#pragma unroll
        for (int u = 0; u < AT_U; u++) {
            if (t0 + u * step >= end) break;
            float vf[8];
            kv_unpack8(vr[u], vf);
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                l[gi] += s[gi][u];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[gi][e] += s[gi][u] * vf[e];
            }
        }
#pragma unroll
        for (int u = 0; u < AT_U; u++) {
            kr[u] = kn[u];
            vr[u] = vn[u];
        }
    }
    // Lane groups share each head's max, so their sums add directly.
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        for (int o = LP; o < 32; o <<= 1) {
            l[gi] += __shfl_xor_sync(0xffffffffu, l[gi], o);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[gi][e] += __shfl_xor_sync(0xffffffffu, acc[gi][e], o);
        }
        if (lane < LP) {
#pragma unroll
            for (int e = 0; e < 8; e++) sacc[(warp * G + gi) * head_dim + sub * 8 + e] = acc[gi][e];
        }
        if (lane == 0) {
            sm[warp * G + gi] = m[gi];
            sl[warp * G + gi] = l[gi];
        }
    }
    __syncthreads();
    // Each query head's warp weights 2^(m_w - M), M, L and 1 / L, once a block (thread gi) rather than once an
    // output element: the same operations in the same order, so the same bits.
    __shared__ float sf[4 * G], sM[G], sL[G], sinv[G];
    if (threadIdx.x < G) {
        int gi = threadIdx.x;
        float M = NEG_INF;
        for (int w = 0; w < 4; w++) M = fmaxf(M, sm[w * G + gi]);
        float L = 0.0f;
        for (int w = 0; w < 4; w++) {
            float mw = sm[w * G + gi];
            if (mw == NEG_INF) continue;
            float f = exp2f(mw - M);
            sf[w * G + gi] = f;
            L += sl[w * G + gi] * f;
        }
        sM[gi] = M;
        sL[gi] = L;
        sinv[gi] = 1.0f / L;
    }
    __syncthreads();
    // A row whose span is one split (with `out` non-null: G * HD % 128 == 0, % 256 with kq unless G * HD = 128 in
    // clusters of 2, `pair`) is finished here:
    // attn_merge of one split computes M = m, weight 2^0 = 1, L = 0 + l, A = 0 + acc, so out = acc (1 / l) is
    // its bits, and the merge kernel skips the row. Else the partials go to `ws`.
    bool direct = out && start == 0 && end == n_pos;
    constexpr int PASSES = (G * HD + 127) / 128;
    float ov[PASSES];
    __shared__ float mk[(G * HD + 31) / 32];
    long long ob = ((long long)r * n_head + qh0) * head_dim; // the block's first output element
#pragma unroll
    for (int k = 0; k < PASSES; k++) {
        int idx = threadIdx.x + 128 * k;
        if (idx >= G * head_dim) break; // whole warps (head_dim % 32 == 0)
        int gi = idx / head_dim, e = idx % head_dim;
        float A = 0.0f;
        for (int w = 0; w < 4; w++) {
            if (sm[w * G + gi] == NEG_INF) continue;
            A += sacc[(w * G + gi) * head_dim + e] * sf[w * G + gi];
        }
        if (direct) {
            ov[k] = A * sinv[gi];
            out[ob + idx] = ov[k];
            if (xq) q8_warp(ov[k], xq, xd, xs, (ob + idx) / 32);
            if (kq) k8_publish(ov[k], true, &mk[idx / 32]);
        } else {
            float* part = ws + (((long long)r * n_head + qh0 + gi) * n_splits + sp) * (head_dim + 2);
            part[e] = A;
            if (e == 0) {
                part[head_dim] = sM[gi];
                part[head_dim + 1] = sL[gi];
            }
        }
    }
    if (!direct || !kq) return;
    if (G * HD == 128) {
        // Half a K8 block: launched as clusters of 2 (`pair`: the host does so only then), rank 0 with the
        // block's first 128 elements. The block's 4 warp maxima and the partner's make the block's 8 (max is
        // exact in any order: the bits of one block writing all 256); the second barrier keeps each block's
        // maxima alive until the partner has read them.
        if (!pair) __trap();
        __shared__ float g8[8];
        unsigned rank = cluster_rank();
        cluster_sync();
        if (threadIdx.x < 8) {
            unsigned from = threadIdx.x / 4;
            g8[threadIdx.x] = from == rank ? mk[threadIdx.x % 4] : cluster_load(&mk[threadIdx.x % 4], from);
        }
        __syncwarp(); // the cluster barrier is .aligned: whole warps
        cluster_sync();
        k8_write(ov[0], g8, kq, kd, ks, kp, ob + threadIdx.x, rank == 0 && threadIdx.x < 32);
        return;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PASSES; k++) {
        int idx = threadIdx.x + 128 * k;
        if (idx < G * head_dim)
            k8_write(ov[k], &mk[idx / 256 * 8], kq, kd, ks, kp, ob + idx, idx / 32 % 8 == 0);
    }
}

// grid = (n_head_kv, rows, n_splits), block = 128; one kernel per (query heads per KV head, head_dim): registers
// scale with G (MINB blocks an SM is the most that fits without spills), and a constant head_dim unrolls the lane
// groups' shuffle trees.
#define ATTN_SPLIT_KERNEL(NAME, G, HD, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(128, MINB) NAME(                                               \
        float* ws, const float* q, const void* kc, const void* vc, const int* slots, const int* positions,      \
        int layer, int n_slots, int slot_ctx, int n_head, int n_head_kv, float scale, int n_splits, int n_vis,  \
        float* out, signed char* xq, float* xd, float* xs, signed char* kq, float* kd, int* ks, u8* kp,         \
        const float* k, const float* v, const float* q_norm, const float* k_norm, float eps, float theta,       \
        float freq_scale, int neox, int prep, int pair) {                                                       \
        wait_prior_kernel();                                                                                    \
        attn_split_body<G, HD>(ws, q, kc, vc, slots, positions, layer, n_slots, slot_ctx, n_head, n_head_kv,    \
                               scale, n_splits, n_vis, out, xq, xd, xs, kq, kd, ks, kp, k, v, q_norm, k_norm,   \
                               eps, theta, freq_scale, neox, prep, pair);                                      \
    }
ATTN_SPLIT_KERNEL(attn_split_g1_h64, 1, 64, 4)
ATTN_SPLIT_KERNEL(attn_split_g2_h64, 2, 64, 4)
ATTN_SPLIT_KERNEL(attn_split_g3_h64, 3, 64, 3)
ATTN_SPLIT_KERNEL(attn_split_g4_h64, 4, 64, 3)
ATTN_SPLIT_KERNEL(attn_split_g8_h64, 8, 64, 2)
ATTN_SPLIT_KERNEL(attn_split_g1_h128, 1, 128, 4)
ATTN_SPLIT_KERNEL(attn_split_g2_h128, 2, 128, 4)
ATTN_SPLIT_KERNEL(attn_split_g3_h128, 3, 128, 3)
ATTN_SPLIT_KERNEL(attn_split_g4_h128, 4, 128, 3)
ATTN_SPLIT_KERNEL(attn_split_g8_h128, 8, 128, 2)

// Max / sum over the `gw` warps of one head's threads (warps gw k .. gw k + gw - 1): the tree of block_max /
// block_sum on a block of just those warps, so a head's bits do not depend on how many heads share the block.
// Every warp of the group computes the second stage itself (no broadcast barrier).
__device__ float group_max(float v, float* sh, int gw) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < gw ? sh[warp - warp % gw + lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

__device__ float group_sum(float v, float* sh, int gw) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < gw ? sh[warp - warp % gw + lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

#define MERGE_MAX_HEADS 4 // heads a block (256 threads of head_dim 64)

// Merges the splits of each (query head, row) (log2 domain, as attn_split writes them):
// out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), the numerator summed in split order, the denominator by
// a fixed tree. grid = (n_head / heads, rows), block = heads * head_dim threads (head_dim a multiple of 32, <= 256;
// heads <= MERGE_MAX_HEADS); with `xq` non-null also writes the Q8 blocks of the output, with `kq` non-null the
// K8 blocks (then the block is 256 threads: one K8 block). n_splits <= 256. With `direct`, rows whose span is one
// split were finished by attn_split and are skipped.
extern "C" __global__ void __launch_bounds__(256, 1) attn_merge(float* out, signed char* xq, float* xd, float* xs, signed char* kq, float* kd,
                                      int* ks, u8* kp, const float* ws, const int* positions, int n_head, int head_dim,
                                      int n_splits, int n_vis, int direct) {
    wait_prior_kernel();
    __shared__ float f[MERGE_MAX_HEADS][256], sh[32], sk[8];
    int hl = threadIdx.x / head_dim, e = threadIdx.x % head_dim;
    int h = blockIdx.x * (blockDim.x / head_dim) + hl, r = blockIdx.y;
    int gw = head_dim / 32;
    int n_pos = attn_len(positions, r, n_vis);
    int chunk = attn_chunk(n_pos, n_splits);
    int n_act = (n_pos + chunk - 1) / chunk;
    if (direct && n_act == 1) return; // the whole block (one row)
    const float* p = ws + ((long long)r * n_head + h) * n_splits * (head_dim + 2);
    // Thread e takes splits e, e + head_dim, ...: their maxima, then their weights 2^(m_s - M).
    float mx = NEG_INF;
    for (int s = e; s < n_act; s += head_dim) mx = fmaxf(mx, p[s * (head_dim + 2) + head_dim]);
    float M = group_max(mx, sh, gw);
    float lsum = 0.0f;
    for (int s = e; s < n_act; s += head_dim) {
        float w = exp2f(p[s * (head_dim + 2) + head_dim] - M);
        f[hl][s] = w;
        lsum += p[s * (head_dim + 2) + head_dim + 1] * w;
    }
    float L = group_sum(lsum, sh, gw); // its barriers also publish f
    // In split order, the loads of 32 splits issued before the first product: the loop's latency is its cost
    // (ptxas kept 4 loads in flight in a plain loop, 32 round trips for 128 splits; the kernel took 25.6 us at depth
    // 32,768 in ncu, against the split kernel's 57.7).
    float A = 0.0f;
    int s = 0;
    for (; s + 32 <= n_act; s += 32) {
        float pv[32];
#pragma unroll
        for (int j = 0; j < 32; j++) pv[j] = p[(s + j) * (head_dim + 2) + e];
#pragma unroll
        for (int j = 0; j < 32; j++) A += pv[j] * f[hl][s + j];
    }
    for (; s < n_act; s++) A += p[s * (head_dim + 2) + e] * f[hl][s];
    float v = A * (1.0f / L);
    long long i = ((long long)r * n_head + h) * head_dim + e;
    out[i] = v;
    if (xq) q8_warp(v, xq, xd, xs, i / 32);
    if (kq) {
        int warp = threadIdx.x >> 5;
        k8_publish(v, true, &sk[warp]);
        __syncthreads();
        k8_write(v, sk, kq, kd, ks, kp, i, warp == 0);
    }
}

// ---- Prefill: flash attention on f16 tensor cores ----

// d = a . b + c for a 16x16 f16 A (row-major), a 16x8 f16 B (column-major), f32 C/D.
__device__ __forceinline__ void mma_f16_16816(float* d, const u32* a, u32 b0, u32 b1, const float* c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}

// Two floats as one f16x2 word (lo in the low half).
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#define FA_ROWS 64 // query rows a block (4 warps of 16)
#define FA_TILE 64 // positions a K/V tile

// ldmatrix x4 on f16 tiles in shared memory (`.trans` when T): lane l gives the address of row l % 8 of matrix
// l / 8 and gets one mma B-fragment register per matrix.
template <bool T>
__device__ __forceinline__ void fa_ldsm(u32 (&r)[4], const u16* p) {
    if (T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(p))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(p))
                     : "memory");
}

// One block per (64 consecutive rows of a prefill pass, query head); warp w takes rows 16w .. 16w + 15. K/V tiles
// of 64 positions (aligned to position 0) are copied as they are ([position][dim], rows padded against bank
// conflicts) into shared memory with cp.async, two tiles in flight (tile i + 1 loads while tile i is used), and
// shared by the four warps; S = Q K^T and O += P V are mma.sync m16n8k16 on f16 with f32 accumulation, their B
// fragments loaded by ldmatrix (V's transposed); q is scaled by scale * log2 e before rounding to f16, P is
// rounded to f16, with an online softmax per row in the log2 domain. Rows of other slots than the one being
// staged, and positions after a row's own, are masked: a row sees exactly its own slot's positions 0..=pos in
// tile order, whatever other rows share its block, so a sequence's prefill does not depend on the batch.
// grid = (ceil(rows / 64), n_head), block = 128, dynamic shared memory FA_SMEM(HD). Writes out[row][head][dim].
#define FA_SMEM(HD) (2 * 2 * FA_TILE * ((HD) + 8) * 2)
#define FA_SMEM_H64 36864 // read by the host (compile.rs's dynamic_smem)
#define FA_SMEM_H128 69632
static_assert(FA_SMEM_H64 == FA_SMEM(64) && FA_SMEM_H128 == FA_SMEM(128), "FA_SMEM_H*: two stages of K and V tiles");
template <int HD>
__device__ __forceinline__ void attn_flash_body(float* out, const float* q, const void* kc, const void* vc,
                                                const int* slots, const int* positions, int n_rows, int layer,
                                                int n_slots, int slot_ctx, int n_head, int n_head_kv, float scale) {
    constexpr int KLD = HD + 8; // K / V row stride in halves (272 bytes at HD 128: conflict-free ldmatrix rows)
    constexpr int TILE = FA_TILE * KLD;
    mp_check_smem(FA_SMEM(HD));
    u16* kv_smem = (u16*)mp_smem; // [stage][K, V][position][KLD]
    __shared__ int rslot[FA_ROWS], rpos[FA_ROWS];
    int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int b0 = blockIdx.x * FA_ROWS;
    int kv_dim = n_head_kv * HD;
    for (int i = threadIdx.x; i < FA_ROWS; i += blockDim.x) {
        bool in = b0 + i < n_rows;
        rslot[i] = in ? slots[b0 + i] : -1;
        rpos[i] = in ? positions[b0 + i] : -1;
    }
    __syncthreads();
    // This lane's rows (g and g + 8 of the warp's 16): slot and position.
    int ra = warp * 16 + g, rb = ra + 8;
    int sa = rslot[ra], sb = rslot[rb], pa = rpos[ra], pb = rpos[rb];
    // Q fragments (A operand, 16 rows x HD), scaled into the log2 domain.
    const float qscale = scale * 1.4426950408889634f;
    u32 qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int col = 16 * kk + 8 * half + 2 * t;
            float2 xa = sa >= 0 ? *(const float2*)(q + ((long long)(b0 + ra) * n_head + h) * HD + col)
                                : make_float2(0.0f, 0.0f);
            float2 xb = sb >= 0 ? *(const float2*)(q + ((long long)(b0 + rb) * n_head + h) * HD + col)
                                : make_float2(0.0f, 0.0f);
            qf[kk][2 * half] = pack_f16x2(xa.x * qscale, xa.y * qscale);
            qf[kk][2 * half + 1] = pack_f16x2(xb.x * qscale, xb.y * qscale);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    // Each distinct slot of the block's rows, in order of first appearance.
    for (int first = 0; first < FA_ROWS; first++) {
        int s = rslot[first];
        if (s < 0) continue;
        bool seen = false;
        for (int i = 0; i < first; i++) seen |= rslot[i] == s;
        if (seen) continue;
        int last = 0; // highest position among the block's rows of slot s
        for (int i = first; i < FA_ROWS; i++)
            if (rslot[i] == s) last = max(last, rpos[i]);
        // Does this warp have a row of slot s, and up to which position?
        int wlast = -1;
        for (int i = warp * 16; i < warp * 16 + 16; i++)
            if (rslot[i] == s) wlast = max(wlast, rpos[i]);
        // The lowest position of this warp's rows when all 16 are of slot s (else -1): tiles that end at or
        // before it are seen whole by every row, so they skip the mask (which would keep every score as is).
        int wmin = 0x7fffffff;
        for (int i = warp * 16; i < warp * 16 + 16; i++) wmin = rslot[i] == s ? min(wmin, rpos[i]) : -1;
        long long base = kv_row(layer, s, 0, n_slots, slot_ctx, kv_dim) + (long long)kvh * HD;
        // Copies of tile i (positions 64 i ..) into stage i % 2: a thread per 8 dims of a position, K and V.
        auto issue = [&](int i) {
            u16* st = kv_smem + (i & 1) * 2 * TILE;
            for (int u = threadIdx.x; u < FA_TILE * HD / 8; u += blockDim.x) {
                int p = u / (HD / 8), c = (u % (HD / 8)) * 8;
                bool in = FA_TILE * i + p < slot_ctx;
                long long src = in ? base + (long long)(FA_TILE * i + p) * kv_dim + c : 0;
                cp_async<16>(st + p * KLD + c, (const u16*)kc + src, in);
                cp_async<16>(st + TILE + p * KLD + c, (const u16*)vc + src, in);
            }
            cp_commit();
        };
        int n_tiles = last / FA_TILE + 1;
        __syncthreads(); // the previous slot's tiles are no longer read
        issue(0);
        for (int it = 0; it < n_tiles; it++) {
            int t0 = FA_TILE * it;
            cp_wait_all();
            __syncthreads(); // tile it is in; every warp is done with tile it - 1
            if (it + 1 < n_tiles) issue(it + 1);
            const u16* ks = kv_smem + (it & 1) * 2 * TILE;
            const u16* vs = ks + TILE;
            if (t0 > wlast) continue; // no row of this warp sees this tile (warp-uniform)
            // S = Q K^T: 8 tiles of 8 positions.
            float sc[FA_TILE / 8][4];
#pragma unroll
            for (int j = 0; j < FA_TILE / 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) sc[j][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk += 2) {
                    // B fragments of dims 16 kk .. + 31 for positions 8 j .. + 7 (K rows as they are).
                    u32 kb[4];
                    fa_ldsm<false>(kb, ks + (8 * j + (lane & 7)) * KLD + 16 * kk + 8 * (lane >> 3));
                    mma_f16_16816(sc[j], qf[kk], kb[0], kb[1], sc[j]);
                    mma_f16_16816(sc[j], qf[kk + 1], kb[2], kb[3], sc[j]);
                }
            }
            // Mask (unless every row sees the whole tile: warp-uniform), then the online softmax of rows a (C
            // elements 0, 1) and b (2, 3).
            float mt[2] = {NEG_INF, NEG_INF};
            if (t0 + FA_TILE - 1 > wmin) {
#pragma unroll
                for (int j = 0; j < FA_TILE / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int p = t0 + 8 * j + 2 * t + (e & 1);
                        bool vis = e < 2 ? (sa == s && p <= pa) : (sb == s && p <= pb);
                        sc[j][e] = vis ? sc[j][e] : NEG_INF;
                    }
            }
#pragma unroll
            for (int j = 0; j < FA_TILE / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) mt[e >> 1] = fmaxf(mt[e >> 1], sc[j][e]);
            float corr[2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 1));
                mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 2));
                float mn = fmaxf(m[rr], mt[rr]);
                // A row with nothing visible yet keeps m = -inf, and its sums stay 0.
                corr[rr] = mn == NEG_INF ? 1.0f : exp2f(m[rr] - mn);
                m[rr] = mn;
            }
            float ls[2] = {0.0f, 0.0f};
            u32 pf[FA_TILE / 16][4]; // P as A fragments: tile pair (2kk, 2kk + 1)
#pragma unroll
            for (int j = 0; j < FA_TILE / 8; j++) {
                float pv[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int rr = e >> 1;
                    pv[e] = m[rr] == NEG_INF ? 0.0f : exp2f(sc[j][e] - m[rr]);
                    ls[rr] += pv[e];
                }
                pf[j >> 1][2 * (j & 1)] = pack_f16x2(pv[0], pv[1]);
                pf[j >> 1][2 * (j & 1) + 1] = pack_f16x2(pv[2], pv[3]);
            }
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                ls[rr] += __shfl_xor_sync(0xffffffffu, ls[rr], 1);
                ls[rr] += __shfl_xor_sync(0xffffffffu, ls[rr], 2);
                l[rr] = l[rr] * corr[rr] + ls[rr];
            }
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                o[j][0] *= corr[0];
                o[j][1] *= corr[0];
                o[j][2] *= corr[1];
                o[j][3] *= corr[1];
            }
            // O += P V: B[k = position][n = dim] from V^T.
#pragma unroll
            for (int j = 0; j < HD / 8; j += 2)
#pragma unroll
                for (int kk = 0; kk < FA_TILE / 16; kk++) {
                    // B fragments of positions 16 kk .. + 15 for dims 8 j .. + 15 (V rows, transposed by ldmatrix).
                    u32 vb[4];
                    fa_ldsm<true>(vb, vs + (16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)) * KLD + 8 * j + 8 * (lane >> 4));
                    mma_f16_16816(o[j], pf[kk], vb[0], vb[1], o[j]);
                    mma_f16_16816(o[j + 1], pf[kk], vb[2], vb[3], o[j + 1]);
                }
        }
    }
    // Normalize and store rows a and b.
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int r = rr ? rb : ra;
        if (rslot[r] < 0) continue;
        float inv = 1.0f / l[rr];
        float* orow = out + ((long long)(b0 + r) * n_head + h) * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *(float2*)(orow + 8 * j + 2 * t) = make_float2(o[j][2 * rr] * inv, o[j][2 * rr + 1] * inv);
    }
}

#define ATTN_FLASH_KERNEL(NAME, HD)                                                                                \
    extern "C" __global__ void __launch_bounds__(128) NAME(float* out, const float* q, const void* kc,             \
                                                           const void* vc, const int* slots, const int* positions, \
                                                           int n_rows, int layer, int n_slots, int slot_ctx,       \
                                                           int n_head, int n_head_kv, float scale) {               \
        wait_prior_kernel();                                                                                       \
        attn_flash_body<HD>(out, q, kc, vc, slots, positions, n_rows, layer, n_slots, slot_ctx, n_head,            \
                            n_head_kv, scale);                                                                     \
    }
ATTN_FLASH_KERNEL(attn_flash_h64, 64)
ATTN_FLASH_KERNEL(attn_flash_h128, 128)
