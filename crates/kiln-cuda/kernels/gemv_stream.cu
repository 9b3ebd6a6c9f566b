// The one-row K8 GEMV on a persistent grid that streams its weights through shared memory (sm_90 and later: bulk
// copies completing on mbarriers). The decode GEMVs of gemv.cu run one block of 4 outputs at a time: each block
// loads its rows, waits for them, copies the activation row into shared memory and computes, so a block slot
// holds bytes in flight only for part of its short life, and the 8B's one-row GEMVs reached 1.5-2.7 TB/s of the
// card's ~4.3. Here a block takes a contiguous share of every weight's rows (the shares of all blocks differ by at
// most a row, so the multiprocessors finish together); one producer warp keeps a ring of stages
// (up to GS_WARPS consecutive rows, GS_CHUNK super-blocks of each) filling with bulk copies, starting before the launch
// wait (weights never change while kernels run), and the consumer warps, one row of a stage each, compute from
// shared memory with the activation row staged once a block. The lane work, integers and float order are
// gemv_q4k8_body's / gemv_q6k8_body's (one of their rounds is one stage), so every output has their bits and
// the block kernel's (the self-test's batch-invariance checks compare it with gemv16_k8 bit for bit).

#define GS_WARPS 15  // consumer warps a block (with the producer, 16 warps: 2 blocks of 64 registers a thread fill an SM)
#define GS_CHUNK 8   // super-blocks of a row a stage: a step of the GEMV bodies' rounds (u), so the same order
#define GS_MAXST 12  // most stages in the ring
#define GS_SMEM 98304 // dynamic shared memory a block: barriers, the staged activation row(s), the ring
#ifndef GS_BPS
#define GS_BPS 2 // blocks a multiprocessor (the host sizes the grid by it; two leave ~25 KB for the next kernel)
#endif
#define GS_BAR_BYTES 256
// The host takes this kernel only when this is 1 (KILN_CUDA_DEFINES=-DGS_ON=1; crate::Options::gemv_stream), until a
// GPU run measures it faster than gemv3_k8_r1 (its first form, 8 consumer warps in tiles of 8 rows, measured 0.83x
// on the 8B's decode: docs/PERFORMANCE.md).
#ifndef GS_ON
#define GS_ON 0
#endif

typedef unsigned long long u64;

__device__ __forceinline__ void mbar_init(u64* b, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u64* b, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(u64* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}

__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory, counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

// The ring's geometry for one launch, the same on the host (device.rs, `stream_stages`): the staged activation
// row in each layout a job needs (Q4_K: gv_swz codes, sums, scales; Q6_K: gv_swz6 codes, scales), then stages of
// GS_WARPS rows of min(GS_CHUNK, nsb) super-blocks of the largest record among the jobs.
struct GsRing {
    int act, slot, nst;
};
__device__ __forceinline__ GsRing gs_ring(int width, bool has4, bool has6) {
    GsRing g;
    g.act = (width + width / 8 + width / 64 + 15) & ~15;
    g.slot = GS_WARPS * min(GS_CHUNK, width / 256) * (has6 ? 208 : 144);
    g.nst = min(GS_MAXST, (GS_SMEM - GS_BAR_BYTES - g.act * ((int)has4 + (int)has6)) / g.slot);
    return g;
}

// k4_sm of sub-blocks 2p and 2p + 1 (p = 0..3) at once, two bytes in each operation and without branches (lanes of
// one warp take different p; k4_sm's select on j became divergent branches here): the same integers.
__device__ __forceinline__ void gs_k4_pair(u32 s0, u32 s1, u32 s2, int p, int& sc0, int& m0, int& sc1, int& m1) {
    u32 sel = (p & 1) ? 0x3232u : 0x1010u; // bytes 2 (p & 1), 2 (p & 1) + 1 of a word, as the low two bytes
    u32 a = __byte_perm(s0, 0, sel) & 0xFFFFu, b = __byte_perm(s1, 0, sel) & 0xFFFFu;
    u32 c = __byte_perm(s2, 0, sel) & 0xFFFFu;
    u32 hi = 0u - (u32)(p >> 1); // all ones for sub-blocks 4..7
    u32 sc = (((c & 0x0F0Fu) | ((a >> 2) & 0x3030u)) & hi) | (a & 0x3F3Fu & ~hi);
    u32 m = ((((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u)) & hi) | (b & 0x3F3Fu & ~hi);
    sc0 = (int)(sc & 0xFFu);
    sc1 = (int)(sc >> 8);
    m0 = (int)(m & 0xFFu);
    m1 = (int)(m >> 8);
}

// One stage of a Q4_K row: gemv_q4k8_body's round steps u from super-block `base` (L = 4 lanes a super-block, S = 2
// sub-groups, 8 super-blocks a step), its weights at `rec0` (super-block base) in shared memory. The two 16-byte quant loads of
// sub-group 1 come in the other order: its super-blocks sit 576 bytes (64 mod 128) after sub-group 0's, so in
// the same order the two sub-groups of a phase of 8 lanes would hit the same banks.
__device__ __forceinline__ float gs_q4k_round(float acc, const u8* rec0, int base, int nsb, const int4* stage,
                                              int width, int lane) {
    constexpr int L = 4, S = 2, U = GS_CHUNK / 8;
    int a = lane >> 3, sg = (lane & 7) / L, p = lane % L;
    const int* st_sums = (const int*)(stage + width / 16);
    const float* st_scales = (const float*)(stage + width / 16 + width / 128);
#pragma unroll
    for (int u = 0; u < U; u++) {
        int first = base + 4 * S * u; // group 0's first super-block this round
        if (first >= nsb) break;      // warp-uniform
        int sb = min(first + a + 4 * sg, nsb - 1);
        const u8* rec = rec0 + (sb - base) * 144;
        int4 hdr = *(const int4*)rec;
        int4 qa = *(const int4*)(rec + 16 + 32 * p + 16 * sg), qb = *(const int4*)(rec + 16 + 32 * p + 16 * (sg ^ 1));
        int4 q0 = sg ? qb : qa, q1 = sg ? qa : qb;
        float d = h2f((u16)(hdr.x & 0xFFFF)), dmin = h2f((u16)((u32)hdr.x >> 16));
        int j0 = 2 * p;
        int sc0, m0, sc1, m1;
        gs_k4_pair((u32)hdr.y, (u32)hdr.z, (u32)hdr.w, p, sc0, m0, sc1, m1);
        // Chunk 16 sb + 4 p + k of the codes sits at gv_swz of it: its low 3 bits xor (p / 2) | ((sb / 2) & 6)
        // (the row's bits 0, 3, 4), written out so the address is a few operations a super-block.
        const u8* xr = (const u8*)stage + 256 * sb;
        int xv = 16 * ((p >> 1) | ((sb >> 1) & 6));
        int4 x[4];
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = *(const int4*)(xr + ((64 * p + 16 * k) ^ xv));
        int2 sm = *(const int2*)(st_sums + sb * 8 + j0);
        int lo = dot16(nib_lo(q1), x[1], dot16(nib_lo(q0), x[0], 0));
        int hi = dot16(nib_hi(q1), x[3], dot16(nib_hi(q0), x[2], 0));
        int is = sc0 * lo + sc1 * hi, im = m0 * sm.x + m1 * sm.y;
#pragma unroll
        for (int m = 1; m < L; m <<= 1) {
            is += __shfl_xor_sync(0xffffffffu, is, m);
            im += __shfl_xor_sync(0xffffffffu, im, m);
        }
        float own = k8_step(d, dmin, st_scales[sb], is, im);
#pragma unroll
        for (int t = 0; t < S; t++) {
            float step = __shfl_sync(0xffffffffu, own, (lane & ~7) + L * t);
            if (first + a + 4 * t < nsb) acc = __fadd_rn(acc, step);
        }
    }
    return acc;
}

// One stage of a Q6_K row: gemv_q6k8_body's round steps from super-block `base` (group G = lane / 4 takes
// super-blocks base + G, base + G + 8, ...), `dv` the f16 d of those (read ahead from global memory by the caller).
__device__ __forceinline__ float gs_q6k_round(float acc, const u8* rec0, int base, int nsb, const int4* stage,
                                              int width, int lane, const u16* dv) {
    int unit = lane & 3, h = unit >> 1, c = unit & 1;
    const float* st_scales = (const float*)(stage + width / 16 + width / 128);
#pragma unroll
    for (int u = 0; u < GS_CHUNK / 8; u++) {
        if (base + 8 * u >= nsb) break; // warp-uniform
        int sb = base + (lane >> 2) + 8 * u;
        bool valid = sb < nsb;
        sb = min(sb, nsb - 1);
        const u8* rec = rec0 + (sb - base) * 208;
        int4 qa = *(const int4*)(rec + 64 * h + 16 * c), qb = *(const int4*)(rec + 64 * h + 32 + 16 * c);
        int4 qh = *(const int4*)(rec + 128 + 32 * h + 16 * c), scv = *(const int4*)(rec + 192);
        float d = h2f(dv[u]);
        u32 sw0 = (u32)(h ? scv.z : scv.x), sw1 = (u32)(h ? scv.w : scv.y);
        int s[4] = {(signed char)byte_of(sw0, c), (signed char)byte_of(sw0, 2 + c), (signed char)byte_of(sw1, c),
                    (signed char)byte_of(sw1, 2 + c)};
        int4 q[4];
        q6k_unpack(qa, qb, qh, q);
        int is = 0;
#pragma unroll
        // Chunk 16 sb + 8 h + c + 2 k of the codes sits at gv_swz6 of it: its low 3 bits xor 4 (sb & 1) + 2 h.
        const u8* xr = (const u8*)stage + 256 * sb + 128 * h;
        int xv = 16 * (4 * (sb & 1) + 2 * h);
        for (int k = 0; k < 4; k++) is += s[k] * dot16(q[k], *(const int4*)(xr + ((16 * c + 32 * k) ^ xv)), 0);
        is += __shfl_xor_sync(0xffffffffu, is, 1);
        is += __shfl_xor_sync(0xffffffffu, is, 2);
        if (valid) acc = __fadd_rn(acc, k8_step(d, 0.0f, st_scales[sb], is, 0));
    }
    return acc;
}

// The launch's weights (JOB_ARGS without the block counts) and one block's walk through its stages: for weight i,
// rows [lo, hi) (the block's share), groups of GS_WARPS rows from r, chunk c of each. The producer and the
// consumers take the same walk.
struct GsJobs {
    int ty0, ty1, ty2, n0, n1, n2;
    const u8 *w0, *w1, *w2;
    float *out0, *out1, *out2;
    // Selects, not arrays: an array indexed at run time would live in local memory.
    __device__ __forceinline__ int ty(int i) const { return i == 0 ? ty0 : i == 1 ? ty1 : ty2; }
    __device__ __forceinline__ int n(int i) const { return i == 0 ? n0 : i == 1 ? n1 : n2; }
    __device__ __forceinline__ const u8* w(int i) const { return i == 0 ? w0 : i == 1 ? w1 : w2; }
    __device__ __forceinline__ float* out(int i) const { return i == 0 ? out0 : i == 1 ? out1 : out2; }
};
struct GsWalk {
    int i, lo, hi, r, c;
    // Moves to the first weight from `from` on where this block has rows (i = 3: the walk is done).
    __device__ __forceinline__ void seek(const GsJobs& J, int from) {
        for (i = from; i < 3; i++) {
            int n = J.n(i);
            lo = (int)((long long)blockIdx.x * n / gridDim.x);
            hi = (int)((long long)(blockIdx.x + 1) * n / gridDim.x);
            if (lo < hi) {
                r = lo;
                c = 0;
                return;
            }
        }
    }
    __device__ __forceinline__ void next(const GsJobs& J, int nch) {
        if (++c < nch) return;
        c = 0;
        r += GS_WARPS;
        if (r >= hi) seek(J, i + 1);
    }
};

// The f16 d of the super-blocks a Q6_K lane takes at stage `g` for row r + warp (0 for other types and past the
// share).
__device__ __forceinline__ void gs_q6k_d(const GsJobs& J, const GsWalk& g, int warp, int nsb, int lane, u16* dv) {
#pragma unroll
    for (int u = 0; u < GS_CHUNK / 8; u++) dv[u] = 0;
    if (g.i >= 3 || J.ty(g.i) != K8_Q6_K || g.r + warp >= g.hi) return;
    int n = J.n(g.i);
    const u16* dd = (const u16*)(J.w(g.i) + (long long)n * nsb * 208) + (long long)(g.r + warp) * nsb;
#pragma unroll
    for (int u = 0; u < GS_CHUNK / 8; u++) dv[u] = __ldg(dd + min(GS_CHUNK * g.c + (lane >> 2) + 8 * u, nsb - 1));
}

// out (+)= W . x for one activation row over up to three weights (JOB_ARGS; b1 / b2 unused); grid: up to GS_BPS
// blocks a multiprocessor, 32 (GS_WARPS + 1) threads, GS_SMEM bytes of dynamic shared memory.
__device__ __forceinline__ void gemv_stream_block(const signed char* kq, const float* kd, const int* ks, int width,
                                                  int accumulate, const GsJobs& J) {
#if __CUDA_ARCH__ >= 900
    u64* full = (u64*)mp_smem;
    u64* empty = full + GS_MAXST;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nsb = width / 256, nch = (nsb + GS_CHUNK - 1) / GS_CHUNK;
    bool has4 = false, has6 = false;
#pragma unroll
    for (int i = 0; i < 3; i++) {
        has4 |= J.ty(i) == K8_Q4_K && J.n(i) > 0;
        has6 |= J.ty(i) == K8_Q6_K && J.n(i) > 0;
    }
    GsRing ring_g = gs_ring(width, has4, has6);
    int4* st4 = (int4*)(mp_smem + GS_BAR_BYTES);
    int4* st6 = (int4*)(mp_smem + GS_BAR_BYTES + (has4 ? ring_g.act : 0));
    u8* ring = mp_smem + GS_BAR_BYTES + ring_g.act * ((int)has4 + (int)has6);
    int nst = ring_g.nst, slot = ring_g.slot;
    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, GS_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    GsWalk g;
    g.seek(J, 0);
    if (warp == GS_WARPS) {
        // The producer: stage k into slot k % nst once the consumers have released its previous use; the first nst
        // stages go out before the launch wait.
        for (int k = 0, s = 0, phase = 0; g.i < 3; k++, g.next(J, nch)) {
            int rows = min(GS_WARPS, g.hi - g.r), rec = J.ty(g.i) == K8_Q6_K ? 208 : 144;
            if (k >= nst) mbar_wait(empty + s, (u32)phase ^ 1);
            u32 bytes = (u32)(min(GS_CHUNK, nsb - GS_CHUNK * g.c) * rec);
            if (lane == 0) mbar_expect_tx(full + s, (u32)rows * bytes);
            __syncwarp();
            if (lane < rows)
                bulk_copy(ring + s * slot + lane * bytes,
                          J.w(g.i) + ((long long)(g.r + lane) * nsb + GS_CHUNK * g.c) * rec, bytes, full + s);
            if (++s == nst) {
                s = 0;
                phase ^= 1;
            }
        }
        return;
    }
    // The consumers: warp w takes row r + w of each stage. Q6_K d values are read a stage ahead (the first before
    // the launch wait).
    u16 dv[GS_CHUNK / 8], dn[GS_CHUNK / 8];
    gs_q6k_d(J, g, warp, nsb, lane, dn);
    wait_prior_kernel();
    if (has4) gv_stage_row<false>(st4, kq, ks, kd, width, 0, 32 * GS_WARPS);
    if (has6) gv_stage_row<true>(st6, kq, ks, kd, width, 0, 32 * GS_WARPS);
    GsWalk ahead = g;
    ahead.next(J, nch);
    float acc = 0.0f;
    for (int s = 0, phase = 0; g.i < 3;) {
#pragma unroll
        for (int u = 0; u < GS_CHUNK / 8; u++) dv[u] = dn[u];
        gs_q6k_d(J, ahead, warp, nsb, lane, dn);
        int o = g.r + warp;
        bool live = o < g.hi, q6 = J.ty(g.i) == K8_Q6_K;
        mbar_wait(full + s, (u32)phase);
        int cs = min(GS_CHUNK, nsb - GS_CHUNK * g.c);
        const u8* rec0 = ring + s * slot + warp * cs * (q6 ? 208 : 144);
        if (live) {
            if (q6) acc = gs_q6k_round(acc, rec0, GS_CHUNK * g.c, nsb, st6, width, lane, dv);
            else acc = gs_q4k_round(acc, rec0, GS_CHUNK * g.c, nsb, st4, width, lane);
        }
        // The slot's next bytes come by the async proxy: order this warp's reads before them.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + s);
        if (g.c == nch - 1) {
            if (live) gv_store_groups<1>(J.out(g.i), &acc, o, 0, 1, J.n(g.i), accumulate, 16, q6 ? 4 : 8);
            acc = 0.0f;
        }
        g = ahead;
        ahead.next(J, nch);
        if (++s == nst) {
            s = 0;
            phase ^= 1;
        }
    }
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(32 * (GS_WARPS + 1), GS_BPS) gemv_k8_stream(
    const signed char* kq, const float* kd, const float* ks, int width, int n_rows, int accumulate, JOB_ARGS) {
    gemv_stream_block(kq, kd, (const int*)ks, width, accumulate,
                      GsJobs{ty0, ty1, ty2, n0, n1, n2, w0, w1, w2, out0, out1, out2});
}
