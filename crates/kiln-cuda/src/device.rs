//! The device: context, stream, the compiled kernel module, and one method per kernel.
//!
//! Buffers are plain device allocations: [`DBuf`] of f32 with a Q8 shadow (the activation blocks the quantized
//! matmuls read, written by the fused norm/SwiGLU/attention kernels or quantized on first use), [`DWeight`]
//! holding a weight repacked at upload into the layout its GEMV kernel loads with 16-byte vectors (or the GGUF
//! bytes as they are, for the generic kernels). Everything runs on one stream, so kernels see each other's writes
//! in launch order; only [`Device::read`] synchronizes.
//!
//! A forward pass reads its per-row metadata (tokens, KV slots, positions, rows that want logits) from one device
//! buffer set by [`Device::set_pass`], and no op allocates or copies from the host, so a whole pass can be
//! captured once as a CUDA graph and replayed ([`Device::run_pass`]) with new metadata.

use crate::compile::{arch_name, cubin_cached};
use crate::error::{drv, Error, Result};
use cudarc::cublas::sys::cudaDataType;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys as cu, CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream,
    DevicePtr, LaunchConfig,
};
use cudarc::nvrtc::Ptx;
use kiln_quant::GgmlType;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Threads per block of the generic matmul kernels (also fixes their reduction order).
const MM_THREADS: u32 = 128;
/// Activation rows per generic matmul block (`MM_ROWS` in quant.cu).
const MM_ROWS: usize = 8;
/// Output features per GEMV block (`GV_WARPS` in gemv.cu) and activation rows per row group of the many-row
/// GEMV kernels (`gemv_r8`, `gemv3_r8`); one row goes through `gemv_r1` / `gemv3_r1`.
const GV_WARPS: usize = 4;
const GV_ROWS: usize = 8;
/// Threads per block of the row kernels (norms, attention).
const ROW_THREADS: u32 = 256;
/// Rows above which a prefill pass's matmuls use the tensor-core kernel (below, the GEMV's one weight read serves
/// a few rows as well).
pub const MMQ_MIN_ROWS: usize = 16;
/// Rows from which a prefill pass's matmul on a weight with a dense bf16 copy runs on cuBLAS ([`Options::prefill_blas`]):
/// the first row count of the prefill kernels' range. Measured on the H200 (8B Q4_K_M, a pass's time): at 64 rows
/// cuBLAS 8.2 ms against the int8 kernel's 14.4, and the int8 kernel's time hardly falls with fewer rows (13.6 ms
/// at 32: its few tiles are latency-bound) while cuBLAS reads the same copies for less arithmetic.
pub const BLAS_MIN_ROWS: usize = MMQ_MIN_ROWS + 1;
/// cuBLAS workspace, set once at open so that a captured pass never has cuBLAS allocate.
const BLAS_WORKSPACE: usize = 32 << 20;
/// Device memory a dense copy must leave free (besides this share of the card): the KV cache and the scratch are
/// allocated after the weights.
const DENSE_KEEP_FREE: usize = 4 << 30;
const DENSE_KEEP_FREE_SHARE: usize = 8;
/// Rows from which other passes' Q4_K/Q6_K/Q8_0 matmuls use the tensor-core block kernel (same bits as the GEMV).
pub const G16_MIN_ROWS: usize = 4;
/// Added to a K-quant's type id for the GEMV kernels' K8 bodies (`K8_Q4_K` / `K8_Q6_K` in gemv.cu).
pub(crate) const K8_TYPE_OFFSET: i32 = 1000;
/// Graphs kept before the cache is cleared: one per batch shape and span class (the attention grid's depth doubles
/// with the context, up to 8 classes), so a server's row counts times its contexts' classes stay cached.
const MAX_GRAPHS: usize = 256;
/// Positions below which every row of a pass must sit for a split-KV block to take part of a KV head's query
/// heads (`attn_head_split`). Split at every depth, the 8B's decode was faster at depth 4,096 (1.010x) and
/// slower at 32,768 (0.959x), where each block reading its KV head's K/V costs more than the fixed work it
/// spreads; between them unmeasured.
const HEAD_SPLIT_MAX_POS: usize = 8192;

/// Which fast paths the device uses. Each is on by default and has a kill switch in kiln's flag registry, so
/// before/after is one binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Weights repacked at upload and the 16-byte-load GEMV kernels (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K); else the
    /// generic kernel on the GGUF bytes.
    pub fast_gemv: bool,
    /// Fused kernels: RMSNorm, SwiGLU and attention write the Q8 activations of their output; QK-norm, RoPE and
    /// the KV append are one kernel; the residual add happens in the output projection's matmul.
    pub fused: bool,
    /// Split-KV ("flash decoding") attention; else one block per (head, row) over all positions.
    pub split_kv: bool,
    /// With `fused` and `split_kv`: a row whose attention span is one split is finished by the split kernel
    /// (output and shadows; the merge kernel skips it, same bits); else the merge kernel takes every row.
    pub split_direct: bool,
    /// With `fused` and `split_kv`: a one-row pass's QK-norm, RoPE and K/V append are done by the split kernel
    /// (same bits); else by `attn_prep` before it.
    pub prep_in_split: bool,
    /// With `prep_in_split`: causal passes of 2 to 16 rows too (`PREP_MAX_ROWS` in attention.cu: a verify block,
    /// several slots' decode rows): each split kernel block writes the K/V of every position of its span that a
    /// row of the pass brings and reads them back itself (same bits); else such passes run `attn_prep` first.
    pub prep_rows_in_split: bool,
    /// With `split_kv`: a split kernel block takes the fewest query heads of a KV head whose outputs fill whole
    /// activation blocks (Q8: 128 elements a pass; K8: 256, or 128 when every row is one split on a GPU with
    /// thread block clusters, two blocks of a cluster sharing a K8 block's scale), e.g. 1 of the 8B's 4, so a
    /// short row's per-block work (prep, epilogue) is spread over more multiprocessors, for passes whose rows
    /// are all below [`HEAD_SPLIT_MAX_POS`] (same bits: a head's sums do not depend on the heads beside it, and a
    /// maximum not on which block takes it); else one block per KV head with all of its query heads.
    pub attn_head_split: bool,
    /// With `split_kv`: the split kernel's grid has as many splits as the pass's longest span uses (rounded up to
    /// a power of two; same bits: the other blocks of a grid of the slot's whole split count return at once), so a
    /// short context in a large slot (`kiln run -c 32768` at its first tokens) launches a few blocks per head,
    /// not 128; else the slot's split count.
    pub attn_fit_grid: bool,
    /// The one-row K8 GEMVs stage their activation row in shared memory for rows 4,096 to 12,288 wide (same
    /// bits); else every warp reads it from global memory. A kernel define (`GV_STAGE_MAXW=0` when off).
    pub gemv_stage: bool,
    /// The K8 GEMVs issue their first weight loads before waiting for the kernel before them, and the block-shared
    /// K8 block kernel its first stages' weight copies (same bits); else after. A kernel define (`GV_EARLY_W=0`
    /// when off).
    pub early_weights: bool,
    /// Each forward pass captured once as a CUDA graph and replayed.
    pub graphs: bool,
    /// Int8 tensor cores for prefill passes ([`Device::set_pass`] with `prefill`) of more than [`MMQ_MIN_ROWS`]
    /// rows on Q4_K/Q6_K/Q8_0 (mmq.cu, its own float order).
    pub prefill_mma: bool,
    /// Int8 tensor cores for other passes' matmuls of [`G16_MIN_ROWS`] rows or more on Q4_K/Q6_K/Q8_0
    /// (gemv16.cu, bit-identical to the GEMV).
    pub block_mma: bool,
    /// With `block_mma` and without `block_direct`: a K8 block launch that would give the multiprocessors fewer
    /// than two 32-output tiles each (at 16 rows: the 8B's Q/K/V, o-proj and down, every matmul of the 0.6B)
    /// takes tiles of 16 outputs
    /// (`gemv16_k8_o16`: twice the blocks, each about half the work, 3 a multiprocessor); else always 32. Same
    /// bits. Per launch on the H200 (ncu) 16 is much faster on long rows (8B down 38.8 -> 31.1 µs) and slightly
    /// slower on some short ones (8B o-proj 14.7 -> 15.3); a finer rule fitted to those (16 only for at most one
    /// tile per two multiprocessors, or rows of 8,192+) was no faster on the 8B and 2 % slower on the 0.6B.
    pub block_tile16: bool,
    /// With `block_mma`: every K8 block launch takes the direct-fragment kernel (`gemv16_k8d` in gemv16.cu: each
    /// lane loads its mma fragments from global memory into registers, no shared-memory stages; 16 outputs a
    /// block) instead of the 4-warp kernel. Same bits. End to end on the H100 (16-row blocks): 8B Q4_K_M 1.10x,
    /// 0.6B 1.07x against the kernels it replaced.
    pub block_direct: bool,
    /// With `block_direct`: each warp of the direct kernel copies its weights (16-byte cp.async) into a ring of
    /// shared-memory stages of its own, Q4_K three super-blocks ahead and Q6_K two, instead of one super-block
    /// ahead in registers (`B16D_RING` in gemv16.cu; off compiles it with `B16D_RING=0`). Same bits. H100,
    /// 16-row blocks: 8B Q4_K_M 1.076x, 0.6B 0.994x.
    pub block_ring: bool,
    /// With `block_direct`: a K8 block launch of at most 8 rows (a verify of up to 7 drafts, up to 8 slots
    /// decoding) takes the direct kernel built for one n8 tile of rows (`gemv16_k8d_n8`: half the mma,
    /// activation loads and float steps) instead of the 16-row one, whose second tile would repeat the first's
    /// rows. Same bits.
    pub block_n8: bool,
    /// Q4_K/Q6_K matmuls on the GEMV, block and prefill kernels read K8 activations (one scale per 256 elements,
    /// as the CPU's Q8_K): the sub-block products are exact integers over a super-block and the float work is one
    /// step per super-block; else per-32 Q8 blocks with a float step per 32 weights.
    pub k8: bool,
    /// With `k8`: the prefill kernel reads Q4_K/Q6_K against K8 activations too (`mmq_q4_k8`: the Q4_K min term
    /// as one more mma; `mmq_q6_k8`); else per-32 Q8 blocks there.
    pub prefill_k8: bool,
    /// Flash attention on f16 tensor cores for prefill passes of more than [`MMQ_MIN_ROWS`] rows over an f16
    /// cache (`attn_flash_h<D>`, its own float order); else the split-KV decode kernel per row.
    pub flash_attn: bool,
    /// MoE FFNs of several rows group the choices by expert (`moe_count`, `moe_place`) and multiply 8 of them per
    /// weight read (`moe_gemv_tiles`; same bits as one GEMV per choice, which is what this turns off) or, in
    /// prefill passes with the prefill kernel on, 64 per weight tile on tensor cores (`moe_mmq_*`).
    pub moe_group: bool,
    /// With `moe_group`: the tokens' Q8/K8 activations (quantized once a token, or already written by the fused
    /// RMSNorm) are gathered into slot order (`gather_quant`); else the f32 rows are gathered (`gather_rows`) and
    /// quantized once a choice. Same bits: a row's quantization depends on that row only.
    pub moe_gather_quant: bool,
    /// Prefill passes of [`BLAS_MIN_ROWS`] rows or more multiply quantized weights on cuBLAS (bf16 tensor cores,
    /// f32 accumulation, its own float order) against a bf16 copy of each 2-D weight, decoded at upload while
    /// device memory allows ([`Device::dense_bytes`]), and the activations rounded to bf16; else the int8 prefill
    /// kernel (mmq.cu) on the quantized bytes.
    pub prefill_blas: bool,
    /// With `prefill_blas`: those passes multiply F32 weights (the MoE router) on cuBLAS in f32 (no TF32) against
    /// the f32 activations, and BF16 weights in bf16 against activations rounded to bf16, both reading the weight
    /// as uploaded, and F16 weights through a bf16 copy made at upload like a quantized weight's; else `matmul_f`
    /// (one block per output, every weight row read once per 8 activation rows).
    pub prefill_blas_float: bool,
    /// GEMV and K8 direct block launches issue the L2 prefetch of the weights a later matmul reads
    /// ([`Device::prefetch`]: up to `L2PF_MB` megabytes, common.cu), so they stream in while the latency-bound
    /// kernels between (norms, attention, SwiGLU) leave DRAM idle; sm_90 and later, and not in passes attending
    /// to [`HEAD_SPLIT_MAX_POS`] positions or more (there the attention itself streams its KV). Same bits: a hint.
    pub l2_prefetch: bool,
    /// Programmatic dependent launch (sm_90 and later): each kernel may be launched while the one before it
    /// runs, and waits on the device for it (`wait_prior_kernel`), so launch latency and block start-up overlap
    /// the previous kernel's tail. Same bits.
    pub pdl: bool,
    /// The reference mode: every matmul on f32 activations against dequantized weights.
    pub reference: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fast_gemv: true,
            fused: true,
            split_kv: true,
            split_direct: true,
            prep_in_split: true,
            prep_rows_in_split: true,
            attn_head_split: true,
            attn_fit_grid: true,
            gemv_stage: true,
            early_weights: true,
            graphs: true,
            prefill_mma: true,
            block_mma: true,
            block_tile16: true,
            block_direct: true,
            block_ring: true,
            block_n8: true,
            k8: true,
            prefill_k8: true,
            flash_attn: true,
            moe_group: true,
            moe_gather_quant: true,
            prefill_blas: true,
            prefill_blas_float: true,
            l2_prefetch: true,
            pdl: true,
            reference: false,
        }
    }
}

/// Identities of buffers (graph keys): never reused within a process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Per-pass row metadata on the device: `[tokens | slots | positions | logit rows]`, `cap` entries each.
struct Meta {
    buf: CudaSlice<i32>,
    cap: usize,
    host: Vec<i32>,
    /// `(slot, pos)` of the current pass's rows, for the host-side checks.
    rows: Vec<(usize, usize)>,
    n_logits: usize,
    /// The pass holds prompt rows only (its matmuls may use the prefill kernel).
    prefill: bool,
}

/// CUDA graphs by pass key. A graph is only touched under the device's lock.
struct Graphs(HashMap<[u64; 7], CudaGraph>);
// SAFETY: CudaGraph holds raw driver handles; every use is serialized by the Mutex around `Graphs`.
unsafe impl Send for Graphs {}

/// The cuBLAS handle of the prefill GEMM, bound to the device's stream, with its fixed workspace.
struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

impl Blas {
    fn new(stream: &Arc<CudaStream>) -> std::result::Result<Blas, String> {
        // SAFETY: probes dlopen with cudarc's candidate names only.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("no cuBLAS library found (libcublas.so)".into());
        }
        let handle = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS handle: {e}"))?;
        let ws = stream
            .alloc_zeros::<u8>(BLAS_WORKSPACE)
            .map_err(|e| format!("cuBLAS workspace: {e}"))?;
        let p = {
            let (p, _sync) = ws.device_ptr(stream);
            p
        };
        // SAFETY: the workspace outlives the handle (both live in this struct) and is used on its stream only.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *handle.handle(),
                p as *mut c_void,
                BLAS_WORKSPACE,
            )
        }
        .result()
        .map_err(|e| format!("cuBLAS workspace: {e}"))?;
        Ok(Blas {
            handle,
            _workspace: ws,
        })
    }
}

/// An open GPU with the kernels loaded.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    /// Every kernel, with the dynamic shared memory its launches take (set as its limit at load).
    funcs: HashMap<&'static str, (CudaFunction, u32)>,
    opts: Options,
    /// `opts.pdl` on a GPU that has it (compute capability 9.0 or later).
    pdl: bool,
    /// Thread block clusters (compute capability 9.0 or later).
    clusters: bool,
    /// Multiprocessors of the GPU.
    sm_count: usize,
    /// The K8 block kernels read code sums packed by the K8 writers (`B16_PACKED_SUMS`, a tuning define read
    /// once); the writers then write them too.
    b16_packed: bool,
    meta: Mutex<Meta>,
    /// Attention scratch (split partials or scores), grown only outside graph capture.
    ws: Mutex<CudaSlice<f32>>,
    /// Greedy tokens of the last [`Device::argmax`] (grown as rows need, never inside a graph).
    argmax_out: Mutex<CudaSlice<i32>>,
    graphs: Mutex<Graphs>,
    /// Mixture-of-experts intermediates, sized by [`Device::reserve_moe`].
    moe: Mutex<Option<MoeScratch>>,
    /// Bumped whenever `meta` or `ws` is reallocated: captured graphs hold their old addresses.
    generation: Mutex<u64>,
    /// Set while a pass is being captured (allocation is then an error).
    capturing: AtomicBool,
    /// Set once a weight that reads K8 activations is uploaded: until then the fused writers skip the K8 shadow
    /// (a Q8_0 model never pays for it).
    k8_weights: AtomicBool,
    /// Set once a matmul reads per-32 Q8 activations: until then a fused writer that writes the K8 shadow skips the
    /// per-32 blocks (a model whose matmuls all read K8 never pays for them; a later reader quantizes on demand).
    q8_read: AtomicBool,
    /// Bytes of weights uploaded (repacking keeps sizes; a tied output head counts twice).
    weight_bytes: AtomicU64,
    /// cuBLAS for the prefill GEMM ([`Options::prefill_blas`]; none when off or when the library is missing).
    blas: Option<Blas>,
    /// Rows from which a prefill pass's matmuls take cuBLAS ([`BLAS_MIN_ROWS`]; [`Device::set_blas_min_rows`]).
    blas_min_rows: AtomicUsize,
    /// A DFlash drafter's device: Q8_0 blocks of rows on `gemv16_q8d` ([`Device::set_q8_blocks`]).
    q8_blocks: AtomicBool,
    /// Bytes of the weights' dense bf16 copies, and the widest such weight (sizes `dense_x`).
    dense_bytes: AtomicU64,
    dense_cols: AtomicUsize,
    /// The bf16 activations of a cuBLAS matmul, grown only outside graph capture.
    dense_x: Mutex<CudaSlice<u16>>,
    /// Launches left out to time what they cost inside a step (`KILN_CUDA_TIMING_SKIP`, [`timing_skips`]).
    timing_skip: Mutex<Vec<String>>,
    /// With pass timing on ([`Device::set_pass_timing`]): the event pairs of the passes timed since the last
    /// [`Device::take_pass_time`].
    pass_events: Mutex<Option<Vec<(CudaEvent, CudaEvent)>>>,
    /// The split-KV kernels' fewest positions a split ([`crate::compile::attn_min_chunk`]).
    min_chunk: usize,
    /// The most rows of a pass the split kernel preps itself (attention.cu's `PREP_MAX_ROWS`).
    prep_max_rows: usize,
    /// The L2 prefetch the next GEMV or K8 direct block launch issues ([`Device::prefetch`]): up to two
    /// (address, bytes) ranges.
    l2pf: Mutex<[(u64, i64); 2]>,
    /// The most bytes one prefetch hint fetches (common.cu's `L2PF_MB`).
    l2pf_cap: usize,
    /// Marketing name of the GPU.
    pub name: String,
    /// The architecture the kernels were compiled for (`sm_90a`).
    pub arch: String,
    /// Whether the cubin came from the on-disk cache.
    pub cache_hit: bool,
    /// A non-fatal note from start-up (a kernel cache that could not be written).
    pub warning: Option<String>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({} {}, {:?})", self.name, self.arch, self.opts)
    }
}

/// How a weight's bytes are laid out on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// The GGUF rows as they are (generic kernels, embedding lookups).
    Native,
    /// Repacked for the GEMV kernels (see gemv.cu).
    Gemv,
}

/// A weight on the device.
pub struct DWeight {
    /// Tensor name (for errors).
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    /// Rows (output features).
    pub rows: usize,
    /// Bytes per GGUF row.
    pub row_bytes: usize,
    layout: Layout,
    data: CudaSlice<u8>,
    /// Every element decoded to bf16, `rows × cols` row-major, for the prefill GEMM on cuBLAS.
    dense: Option<CudaSlice<u16>>,
}

impl DWeight {
    /// Whether the weight is repacked for a 16-byte-load GEMV kernel.
    pub fn is_repacked(&self) -> bool {
        self.layout == Layout::Gemv
    }
    /// Frees the dense copy (the self-test's int8 prefill checks).
    pub(crate) fn drop_dense(&mut self) {
        self.dense = None;
    }
}

/// An f32 activation buffer with its Q8 shadow: int8 quants, block scales and scale × quant sums per 32 elements.
pub struct DBuf {
    data: CudaSlice<f32>,
    xq: CudaSlice<i8>,
    xd: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    /// Leading elements whose Q8 shadow matches the f32 data.
    q8_valid: AtomicUsize,
    /// The K8 shadow (K-quant matmuls): codes, a scale per 256, the code sum of every 32 (then the same sums
    /// packed for the K8 block kernels, 16 bytes a K8 block: [`Device::packed_ptr`]).
    kq: CudaSlice<i8>,
    kd: CudaSlice<f32>,
    ks: CudaSlice<i32>,
    /// Leading elements whose K8 shadow matches the f32 data.
    k8_valid: AtomicUsize,
    /// Leading elements whose packed code sums match the f32 data (written only with `B16_PACKED_SUMS`).
    kp_valid: AtomicUsize,
    id: u64,
}

impl DBuf {
    /// The f32 data is about to change: neither shadow matches it any more.
    fn invalidate(&self) {
        self.q8_valid.store(0, Ordering::Relaxed);
        self.k8_valid.store(0, Ordering::Relaxed);
        self.kp_valid.store(0, Ordering::Relaxed);
    }
    /// A process-unique identity (keys captured graphs).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }
}

/// KV cache storage: keys and values, `[layer][slot][pos][kv_dim]`, f16 bits or f32.
pub struct DKv {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    /// Layers, slots, positions per slot, `n_head_kv × head_dim`.
    pub dims: (usize, usize, usize, usize),
    /// Whether elements are f16.
    pub f16: bool,
    id: u64,
}

impl DKv {
    /// A process-unique identity (keys captured graphs).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// The intermediates of one MoE FFN call: router logits, choices, expert activations and outputs.
struct MoeScratch {
    /// Sized for passes of up to `rows` rows of this shape.
    rows: usize,
    shape: MoeShape,
    logits: DBuf,
    ids: CudaSlice<i32>,
    wts: DBuf,
    gate: DBuf,
    up: DBuf,
    act: DBuf,
    y: DBuf,
    /// Expert-grouped order (`moe_count`, `moe_place`): choices per expert, each choice's slot, each slot's
    /// activation row, the tile table.
    counts: CudaSlice<i32>,
    slot_of: CudaSlice<i32>,
    src_row: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    /// The activation rows in slot order.
    xg: DBuf,
}

/// The shape of a mixture-of-experts FFN (weights `[width, ff, n_exp]` and `[ff, width, n_exp]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// Experts.
    pub n_exp: usize,
    /// Experts per token.
    pub k: usize,
    /// Expert hidden size.
    pub ff: usize,
    /// Model width.
    pub width: usize,
    /// Renormalise the chosen experts' weights.
    pub norm_topk: bool,
}

/// Attention geometry and RoPE / QK-norm parameters of [`Device::attention_fused`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Score scale.
    pub scale: f32,
    /// RoPE base frequency.
    pub theta: f32,
    /// RoPE position multiplier.
    pub freq_scale: f32,
    /// NEOX (half-split) pairs, else adjacent pairs.
    pub neox: bool,
    /// QK-norm epsilon.
    pub eps: f32,
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: probes dlopen with cudarc's candidate names only.
    unsafe { cu::is_culib_present() }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Whether the matmul/embed kernels handle `ty`.
pub fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q4_K | Q5_K | Q6_K | IQ2_XXS
    )
}

/// Whether the GEMV kernels (gemv.cu) handle `ty`.
fn has_gemv(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_K | Q6_K | Q8_0 | Q4_0 | Q4_1)
}

/// Repacks GGUF rows into the GEMV layout of `ty` (gemv.cu's header): the 16-byte-aligned quant part of every block
/// first, then the scale part of every block, both in row-major block order.
fn repack(ty: GgmlType, bytes: &[u8]) -> Vec<u8> {
    use GgmlType::*;
    // (block bytes, offset and length of the aligned part, offsets of the scale part)
    let (blk, q_off, q_len): (usize, usize, usize) = match ty {
        Q4_K => return bytes.to_vec(),
        Q6_K => (210, 0, 208),
        Q8_0 => (34, 2, 32),
        Q4_0 => (18, 2, 16),
        Q4_1 => (20, 4, 16),
        _ => return bytes.to_vec(),
    };
    let n = bytes.len() / blk;
    let meta_len = blk - q_len;
    let mut out = vec![0u8; bytes.len()];
    let (qs, meta) = out.split_at_mut(n * q_len);
    for (i, b) in bytes.chunks_exact(blk).enumerate() {
        qs[i * q_len..(i + 1) * q_len].copy_from_slice(&b[q_off..q_off + q_len]);
        let m = &mut meta[i * meta_len..(i + 1) * meta_len];
        // The scale part is whatever is outside the quant range, in file order.
        m[..q_off].copy_from_slice(&b[..q_off]);
        m[q_off..].copy_from_slice(&b[q_off + q_len..]);
    }
    out
}

/// Rows from which [`Device::moe_ffn`] groups the choices by expert (`moe_count`, `moe_place`).
const MOE_GROUP_MIN_ROWS: usize = 2;
/// Slots of one expert a grouped tile holds: the 8-row GEMV body, or the prefill kernel's 64-row tile.
const MOE_GEMV_TILE: usize = 8;
const MOE_MMQ_TILE: usize = 64;

/// Tiles of up to `tile` slots that `n` choices over `n_exp` experts can need (each expert's last tile may be
/// partial).
fn moe_max_tiles(n: usize, n_exp: usize, tile: usize) -> usize {
    n.div_ceil(tile) + n_exp
}

/// [`repack`] of each of `parts` equal matrices stacked in `bytes` (MoE experts): every expert's scales follow its
/// own quants, so a GEMV over one expert finds them where it would for a 2-D matrix. A Q6_K buffer is padded to a
/// whole 4-byte word: the block kernel's weight ring (`B16D_RING`) copies the f16 d values as aligned words.
fn repack_parts(ty: GgmlType, bytes: &[u8], parts: usize) -> Vec<u8> {
    let mut out: Vec<u8> = bytes
        .chunks((bytes.len() / parts.max(1)).max(1))
        .flat_map(|m| repack(ty, m))
        .collect();
    if ty == GgmlType::Q6_K {
        out.resize(out.len().next_multiple_of(4), 0);
    }
    out
}

/// Most splits of one row's positions in the split-KV attention: at long spans 128 splits × the KV heads fill
/// the GPU several times over (even waves), and the merge reads 128 partial states a head.
const ATTN_MAX_SPLITS: usize = 128;

/// Splits a row may use in a slot of `slot_ctx` positions (at least 64 positions each). A row's own split size
/// is computed on the device from its span and this count (`attn_chunk` in attention.cu), so its reduction
/// order depends only on its position and the slot size, never on the batch.
fn attn_splits(slot_ctx: usize) -> usize {
    slot_ctx.div_ceil(64).clamp(1, ATTN_MAX_SPLITS)
}

/// Positions a split takes for a row of `n_pos` positions in a slot of `n_splits` splits (`attn_chunk` in
/// attention.cu, whose fewest positions a split are `min_chunk`).
fn attn_chunk(n_pos: usize, n_splits: usize, min_chunk: usize) -> usize {
    (n_pos.div_ceil(n_splits).div_ceil(64) * 64).max(min_chunk)
}

/// The split kernel's grid depth for a pass whose rows attend to at most `n_pos` positions, of `n_splits`
/// splits a row: the longest span's splits, rounded up to a power of two (a growing context re-captures its
/// graphs at doublings only).
fn fit_splits(n_pos: usize, n_splits: usize, min_chunk: usize) -> usize {
    n_pos
        .div_ceil(attn_chunk(n_pos, n_splits, min_chunk))
        .next_power_of_two()
        .min(n_splits)
}

impl Device {
    /// Opens GPU `ordinal`, compiles (or loads from the cache) the kernels for its architecture.
    /// Without a driver or GPU this returns an error saying so; it never panics.
    pub fn open(ordinal: usize, opts: Options) -> Result<Device> {
        if !driver_available() {
            return Err(Error::NoDriver);
        }
        let count = CudaContext::device_count()
            .map_err(drv("device count"))?
            .max(0) as usize;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("context creation"))?;
        // One stream, launch order is the dependency order: no per-buffer events needed.
        // SAFETY: no other stream touches these buffers.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(drv("device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        let arch = arch_name(major, minor);
        let sm_count = ctx
            .attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("multiprocessor count"))? as usize;
        let mut drv_ver = 0i32;
        // SAFETY: plain out-parameter; the driver library is loaded.
        unsafe { cu::cuDriverGetVersion(&mut drv_ver) };
        let (cubin, cache_hit, mut warning) =
            cubin_cached(&arch, &crate::compile::option_defines(&opts), drv_ver)?;
        let timing_skip = timing_skip_patterns();
        if !timing_skip.is_empty() {
            let note = format!(
                "KILN_CUDA_TIMING_SKIP={}: those launches are left out to time a step without them; the outputs \
                 are wrong",
                timing_skip.join(",")
            );
            warning = Some(match warning {
                Some(w) => format!("{w}; {note}"),
                None => note,
            });
        }
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(drv("loading the kernel module"))?;
        let mut funcs = HashMap::new();
        for k in crate::compile::KERNEL_NAMES {
            let f = module
                .load_function(k)
                .map_err(drv(format!("loading kernel {k}")))?;
            let smem = crate::compile::dynamic_smem(k);
            if smem > 0 {
                f.set_attribute(
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(drv(format!(
                    "allowing kernel {k} {smem} bytes of shared memory"
                )))?;
            }
            funcs.insert(k, (f, smem));
        }
        // A created stream, not the legacy default one: only those can be captured into graphs.
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let meta = Meta {
            buf: stream
                .alloc_zeros::<i32>(4 * 64)
                .map_err(drv("allocating metadata"))?,
            cap: 64,
            host: vec![0; 4 * 64],
            rows: Vec::new(),
            n_logits: 0,
            prefill: false,
        };
        let ws = stream
            .alloc_zeros::<f32>(1)
            .map_err(drv("allocating attention scratch"))?;
        let argmax_out = stream
            .alloc_zeros::<i32>(64)
            .map_err(drv("allocating argmax output"))?;
        let blas = if opts.prefill_blas && !opts.reference {
            match Blas::new(&stream) {
                Ok(b) => Some(b),
                Err(e) => {
                    let note = format!("{e}: prefill matmuls stay on the int8 kernels");
                    warning = Some(match warning {
                        Some(w) => format!("{w}; {note}"),
                        None => note,
                    });
                    None
                }
            }
        } else {
            None
        };
        let dense_x = stream
            .alloc_zeros::<u16>(8)
            .map_err(drv("allocating bf16 activations"))?;
        Ok(Device {
            ctx,
            stream,
            _module: module,
            funcs,
            opts,
            pdl: opts.pdl && major >= 9,
            clusters: major >= 9,
            sm_count,
            b16_packed: crate::compile::tuned_define("B16_PACKED_SUMS") != 0,
            meta: Mutex::new(meta),
            ws: Mutex::new(ws),
            argmax_out: Mutex::new(argmax_out),
            graphs: Mutex::new(Graphs(HashMap::new())),
            moe: Mutex::new(None),
            generation: Mutex::new(0),
            capturing: AtomicBool::new(false),
            k8_weights: AtomicBool::new(false),
            q8_read: AtomicBool::new(false),
            weight_bytes: AtomicU64::new(0),
            blas,
            blas_min_rows: AtomicUsize::new(BLAS_MIN_ROWS),
            q8_blocks: AtomicBool::new(false),
            dense_bytes: AtomicU64::new(0),
            dense_cols: AtomicUsize::new(0),
            dense_x: Mutex::new(dense_x),
            timing_skip: Mutex::new(timing_skip),
            pass_events: Mutex::new(None),
            min_chunk: crate::compile::attn_min_chunk(),
            prep_max_rows: crate::compile::tuned_define("PREP_MAX_ROWS") as usize,
            l2pf: Mutex::new([(0, 0); 2]),
            l2pf_cap: (crate::compile::tuned_define("L2PF_MB") as usize) << 20,
            name,
            arch,
            cache_hit,
            warning,
        })
    }

    /// Leaves out from now on the launches `list` names (comma-separated, as `KILN_CUDA_TIMING_SKIP`; empty:
    /// none), so one process can time a step without each kind of launch in turn (`kiln bench --skip-each`).
    /// Graphs are captured anew. The outputs are wrong while anything is left out.
    pub fn set_timing_skip(&self, list: &str) {
        *self.lock(&self.timing_skip) = skip_list(list);
        self.bump_generation();
    }

    /// Times every pass from now on (`on`) or none: events around [`Device::timed_pass`], read and summed by
    /// [`Device::take_pass_time`]. The span of a pass is GPU time from its metadata upload to its last kernel,
    /// so set against the host's wall time it separates the GPU's work from the host's (launches, copies back).
    pub fn set_pass_timing(&self, on: bool) {
        *self.lock(&self.pass_events) = on.then(Vec::new);
    }

    /// Runs `f` (one pass: its metadata upload and [`Device::run_pass`]), between two events when pass timing is
    /// on. The events are recorded outside any capture.
    pub fn timed_pass(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        if self.lock(&self.pass_events).is_none() {
            return f();
        }
        let event = || {
            let e = self
                .ctx
                .new_event(Some(cu::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("creating an event"))?;
            e.record(&self.stream).map_err(drv("recording an event"))?;
            Ok::<_, Error>(e)
        };
        let start = event()?;
        f()?;
        let end = event()?;
        if let Some(v) = self.lock(&self.pass_events).as_mut() {
            v.push((start, end));
        }
        Ok(())
    }

    /// The GPU time of the passes timed since the last call (waiting for them to finish), and forgets them;
    /// `None` when pass timing is off.
    pub fn take_pass_time(&self) -> Result<Option<std::time::Duration>> {
        let Some(pairs) = self.lock(&self.pass_events).as_mut().map(std::mem::take) else {
            return Ok(None);
        };
        let mut ms = 0f64;
        for (start, end) in &pairs {
            ms += start.elapsed_ms(end).map_err(drv("timing a pass"))? as f64;
        }
        Ok(Some(std::time::Duration::from_secs_f64(ms / 1e3)))
    }

    fn skipped(&self, name: &str) -> bool {
        timing_skips(&self.lock(&self.timing_skip), name)
    }

    /// Bytes of weights uploaded so far (the device memory they take).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of the dense bf16 weight copies the prefill GEMM on cuBLAS reads ([`Options::prefill_blas`]).
    pub fn dense_bytes(&self) -> u64 {
        self.dense_bytes.load(Ordering::Relaxed)
    }

    /// One line for the user: the GPU, its architecture and the device memory the weights take.
    pub fn summary(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut s = format!(
            "{} ({}), {:.2} GiB of weights",
            self.name,
            self.arch,
            gib(self.weight_bytes())
        );
        if self.dense_bytes() > 0 {
            s.push_str(&format!(
                " + {:.2} GiB of bf16 copies for prefill",
                gib(self.dense_bytes())
            ));
        }
        s
    }

    /// The fast paths in use.
    pub fn options(&self) -> Options {
        self.opts
    }

    fn f(&self, name: &'static str) -> &(CudaFunction, u32) {
        // Every name in KERNEL_NAMES was loaded in `open`; callers only use those names.
        &self.funcs[name]
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    fn lock<'a, T>(&self, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        // A panic while holding a device lock leaves plain data behind; keep going with it.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump_generation(&self) {
        *self.lock(&self.generation) += 1;
        self.lock(&self.graphs).0.clear();
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    /// Work queued on this device's stream from now on waits for the work `other` (another device object on the
    /// same GPU) has queued so far; neither the host nor `other` waits.
    pub fn wait_for(&self, other: &Device) -> Result<()> {
        self.stream
            .join(&other.stream)
            .map_err(drv("ordering two streams"))
    }

    /// The stream every kernel runs on (for timing with events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context (for callers that allocate their own buffers).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A zeroed buffer of `len` f32 (plus its Q8 shadow).
    pub fn alloc(&self, len: usize) -> Result<DBuf> {
        let data = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(drv(format!("allocating {len} floats")))?;
        self.with_shadow(data)
    }

    /// A zeroed device array of `len` i32 (indices, tables).
    fn alloc_i32(&self, len: usize) -> Result<CudaSlice<i32>> {
        self.stream
            .alloc_zeros::<i32>(len.max(1))
            .map_err(drv(format!("allocating {len} indices")))
    }

    fn with_shadow(&self, data: CudaSlice<f32>) -> Result<DBuf> {
        let nb = data.len().div_ceil(32);
        let err = || drv("allocating Q8 activations");
        // The K8 shadow only for buffers that can feed a K-quant matmul (whole 256-element blocks).
        let nk = if self.opts.k8 { data.len() / 256 } else { 0 };
        Ok(DBuf {
            xq: self.stream.alloc_zeros::<i8>(nb * 32).map_err(err())?,
            xd: self.stream.alloc_zeros::<f32>(nb).map_err(err())?,
            xs: self.stream.alloc_zeros::<f32>(nb).map_err(err())?,
            kq: self
                .stream
                .alloc_zeros::<i8>((nk * 256).max(1))
                .map_err(err())?,
            kd: self.stream.alloc_zeros::<f32>(nk.max(1)).map_err(err())?,
            // 8 int sums a K8 block, then (B16_PACKED_SUMS) its 16 bytes of packed sums.
            ks: self
                .stream
                .alloc_zeros::<i32>((nk * if self.b16_packed { 12 } else { 8 }).max(1))
                .map_err(err())?,
            data,
            q8_valid: AtomicUsize::new(0),
            k8_valid: AtomicUsize::new(0),
            kp_valid: AtomicUsize::new(0),
            id: next_id(),
        })
    }

    /// A buffer holding `x`.
    pub fn upload(&self, x: &[f32]) -> Result<DBuf> {
        let data = self
            .stream
            .clone_htod(x)
            .map_err(drv(format!("uploading {} floats", x.len())))?;
        self.with_shadow(data)
    }

    /// Copies `src` into the first `src.len()` elements of `dst`.
    pub fn write(&self, dst: &mut DBuf, src: &[f32]) -> Result<()> {
        if src.len() > dst.len() {
            return Err(Error::Shape {
                op: "write",
                detail: format!("{} elements into a buffer of {}", src.len(), dst.len()),
            });
        }
        dst.invalidate();
        let mut view = dst.data.slice_mut(..src.len());
        self.stream
            .memcpy_htod(src, &mut view)
            .map_err(drv("writing to the device"))
    }

    /// Copies the first `dst.len()` elements of `x` to the host (synchronizes).
    pub fn read(&self, x: &DBuf, dst: &mut [f32]) -> Result<()> {
        if dst.len() > x.len() {
            return Err(Error::Shape {
                op: "read",
                detail: format!("{} elements asked of a buffer of {}", dst.len(), x.len()),
            });
        }
        self.stream
            .memcpy_dtoh(&x.data.slice(..dst.len()), dst)
            .map_err(drv("reading back"))?;
        self.synchronize()
    }

    /// The keys `layer` of the cache holds for `slot`, as f32 (`slot_ctx × kv_dim`; synchronizes): the self-test's
    /// host reference attends over the keys the device stored.
    pub fn read_kv_keys(&self, kv: &DKv, layer: usize, slot: usize) -> Result<Vec<f32>> {
        let (n_layer, n_slots, slot_ctx, kv_dim) = kv.dims;
        self.check("read_kv_keys", layer < n_layer && slot < n_slots, || {
            format!("layer {layer}, slot {slot}, cache {:?}", kv.dims)
        })?;
        let (n, el) = (slot_ctx * kv_dim, if kv.f16 { 2 } else { 4 });
        let start = (layer * n_slots + slot) * n * el;
        let mut bytes = vec![0u8; n * el];
        self.stream
            .memcpy_dtoh(&kv.k.slice(start..start + n * el), &mut bytes)
            .map_err(drv("reading back"))?;
        self.synchronize()?;
        Ok(if kv.f16 {
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect()
        } else {
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
    }

    /// Uploads a weight (`rows × row_bytes` GGUF bytes). With `gemv` and a type that has a GEMV kernel (and not
    /// in the reference mode), the bytes are repacked for it; otherwise kept as they are (needed by
    /// [`Device::embed`]).
    pub fn upload_weight(
        &self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        bytes: &[u8],
        gemv: bool,
    ) -> Result<DWeight> {
        self.upload_matrices(name, ty, cols, rows, bytes, gemv, 1)
    }

    /// A 3-D expert tensor of `n_exp` matrices (`rows` in all, GGUF order) for [`Device::moe_ffn`]: each expert's
    /// matrix repacked on its own for the GEMV kernels when they take the type (and the fast paths are on), else
    /// kept in GGUF layout for the generic expert kernel.
    pub fn upload_experts(
        &self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        n_exp: usize,
        bytes: &[u8],
    ) -> Result<DWeight> {
        if n_exp == 0 || !rows.is_multiple_of(n_exp) {
            return Err(Error::Shape {
                op: "upload_experts",
                detail: format!("tensor '{name}': {rows} rows are not {n_exp} experts"),
            });
        }
        self.upload_matrices(name, ty, cols, rows, bytes, true, n_exp)
    }

    /// [`Device::upload_weight`] of `parts` equal matrices stacked in `bytes`, each repacked on its own.
    #[allow(clippy::too_many_arguments)]
    fn upload_matrices(
        &self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        bytes: &[u8],
        gemv: bool,
        parts: usize,
    ) -> Result<DWeight> {
        if !supports(ty) {
            return Err(Error::Unsupported {
                name: name.into(),
                ty,
            });
        }
        let row_bytes = ty.row_bytes(cols as u64).ok_or_else(|| Error::Shape {
            op: "upload_weight",
            detail: format!("tensor '{name}': {cols} columns is not a whole number of {ty} blocks"),
        })? as usize;
        if bytes.len() != rows * row_bytes || (!is_float(ty) && !cols.is_multiple_of(32)) {
            return Err(Error::Shape {
                op: "upload_weight",
                detail: format!(
                    "tensor '{name}': {} bytes for {rows} rows of {cols} {ty}",
                    bytes.len()
                ),
            });
        }
        let repacked = has_gemv(ty) && gemv && self.opts.fast_gemv && !self.opts.reference;
        let (layout, data) = if repacked {
            (
                Layout::Gemv,
                self.stream.clone_htod(&repack_parts(ty, bytes, parts)),
            )
        } else {
            (Layout::Native, self.stream.clone_htod(bytes))
        };
        // A dense copy for the prefill GEMM: 2-D matrices (not expert stacks or lookup tables) of quantized types,
        // and of F16 (cuBLAS multiplies F32 and BF16 weights as they are, `blas_float`).
        let f16_copy =
            ty == GgmlType::F16 && self.opts.prefill_blas_float && cols.is_multiple_of(32);
        let dense = if self.blas.is_some() && gemv && parts == 1 && (!is_float(ty) || f16_copy) {
            self.dense_copy(name, ty, cols, rows, row_bytes, bytes)?
        } else {
            None
        };
        let w = DWeight {
            name: name.into(),
            ty,
            cols,
            rows,
            row_bytes,
            layout,
            data: data.map_err(drv(format!("uploading tensor '{name}'")))?,
            dense,
        };
        if self.blas_float(&w).is_some() {
            self.dense_cols.fetch_max(cols, Ordering::Relaxed);
        }
        if self.uses_k8(&w, 1) {
            self.k8_weights.store(true, Ordering::Relaxed);
        }
        self.weight_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(w)
    }

    /// `rows × cols` bf16 elements decoded on the device from GGUF `bytes` (`dequant_bf16`), or none when that
    /// would leave less than [`DENSE_KEEP_FREE`] (or an eighth of the card) free.
    fn dense_copy(
        &self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        row_bytes: usize,
        bytes: &[u8],
    ) -> Result<Option<CudaSlice<u16>>> {
        let need = rows * cols * 2;
        self.ctx
            .bind_to_thread()
            .map_err(drv("querying free memory"))?;
        let (free, total) =
            cudarc::driver::result::mem_get_info().map_err(drv("querying free memory"))?;
        let keep = DENSE_KEEP_FREE.max(total / DENSE_KEEP_FREE_SHARE);
        if free < need + bytes.len() + keep {
            return Ok(None);
        }
        let raw = self
            .stream
            .clone_htod(bytes)
            .map_err(drv(format!("uploading tensor '{name}'")))?;
        let out = self
            .stream
            .alloc_zeros::<u16>(rows * cols)
            .map_err(drv(format!("allocating the bf16 copy of '{name}'")))?;
        let blocks = rows * cols / 32;
        let (op, rp) = (self.ptr(&out), self.ptr(&raw));
        self.launch(
            "dequant_bf16",
            grid(blocks.div_ceil(256) as u32, 1, 256),
            &[
                &op,
                &rp,
                &(row_bytes as i64),
                &(ty.id() as i32),
                &(cols as i32),
                &(rows as i32),
            ],
        )?;
        self.dense_bytes.fetch_add(need as u64, Ordering::Relaxed);
        self.dense_cols.fetch_max(cols, Ordering::Relaxed);
        Ok(Some(out))
    }

    /// Frees `w`'s dense bf16 copy: its matmuls then read it quantized at every row count.
    pub fn drop_dense_copy(&self, w: &mut DWeight) {
        if let Some(d) = w.dense.take() {
            self.dense_bytes
                .fetch_sub(2 * d.len() as u64, Ordering::Relaxed);
        }
    }

    /// Whether matmuls of a few rows on `w` take the K8 kernels (Q4_K/Q6_K against K8 activations; at 4 to 16
    /// rows the direct block kernel).
    pub fn reads_k8(&self, w: &DWeight) -> bool {
        self.uses_k8(w, G16_MIN_ROWS)
    }

    /// Sizes the bf16 activations of the cuBLAS matmuls for passes of up to `rows` rows (before any pass is
    /// captured).
    pub fn reserve_dense(&self, rows: usize) -> Result<()> {
        if self.dense_cols.load(Ordering::Relaxed) > 0 {
            self.dense_scratch(rows * self.dense_cols.load(Ordering::Relaxed))?;
        }
        Ok(())
    }

    /// The bf16 activation scratch, at least `n` elements long.
    fn dense_scratch(&self, n: usize) -> Result<u64> {
        self.grow_scratch(&self.dense_x, n, "matmul", "bf16 activations")?;
        Ok(self.ptr(&self.lock(&self.dense_x)))
    }

    /// Grows the scratch `m` to at least `n` elements, never while a pass is captured (a graph holds the old
    /// address; growing invalidates the captured graphs).
    fn grow_scratch<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        m: &Mutex<CudaSlice<T>>,
        n: usize,
        op: &'static str,
        what: &str,
    ) -> Result<()> {
        let mut s = self.lock(m);
        if s.len() >= n {
            return Ok(());
        }
        if self.capturing.load(Ordering::Relaxed) {
            return Err(Error::Shape {
                op,
                detail: format!("{what} not reserved before graph capture"),
            });
        }
        *s = self
            .stream
            .alloc_zeros::<T>(n)
            .map_err(drv(format!("allocating {what}")))?;
        drop(s);
        self.bump_generation();
        Ok(())
    }

    /// `x`'s first `n` elements rounded to bf16 in the scratch (`to_bf16`); returns its pointer.
    fn dense_input(&self, x: &DBuf, n: usize) -> Result<u64> {
        self.check("matmul", n.is_multiple_of(8) && n <= x.len(), || {
            format!(
                "bf16 activations of {n} elements from a buffer of {}",
                x.len()
            )
        })?;
        let xb = self.dense_scratch(n)?;
        let xp = self.ptr(&x.data);
        self.launch(
            "to_bf16",
            grid((n / 8).div_ceil(256) as u32, 1, 256),
            &[&xb, &xp, &(n as i64)],
        )?;
        Ok(xb)
    }

    /// The matrix cuBLAS reads for `w` and its element type, when a matmul of `n_rows` rows of the current pass
    /// takes cuBLAS.
    fn blas_weight(&self, w: &DWeight, n_rows: usize) -> Option<(u64, cudaDataType)> {
        if !self.lock(&self.meta).prefill {
            return None;
        }
        self.blas_matrix(w, n_rows)
    }

    /// What a prefill pass of `n_rows` rows multiplies on cuBLAS for `w`: the dense bf16 copy of a quantized
    /// weight, or an F32/BF16 weight as uploaded.
    fn blas_matrix(&self, w: &DWeight, n_rows: usize) -> Option<(u64, cudaDataType)> {
        if self.blas.is_none() || n_rows < self.blas_min_rows.load(Ordering::Relaxed) {
            return None;
        }
        match &w.dense {
            Some(d) => Some((self.ptr(d), cudaDataType::CUDA_R_16BF)),
            None => self.blas_float(w).map(|t| (self.ptr(&w.data), t)),
        }
    }

    /// The cuBLAS element type of an F32 or BF16 weight that prefill passes multiply on cuBLAS
    /// ([`Options::prefill_blas_float`]; BF16 rows a whole number of `to_bf16`'s groups of 8).
    fn blas_float(&self, w: &DWeight) -> Option<cudaDataType> {
        if self.blas.is_none() || !self.opts.prefill_blas_float || w.layout != Layout::Native {
            return None;
        }
        match w.ty {
            GgmlType::F32 => Some(cudaDataType::CUDA_R_32F),
            GgmlType::BF16 if w.cols.is_multiple_of(8) => Some(cudaDataType::CUDA_R_16BF),
            _ => None,
        }
    }

    /// A DFlash drafter's device sets this: its Q8_0 matmuls of [`G16_MIN_ROWS`] to [`MMQ_MIN_ROWS`] rows read
    /// K8 activations on the Q8_0 direct block kernel (`gemv16_q8d` in gemv16.cu: 16 outputs a block, the
    /// weights' own bytes, half a bf16 copy's), in a float order of its own. Its proposals only decide how many
    /// tokens a round accepts, never which, so no other path's bits are needed. Captured graphs are dropped.
    pub fn set_q8_blocks(&self, on: bool) {
        self.q8_blocks.store(on, Ordering::Relaxed);
        if on {
            self.k8_weights.store(true, Ordering::Relaxed);
        }
        self.bump_generation();
    }

    /// Whether prefill passes of `n_rows` rows multiply `w` on cuBLAS.
    pub fn takes_blas(&self, w: &DWeight, n_rows: usize) -> bool {
        self.blas_matrix(w, n_rows).is_some()
    }

    /// The activations cuBLAS reads for a weight of element type `t`: the f32 rows themselves, or rounded to bf16.
    fn blas_input(&self, x: &DBuf, n: usize, t: cudaDataType) -> Result<u64> {
        if t == cudaDataType::CUDA_R_32F {
            return Ok(self.ptr(&x.data));
        }
        self.dense_input(x, n)
    }

    /// Prefill passes' matmuls take cuBLAS from `rows` rows on (default [`BLAS_MIN_ROWS`]). A DFlash drafter's
    /// device sets 1: its proposals only decide how many tokens a round accepts, never which, so its 16-row
    /// blocks may read bf16 copies at cuBLAS's rate rather than match any other path's bits. Captured graphs are
    /// dropped (they hold the kernel choice).
    pub fn set_blas_min_rows(&self, rows: usize) {
        self.blas_min_rows.store(rows.max(1), Ordering::Relaxed);
        self.bump_generation();
    }

    /// `out[r] (+)= W · x[r]` on cuBLAS: `W` (`n_out × cols`, row-major, i.e. column-major `cols × n_out`,
    /// transposed) and `x` (`n_rows × cols`) both of element type `t` (bf16 or f32), `out` f32 `n_rows × n_out`;
    /// f32 accumulation (no TF32: the handle keeps the default math mode).
    #[allow(clippy::too_many_arguments)]
    fn gemm_dense(
        &self,
        out: u64,
        (wp, t): (u64, cudaDataType),
        xb: u64,
        n_out: usize,
        cols: usize,
        n_rows: usize,
        accumulate: bool,
        name: &str,
    ) -> Result<()> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
        let Some(blas) = &self.blas else {
            return Err(Error::Shape {
                op: "matmul",
                detail: format!("'{name}': no cuBLAS handle"),
            });
        };
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        self.ctx
            .bind_to_thread()
            .map_err(drv(format!("cuBLAS matmul '{name}'")))?;
        // SAFETY: the pointers are live device allocations of the checked sizes (w: n_out × cols, xb: at least
        // n_rows × cols from `blas_input`, out: n_rows × n_out by the caller's check); alpha and beta are host
        // values read during the call; the handle's stream is the device's one stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n_out as i32,
                n_rows as i32,
                cols as i32,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                t,
                cols as i32,
                xb as *const c_void,
                t,
                cols as i32,
                &beta as *const f32 as *const c_void,
                out as *mut c_void,
                cudaDataType::CUDA_R_32F,
                n_out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Shape {
            op: "matmul",
            detail: format!("cuBLAS on '{name}' ({n_out} x {cols}, {n_rows} rows): {e}"),
        })
    }

    /// KV storage of `n_layer × n_slots × slot_ctx × kv_dim` keys and values.
    pub fn alloc_kv(
        &self,
        n_layer: usize,
        n_slots: usize,
        slot_ctx: usize,
        kv_dim: usize,
        f16: bool,
    ) -> Result<DKv> {
        let bytes = n_layer * n_slots * slot_ctx * kv_dim * if f16 { 2 } else { 4 };
        let k = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(drv("allocating the KV cache"))?;
        let v = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(drv("allocating the KV cache"))?;
        Ok(DKv {
            k,
            v,
            dims: (n_layer, n_slots, slot_ctx, kv_dim),
            f16,
            id: next_id(),
        })
    }

    /// Sizes the attention scratch for passes of up to `rows` rows of `n_head × head_dim` over slots of
    /// `slot_ctx` (called before any pass is captured, so capture never allocates).
    pub fn reserve_attention(
        &self,
        rows: usize,
        n_head: usize,
        head_dim: usize,
        slot_ctx: usize,
    ) -> Result<()> {
        let n_splits = attn_splits(slot_ctx);
        let need = rows * n_head * (n_splits * (head_dim + 2)).max(slot_ctx);
        self.grow_scratch(&self.ws, need, "attention", "attention scratch")
    }

    /// Sizes the MoE intermediates for passes of up to `rows` rows (before any pass is captured).
    pub fn reserve_moe(&self, rows: usize, m: &MoeShape) -> Result<()> {
        let mut g = self.lock(&self.moe);
        if g.as_ref().is_some_and(|s| s.rows >= rows && s.shape == *m) {
            return Ok(());
        }
        if self.capturing.load(Ordering::Relaxed) {
            return Err(Error::Shape {
                op: "moe_ffn",
                detail: "scratch not reserved before graph capture".into(),
            });
        }
        let c = rows * m.k;
        *g = Some(MoeScratch {
            rows,
            shape: *m,
            logits: self.alloc(rows * m.n_exp)?,
            ids: self.alloc_i32(c)?,
            wts: self.alloc(c)?,
            gate: self.alloc(c * m.ff)?,
            up: self.alloc(c * m.ff)?,
            act: self.alloc(c * m.ff)?,
            y: self.alloc(c * m.width)?,
            counts: self.alloc_i32(m.n_exp)?,
            slot_of: self.alloc_i32(c)?,
            src_row: self.alloc_i32(c)?,
            tiles: self.alloc_i32(1 + 3 * moe_max_tiles(c, m.n_exp, MOE_GEMV_TILE))?,
            xg: self.alloc(c * m.width)?,
        });
        drop(g);
        self.bump_generation();
        Ok(())
    }

    /// Mixture-of-experts FFN of `n_rows` rows of `x`: routing on the device (softmax, top-k, optional
    /// renormalisation), each chosen expert's SwiGLU FFN, outputs summed in ascending expert order into `out`.
    /// Expert weights from [`Device::upload_experts`]: repacked ones run the one-row GEMV body per (output,
    /// choice) (`moe_gemv`, `moe_gemv_k8`), GGUF-layout ones the generic expert kernel (`moe_matmul`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_ffn(
        &self,
        out: &mut DBuf,
        x: &DBuf,
        n_rows: usize,
        router: &DWeight,
        gate: &DWeight,
        up: &DWeight,
        down: &DWeight,
        m: &MoeShape,
    ) -> Result<()> {
        let (d, ff, k) = (m.width, m.ff, m.k);
        self.check(
            "moe_ffn",
            k > 0
                && k <= 16
                && k <= m.n_exp
                && router.cols == d
                && router.rows == m.n_exp
                && gate.cols == d
                && up.cols == d
                && gate.rows == ff * m.n_exp
                && up.rows == ff * m.n_exp
                && down.cols == ff
                && down.rows == d * m.n_exp
                && [gate, up, down].iter().all(|w| !is_float(w.ty))
                && x.len() >= n_rows * d
                && out.len() >= n_rows * d,
            || format!("'{}': {m:?} on {n_rows} rows", gate.name),
        )?;
        out.invalidate();
        if n_rows == 0 {
            return Ok(());
        }
        self.reserve_moe(n_rows, m)?;
        let mut g = self.lock(&self.moe);
        let s = g.as_mut().ok_or_else(|| Error::Shape {
            op: "moe_ffn",
            detail: "no scratch".into(),
        })?;
        self.matmul(&mut s.logits, router, x, n_rows, false)?;
        let (ip, wp, lp) = (
            self.ptr(&s.ids),
            self.ptr(&s.wts.data),
            self.ptr(&s.logits.data),
        );
        self.launch(
            "moe_route",
            grid(n_rows as u32, 1, 32),
            &[
                &ip,
                &wp,
                &lp,
                &(m.n_exp as i32),
                &(k as i32),
                &(m.norm_topk as i32),
            ],
        )?;
        let reference = self.opts.reference;
        let (n_exp, n_choices) = (m.n_exp, n_rows * k);
        // Several rows on repacked experts: choices grouped by expert, each weight read once per 8 of them (GEMV
        // tiles) or, in a prefill pass, once per 64 (tensor-core tiles, when all three matrices have that kernel).
        let grouped = self.opts.moe_group
            && n_rows >= MOE_GROUP_MIN_ROWS
            && [gate, up, down].iter().all(|w| w.layout == Layout::Gemv);
        let mmq = grouped
            && [gate, up, down]
                .iter()
                .all(|w| self.moe_mmq_kernel(w, n_rows).is_some());
        let tile = if mmq { MOE_MMQ_TILE } else { MOE_GEMV_TILE };
        let MoeScratch {
            gate: sg,
            up: su,
            act,
            y,
            counts,
            slot_of,
            src_row,
            tiles,
            xg,
            ..
        } = s;
        let (slot_p, tiles_p) = (self.ptr(slot_of), self.ptr(tiles));
        if grouped {
            let (cnt_p, src_p) = (self.ptr(counts), self.ptr(src_row));
            // 1,024 threads: a block scans the choices in 4 steps at 4,096 of them (16 at 256 threads: ~17 µs).
            let per_expert = grid(n_exp as u32, 1, 1024);
            self.launch("moe_count", per_expert, &[&cnt_p, &ip, &(n_choices as i32)])?;
            self.launch(
                "moe_place",
                per_expert,
                &[
                    &slot_p,
                    &src_p,
                    &tiles_p,
                    &cnt_p,
                    &ip,
                    &(n_choices as i32),
                    &(k as i32),
                    &(n_exp as i32),
                    &(tile as i32),
                ],
            )?;
            xg.invalidate();
            if self.opts.moe_gather_quant {
                // The activation kinds gate and up read (both, when their types differ).
                let mut kinds = vec![self.uses_k8(gate, n_rows), self.uses_k8(up, n_rows)];
                kinds.dedup();
                for k8 in kinds {
                    let (qp, dp, sp) = self.activations(x, n_rows * d, k8)?;
                    let (codes, valid, sblk) = if k8 {
                        (&xg.kq, &xg.k8_valid, 256i32)
                    } else {
                        (&xg.xq, &xg.q8_valid, 32)
                    };
                    self.check("moe_ffn", n_choices * d <= codes.len(), || {
                        format!("{n_choices} slots of {d} in a shadow of {}", codes.len())
                    })?;
                    let (gq, gd, gs) = if k8 {
                        (self.ptr(&xg.kq), self.ptr(&xg.kd), self.ptr(&xg.ks))
                    } else {
                        (self.ptr(&xg.xq), self.ptr(&xg.xd), self.ptr(&xg.xs))
                    };
                    self.launch(
                        "gather_quant",
                        grid(n_choices as u32, 1, 256),
                        &[&gq, &gd, &gs, &qp, &dp, &sp, &src_p, &(d as i32), &sblk],
                    )?;
                    valid.store(n_choices * d, Ordering::Relaxed);
                }
            } else {
                let (gp, xp) = (self.ptr(&xg.data), self.ptr(&x.data));
                self.launch(
                    "gather_rows",
                    grid(n_choices as u32, 1, ROW_THREADS),
                    &[&gp, &xp, &src_p, &(d as i32)],
                )?;
            }
        }
        // The expert matmul of `w` (n_out rows an expert) on `a`: in grouped order (`a` one row a slot), or one
        // row a choice (`per_choice`) or a token.
        let expert =
            |o: &mut DBuf, w: &DWeight, a: &DBuf, per_choice: bool, n_out: usize| -> Result<()> {
                let width = w.cols;
                let expert_bytes = (w.rows / n_exp * w.row_bytes) as i64;
                let n_act = if per_choice || grouped {
                    n_choices
                } else {
                    n_rows
                };
                if w.layout == Layout::Gemv {
                    let k8 = self.uses_k8(w, n_rows);
                    let (qp, dp, sp) = self.activations(a, n_act * width, k8)?;
                    o.invalidate();
                    let (op, wp, ty) = (
                        self.ptr(&o.data),
                        self.ptr(&w.data),
                        self.gemv_type_id(w, n_rows),
                    );
                    let cfg = |z: usize| LaunchConfig {
                        grid_dim: (n_out.div_ceil(GV_WARPS) as u32, 1, z as u32),
                        block_dim: (32 * GV_WARPS as u32, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    if let Some(kernel) = self.moe_mmq_kernel(w, n_rows).filter(|_| mmq) {
                        return self.launch(
                            kernel,
                            LaunchConfig {
                                grid_dim: (
                                    n_out.div_ceil(64) as u32,
                                    1,
                                    moe_max_tiles(n_choices, n_exp, MOE_MMQ_TILE) as u32,
                                ),
                                block_dim: (128, 1, 1),
                                shared_mem_bytes: 0,
                            },
                            &[
                                &op,
                                &wp,
                                &expert_bytes,
                                &qp,
                                &dp,
                                &sp,
                                &tiles_p,
                                &(width as i32),
                                &(n_out as i32),
                            ],
                        );
                    }
                    let (width, n_out) = (width as i32, n_out as i32);
                    if grouped {
                        return self.launch(
                            if k8 {
                                "moe_gemv_tiles_k8"
                            } else {
                                "moe_gemv_tiles"
                            },
                            cfg(moe_max_tiles(n_choices, n_exp, MOE_GEMV_TILE)),
                            &[
                                &ty,
                                &op,
                                &wp,
                                &expert_bytes,
                                &qp,
                                &dp,
                                &sp,
                                &tiles_p,
                                &width,
                                &n_out,
                            ],
                        );
                    }
                    // One-row GEMV body per (output, choice).
                    return self.launch(
                        if k8 { "moe_gemv_k8" } else { "moe_gemv" },
                        cfg(n_choices),
                        &[
                            &ty,
                            &op,
                            &wp,
                            &expert_bytes,
                            &qp,
                            &dp,
                            &sp,
                            &ip,
                            &(k as i32),
                            &(per_choice as i32),
                            &width,
                            &n_out,
                        ],
                    );
                }
                if !reference {
                    self.activations(a, n_act * width, false)?;
                }
                o.invalidate();
                let (op, wp) = (self.ptr(&o.data), self.ptr(&w.data));
                let (qp, dp, sp, fp) = (
                    self.ptr(&a.xq),
                    self.ptr(&a.xd),
                    self.ptr(&a.xs),
                    self.ptr(&a.data),
                );
                self.launch(
                    "moe_matmul",
                    grid(n_out as u32, n_choices as u32, MM_THREADS),
                    &[
                        &op,
                        &wp,
                        &((n_out * w.row_bytes) as i64),
                        &(w.row_bytes as i64),
                        &(w.ty.id() as i32),
                        &qp,
                        &dp,
                        &sp,
                        &fp,
                        &(reference as i32),
                        &ip,
                        &(k as i32),
                        &(per_choice as i32),
                        &(width as i32),
                        &(n_out as i32),
                    ],
                )
            };
        let xin: &DBuf = if grouped { xg } else { x };
        // Decode (one row a token): gate and up in one launch when both are repacked and read the same activations.
        let k8 = self.uses_k8(gate, n_rows);
        if !grouped
            && !reference
            && self.opts.fused
            && [gate, up]
                .iter()
                .all(|w| w.layout == Layout::Gemv && w.cols == d)
            && self.uses_k8(up, n_rows) == k8
        {
            let (qp, dp, sp) = self.activations(x, n_rows * d, k8)?;
            sg.invalidate();
            su.invalidate();
            let nb = ff.div_ceil(GV_WARPS);
            let bytes = |w: &DWeight| (w.rows / n_exp * w.row_bytes) as i64;
            self.launch(
                if k8 { "moe_gate_up_k8" } else { "moe_gate_up" },
                LaunchConfig {
                    grid_dim: (2 * nb as u32, 1, n_choices as u32),
                    block_dim: (32 * GV_WARPS as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &self.gemv_type_id(gate, n_rows),
                    &self.ptr(&sg.data),
                    &self.ptr(&gate.data),
                    &bytes(gate),
                    &self.gemv_type_id(up, n_rows),
                    &self.ptr(&su.data),
                    &self.ptr(&up.data),
                    &bytes(up),
                    &qp,
                    &dp,
                    &sp,
                    &ip,
                    &(k as i32),
                    &(d as i32),
                    &(ff as i32),
                    &(nb as i32),
                ],
            )?;
        } else {
            expert(sg, gate, xin, false, ff)?;
            expert(su, up, xin, false, ff)?;
        }
        self.swiglu(act, sg, su, n_choices * ff)?;
        expert(y, down, act, true, d)?;
        let (o, yp) = (self.ptr(&out.data), self.ptr(&y.data));
        let map = if grouped { slot_p } else { 0 };
        self.launch(
            "moe_combine",
            grid(n_rows as u32, 1, ROW_THREADS),
            &[&o, &yp, &wp, &map, &(k as i32), &(d as i32)],
        )
    }

    /// Sets the rows of the next pass: their tokens, `(slot, pos)` and the batch rows that want logits. Ops of the
    /// pass ([`Device::embed`], [`Device::attention`], [`Device::gather_rows`] …) read these from the device.
    /// `prefill`: the rows are prompt tokens only, no decode or verify rows, so the pass's matmuls may use the
    /// tensor-core prefill kernel (whose bits differ from the decode path's); the graph key must include it.
    pub fn set_pass(
        &self,
        tokens: &[u32],
        rows: &[(usize, usize)],
        logit_rows: &[usize],
        prefill: bool,
    ) -> Result<()> {
        let n = tokens.len().max(rows.len()).max(logit_rows.len());
        let mut m = self.lock(&self.meta);
        if n > m.cap {
            let cap = n.next_power_of_two();
            m.buf = self
                .stream
                .alloc_zeros::<i32>(4 * cap)
                .map_err(drv("allocating metadata"))?;
            m.cap = cap;
            m.host = vec![0; 4 * cap];
            self.bump_generation();
        }
        let cap = m.cap;
        m.host.fill(0);
        for (i, &t) in tokens.iter().enumerate() {
            m.host[i] = t as i32;
        }
        for (i, &(s, p)) in rows.iter().enumerate() {
            m.host[cap + i] = s as i32;
            m.host[2 * cap + i] = p as i32;
        }
        for (i, &r) in logit_rows.iter().enumerate() {
            m.host[3 * cap + i] = r as i32;
        }
        m.rows = rows.to_vec();
        m.n_logits = logit_rows.len();
        m.prefill = prefill;
        let Meta { buf, host, .. } = &mut *m;
        self.stream
            .memcpy_htod(host.as_slice(), buf)
            .map_err(drv("uploading pass metadata"))
    }

    /// What the attention's launches depend on in the pass's positions (part of the graph key; a drafter
    /// block's rows see up to its last row's position, so the largest position bounds every span).
    fn spans(&self) -> Spans {
        let m = self.lock(&self.meta);
        let last = m.rows.iter().map(|&(_, p)| p).max().unwrap_or(0);
        if last < self.min_chunk {
            Spans::OneSplit
        } else if last < HEAD_SPLIT_MAX_POS {
            Spans::Short
        } else {
            Spans::Long
        }
    }

    /// The split kernel's grid depth for this pass in a slot of `n_splits` splits a row: [`fit_splits`] of the
    /// longest span (every row attends to at most its largest position + 1), or all with `attn_fit_grid` off.
    fn split_grid(&self, n_splits: usize) -> usize {
        if !self.opts.attn_fit_grid {
            return n_splits;
        }
        let m = self.lock(&self.meta);
        let n_pos = m.rows.iter().map(|&(_, p)| p).max().unwrap_or(0) + 1;
        fit_splits(n_pos, n_splits, self.min_chunk)
    }

    /// Device pointers of the pass metadata: tokens, slots, positions, logit rows.
    fn meta_ptrs(&self) -> [u64; 4] {
        let m = self.lock(&self.meta);
        let base = self.ptr(&m.buf);
        let step = (m.cap * 4) as u64;
        [base, base + step, base + 2 * step, base + 3 * step]
    }

    /// Runs one forward pass `f` (whose ops use the metadata of the last [`Device::set_pass`]). With graphs on
    /// and `capturable`, the pass is captured as a CUDA graph the first time a `key` is seen and replayed after:
    /// `key` must identify everything the launches depend on besides the metadata (row counts, buffers).
    pub fn run_pass(
        &self,
        key: [u64; 5],
        capturable: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        if !capturable || !self.opts.graphs {
            return f();
        }
        let mut graphs = self.lock(&self.graphs);
        let gen = *self.lock(&self.generation);
        // The attention's launches depend on the rows' positions (`spans`, and the split grid's depth: with a
        // slot's own split count it follows from the depth for the most splits, the test
        // `fitted_split_grid_covers_every_row_of_the_pass` checks).
        let spans = self.spans() as u64 | (self.split_grid(ATTN_MAX_SPLITS) as u64) << 8;
        let full = [key[0], key[1], key[2], key[3], key[4], gen, spans];
        if let Some(g) = graphs.0.get(&full) {
            return g.launch().map_err(drv("launching a graph"));
        }
        self.stream
            .begin_capture(cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("beginning graph capture"))?;
        self.capturing.store(true, Ordering::Relaxed);
        let r = f();
        self.capturing.store(false, Ordering::Relaxed);
        let g = self.stream.end_capture(cu::CUgraphInstantiate_flags(0));
        r?;
        let g = g
            .map_err(drv("capturing a graph"))?
            .ok_or_else(|| Error::Shape {
                op: "graph",
                detail: "capture produced no graph".into(),
            })?;
        g.launch().map_err(drv("launching a graph"))?;
        if graphs.0.len() >= MAX_GRAPHS {
            graphs.0.clear();
        }
        graphs.0.insert(full, g);
        Ok(())
    }

    fn check(&self, op: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::Shape {
                op,
                detail: detail(),
            })
        }
    }

    fn launch(&self, name: &'static str, cfg: LaunchConfig, args: &[&dyn Arg]) -> Result<()> {
        self.launch_clusters(name, cfg, 1, args)
    }

    /// [`Device::launch`] with the blocks in clusters of `cluster` along x (sm_90 and later; 1: no clusters).
    fn launch_clusters(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        cluster: u32,
        args: &[&dyn Arg],
    ) -> Result<()> {
        if self.skipped(name) {
            return Ok(());
        }
        let (f, smem) = self.f(name);
        let mut params: Vec<*mut c_void> = args.iter().map(|a| a.param()).collect();
        // SAFETY: plain-old-data unions; zeroed is a valid value, then the one field for each id is set.
        let mut pdl: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        pdl.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        pdl.value.programmaticStreamSerializationAllowed = 1;
        let mut dims: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        dims.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        dims.value.clusterDim.x = cluster;
        dims.value.clusterDim.y = 1;
        dims.value.clusterDim.z = 1;
        let mut attrs = Vec::with_capacity(2);
        // Kernels with dynamic shared memory (prefill and block matmuls, flash attention) launch after the previous
        // kernel: launched early, the 16-row block pass of the 8B model measured 9 % slower.
        if self.pdl && *smem == 0 {
            attrs.push(pdl);
        }
        if cluster > 1 {
            attrs.push(dims);
        }
        let config = cu::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: *smem,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        self.ctx
            .bind_to_thread()
            .map_err(drv(format!("launching {name}")))?;
        // SAFETY: each kernel's argument list matches its signature in kernels/*.cu (checked by the self-test),
        // every pointer refers to a live allocation sized by the caller's checks, and `params` points at the
        // argument values, which outlive the call (the driver copies them at launch). The early-launch
        // attribute is set only where every kernel starts with `wait_prior_kernel` (a unit test checks).
        unsafe {
            cu::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(drv(format!("launching {name}")))?;
        Ok(())
    }

    /// `out[i] = table[tokens[i]]`, dequantized, for the `n` tokens of the pass. `w` must be in GGUF layout.
    pub fn embed(&self, out: &mut DBuf, w: &DWeight, n: usize) -> Result<()> {
        self.check(
            "embed",
            out.len() >= n * w.cols && w.layout == Layout::Native,
            || {
                format!(
                    "output of {} for {n} rows of {} ('{}', {:?})",
                    out.len(),
                    w.cols,
                    w.name,
                    w.layout
                )
            },
        )?;
        out.invalidate();
        if n == 0 {
            return Ok(());
        }
        let [tp, ..] = self.meta_ptrs();
        let cfg = grid(n as u32, 1, ROW_THREADS);
        let (o, wp) = (self.ptr(&out.data), self.ptr(&w.data));
        self.launch(
            "embed_rows",
            cfg,
            &[
                &o,
                &wp,
                &(w.row_bytes as i64),
                &(w.ty.id() as i32),
                &tp,
                &(w.cols as i32),
            ],
        )
    }

    /// The quantized activations a matmul reads, made current for `x`'s first `n` elements: the K8 shadow (codes,
    /// scales per 256, sums per 32; `n % 256 == 0`) when `k8`, else the Q8 one (codes, scales and scaled sums per
    /// 32; `n % 32 == 0`). Quantizes only what no fused writer or earlier matmul left current.
    fn activations(&self, x: &DBuf, n: usize, k8: bool) -> Result<(u64, u64, u64)> {
        self.quantize(x, n, k8, false)
    }

    /// [`Device::activations`]; with `packed`, also the K8 code sums packed for the K8 block kernels, whose
    /// pointer is then the third.
    fn quantize(&self, x: &DBuf, n: usize, k8: bool, packed: bool) -> Result<(u64, u64, u64)> {
        let kp = if k8 { self.packed_ptr(x) } else { 0 };
        let stale = |valid: &AtomicUsize| valid.load(Ordering::Relaxed) < n;
        let (valid, codes, scales, sums, kernel, block) = if k8 {
            (
                &x.k8_valid,
                &x.kq,
                &x.kd,
                self.ptr(&x.ks),
                "quantize_k8",
                256,
            )
        } else {
            (
                &x.q8_valid,
                &x.xq,
                &x.xd,
                self.ptr(&x.xs),
                "quantize_q8_warp",
                32,
            )
        };
        if !k8 {
            self.q8_read.store(true, Ordering::Relaxed);
        }
        let (qp, dp) = (self.ptr(codes), self.ptr(scales));
        if stale(valid) || (packed && stale(&x.kp_valid)) {
            self.check(
                "matmul",
                n <= codes.len() && n.is_multiple_of(block),
                || {
                    format!(
                        "activations of {n} elements in blocks of {block} (shadow of {})",
                        codes.len()
                    )
                },
            )?;
            let xp = self.ptr(&x.data);
            // Both kernels: one warp per block, 8 warps a thread block.
            let cfg = grid((n / block).div_ceil(8) as u32, 1, 256);
            if k8 {
                self.launch(kernel, cfg, &[&qp, &dp, &sums, &kp, &xp, &(n as i64)])?;
                if kp != 0 {
                    x.kp_valid.store(n, Ordering::Relaxed);
                }
            } else {
                self.launch(kernel, cfg, &[&qp, &dp, &sums, &xp, &(n as i64)])?;
            }
            valid.store(n, Ordering::Relaxed);
        }
        Ok((qp, dp, if packed { kp } else { sums }))
    }

    /// Where `x`'s packed code sums start (after its int sums), or null without `B16_PACKED_SUMS` (the writers
    /// then write none) or a K8 shadow.
    fn packed_ptr(&self, x: &DBuf) -> u64 {
        let nk = x.kq.len() / 256;
        if self.b16_packed && nk > 0 {
            self.ptr(&x.ks) + (nk * 8 * std::mem::size_of::<i32>()) as u64
        } else {
            0
        }
    }

    /// A fused writer wrote `n` elements of `out`'s K8 shadow (and its packed sums, when it was given them).
    fn k8_written(&self, out: &DBuf, n: usize) {
        out.k8_valid.store(n, Ordering::Relaxed);
        if self.packed_ptr(out) != 0 {
            out.kp_valid.store(n, Ordering::Relaxed);
        }
    }

    /// Whether a fused writer of `n` elements in rows of `width` also writes `out`'s K8 shadow (not in a
    /// prefill-kernel pass with `prefill_k8` off, where no matmul reads it).
    fn fused_k8(&self, out: &DBuf, n: usize, width: usize) -> bool {
        let pass_rows = self.lock(&self.meta).rows.len();
        self.k8_weights.load(Ordering::Relaxed)
            && width.is_multiple_of(256)
            && n <= out.kq.len()
            && (self.opts.prefill_k8 || !self.mmq_rows(pass_rows))
    }

    /// `out`'s per-32 Q8 pointers for a fused writer (nulls when it writes the K8 shadow and no matmul has read
    /// per-32 activations yet), and whether it writes them.
    fn q8_ptrs(&self, out: &DBuf, k8: bool) -> ((u64, u64, u64), bool) {
        if !k8 || self.q8_read.load(Ordering::Relaxed) {
            (
                (self.ptr(&out.xq), self.ptr(&out.xd), self.ptr(&out.xs)),
                true,
            )
        } else {
            ((0, 0, 0), false)
        }
    }

    /// `out`'s K8 shadow pointers for a fused writer (codes, scales, sums, packed sums), or nulls.
    fn k8_ptrs(&self, out: &DBuf, on: bool) -> (u64, u64, u64, u64) {
        if on {
            let p = (self.ptr(&out.kq), self.ptr(&out.kd), self.ptr(&out.ks));
            (p.0, p.1, p.2, self.packed_ptr(out))
        } else {
            (0, 0, 0, 0)
        }
    }

    /// Whether `w` is read against K8 activations by a matmul of `n_rows` rows: a repacked Q4_K/Q6_K weight on the
    /// GEMV and block kernels, and on the prefill kernel with `prefill_k8`; on a drafter's device
    /// ([`Device::set_q8_blocks`]) a repacked Q8_0 weight on the block kernel.
    fn uses_k8(&self, w: &DWeight, n_rows: usize) -> bool {
        let base = self.opts.k8
            && !self.opts.reference
            && w.layout == Layout::Gemv
            && w.cols.is_multiple_of(256);
        match w.ty {
            GgmlType::Q4_K | GgmlType::Q6_K => {
                base && (self.opts.prefill_k8 || !self.mmq_rows(n_rows))
            }
            GgmlType::Q8_0 => {
                base && self.q8_blocks.load(Ordering::Relaxed)
                    && self.opts.block_mma
                    && n_rows >= G16_MIN_ROWS
                    && !self.mmq_rows(n_rows)
            }
            _ => false,
        }
    }

    /// Weights a later matmul of this pass reads, in the order it reads them: the next GEMV or K8 direct block
    /// launch (`gemv*`, `gemv16_k8d*`) prefetches their first `L2PF_MB` megabytes into L2
    /// ([`Options::l2_prefetch`]). The next matmul call takes the hint whether or not its kernel issues it, so a
    /// hint never outlives it.
    pub fn prefetch(&self, ws: &[&DWeight]) {
        let mut ranges = [(0u64, 0i64); 2];
        if self.opts.l2_prefetch && self.pdl && !self.opts.reference && self.spans() != Spans::Long
        {
            let mut left = self.l2pf_cap;
            for (r, w) in ranges.iter_mut().zip(ws) {
                // Whole 16-byte units (cp.async.bulk's); allocations are 256-byte aligned.
                let n = w.data.len().min(left) & !15;
                *r = (self.ptr(&w.data), n as i64);
                left -= n;
            }
        }
        *self.lock(&self.l2pf) = ranges;
    }

    /// The prefetch hint for this launch (taken: the next launch has none unless given one).
    fn take_prefetch(&self) -> [(u64, i64); 2] {
        std::mem::take(&mut *self.lock(&self.l2pf))
    }

    /// Whether matmuls of `n_rows` rows in the current pass run on the prefill kernel (mmq.cu).
    fn mmq_rows(&self, n_rows: usize) -> bool {
        self.opts.prefill_mma && n_rows > MMQ_MIN_ROWS && self.lock(&self.meta).prefill
    }

    /// The ggml type id the GEMV kernels take for `w` (K-quants on K8 activations: the id + [`K8_TYPE_OFFSET`]).
    fn gemv_type_id(&self, w: &DWeight, n_rows: usize) -> i32 {
        w.ty.id() as i32
            + if self.uses_k8(w, n_rows) {
                K8_TYPE_OFFSET
            } else {
                0
            }
    }

    /// `out[r] (+)= W · x[r]` for `n_rows` rows (`x` is `n_rows × w.cols`, `out` is `n_rows × w.rows`); with
    /// `accumulate` the product is added to `out` (the residual connection).
    pub fn matmul(
        &self,
        out: &mut DBuf,
        w: &DWeight,
        x: &DBuf,
        n_rows: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.check(
            "matmul",
            x.len() >= n_rows * w.cols && out.len() >= n_rows * w.rows,
            || {
                format!(
                    "'{}' [{} x {}] on {} rows: input {} / output {} elements",
                    w.name,
                    w.rows,
                    w.cols,
                    n_rows,
                    x.len(),
                    out.len()
                )
            },
        )?;
        out.invalidate();
        let pf = self.take_prefetch();
        let [(pf0, pn0), (pf1, pn1)] = pf;
        if n_rows == 0 || self.skipped(weight_role(&w.name)) {
            return Ok(());
        }
        if let Some(bw) = self.blas_weight(w, n_rows) {
            let xb = self.blas_input(x, n_rows * w.cols, bw.1)?;
            let o = self.ptr(&out.data);
            return self.gemm_dense(o, bw, xb, w.rows, w.cols, n_rows, accumulate, &w.name);
        }
        let (o, wp, xp) = (self.ptr(&out.data), self.ptr(&w.data), self.ptr(&x.data));
        let (rb, ty, width, n_out, nr, acc) = (
            w.row_bytes as i64,
            w.ty.id() as i32,
            w.cols as i32,
            w.rows as i32,
            n_rows as i32,
            accumulate as i32,
        );
        let generic = LaunchConfig {
            grid_dim: (w.rows as u32, n_rows.div_ceil(MM_ROWS) as u32, 1),
            block_dim: (MM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if is_float(w.ty) {
            return self.launch(
                "matmul_f",
                generic,
                &[&o, &wp, &rb, &ty, &xp, &width, &n_out, &nr, &acc],
            );
        }
        if self.opts.reference {
            return self.launch(
                "matmul_deq",
                generic,
                &[&o, &wp, &rb, &ty, &xp, &width, &n_out, &nr, &acc],
            );
        }
        let (qp, dp, sp) = self.activations(x, n_rows * w.cols, self.uses_k8(w, n_rows))?;
        let ty = self.gemv_type_id(w, n_rows);
        if let Some((kernel, tile_rows, tile_outs)) = self.tensor_core_kernel(w, n_rows) {
            if takes_jobs(kernel) {
                let job = (ty, o, wp, w.rows);
                *self.lock(&self.l2pf) = pf; // launch_jobs issues it
                return self.launch_jobs(
                    kernel,
                    &[job],
                    (x, (qp, dp, sp)),
                    w.cols,
                    n_rows,
                    accumulate,
                    (tile_rows, tile_outs),
                );
            }
            return self.launch(
                kernel,
                LaunchConfig {
                    grid_dim: (
                        w.rows.div_ceil(tile_outs) as u32,
                        n_rows.div_ceil(tile_rows) as u32,
                        1,
                    ),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[&o, &wp, &qp, &dp, &sp, &width, &n_out, &nr, &acc],
            );
        }
        match w.layout {
            Layout::Gemv => self.launch(
                match (self.uses_k8(w, n_rows), n_rows == 1) {
                    (false, true) => "gemv_r1",
                    (false, false) => "gemv_r8",
                    (true, true) => "gemv_k8_r1",
                    (true, false) => "gemv_k8_r8",
                },
                LaunchConfig {
                    grid_dim: (
                        w.rows.div_ceil(GV_WARPS) as u32,
                        n_rows.div_ceil(GV_ROWS) as u32,
                        1,
                    ),
                    block_dim: (32 * GV_WARPS as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &ty, &o, &wp, &qp, &dp, &sp, &width, &n_out, &nr, &acc, &pf0, &pn0, &pf1, &pn1,
                ],
            ),
            Layout::Native => self.launch(
                "matmul_q8",
                generic,
                &[&o, &wp, &rb, &ty, &qp, &dp, &sp, &width, &n_out, &nr, &acc],
            ),
        }
    }

    /// The tensor-core kernel for `w` on `n_rows` rows of the current pass, when one applies, with its tile (rows,
    /// outputs): in a prefill pass of more than [`MMQ_MIN_ROWS`] rows the prefill matmul (mmq.cu, its own float
    /// order); else, from [`G16_MIN_ROWS`] rows, the decode-path block kernel (gemv16.cu, the GEMV's bits).
    fn tensor_core_kernel(
        &self,
        w: &DWeight,
        n_rows: usize,
    ) -> Option<(&'static str, usize, usize)> {
        if w.layout != Layout::Gemv || !w.cols.is_multiple_of(256) {
            return None;
        }
        if self.mmq_rows(n_rows) {
            let k8 = self.uses_k8(w, n_rows);
            return match w.ty {
                GgmlType::Q4_K => Some((if k8 { "mmq_q4_k8" } else { "mmq_q4_k" }, 64, 64)),
                GgmlType::Q6_K => Some((if k8 { "mmq_q6_k8" } else { "mmq_q6_k" }, 64, 64)),
                GgmlType::Q8_0 => Some(("mmq_q8_0", 64, 64)),
                _ => None,
            };
        }
        if !self.opts.block_mma || n_rows < G16_MIN_ROWS {
            return None;
        }
        let k8 = self.uses_k8(w, n_rows);
        match w.ty {
            GgmlType::Q4_K if k8 => Some(("gemv16_k8", 16, 32)),
            GgmlType::Q4_K => Some(("gemv16_q4k", 16, 8)),
            GgmlType::Q6_K if k8 => Some(("gemv16_k8", 16, 32)),
            GgmlType::Q6_K => Some(("gemv16_q6k", 16, 8)),
            GgmlType::Q8_0 if k8 => Some(("gemv16_q8d", 16, 16)),
            GgmlType::Q8_0 => Some(("gemv16_q8_0", 16, 8)),
            _ => None,
        }
    }

    /// The grouped tensor-core expert kernel (moe.cu) for the experts of `w` in a prefill pass of `n_rows` rows:
    /// the prefill kernel [`Device::tensor_core_kernel`] picks for such a matrix, over tiles of one expert's slots.
    fn moe_mmq_kernel(&self, w: &DWeight, n_rows: usize) -> Option<&'static str> {
        if w.layout != Layout::Gemv || !w.cols.is_multiple_of(256) || !self.mmq_rows(n_rows) {
            return None;
        }
        match w.ty {
            GgmlType::Q4_K if self.uses_k8(w, n_rows) => Some("moe_mmq_q4_k8"),
            GgmlType::Q4_K => Some("moe_mmq_q4_k"),
            GgmlType::Q6_K if self.uses_k8(w, n_rows) => Some("moe_mmq_q6_k8"),
            GgmlType::Q6_K => Some("moe_mmq_q6_k"),
            GgmlType::Q8_0 => Some("moe_mmq_q8_0"),
            _ => None,
        }
    }

    /// `outs[i][r] = ws[i] · x[r]` for weights reading the same activations (Q/K/V, gate/up). With the fused ops
    /// on, the weights that take the same job kernel share one launch (up to three a launch): the GEMV's when they
    /// take no tensor-core kernel, else the K8 block kernel or a pipelined prefill kernel (so Q and K share one
    /// even where V has another type); any other weight gets its own matmul. Each output has the bits of its
    /// own [`Device::matmul`].
    pub fn matmul_many(
        &self,
        outs: &mut [&mut DBuf],
        ws: &[&DWeight],
        x: &DBuf,
        n_rows: usize,
    ) -> Result<()> {
        let cols = ws.first().map(|w| w.cols).unwrap_or(0);
        // On cuBLAS, the activations are rounded to bf16 once for all the weights.
        let bf16_blas = |w: &DWeight| {
            self.blas_weight(w, n_rows)
                .is_some_and(|(_, t)| t == cudaDataType::CUDA_R_16BF)
        };
        if !ws.is_empty()
            && outs.len() == ws.len()
            && ws.iter().all(|w| w.cols == cols && bf16_blas(w))
        {
            for (o, w) in outs.iter().zip(ws) {
                self.check_many_output(o, w, x, n_rows)?;
            }
            self.take_prefetch(); // cuBLAS issues none
            let xb = self.dense_input(x, n_rows * cols)?;
            for (o, w) in outs.iter().zip(ws) {
                if self.skipped(weight_role(&w.name)) {
                    continue;
                }
                if let Some(bw) = self.blas_weight(w, n_rows) {
                    let op = self.ptr(&o.data);
                    self.gemm_dense(op, bw, xb, w.rows, cols, n_rows, false, &w.name)?;
                }
            }
            return Ok(());
        }
        let joinable = self.opts.fused
            && !self.opts.reference
            && outs.len() == ws.len()
            && ws
                .iter()
                .all(|w| w.layout == Layout::Gemv && w.cols == cols);
        // Each weight's job kernel and tile (rows, outputs), if it has one.
        let job_kernel = |w: &DWeight| -> Option<(&'static str, (usize, usize))> {
            if !joinable || self.blas_weight(w, n_rows).is_some() {
                return None;
            }
            match self.tensor_core_kernel(w, n_rows) {
                None => Some((
                    match (self.uses_k8(w, n_rows), n_rows == 1) {
                        (false, true) => "gemv3_r1",
                        (false, false) => "gemv3_r8",
                        (true, true) => "gemv3_k8_r1",
                        (true, false) => "gemv3_k8_r8",
                    },
                    (GV_ROWS, GV_WARPS),
                )),
                Some((k, r, o)) if takes_jobs(k) => Some((k, (r, o))),
                Some(_) => None,
            }
        };
        let kinds: Vec<_> = ws.iter().map(|w| job_kernel(w)).collect();
        let mut done = vec![false; ws.len()];
        for i in 0..ws.len() {
            if done[i] {
                continue;
            }
            let group: Vec<usize> = match kinds[i] {
                Some(_) => (i..ws.len())
                    .filter(|&j| !done[j] && kinds[j] == kinds[i])
                    .take(3)
                    .collect(),
                None => vec![i],
            };
            for &j in &group {
                done[j] = true;
            }
            let (kernel, tile) = match kinds[i] {
                Some(k) if group.len() > 1 => k,
                _ => {
                    self.matmul(outs[i], ws[i], x, n_rows, false)?;
                    continue;
                }
            };
            for &j in &group {
                self.check_many_output(outs[j], ws[j], x, n_rows)?;
            }
            if n_rows == 0 || self.skipped(weight_role(&ws[i].name)) {
                continue;
            }
            // One activation format for the group (its kernel's name says which).
            let act = self.activations(x, n_rows * cols, self.uses_k8(ws[i], n_rows))?;
            let jobs: Vec<_> = group
                .iter()
                .map(|&j| {
                    (
                        self.gemv_type_id(ws[j], n_rows),
                        self.ptr(&outs[j].data),
                        self.ptr(&ws[j].data),
                        ws[j].rows,
                    )
                })
                .collect();
            self.launch_jobs(kernel, &jobs, (x, act), cols, n_rows, false, tile)?;
        }
        Ok(())
    }

    /// [`Device::matmul_many`]'s shape check of one weight and its output, which is about to be overwritten.
    fn check_many_output(&self, o: &DBuf, w: &DWeight, x: &DBuf, n_rows: usize) -> Result<()> {
        self.check(
            "matmul",
            x.len() >= n_rows * w.cols && o.len() >= n_rows * w.rows,
            || format!("'{}' [{} x {}] on {n_rows} rows", w.name, w.rows, w.cols),
        )?;
        o.invalidate();
        Ok(())
    }

    /// Launches a job kernel (`gemv3_*`, [`takes_jobs`]) over up to three weights `(type id, out, weight, rows)`
    /// that read the same activations (`x` and its shadow pointers): each weight's tiles of `tile.1` outputs, one
    /// after the other along grid x (its first tile at `b1` / `b2`), activation rows in tiles of `tile.0` along
    /// grid y. The K8 block launches take their kernel and tile from [`k8_block_kernel`].
    #[allow(clippy::too_many_arguments)]
    fn launch_jobs(
        &self,
        kernel: &'static str,
        jobs: &[(i32, u64, u64, usize)],
        (x, (qp, dp, sp)): (&DBuf, (u64, u64, u64)),
        cols: usize,
        n_rows: usize,
        accumulate: bool,
        (tile_rows, tile_outs): (usize, usize),
    ) -> Result<()> {
        let tiles = |outs: usize| -> usize {
            jobs.iter().map(|j| j.3.div_ceil(outs)).sum::<usize>() * n_rows.div_ceil(tile_rows)
        };
        let (kernel, tile_outs) = if kernel == "gemv16_k8" {
            k8_block_kernel(&self.opts, self.sm_count, n_rows, tiles)
        } else if kernel == "gemv16_q8d" && self.opts.block_n8 && n_rows <= 8 {
            ("gemv16_q8d_n8", tile_outs)
        } else {
            (kernel, tile_outs)
        };
        // A K8 block kernel built to read packed code sums gets their pointer for the sums.
        let block = kernel.starts_with("gemv16_k8");
        let (qp, dp, sp) = if self.b16_packed && block {
            self.quantize(x, n_rows * cols, true, true)?
        } else {
            (qp, dp, sp)
        };
        let blocks: Vec<usize> = jobs.iter().map(|j| j.3.div_ceil(tile_outs)).collect();
        let b1 = blocks[0] as i32;
        let b2 = (blocks[0] + blocks.get(1).copied().unwrap_or(0)) as i32;
        let total: usize = blocks.iter().sum();
        let job = |i: usize| -> (i32, u64, u64, i32) {
            jobs.get(i)
                .map_or((0, 0, 0, 0), |&(t, o, w, n)| (t, o, w, n as i32))
        };
        let (t0, o0, w0, n0) = job(0);
        let (t1, o1, w1, n1) = job(1);
        let (t2, o2, w2, n2) = job(2);
        let [(pf0, pn0), (pf1, pn1)] = self.take_prefetch();
        let threads = match kernel {
            "gemv16_k8" | "gemv16_k8_o16" => 32 * crate::compile::b16_warps(),
            _ => 128, // gemv16_k8d, gemv16_q8d and their one-tile forms among them
        };
        self.launch(
            kernel,
            LaunchConfig {
                grid_dim: (total as u32, n_rows.div_ceil(tile_rows) as u32, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                &qp,
                &dp,
                &sp,
                &(cols as i32),
                &(n_rows as i32),
                &(accumulate as i32),
                &b1,
                &b2,
                &t0,
                &o0,
                &w0,
                &n0,
                &t1,
                &o1,
                &w1,
                &n1,
                &t2,
                &o2,
                &w2,
                &n2,
                &pf0,
                &pn0,
                &pf1,
                &pn1,
            ],
        )
    }

    /// Row-wise RMSNorm of `n_rows × width` rows of `x` into `out`, times `w` (`width` values). With the fused
    /// kernels on and `width % 32 == 0`, also writes `out`'s Q8 shadow.
    pub fn rms_norm(
        &self,
        out: &mut DBuf,
        x: &DBuf,
        w: &DBuf,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.check(
            "rms_norm",
            out.len() >= n_rows * width && x.len() >= n_rows * width && w.len() >= width,
            || {
                format!(
                    "{n_rows} rows of {width}: output {} / input {} / weight {}",
                    out.len(),
                    x.len(),
                    w.len()
                )
            },
        )?;
        out.invalidate();
        if n_rows == 0 {
            return Ok(());
        }
        let (o, xp, wp) = (self.ptr(&out.data), self.ptr(&x.data), self.ptr(&w.data));
        let cfg = grid(n_rows as u32, 1, ROW_THREADS);
        if self.opts.fused && width.is_multiple_of(32) {
            let k8 = self.fused_k8(out, n_rows * width, width);
            let ((qp, dp, sp), q8) = self.q8_ptrs(out, k8);
            let (kq, kd, ks, kp) = self.k8_ptrs(out, k8);
            // A few rows (decode, a verify block): one block per 256 elements of a row (bits unchanged).
            let parts = if n_rows <= MMQ_MIN_ROWS {
                width.div_ceil(256)
            } else {
                1
            };
            self.launch(
                "rms_norm_q8",
                LaunchConfig {
                    grid_dim: (n_rows as u32, parts as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &o,
                    &qp,
                    &dp,
                    &sp,
                    &kq,
                    &kd,
                    &ks,
                    &kp,
                    &xp,
                    &wp,
                    &(width as i32),
                    &eps,
                ],
            )?;
            if q8 {
                out.q8_valid.store(n_rows * width, Ordering::Relaxed);
            }
            if k8 {
                self.k8_written(out, n_rows * width);
            }
            return Ok(());
        }
        self.launch("rms_norm", cfg, &[&o, &xp, &wp, &(width as i32), &eps])
    }

    /// [`Device::rms_norm`] in place (QK-norm: rows are tokens × heads, `width` the head dimension).
    pub fn rms_norm_inplace(
        &self,
        x: &mut DBuf,
        w: &DBuf,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.check(
            "rms_norm",
            x.len() >= n_rows * width && w.len() >= width,
            || {
                format!(
                    "{n_rows} rows of {width}: input {} / weight {}",
                    x.len(),
                    w.len()
                )
            },
        )?;
        x.invalidate();
        if n_rows == 0 {
            return Ok(());
        }
        let (xp, wp) = (self.ptr(&x.data), self.ptr(&w.data));
        self.launch(
            "rms_norm",
            grid(n_rows as u32, 1, ROW_THREADS),
            &[&xp, &xp, &wp, &(width as i32), &eps],
        )
    }

    /// Rotates `n_heads` heads in each of the pass's `n_rows` rows in place (positions from the pass metadata).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut DBuf,
        n_rows: usize,
        n_heads: usize,
        head_dim: usize,
        theta: f32,
        freq_scale: f32,
        neox: bool,
    ) -> Result<()> {
        self.check(
            "rope",
            x.len() >= n_rows * n_heads * head_dim && head_dim.is_multiple_of(2),
            || format!("{n_rows} rows of {n_heads}x{head_dim} in {}", x.len()),
        )?;
        x.invalidate();
        if n_rows == 0 {
            return Ok(());
        }
        let [_, _, pp, _] = self.meta_ptrs();
        let xp = self.ptr(&x.data);
        self.launch(
            "rope",
            grid(n_rows as u32, 1, ROW_THREADS),
            &[
                &xp,
                &pp,
                &(n_heads as i32),
                &(head_dim as i32),
                &theta,
                &freq_scale,
                &(neox as i32),
            ],
        )
    }

    /// `out = silu(gate) * up` over `n` elements (with the fused kernels, also `out`'s Q8 shadow).
    pub fn swiglu(&self, out: &mut DBuf, gate: &DBuf, up: &DBuf, n: usize) -> Result<()> {
        self.check(
            "swiglu",
            out.len() >= n && gate.len() >= n && up.len() >= n,
            || format!("{n} elements"),
        )?;
        out.invalidate();
        if n == 0 {
            return Ok(());
        }
        let (o, g, u) = (
            self.ptr(&out.data),
            self.ptr(&gate.data),
            self.ptr(&up.data),
        );
        if self.opts.fused && n.is_multiple_of(32) {
            let k8 = self.fused_k8(out, n, n);
            let ((qp, dp, sp), q8) = self.q8_ptrs(out, k8);
            let (kq, kd, ks, kp) = self.k8_ptrs(out, k8);
            self.launch(
                "swiglu_q8",
                grid((n / 32).div_ceil(8) as u32, 1, 256),
                &[&o, &qp, &dp, &sp, &kq, &kd, &ks, &kp, &g, &u, &(n as i64)],
            )?;
            if q8 {
                out.q8_valid.store(n, Ordering::Relaxed);
            }
            if k8 {
                self.k8_written(out, n);
            }
            return Ok(());
        }
        self.launch(
            "swiglu",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&o, &g, &u, &(n as i64)],
        )
    }

    /// `x += y` over `n` elements.
    pub fn add(&self, x: &mut DBuf, y: &DBuf, n: usize) -> Result<()> {
        self.check("add", x.len() >= n && y.len() >= n, || {
            format!("{n} elements")
        })?;
        x.invalidate();
        if n == 0 {
            return Ok(());
        }
        let (xp, yp) = (self.ptr(&x.data), self.ptr(&y.data));
        self.launch(
            "add_inplace",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&xp, &yp, &(n as i64)],
        )
    }

    /// `dst[offset..offset + n] = src[..n]`.
    pub fn copy(&self, dst: &mut DBuf, offset: usize, src: &DBuf, n: usize) -> Result<()> {
        self.check("copy", dst.len() >= offset + n && src.len() >= n, || {
            format!("{n} elements at {offset} into {}", dst.len())
        })?;
        dst.invalidate();
        if n == 0 {
            return Ok(());
        }
        let (d, s) = (self.ptr(&dst.data) + 4 * offset as u64, self.ptr(&src.data));
        self.launch(
            "copy_f32",
            grid(n.div_ceil(256) as u32, 1, 256),
            &[&d, &s, &(n as i64)],
        )
    }

    /// Rows of `width` elements: `dst[dst_at + r·dst_stride ..][..width] = src[src_at + r·src_stride ..][..width]`
    /// for `r < rows`. `src` may belong to another [`Device`] on the same GPU (a target's tapped hidden states
    /// going to its drafter's features): the copy runs on this device's stream, so the caller must have waited for
    /// the work that wrote `src`, and must not let it be rewritten before this stream has passed the copy.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_rows(
        &self,
        dst: &mut DBuf,
        dst_at: usize,
        dst_stride: usize,
        src: &DBuf,
        src_at: usize,
        src_stride: usize,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let end = |at: usize, stride: usize| at + rows.saturating_sub(1) * stride + width;
        self.check(
            "copy_rows",
            rows == 0
                || (rows <= 65_535 // the grid's y dimension
                    && end(dst_at, dst_stride) <= dst.len()
                    && end(src_at, src_stride) <= src.len()),
            || {
                format!(
                    "{rows} rows of {width}: into {} at {dst_at} (stride {dst_stride}), from {} at {src_at} \
                     (stride {src_stride})",
                    dst.len(),
                    src.len()
                )
            },
        )?;
        dst.invalidate();
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let (d, s) = (
            self.ptr(&dst.data) + 4 * dst_at as u64,
            self.ptr(&src.data) + 4 * src_at as u64,
        );
        self.launch(
            "copy_rows_f32",
            grid(width.div_ceil(256) as u32, rows as u32, 256),
            &[
                &d,
                &(dst_stride as i64),
                &s,
                &(src_stride as i64),
                &(width as i32),
            ],
        )
    }

    /// `out[i] = x[logit_rows[i]]` for the pass's rows that want logits (rows of `width`).
    pub fn gather_rows(&self, out: &mut DBuf, x: &DBuf, width: usize) -> Result<()> {
        let (n, max) = {
            let m = self.lock(&self.meta);
            let cap = m.cap;
            let max = m.host[3 * cap..3 * cap + m.n_logits]
                .iter()
                .copied()
                .max()
                .unwrap_or(0) as usize;
            (m.n_logits, max)
        };
        self.check(
            "gather_rows",
            out.len() >= n * width && (n == 0 || x.len() >= (max + 1) * width),
            || format!("{n} rows (max {max}) of {width}"),
        )?;
        out.invalidate();
        if n == 0 {
            return Ok(());
        }
        let [_, _, _, rp] = self.meta_ptrs();
        let (o, xp) = (self.ptr(&out.data), self.ptr(&x.data));
        self.launch(
            "gather_rows",
            grid(n as u32, 1, ROW_THREADS),
            &[&o, &xp, &rp, &(width as i32)],
        )
    }

    /// Index of the maximum of each of `n_rows` rows of `width` (lowest on ties; see `argmax_part` in ops.cu).
    pub fn argmax(&self, x: &DBuf, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        self.check("argmax", x.len() >= n_rows * width, || {
            format!("{n_rows} rows of {width}")
        })?;
        if n_rows == 0 {
            return Ok(Vec::new());
        }
        // Parts of at least 2,048 elements (8 a thread), at most 128 (a Qwen3 row: 75 parts).
        let parts = width.div_ceil(2048).clamp(1, 128);
        let need = n_rows * (1 + 2 * parts);
        let mut out = self.lock(&self.argmax_out);
        if out.len() < need {
            *out = self
                .stream
                .alloc_zeros::<i32>(need.next_power_of_two())
                .map_err(drv("allocating argmax output"))?;
        }
        // [the rows' answers | each part's best value (f32 bits) | its index]
        let o = self.ptr(&*out);
        let (pv, pi) = (o + 4 * n_rows as u64, o + 4 * (n_rows * (1 + parts)) as u64);
        let xp = self.ptr(&x.data);
        self.launch(
            "argmax_part",
            grid(n_rows as u32, parts as u32, 256),
            &[&pv, &pi, &xp, &(width as i32)],
        )?;
        self.launch(
            "argmax_final",
            grid(n_rows as u32, 1, 32),
            &[&o, &pv, &pi, &(parts as i32)],
        )?;
        let mut h = vec![0i32; n_rows];
        self.stream
            .memcpy_dtoh(&out.slice(..n_rows), &mut h)
            .map_err(drv("reading argmax"))?;
        drop(out);
        self.synchronize()?;
        Ok(h.into_iter().map(|v| v as u32).collect())
    }

    /// Checks an attention call against the pass metadata and the cache.
    #[allow(clippy::too_many_arguments)]
    fn attention_checks(
        &self,
        out: &DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &DKv,
        layer: usize,
        n: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<()> {
        let (n_layer, n_slots, slot_ctx, kv_dim) = kv.dims;
        let m = self.lock(&self.meta);
        let bad_row = m
            .rows
            .iter()
            .take(n)
            .find(|&&(s, p)| s >= n_slots || p >= slot_ctx)
            .copied();
        self.check(
            "attention",
            layer < n_layer
                && m.rows.len() >= n
                && kv_dim == n_head_kv * head_dim
                && n_head_kv > 0
                && n_head.is_multiple_of(n_head_kv)
                && head_dim <= 256
                && head_dim.is_multiple_of(2)
                && bad_row.is_none()
                && q.len() >= n * n_head * head_dim
                && out.len() >= n * n_head * head_dim
                && k.len() >= n * kv_dim
                && v.len() >= n * kv_dim,
            || format!("layer {layer}, {n} rows (bad row {bad_row:?}), heads {n_head}/{n_head_kv}x{head_dim}, cache {:?}", kv.dims),
        )
    }

    /// Stores each pass row's k/v at its `(slot, pos)` of `layer`, then attention of each row's query over
    /// positions `0..=pos` of its slot (q and k already normalised and rotated).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        n: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
    ) -> Result<()> {
        self.attention_visible(
            out, q, k, v, kv, layer, n, n_head, n_head_kv, head_dim, scale, 0,
        )
    }

    /// [`Device::attention`] with every row attending to positions `0..visible` of its slot instead of
    /// `0..=pos` (`visible` 0: causal). `visible` must be the last row's position + 1 (the kernels read it from
    /// the pass metadata, so a captured pass replays with the current span).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_visible(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        k: &DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        n: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
        visible: usize,
    ) -> Result<()> {
        self.attention_checks(out, q, k, v, kv, layer, n, n_head, n_head_kv, head_dim)?;
        self.visible_check(kv, n, visible)?;
        out.invalidate();
        if n == 0 {
            return Ok(());
        }
        self.kv_append(kv, k, v, layer, n)?;
        self.attend(
            out, q, kv, layer, n, n_head, n_head_kv, head_dim, scale, visible, None,
        )
    }

    /// Stores each pass row's k/v (`n` rows) at its `(slot, pos)` of `layer`, with no attention.
    pub fn kv_store(&self, kv: &mut DKv, k: &DBuf, v: &DBuf, layer: usize, n: usize) -> Result<()> {
        self.kv_store_check(kv, k, v, layer, n)?;
        if n == 0 {
            return Ok(());
        }
        self.kv_append(kv, k, v, layer, n)
    }

    /// [`Device::kv_store`]'s argument checks: the layer, the pass's rows inside the cache, whole rows of K/V.
    fn kv_store_check(&self, kv: &DKv, k: &DBuf, v: &DBuf, layer: usize, n: usize) -> Result<()> {
        let (n_layer, n_slots, slot_ctx, kv_dim) = kv.dims;
        let m = self.lock(&self.meta);
        let bad = m
            .rows
            .iter()
            .take(n)
            .find(|&&(s, p)| s >= n_slots || p >= slot_ctx)
            .copied();
        let have = m.rows.len();
        drop(m);
        self.check(
            "kv_store",
            layer < n_layer
                && have >= n
                && bad.is_none()
                && k.len() >= n * kv_dim
                && v.len() >= n * kv_dim,
            || {
                format!(
                    "layer {layer}, {n} rows (bad row {bad:?}), cache {:?}",
                    kv.dims
                )
            },
        )
    }

    /// With `visible` > 0 (a block attending to `0..visible`), that the span fits the slot and ends at the last
    /// row's position + 1 with no row past it.
    fn visible_check(&self, kv: &DKv, n: usize, visible: usize) -> Result<()> {
        if visible == 0 {
            return Ok(());
        }
        let (_, _, slot_ctx, _) = kv.dims;
        let m = self.lock(&self.meta);
        let late = m.rows.iter().take(n).find(|&&(_, p)| p >= visible).copied();
        let last = n
            .checked_sub(1)
            .and_then(|i| m.rows.get(i))
            .map(|&(_, p)| p + 1);
        drop(m);
        self.check(
            "attention",
            visible <= slot_ctx && late.is_none() && last == Some(visible),
            || format!("{visible} visible positions of a {slot_ctx}-position slot (last row ends at {last:?}, row {late:?})"),
        )
    }

    /// [`Device::kv_store`] of keys that first take their per-head norm (`k_norm`, with `a.eps`) and RoPE at each
    /// row's position (`a`'s; `k` is rotated in place): `attn_prep`'s key heads alone, one launch (a DFlash
    /// drafter's context rows).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_prep(
        &self,
        kv: &mut DKv,
        k: &mut DBuf,
        v: &DBuf,
        layer: usize,
        n: usize,
        a: &AttnShape,
        k_norm: Option<&DBuf>,
    ) -> Result<()> {
        let (_, _, _, kv_dim) = kv.dims;
        self.check(
            "kv_prep",
            a.n_head_kv * a.head_dim == kv_dim
                && a.head_dim <= 256
                && k_norm.is_none_or(|w| w.len() >= a.head_dim),
            || {
                format!(
                    "{} KV heads of {} for a cache of {kv_dim} a position",
                    a.n_head_kv, a.head_dim
                )
            },
        )?;
        self.kv_store_check(kv, k, v, layer, n)?;
        k.invalidate();
        if n == 0 {
            return Ok(());
        }
        let (kp, vp) = (self.ptr(&k.data), self.ptr(&v.data));
        let kn = k_norm.map_or(0u64, |w| self.ptr(&w.data));
        // The key heads alone: no query heads.
        let keys = AttnShape { n_head: 0, ..*a };
        self.launch_prep(kv, [0, kp, vp], [0, kn], layer, n, &keys)
    }

    /// The `attn_prep` launch over the pass's `n` rows: `a.n_head` query heads of `q` and the key heads of `k`
    /// (`qkv`: device pointers) normed by `norms` (0: none) and rotated in place, the keys and `v` into the cache.
    fn launch_prep(
        &self,
        kv: &DKv,
        [qp, kp, vp]: [u64; 3],
        [qn, kn]: [u64; 2],
        layer: usize,
        n: usize,
        a: &AttnShape,
    ) -> Result<()> {
        let (_, n_slots, slot_ctx, _) = kv.dims;
        let [_, sp, pp, _] = self.meta_ptrs();
        let (kc, vc) = (self.ptr(&kv.k), self.ptr(&kv.v));
        // Prefill rows: 4 heads of a row a block (one RoPE table for them, fuller multiprocessors than 18,432
        // one-warp blocks at 512 rows); a few rows keep a block per head, spread over more multiprocessors.
        let warps = if n > MMQ_MIN_ROWS { 4 } else { 1 };
        self.launch(
            "attn_prep",
            grid(
                n as u32,
                (a.n_head + a.n_head_kv).div_ceil(warps) as u32,
                32 * warps as u32,
            ),
            &[
                &qp,
                &kp,
                &vp,
                &kc,
                &vc,
                &qn,
                &kn,
                &sp,
                &pp,
                &(layer as i32),
                &(n_slots as i32),
                &(slot_ctx as i32),
                &(a.n_head as i32),
                &(a.n_head_kv as i32),
                &(a.head_dim as i32),
                &a.eps,
                &a.theta,
                &a.freq_scale,
                &(a.neox as i32),
                &(kv.f16 as i32),
            ],
        )
    }

    /// The `kv_append` launch of [`Device::kv_store`] and [`Device::attention`] (arguments already checked).
    fn kv_append(&self, kv: &mut DKv, k: &DBuf, v: &DBuf, layer: usize, n: usize) -> Result<()> {
        let (_, n_slots, slot_ctx, kv_dim) = kv.dims;
        let [_, sp, pp, _] = self.meta_ptrs();
        let (kc, vc, kp, vp) = (
            self.ptr(&kv.k),
            self.ptr(&kv.v),
            self.ptr(&k.data),
            self.ptr(&v.data),
        );
        let (li, ns, sc, kd, f16) = (
            layer as i32,
            n_slots as i32,
            slot_ctx as i32,
            kv_dim as i32,
            kv.f16 as i32,
        );
        self.launch(
            "kv_append",
            grid(n as u32, 1, ROW_THREADS),
            &[&kc, &vc, &kp, &vp, &sp, &pp, &li, &ns, &sc, &kd, &f16],
        )
    }

    /// QK-norm (when `norms` are given), RoPE, KV append and attention of the pass's `n` rows in two to three
    /// kernels; `q` and `k` are rotated in place. The output's Q8 shadow is written too. `visible` > 0: every
    /// row attends to `0..visible`, as in [`Device::attention_visible`] (a DFlash drafter's block).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_fused(
        &self,
        out: &mut DBuf,
        q: &mut DBuf,
        k: &mut DBuf,
        v: &DBuf,
        kv: &mut DKv,
        layer: usize,
        n: usize,
        a: &AttnShape,
        norms: Option<(&DBuf, &DBuf)>,
        visible: usize,
    ) -> Result<()> {
        let (n_head, n_head_kv, head_dim) = (a.n_head, a.n_head_kv, a.head_dim);
        self.attention_checks(out, q, k, v, kv, layer, n, n_head, n_head_kv, head_dim)?;
        self.visible_check(kv, n, visible)?;
        if let Some((qn, kn)) = norms {
            self.check(
                "attention",
                qn.len() >= head_dim && kn.len() >= head_dim,
                || {
                    format!(
                        "QK-norm weights of {} / {} for head_dim {head_dim}",
                        qn.len(),
                        kn.len()
                    )
                },
            )?;
        }
        out.invalidate();
        q.invalidate();
        k.invalidate();
        if n == 0 {
            return Ok(());
        }
        let (qp, kp, vp) = (self.ptr(&q.data), self.ptr(&k.data), self.ptr(&v.data));
        let (qn, kn) = match norms {
            Some((qn, kn)) => (self.ptr(&qn.data), self.ptr(&kn.data)),
            None => (0u64, 0u64),
        };
        // A causal pass of a few rows on the split kernel preps inside it (attn_split's `prep`): one launch fewer a
        // layer.
        let few = n == 1 || (self.opts.prep_rows_in_split && n <= self.prep_max_rows);
        if few
            && visible == 0
            && self.opts.prep_in_split
            && self.split_path(kv, n_head / n_head_kv, head_dim).is_some()
        {
            let prep = Prep {
                k: kp,
                v: vp,
                q_norm: qn,
                k_norm: kn,
                eps: a.eps,
                theta: a.theta,
                freq_scale: a.freq_scale,
                neox: a.neox as i32,
            };
            return self.attend(
                out,
                q,
                kv,
                layer,
                n,
                n_head,
                n_head_kv,
                head_dim,
                a.scale,
                0,
                Some(prep),
            );
        }
        self.launch_prep(kv, [qp, kp, vp], [qn, kn], layer, n, a)?;
        self.attend(
            out, q, kv, layer, n, n_head, n_head_kv, head_dim, a.scale, visible, None,
        )
    }

    /// Query heads a split kernel block takes of a KV head's `group`, and that kernel: with `attn_head_split`
    /// and the pass's rows short ([`HEAD_SPLIT_MAX_POS`]), the fewest that divide the group and write whole
    /// `unit`-element activation blocks (a head's bits do not depend on the heads beside it), else the group.
    fn split_heads(&self, group: usize, head_dim: usize, unit: usize) -> (usize, &'static str) {
        let fewest = (1..group).find(|&h| {
            group.is_multiple_of(h)
                && (h * head_dim).is_multiple_of(unit)
                && split_kernel(h, head_dim).is_some()
        });
        match fewest.filter(|_| self.opts.attn_head_split && self.spans() != Spans::Long) {
            Some(h) => (h, split_kernel(h, head_dim).unwrap_or_default()),
            None => (group, split_kernel(group, head_dim).unwrap_or_default()),
        }
    }

    /// The split-KV decode kernel for `group` query heads a KV head of `head_dim` over `kv`, when it is used.
    fn split_path(&self, kv: &DKv, group: usize, head_dim: usize) -> Option<&'static str> {
        split_kernel(group, head_dim).filter(|_| self.opts.split_kv && kv.f16)
    }

    /// The attention proper over a cache that already holds the rows' K/V (with `prep`, a one-row pass on the
    /// split kernel: the row's QK-norm, RoPE and K/V append are done by that kernel); `visible` > 0 overrides
    /// every row's causal span `0..=pos` with `0..visible`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        out: &mut DBuf,
        q: &DBuf,
        kv: &DKv,
        layer: usize,
        n: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
        visible: usize,
        prep: Option<Prep>,
    ) -> Result<()> {
        let vis: i32 = if visible > 0 { -1 } else { 0 };
        let (_, n_slots, slot_ctx, _) = kv.dims;
        self.reserve_attention(n, n_head, head_dim, slot_ctx)?;
        let [_, sp, pp, _] = self.meta_ptrs();
        let wsp = self.ptr(&*self.lock(&self.ws));
        let (o, qp, kc, vc) = (
            self.ptr(&out.data),
            self.ptr(&q.data),
            self.ptr(&kv.k),
            self.ptr(&kv.v),
        );
        let f16 = kv.f16 as i32;
        let (li, ns, sc) = (layer as i32, n_slots as i32, slot_ctx as i32);
        let (nh, nkv, hd) = (n_head as i32, n_head_kv as i32, head_dim as i32);
        let group = n_head / n_head_kv;
        let flash = match head_dim {
            64 => Some("attn_flash_h64"),
            128 => Some("attn_flash_h128"),
            _ => None,
        };
        let prefill = self.lock(&self.meta).prefill;
        if let (true, true, true, 0, Some(kernel)) = (
            self.opts.flash_attn && !self.opts.reference,
            prefill && n > MMQ_MIN_ROWS,
            kv.f16,
            visible,
            flash,
        ) {
            out.invalidate();
            return self.launch(
                kernel,
                LaunchConfig {
                    grid_dim: (n.div_ceil(64) as u32, n_head as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &o,
                    &qp,
                    &kc,
                    &vc,
                    &sp,
                    &pp,
                    &(n as i32),
                    &li,
                    &ns,
                    &sc,
                    &nh,
                    &nkv,
                    &scale,
                ],
            );
        }
        if self.split_path(kv, group, head_dim).is_none() {
            return self.launch(
                "attn_decode",
                grid(n_head as u32, n as u32, 128),
                &[
                    &o, &qp, &kc, &vc, &wsp, &sp, &pp, &li, &ns, &sc, &nh, &nkv, &hd, &scale, &f16,
                    &vis,
                ],
            );
        }
        let n_splits = attn_splits(slot_ctx);
        let nsp = n_splits as i32;
        let fused = self.opts.fused && head_dim.is_multiple_of(32);
        let width = n_head * head_dim;
        let k8 = fused
            && matches!(head_dim, 64 | 128 | 256)
            && n_head.is_multiple_of(256 / head_dim)
            && self.fused_k8(out, n * width, width);
        let ((xq, xd, xs), q8) = match self.q8_ptrs(out, k8) {
            (ptrs, true) if fused => (ptrs, true),
            _ => ((0, 0, 0), false),
        };
        let (kq, kd, ks, kp) = self.k8_ptrs(out, k8);
        // Rows whose span is one split finished by the split kernel (its block writes its query heads in passes
        // of 128 elements: whole K8 blocks when it writes them, or with `attn_head_split` on a GPU with clusters,
        // half of one in each block of a cluster of 2); the merge kernel skips them. Clusters only when every row
        // is one split: at position 4,000 the 8B's attention over a block per query head took 19.6 µs against
        // 12.9 with two heads a block (each block re-reads its KV head's K/V), and its tg128 @ d4096 was 0.963x
        // the speed with the head split off.
        let pairs =
            k8 && self.clusters && self.opts.attn_head_split && self.spans() == Spans::OneSplit;
        let unit = if k8 && !pairs { 256 } else { 128 };
        let (heads, split) = self.split_heads(group, head_dim, unit);
        let block = heads * head_dim;
        let pair = pairs && block == 128;
        // (A group that is not split, e.g. 3 heads of 128 for long rows, may fill no whole K8 blocks.)
        let direct = self.opts.split_direct
            && fused
            && block.is_multiple_of(128)
            && (!k8 || pair || block.is_multiple_of(256));
        let pair = (direct && pair) as i32;
        let (split_out, direct) = if direct { (o, 1i32) } else { (0, 0) };
        let (sxq, sxd, sxs, skq, skd, sks, skp) = if direct == 1 {
            (xq, xd, xs, kq, kd, ks, kp)
        } else {
            (0, 0, 0, 0, 0, 0, 0)
        };
        let pr = prep.unwrap_or_default();
        let on = if prep.is_some() { n as i32 } else { 0 };
        self.launch_clusters(
            split,
            LaunchConfig {
                grid_dim: (
                    (n_head / heads) as u32,
                    n as u32,
                    self.split_grid(n_splits) as u32,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            },
            1 + pair as u32,
            &[
                &wsp,
                &qp,
                &kc,
                &vc,
                &sp,
                &pp,
                &li,
                &ns,
                &sc,
                &nh,
                &nkv,
                &scale,
                &nsp,
                &vis,
                &split_out,
                &sxq,
                &sxd,
                &sxs,
                &skq,
                &skd,
                &sks,
                &skp,
                &pr.k,
                &pr.v,
                &pr.q_norm,
                &pr.k_norm,
                &pr.eps,
                &pr.theta,
                &pr.freq_scale,
                &pr.neox,
                &on,
                &pair,
            ],
        )?;
        // With every row finished by the split kernel the merge would only wait and return: a graph node and a
        // kernel boundary in the decode chain, left out.
        if direct == 0 || self.spans() != Spans::OneSplit {
            let merge_heads = if k8 { 256 / head_dim } else { 1 };
            self.launch(
                "attn_merge",
                grid(
                    (n_head / merge_heads) as u32,
                    n as u32,
                    (merge_heads * head_dim) as u32,
                ),
                &[
                    &o, &xq, &xd, &xs, &kq, &kd, &ks, &kp, &wsp, &pp, &nh, &hd, &nsp, &vis, &direct,
                ],
            )?;
        }
        if q8 {
            out.q8_valid.store(n * width, Ordering::Relaxed);
        }
        if k8 {
            self.k8_written(out, n * width);
        }
        Ok(())
    }
}

/// Where a pass's rows sit, for the attention's launches: every row's span within one split (the merge kernel
/// has nothing to do), every row below [`HEAD_SPLIT_MAX_POS`], or not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spans {
    OneSplit,
    Short,
    Long,
}

/// What `attn_prep` would take, for a split kernel that preps a pass of a few rows itself (device pointers; norms
/// 0 when the model has no QK-norm).
#[derive(Clone, Copy, Default)]
struct Prep {
    k: u64,
    v: u64,
    q_norm: u64,
    k_norm: u64,
    eps: f32,
    theta: f32,
    freq_scale: f32,
    neox: i32,
}

/// The K8 block kernel and its outputs a block for a launch of `n_rows` rows that has `tiles(outs)` blocks at
/// `outs` outputs a block: the direct-fragment kernel ([`Options::block_direct`]; its one-tile form for up to 8
/// rows, [`Options::block_n8`]); or, without it, the 4-warp kernel, on 16-output tiles for launches of few
/// 32-output tiles (under two a multiprocessor: at 16 rows the 8B's Q/K/V, o-proj and down, every matmul of the
/// 0.6B; [`Options::block_tile16`]) and 32-output tiles otherwise.
fn k8_block_kernel(
    opts: &Options,
    sm_count: usize,
    n_rows: usize,
    tiles: impl Fn(usize) -> usize,
) -> (&'static str, usize) {
    if opts.block_direct && opts.block_n8 && n_rows <= 8 {
        ("gemv16_k8d_n8", 16)
    } else if opts.block_direct {
        ("gemv16_k8d", 16)
    } else if opts.block_tile16 && tiles(32) < 2 * sm_count {
        ("gemv16_k8_o16", 16)
    } else {
        ("gemv16_k8", 32)
    }
}

/// Tensor-core kernels that take up to three weights a launch (JOB_ARGS in common.cu).
fn takes_jobs(kernel: &str) -> bool {
    matches!(
        kernel,
        "gemv16_k8" | "gemv16_q8d" | "mmq_q4_k8" | "mmq_q6_k8" | "mmq_q8_0"
    )
}

/// The split-KV attention kernel for `group` query heads per KV head of `head_dim` (`attn_split_g<G>_h<D>` in
/// attention.cu), if there is one.
fn split_kernel(group: usize, head_dim: usize) -> Option<&'static str> {
    Some(match (group, head_dim) {
        (1, 64) => "attn_split_g1_h64",
        (2, 64) => "attn_split_g2_h64",
        (3, 64) => "attn_split_g3_h64",
        (4, 64) => "attn_split_g4_h64",
        (8, 64) => "attn_split_g8_h64",
        (1, 128) => "attn_split_g1_h128",
        (2, 128) => "attn_split_g2_h128",
        (3, 128) => "attn_split_g3_h128",
        (4, 128) => "attn_split_g4_h128",
        (8, 128) => "attn_split_g8_h128",
        _ => return None,
    })
}

/// `KILN_CUDA_TIMING_SKIP`: comma-separated kernel names or weight roles (`attn_q`, `attn_output`, `ffn_gate`,
/// `ffn_down`, `output`: [`weight_role`]) whose launches are left out, each matching by prefix. A step's time
/// without a launch, against the time with it, is what that launch costs in place (inside a graph, overlapped
/// with its neighbours by programmatic dependent launch), which a profiler timing kernels alone does not give.
/// A profiling aid only: the outputs are wrong.
fn timing_skip_patterns() -> Vec<String> {
    skip_list(&std::env::var("KILN_CUDA_TIMING_SKIP").unwrap_or_default())
}

fn skip_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn timing_skips(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| name.starts_with(p.as_str()))
}

/// A weight's tensor name without its layer and suffix: `blk.3.attn_output.weight` → `attn_output`.
fn weight_role(name: &str) -> &str {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    match name.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, role)| role),
        None => name,
    }
}

fn grid(x: u32, y: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel argument passed by value (scalars; device pointers as `u64`): the driver reads it through a pointer
/// at launch.
trait Arg {
    fn param(&self) -> *mut c_void;
}

macro_rules! arg_impl {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn param(&self) -> *mut c_void {
                self as *const $t as *mut c_void
            }
        }
    )*};
}
arg_impl!(u64, i64, i32, f32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k8_block_launches_pick_their_kernel() {
        // A 132-multiprocessor card, 16 rows (one row tile): the 8B's launches by their outputs.
        let tiles_of = |outputs: usize| move |outs: usize| outputs.div_ceil(outs);
        let pick =
            |opts: &Options, outputs: usize| k8_block_kernel(opts, 132, 16, tiles_of(outputs));
        let on = Options::default();
        // The direct kernel takes every launch, in 16-output blocks; its one-tile form up to 8 rows.
        for outputs in [2048, 4096, 6144, 24576] {
            assert_eq!(pick(&on, outputs), ("gemv16_k8d", 16));
            for (rows, kernel) in [
                (4, "gemv16_k8d_n8"),
                (8, "gemv16_k8d_n8"),
                (9, "gemv16_k8d"),
            ] {
                assert_eq!(k8_block_kernel(&on, 132, rows, tiles_of(outputs)).0, kernel);
            }
            let two = Options {
                block_n8: false,
                ..Options::default()
            };
            assert_eq!(
                k8_block_kernel(&two, 132, 4, tiles_of(outputs)).0,
                "gemv16_k8d"
            );
        }
        // Without it: the 4-warp kernel, 16-output tiles for launches under two 32-output tiles a
        // multiprocessor (o-proj and down: 128 blocks of 32), 32 for gate/up (768).
        let four = Options {
            block_direct: false,
            ..Options::default()
        };
        assert_eq!(pick(&four, 4096), ("gemv16_k8_o16", 16));
        assert_eq!(pick(&four, 24576), ("gemv16_k8", 32));
        let plain = Options {
            block_tile16: false,
            ..four
        };
        assert_eq!(pick(&plain, 4096), ("gemv16_k8", 32));
    }

    #[test]
    fn repack_moves_scales_after_the_quants() {
        // Two Q8_0 blocks: d = [1, 2] / [3, 4], quants 10.. / 50..
        let mut b = vec![1u8, 2];
        b.extend(10..42u8);
        b.extend([3u8, 4]);
        b.extend(50..82u8);
        let r = repack(GgmlType::Q8_0, &b);
        assert_eq!(&r[..32], &(10..42u8).collect::<Vec<_>>()[..]);
        assert_eq!(&r[32..64], &(50..82u8).collect::<Vec<_>>()[..]);
        assert_eq!(&r[64..], &[1, 2, 3, 4]);
        // Q6_K: the 208 quant/scale bytes stay, the trailing f16 d moves to the end.
        let q6: Vec<u8> = (0..420u32).map(|i| (i % 251) as u8).collect();
        let r = repack(GgmlType::Q6_K, &q6);
        assert_eq!(&r[..208], &q6[..208]);
        assert_eq!(&r[208..416], &q6[210..418]);
        assert_eq!(&r[416..], &[q6[208], q6[209], q6[418], q6[419]]);
        // Q4_1: d and m (4 bytes) after all nibbles.
        let q41: Vec<u8> = (0..40u8).collect();
        let r = repack(GgmlType::Q4_1, &q41);
        assert_eq!(&r[..16], &q41[4..20]);
        assert_eq!(&r[16..32], &q41[24..40]);
        assert_eq!(&r[32..], &[0, 1, 2, 3, 20, 21, 22, 23]);
    }

    #[test]
    fn experts_are_repacked_one_by_one() {
        // Two experts of two Q8_0 blocks each: expert e's scales right after expert e's quants.
        let block = |d: u8, q0: u8| {
            let mut b = vec![d, d + 1];
            b.extend(q0..q0 + 32);
            b
        };
        let expert = |d: u8, q0: u8| [block(d, q0), block(d + 2, q0 + 100)].concat();
        let bytes = [expert(1, 10), expert(5, 50)].concat();
        let r = repack_parts(GgmlType::Q8_0, &bytes, 2);
        assert_eq!(r.len(), bytes.len());
        assert_eq!(&r[..68], &repack(GgmlType::Q8_0, &bytes[..68])[..]);
        assert_eq!(&r[64..68], &[1, 2, 3, 4]);
        assert_eq!(&r[68..100], &(50..82u8).collect::<Vec<_>>()[..]);
        assert_eq!(&r[132..], &[5, 6, 7, 8]);
        // One part is the plain repack.
        assert_eq!(
            repack_parts(GgmlType::Q8_0, &bytes, 1),
            repack(GgmlType::Q8_0, &bytes)
        );
    }

    #[test]
    fn q6_k_buffers_end_on_a_whole_word() {
        // Three Q6_K blocks: 630 bytes, and the last d's aligned word needs two more.
        let q6: Vec<u8> = (0..630u32).map(|i| (i % 251) as u8).collect();
        let r = repack_parts(GgmlType::Q6_K, &q6, 1);
        assert_eq!(r.len(), 632);
        assert_eq!(&r[..630], &repack(GgmlType::Q6_K, &q6)[..]);
        assert_eq!(repack_parts(GgmlType::Q6_K, &q6[..420], 1).len(), 420);
    }

    #[test]
    fn fitted_split_grid_covers_every_row_of_the_pass() {
        // A row of n_pos positions uses ceil(n_pos / chunk) splits.
        let used = |n_pos: usize, n_splits: usize, min: usize| {
            n_pos.div_ceil(attn_chunk(n_pos, n_splits, min))
        };
        for ctx in [1usize, 64, 200, 4096, 4097, 32768, 131072] {
            let n = attn_splits(ctx);
            for min in [64, 128, 256] {
                for longest in [1, 2, 127, 128, 129, 300, 1000, 4096, 8193, 32768, 131072] {
                    let longest = longest.min(ctx);
                    let g = fit_splits(longest, n, min);
                    assert!(
                        g <= n && (g.is_power_of_two() || g == n),
                        "{ctx}/{longest}: {g} of {n}"
                    );
                    // The graph key holds the grid for the most splits a slot has: this grid follows from it.
                    assert_eq!(
                        g,
                        fit_splits(longest, ATTN_MAX_SPLITS, min).min(n),
                        "{ctx}/{longest}"
                    );
                    // Every shorter row of the pass fits the grid too.
                    for n_pos in [1, longest / 2 + 1, longest] {
                        assert!(
                            used(n_pos, n, min) <= g,
                            "{ctx}/{n_pos} (longest {longest}): grid {g}"
                        );
                    }
                }
            }
        }
        // A short context in a large slot: 3 blocks' worth (a grid of 4), not the slot's 64 (4,096) or 128.
        assert_eq!(fit_splits(300, attn_splits(4096), 128), 4);
        assert_eq!(fit_splits(1, attn_splits(32768), 128), 1);
        assert_eq!(fit_splits(32768, attn_splits(32768), 128), 128);
    }

    #[test]
    fn splits_cover_every_span() {
        let chunk = |n_pos: usize, n_splits: usize| attn_chunk(n_pos, n_splits, 128);
        for ctx in [1usize, 40, 64, 65, 512, 4096, 4097, 33000, 131072] {
            let n = attn_splits(ctx);
            assert!((1..=ATTN_MAX_SPLITS).contains(&n), "{ctx}: {n} splits");
            for n_pos in [1, ctx / 3 + 1, ctx.saturating_sub(1).max(1), ctx] {
                let c = chunk(n_pos, n);
                assert!(c % 64 == 0 && c * n >= n_pos, "{ctx}/{n_pos}");
                assert!(n_pos.div_ceil(c) <= n, "{ctx}/{n_pos}: too many splits");
            }
        }
    }

    #[test]
    fn timing_skips_match_kernels_and_weight_roles() {
        assert_eq!(weight_role("blk.3.attn_output.weight"), "attn_output");
        assert_eq!(weight_role("blk.12.ffn_gate.weight"), "ffn_gate");
        assert_eq!(weight_role("output.weight"), "output");
        assert_eq!(weight_role("token_embd.weight"), "token_embd");
        let p = vec!["attn_split".to_string(), "output".to_string()];
        assert!(timing_skips(&p, "attn_split_g4_h128"));
        assert!(timing_skips(&p, weight_role("output.weight")));
        assert!(!timing_skips(&p, weight_role("blk.0.attn_output.weight")));
        assert!(!timing_skips(&p, "attn_merge"));
        assert!(!timing_skips(&[], "attn_split_g4_h128"));
    }
}
