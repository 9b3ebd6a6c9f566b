// Shared helpers, prepended to every kernel file (NVRTC gets one translation unit, no include paths needed).
// f16 conversions go through inline PTX on raw `unsigned short` bits so no CUDA header is required.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Little-endian loads from byte pointers of any alignment (GGUF legacy blocks are 18/20/22/34 bytes).
__device__ __forceinline__ u16 ld16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Block-wide sum with a fixed tree order (same bits for the same inputs and block size).
// `sh` holds at least blockDim.x / 32 floats. Every thread gets the result.
__device__ float block_sum(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0.0f;
    if (warp == 0) {
        t = lane < nw ? sh[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    t = sh[0];
    __syncthreads();
    return t;
}

__device__ float block_max(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? sh[lane] : __int_as_float(0xff800000);
        for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    float t = sh[0];
    __syncthreads();
    return t;
}

// Code sum `sum` of K8 sub-block b (elements 32 b ..) packed as the K8 block kernels' Q4_K min-term mma reads it
// (gemv16.cu, B16_PACKED_SUMS): 16 bytes a K8 block, byte b % 8 the sum's low 6 bits, byte 8 + b % 8 its bits
// 6..13 as a signed byte (sum = lo + 64 hi; mmq.cu's mp_pack_sums packs the same words from the int sums).
__device__ __forceinline__ void k8_pack_sum(u8* kp, long long b, int sum) {
    u8* p = kp + (b >> 3) * 16 + (b & 7);
    p[0] = (u8)(sum & 63);
    p[8] = (u8)((sum >> 6) & 0xFF);
}

// Programmatic dependent launch (sm_90+, host option `pdl`): a kernel may be launched while the one before it in
// the stream is still running, so it waits here, before its first global memory access, until that kernel has
// finished and its writes are visible; then it lets the next kernel launch, whose blocks take free multiprocessors
// and wait in turn. Every kernel calls this first (a unit test checks): a kernel that skipped the wait could read
// stale data, and one launched early without it would break the chain for the kernels after it.
__device__ __forceinline__ void wait_prior_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread block clusters (sm_90 and later; the host launches a kernel as clusters only there): a barrier of every
// thread of the cluster's blocks that also orders their shared memory writes before the reads after it, and a
// float read from the shared memory of the cluster's block `rank` at the address of `p` in this block's.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}

__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
    unsigned a = (unsigned)__cvta_generic_to_shared(p), peer;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(peer) : "memory");
    return v;
#else
    __trap();
    return 0.0f;
#endif
}

// Launches over up to three weights that read the same activations (Q/K/V, gate/up: gemv3_*, gemv16_k8, the
// prefill matmuls): blocks [0, b1) along grid x take weight 0, [b1, b2) weight 1, the rest weight 2. `tile` is
// the block's output tile within its weight; each output's bits are those of a launch over its weight alone.
// Job kernels also take L2PF_ARGS (the GEMVs use them, the others ignore them).
#define JOB_WEIGHTS                                                                                             \
    int b1, int b2, int ty0, float *out0, const u8 *w0, int n0, int ty1, float *out1, const u8 *w1, int n1,     \
        int ty2, float *out2, const u8 *w2, int n2
#define L2PF_ARGS const u8 *pf0, long long pn0, const u8 *pf1, long long pn1
#define JOB_ARGS JOB_WEIGHTS, L2PF_ARGS
#define JOB_PICK pick_job(blockIdx.x, b1, b2, ty0, out0, w0, n0, ty1, out1, w1, n1, ty2, out2, w2, n2)
struct Job {
    int ty;
    float* out;
    const u8* w;
    int n_out, tile;
};
__device__ __forceinline__ Job pick_job(int b, JOB_WEIGHTS) {
    if (b < b1) return Job{ty0, out0, w0, n0, b};
    if (b < b2) return Job{ty1, out1, w1, n1, b - b1};
    return Job{ty2, out2, w2, n2, b - b2};
}

// L2 prefetch of the weights a later matmul reads (L2PF_ARGS: `pn0` bytes at `pf0`, then `pn1` at `pf1`, whole
// 16-byte units), so that they stream in from DRAM while the kernels between (norms, attention, SwiGLU: latency,
// few bytes) leave it idle, and that matmul finds them in L2. Issued by the last L2PF_BLOCKS blocks of the grid
// along x (row tile 0), which start in a launch's last wave, one bulk prefetch a lane of warp 0. A hint: no value
// depends on it, and nothing waits for it. The host caps a hint at L2PF_MB megabytes (50 MB of L2 on an H100 or
// H200). sm_90 and later (cp.async.bulk); a no-op before.
#ifndef L2PF_BLOCKS
#define L2PF_BLOCKS 16
#endif
#ifndef L2PF_MB
#define L2PF_MB 24 // read by the host (KILN_CUDA_DEFINES may override it for a tuning run; 0: no prefetch)
#endif
__device__ __forceinline__ void l2_prefetch_bytes(const u8* p, long long n) {
#if __CUDA_ARCH__ >= 900
    if (n >= 16)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(p)),
                     "r"((unsigned)(n & ~15LL))
                     : "memory");
#endif
}

__device__ __noinline__ void l2_prefetch_share(L2PF_ARGS) {
    long long total = pn0 + pn1;
    int nb = min((int)gridDim.x, L2PF_BLOCKS);
    int b = (int)blockIdx.x - ((int)gridDim.x - nb);
    if (total <= 0 || blockIdx.y != 0 || b < 0 || threadIdx.x >= 32) return;
    long long parts = 32LL * nb;
    long long chunk = ((total + parts - 1) / parts + 15) / 16 * 16;
    long long a = min((32LL * b + threadIdx.x) * chunk, total), e = min(a + chunk, total);
    if (a < pn0) l2_prefetch_bytes(pf0 + a, min(e, pn0) - a);
    if (e > pn0) {
        long long a1 = max(a, pn0);
        l2_prefetch_bytes(pf1 + (a1 - pn0), e - a1);
    }
}
