//! The kill-switch registry: every optimization that replaces a simpler path is on by default and has a
//! `KILN_NO_<NAME>=1` environment variable that falls back to the simpler path, so before/after is one binary.
//!
//! The environment is read ONCE, by [`Flags::from_env`], into a [`Flags`] value that is passed down to whatever
//! needs it; besides the settings in [`NON_FLAG_VARS`] (tests, tools, the CUDA tuning and timing aids), nothing
//! else in kiln reads `KILN_*` variables. [`REGISTRY`] is the one table of flags (`kiln info --flags` prints it).
//! User choices (KV cache type, context size, threads) are CLI options, not flags.

/// One kill switch: its environment variable, what it disables, and its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlagInfo {
    /// The environment variable (`KILN_NO_…`); set to `1` to disable the optimization.
    pub env: &'static str,
    /// What setting it disables, and what runs instead.
    pub disables: &'static str,
    /// Whether the optimization is on when the variable is unset.
    pub default_on: bool,
}

/// Every kill switch kiln knows. Adding a flag: a row here, a field in [`Flags`], one line in [`Flags::from_lookup`].
pub const REGISTRY: &[FlagInfo] = &[
    FlagInfo {
        env: "KILN_NO_QUANT_ACT",
        disables: "8-bit quantized activations in CPU matmuls; every matmul runs with f32 activations against \
                   dequantized weights (the exact reference mode)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_SIMD",
        disables: "SIMD dot-product kernels; the scalar reference kernels run instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_AVX512",
        disables: "CPU: AVX-512 (VNNI) kernels; the AVX2 ones run instead (to measure or test an AVX2 machine's \
                   paths on an AVX-512 one)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_GEMM",
        disables: "CPU: the tiled Q4_K/Q6_K prefill kernel (weight rows packed 8 at a time, 8 activation rows per \
                   call; used where the repacked K-quant kernel is not: AVX2 prefill, KILN_NO_CPU_REPACK_K); \
                   every row runs the row-by-row dot kernel instead (same bits, slower)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_REPACK",
        disables: "CPU (AVX2, AVX-512): Q4_0/Q4_1/Q8_0 weights repacked at first use into groups of 8 interleaved rows, \
                   multiplied with any number of activation rows without horizontal sums (its own float order, \
                   the same for 1 or many rows); the row-by-row dot kernels on the GGUF bytes instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_ATTN_PREFETCH",
        disables: "CPU (AVX2): the attention prefetches each row's K and V head rows 8 positions ahead (a verify \
                   pass reads the cache from memory); no software prefetch (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_REPACK_K",
        disables: "CPU (AVX2, AVX-512 VNNI): Q4_K/Q5_K/Q6_K weights repacked when the model is placed into \
                   groups of 16 interleaved rows (4-bit quants kept packed), multiplied with any number of \
                   activation rows (AVX2: decode only, prefill stays on the tiled or row kernels); same bits as \
                   the row kernels; the row kernels (decode, Q5_K prefill) and the tiled kernel (Q4_K/Q6_K \
                   prefill) on the GGUF bytes instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_POOL_PASS",
        disables: "CPU: a forward pass (target or drafter) run on one of the thread pool's threads, so that its \
                   parallel regions start inside the pool; each region is handed to the pool from the calling \
                   thread and waited for instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CPU_ONE_REGION",
        disables: "CPU decode: Q/K/V and gate/up matmuls share one activation quantization and one thread-pool \
                   region; one region per matmul instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_GEMV",
        disables: "CUDA: weights repacked at load and the 16-byte-load GEMV kernels; the generic byte-load \
                   matmul kernel runs on the GGUF layout instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_FUSE",
        disables: "CUDA: fused kernels (norm/SwiGLU/attention writing Q8 activations, QK-norm+RoPE+KV append, \
                   residual add inside the matmul); one kernel per op instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_SPLIT_KV",
        disables: "CUDA: split-KV (flash-decoding) attention; one block per head and row over all positions",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_SPLIT_DIRECT",
        disables: "CUDA: split-KV attention finishes a row whose span is one split in the split kernel (the merge \
                   kernel skips it); the merge kernel takes every row instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_ATTN_FIT_GRID",
        disables: "CUDA: the split-KV attention's grid has the splits the pass's longest span uses (rounded up to \
                   a power of two), not the slot's whole split count (up to 128 a row, most returning at once when \
                   the context is short) (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_GEMV_STAGE",
        disables: "CUDA: the one-row K-quant GEMV stages its activation row (4,096 to 12,288 wide) in shared memory \
                   once a block; every warp reads it from global memory instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_EARLY_WEIGHTS",
        disables: "CUDA: the K-quant GEMVs issue their first weight loads before waiting for the kernel before them; \
                   after the wait instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREP_IN_SPLIT",
        disables: "CUDA: a one-row pass's QK-norm, RoPE and K/V append done inside the split-KV attention kernel; \
                   by a kernel of their own before it instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREP_ROWS_IN_SPLIT",
        disables: "CUDA: with KILN_NO_CUDA_PREP_IN_SPLIT off, passes of 2 to 16 rows (a DFlash verify block, \
                   several slots decoding) prep inside the split-KV attention kernel too; by a kernel of their \
                   own before it instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_ATTN_HEAD_SPLIT",
        disables: "CUDA: a split-KV attention block takes the fewest query heads of a KV head that fill whole \
                   activation blocks (K8: half of one in each block of a 2-block cluster on sm_90+; 1 of the 8B's \
                   4 heads), so a short row's prep and epilogue spread over more multiprocessors; one block per \
                   KV head with all of its query heads instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREFILL_MMA",
        disables: "CUDA: int8 tensor-core matmul for prompt prefill (Q4_K/Q6_K/Q8_0, more than 16 rows); prefill \
                   rows go through the decode-path kernels instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREFILL_BLAS",
        disables: "CUDA: prompt prefill matmuls of 17+ rows on cuBLAS bf16 tensor cores against a bf16 copy of each \
                   quantized 2-D weight made at load (while device memory allows; reported at load); the int8 \
                   prefill kernel on the quantized weights instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_MOE_GATHER_QUANT",
        disables: "CUDA: MoE expert grouping gathers the tokens' quantized activations (quantized once a token) into \
                   expert order; the f32 rows gathered and quantized once a choice instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREFILL_BLAS_FLOAT",
        disables: "CUDA: prompt prefill matmuls of 17+ rows on F32 weights (the MoE router) as f32 cuBLAS GEMMs \
                   (no TF32), on BF16 weights as bf16 ones, and on F16 weights against a bf16 copy made at load; \
                   the one-block-per-output float kernel instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_BLOCK_MMA",
        disables: "CUDA: int8 tensor-core kernel for blocks of 4+ decode/verify rows (Q4_K/Q6_K/Q8_0; the GEMV's bits); \
                   the 8-row GEMV instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_BLOCK_DIRECT",
        disables: "CUDA: K8 block launches on the direct-fragment kernel (each lane loads its mma fragments from \
                   global memory into registers, no shared-memory stages; same bits); the 4-warp kernel that \
                   stages them",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_BLOCK_RING",
        disables: "CUDA: the direct K8 block kernel's weights copied by each warp into its own ring of \
                   shared-memory stages, several super-blocks ahead (same bits); one super-block ahead in registers",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_BLOCK_N8",
        disables: "CUDA: K8 block launches of at most 8 rows on the direct kernel built for one tile of 8 rows \
                   (half the tensor-core work of 16; same bits); the 16-row kernel for them too",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_BLOCK_TILE16",
        disables: "CUDA: with KILN_NO_CUDA_BLOCK_DIRECT, 16-output tiles of the 4-warp kernel for K8 block \
                   launches that would give the multiprocessors fewer than two 32-output tiles each (same bits); \
                   32-output tiles always",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_K8",
        disables: "CUDA: Q4_K/Q6_K matmuls (decode, block and prefill kernels) on Q8_K-style activations (a scale \
                   per 256, integer sums across a super-block, one float step per super-block); per-32 Q8 blocks instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PREFILL_K8",
        disables: "CUDA: the tensor-core prefill matmul reads Q4_K/Q6_K weights against K8 activations (integer sums \
                   across a super-block, the Q4_K min term as one more mma); per-32 Q8 blocks there instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_FLASH_ATTN",
        disables: "CUDA: flash attention on f16 tensor cores for prompt prefill (more than 16 rows, f16 KV cache); \
                   each prefill row runs the split-KV decode attention instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_MOE_GROUP",
        disables: "CUDA: MoE choices of several rows grouped by expert, each expert weight read once per 8 of them \
                   (same bits); one GEMV per choice instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_DEVICE_ARGMAX",
        disables: "greedy tokens chosen where the logits are (a GPU reads back 4 bytes a row); the logits are read \
                   back and the argmax taken on the host instead (same tokens)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_DRAFT_MARGINS",
        disables: "DFlash `--draft-max auto` on a host drafter: each round's drafts cut where the drafter's margins \
                   say the rest are unlikely to be accepted; the chooser's count alone decides (same output)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_DRAFT_HEAD_Q4",
        disables: "DFlash on a host drafter whose target head is 8 bits or wider: its proposals from a Q4_0 copy of \
                   the head (half the bytes a round), each draft row's 8 likeliest tokens scored again with the head \
                   itself (same output); the head itself over the whole vocabulary instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_DRAFT_PRUNE",
        disables: "DFlash on a host drafter: a proposing pass takes its last layer's attention queries, \
                   o-projection, FFN and final norm over the drafted rows only (the other rows as far as their K and \
                   V; same drafts); every block row through the whole drafter instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DRAFTER",
        disables: "CUDA: a DFlash drafter runs on its target's GPU; it runs on the host instead (the drafts the GPU \
                   gives with KILN_NO_CUDA_DRAFTER_BLAS)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DRAFTER_BLAS",
        disables: "CUDA: a DFlash drafter's matmuls on cuBLAS against bf16 weight copies, every row count (its \
                   proposals set only how many tokens are accepted, never which); the block kernels instead, and no copies",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DRAFTER_Q8",
        disables: "CUDA: a GPU drafter whose matrices are all Q8_0 multiplies its blocks of 4 to 16 rows on the \
                   Q8_0 direct block kernel (gemv16_q8d: the weights' own bytes, no bf16 copies); on cuBLAS \
                   against bf16 copies instead, as a drafter of other types",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DEVICE_TAPS",
        disables: "CUDA: a GPU drafter's context features are gathered on the device from its target's tapped \
                   hidden states (same GPU); read back to the host, reordered and uploaded again instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DRAFTER_FUSED_ATTN",
        disables: "CUDA: a GPU drafter's block takes QK-norm, RoPE and its K/V store in one launch before its \
                   attention (attn_prep), and its context rows k_norm, RoPE and the store in one (kv_prep); a \
                   launch each instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_DRAFT_HEAD_K8",
        disables: "CUDA: with KILN_NO_CUDA_DRAFTER_BLAS off, a GPU drafter's head (the target's) read quantized by \
                   the K8 block kernel when it is Q4_K/Q6_K (no bf16 copy); on cuBLAS like its layers instead",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_L2_PREFETCH",
        disables: "CUDA (sm_90+): GEMV and K8 direct block launches prefetch into L2 the weights of the matmul \
                   after the norms, attention or SwiGLU that follow them (up to L2PF_MB megabytes); no prefetch \
                   instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_PDL",
        disables: "CUDA (sm_90+): programmatic dependent launch, each kernel launched while the one before it \
                   runs and waiting for it on the device; launched after it instead (same bits)",
        default_on: true,
    },
    FlagInfo {
        env: "KILN_NO_CUDA_GRAPH",
        disables: "CUDA: each forward pass captured once as a CUDA graph and replayed; kernels launched one by one",
        default_on: true,
    },
];

/// The kill switches in effect, read once at start-up. `true` means the optimization is ON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags {
    /// Quantize activations to the weight's dot-product format (off: f32 activations, dequantized weights).
    pub quant_act: bool,
    /// Use the SIMD dot products (off: scalar reference kernels).
    pub simd: bool,
    /// CPU: AVX-512 kernels where the CPU has them (off: AVX2 at most).
    pub cpu_avx512: bool,
    /// CPU: the tiled Q4_K/Q6_K prefill kernel (off: row-by-row dot kernels, same bits).
    pub cpu_gemm: bool,
    /// CPU: Q4_0/Q4_1/Q8_0 weights repacked for the interleaved kernel.
    pub cpu_repack: bool,
    /// CPU: the attention's K/V rows prefetched ahead of the positions multiplied.
    pub cpu_attn_prefetch: bool,
    /// CPU: Q4_K/Q5_K/Q6_K weights repacked for the 16-row interleaved kernel.
    pub cpu_repack_k: bool,
    /// CPU: forward passes run on a pool thread.
    pub cpu_pool_pass: bool,
    /// CPU decode: weights reading the same input matmul'd in one thread-pool region.
    pub cpu_one_region: bool,
    /// CUDA: repacked weights and the 16-byte-load GEMV kernels.
    pub cuda_gemv: bool,
    /// CUDA: fused norm/SwiGLU/attention/residual kernels.
    pub cuda_fuse: bool,
    /// CUDA: split-KV attention.
    pub cuda_split_kv: bool,
    /// CUDA: rows of one split finished by the split-KV attention kernel.
    pub cuda_split_direct: bool,
    /// CUDA: a one-row pass's attention prep inside the split-KV kernel.
    pub cuda_prep_in_split: bool,
    /// CUDA: passes of a few rows prep inside the split kernel too.
    pub cuda_prep_rows_in_split: bool,
    /// CUDA: short rows' split-KV attention over blocks of fewer query heads (2-block clusters for K8).
    pub cuda_attn_head_split: bool,
    /// CUDA: the split attention's grid fitted to the pass's longest span.
    pub cuda_attn_fit_grid: bool,
    /// CUDA: the one-row K8 GEMV's activation row staged in shared memory.
    pub cuda_gemv_stage: bool,
    /// CUDA: the K8 GEMVs' first weight loads before the launch wait.
    pub cuda_early_weights: bool,
    /// CUDA: forward passes replayed as CUDA graphs.
    pub cuda_graph: bool,
    /// CUDA: programmatic dependent launch.
    pub cuda_pdl: bool,
    /// CUDA: GEMV launches prefetch later weights into L2.
    pub cuda_l2_prefetch: bool,
    /// CUDA: int8 tensor-core matmul for prefill passes.
    pub cuda_prefill_mma: bool,
    /// CUDA: int8 tensor-core kernel for blocks of decode/verify rows.
    pub cuda_block_mma: bool,
    /// CUDA: the direct-fragment K8 block kernel.
    pub cuda_block_direct: bool,
    /// CUDA: the direct K8 block kernel's per-warp weight ring.
    pub cuda_block_ring: bool,
    /// CUDA: the direct K8 block kernel's one-tile form for launches of at most 8 rows.
    pub cuda_block_n8: bool,
    /// CUDA: 16-output tiles for K8 block launches of few 32-output tiles.
    pub cuda_block_tile16: bool,
    /// CUDA: flash attention for prefill passes.
    pub cuda_flash_attn: bool,
    /// CUDA: K-quant matmuls on K8 activations.
    pub cuda_k8: bool,
    /// CUDA: the prefill kernel on K8 activations for Q4_K/Q6_K.
    pub cuda_prefill_k8: bool,
    /// CUDA: MoE choices grouped by expert.
    pub cuda_moe_group: bool,
    /// CUDA: MoE grouping gathers quantized activations.
    pub cuda_moe_gather_quant: bool,
    /// CUDA: prefill matmuls on cuBLAS against dense bf16 weight copies.
    pub cuda_prefill_blas: bool,
    /// CUDA: prefill matmuls on F32/BF16 weights on cuBLAS.
    pub cuda_prefill_blas_float: bool,
    /// Greedy tokens chosen by the backend where the logits are.
    pub device_argmax: bool,
    /// DFlash auto drafts: a host drafter's rounds cut by its drafts' margins.
    pub draft_margins: bool,
    /// DFlash: a host drafter proposes from a Q4_0 copy of a wide head, its candidates scored again exactly.
    pub draft_head_q4: bool,
    /// DFlash: a host drafter's proposing pass finishes its last layer on the drafted rows only.
    pub draft_prune: bool,
    /// CUDA: a DFlash drafter on its target's GPU.
    pub cuda_drafter: bool,
    /// CUDA: the drafter's matmuls on cuBLAS at every row count.
    pub cuda_drafter_blas: bool,
    /// CUDA: a GPU drafter's K-quant head on the K8 block kernel rather than cuBLAS.
    pub cuda_draft_head_k8: bool,
    /// CUDA: an all-Q8_0 GPU drafter's blocks on the Q8_0 direct block kernel rather than cuBLAS.
    pub cuda_drafter_q8: bool,
    /// CUDA: a GPU drafter's context features gathered on the device from the target's taps.
    pub cuda_device_taps: bool,
    /// CUDA: a GPU drafter's QK-norm, RoPE and K/V store in the fused attention prep.
    pub cuda_drafter_fused_attn: bool,
}

impl Default for Flags {
    /// Every optimization on, regardless of the environment.
    fn default() -> Self {
        Flags {
            quant_act: true,
            simd: true,
            cpu_avx512: true,
            cpu_gemm: true,
            cpu_repack: true,
            cpu_attn_prefetch: true,
            cpu_repack_k: true,
            cpu_pool_pass: true,
            cpu_one_region: true,
            cuda_gemv: true,
            cuda_fuse: true,
            cuda_split_kv: true,
            cuda_split_direct: true,
            cuda_prep_in_split: true,
            cuda_prep_rows_in_split: true,
            cuda_attn_head_split: true,
            cuda_attn_fit_grid: true,
            cuda_gemv_stage: true,
            cuda_early_weights: true,
            cuda_graph: true,
            cuda_pdl: true,
            cuda_l2_prefetch: true,
            cuda_prefill_mma: true,
            cuda_block_mma: true,
            cuda_block_direct: true,
            cuda_block_ring: true,
            cuda_block_n8: true,
            cuda_block_tile16: true,
            cuda_flash_attn: true,
            cuda_k8: true,
            cuda_prefill_k8: true,
            cuda_moe_group: true,
            cuda_moe_gather_quant: true,
            cuda_prefill_blas: true,
            cuda_prefill_blas_float: true,
            device_argmax: true,
            draft_margins: true,
            draft_head_q4: true,
            draft_prune: true,
            cuda_drafter: true,
            cuda_drafter_blas: true,
            cuda_draft_head_k8: true,
            cuda_drafter_q8: true,
            cuda_device_taps: true,
            cuda_drafter_fused_attn: true,
        }
    }
}

impl Flags {
    /// The exact reference configuration: every optimization off.
    pub fn reference() -> Self {
        Flags {
            quant_act: false,
            simd: false,
            cpu_avx512: false,
            cpu_gemm: false,
            cpu_repack: false,
            cpu_attn_prefetch: false,
            cpu_repack_k: false,
            cpu_pool_pass: false,
            cpu_one_region: false,
            cuda_gemv: false,
            cuda_fuse: false,
            cuda_split_kv: false,
            cuda_split_direct: false,
            cuda_prep_in_split: false,
            cuda_prep_rows_in_split: false,
            cuda_attn_head_split: false,
            cuda_attn_fit_grid: false,
            cuda_gemv_stage: false,
            cuda_early_weights: false,
            cuda_graph: false,
            cuda_pdl: false,
            cuda_l2_prefetch: false,
            cuda_prefill_mma: false,
            cuda_block_mma: false,
            cuda_block_direct: false,
            cuda_block_ring: false,
            cuda_block_n8: false,
            cuda_block_tile16: false,
            cuda_flash_attn: false,
            cuda_k8: false,
            cuda_prefill_k8: false,
            cuda_moe_group: false,
            cuda_moe_gather_quant: false,
            cuda_prefill_blas: false,
            cuda_prefill_blas_float: false,
            device_argmax: false,
            draft_margins: false,
            draft_head_q4: false,
            draft_prune: false,
            cuda_drafter: false,
            cuda_drafter_blas: false,
            cuda_draft_head_k8: false,
            cuda_drafter_q8: false,
            cuda_device_taps: false,
            cuda_drafter_fused_attn: false,
        }
    }

    /// Reads the process environment. Returns the flags and one warning per `KILN_*` variable that is not in
    /// [`REGISTRY`] or whose value is not `0`/`1` (a typo must not silently leave an optimization on).
    pub fn from_env() -> (Flags, Vec<String>) {
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
            .filter(|(k, _)| k.starts_with("KILN_"))
            .collect();
        Self::from_lookup(&vars)
    }

    /// [`Flags::from_env`] over an explicit list of `(name, value)` pairs (only `KILN_*` names are considered).
    pub fn from_lookup(vars: &[(String, String)]) -> (Flags, Vec<String>) {
        let mut flags = Flags::default();
        let mut warnings = Vec::new();
        for (name, value) in vars.iter().filter(|(k, _)| k.starts_with("KILN_")) {
            let Some(info) = REGISTRY.iter().find(|f| f.env == name) else {
                // Variables that configure tests or tools rather than kernels are not kill switches.
                if !NON_FLAG_VARS.contains(&name.as_str()) {
                    warnings.push(format!(
                        "unknown environment variable {name} ignored (`kiln info --flags` lists kiln's flags)"
                    ));
                }
                continue;
            };
            let disabled = match value.trim() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" | "" => false,
                other => {
                    warnings.push(format!("{name}={other:?} is not 0 or 1; ignored"));
                    continue;
                }
            };
            match info.env {
                "KILN_NO_QUANT_ACT" => flags.quant_act = !disabled,
                "KILN_NO_SIMD" => flags.simd = !disabled,
                "KILN_NO_CPU_AVX512" => flags.cpu_avx512 = !disabled,
                "KILN_NO_CPU_GEMM" => flags.cpu_gemm = !disabled,
                "KILN_NO_CPU_REPACK" => flags.cpu_repack = !disabled,
                "KILN_NO_CPU_REPACK_K" => flags.cpu_repack_k = !disabled,
                "KILN_NO_CPU_ATTN_PREFETCH" => flags.cpu_attn_prefetch = !disabled,
                "KILN_NO_CPU_POOL_PASS" => flags.cpu_pool_pass = !disabled,
                "KILN_NO_CPU_ONE_REGION" => flags.cpu_one_region = !disabled,
                "KILN_NO_CUDA_GEMV" => flags.cuda_gemv = !disabled,
                "KILN_NO_CUDA_FUSE" => flags.cuda_fuse = !disabled,
                "KILN_NO_CUDA_SPLIT_KV" => flags.cuda_split_kv = !disabled,
                "KILN_NO_CUDA_SPLIT_DIRECT" => flags.cuda_split_direct = !disabled,
                "KILN_NO_CUDA_PREP_IN_SPLIT" => flags.cuda_prep_in_split = !disabled,
                "KILN_NO_CUDA_PREP_ROWS_IN_SPLIT" => flags.cuda_prep_rows_in_split = !disabled,
                "KILN_NO_CUDA_ATTN_HEAD_SPLIT" => flags.cuda_attn_head_split = !disabled,
                "KILN_NO_CUDA_ATTN_FIT_GRID" => flags.cuda_attn_fit_grid = !disabled,
                "KILN_NO_CUDA_GEMV_STAGE" => flags.cuda_gemv_stage = !disabled,
                "KILN_NO_CUDA_EARLY_WEIGHTS" => flags.cuda_early_weights = !disabled,
                "KILN_NO_CUDA_GRAPH" => flags.cuda_graph = !disabled,
                "KILN_NO_CUDA_PDL" => flags.cuda_pdl = !disabled,
                "KILN_NO_CUDA_L2_PREFETCH" => flags.cuda_l2_prefetch = !disabled,
                "KILN_NO_CUDA_PREFILL_MMA" => flags.cuda_prefill_mma = !disabled,
                "KILN_NO_CUDA_BLOCK_MMA" => flags.cuda_block_mma = !disabled,
                "KILN_NO_CUDA_BLOCK_DIRECT" => flags.cuda_block_direct = !disabled,
                "KILN_NO_CUDA_BLOCK_RING" => flags.cuda_block_ring = !disabled,
                "KILN_NO_CUDA_BLOCK_N8" => flags.cuda_block_n8 = !disabled,
                "KILN_NO_CUDA_BLOCK_TILE16" => flags.cuda_block_tile16 = !disabled,
                "KILN_NO_CUDA_FLASH_ATTN" => flags.cuda_flash_attn = !disabled,
                "KILN_NO_CUDA_K8" => flags.cuda_k8 = !disabled,
                "KILN_NO_CUDA_PREFILL_K8" => flags.cuda_prefill_k8 = !disabled,
                "KILN_NO_CUDA_MOE_GROUP" => flags.cuda_moe_group = !disabled,
                "KILN_NO_CUDA_MOE_GATHER_QUANT" => flags.cuda_moe_gather_quant = !disabled,
                "KILN_NO_CUDA_PREFILL_BLAS" => flags.cuda_prefill_blas = !disabled,
                "KILN_NO_CUDA_PREFILL_BLAS_FLOAT" => flags.cuda_prefill_blas_float = !disabled,
                "KILN_NO_DEVICE_ARGMAX" => flags.device_argmax = !disabled,
                "KILN_NO_DRAFT_MARGINS" => flags.draft_margins = !disabled,
                "KILN_NO_DRAFT_HEAD_Q4" => flags.draft_head_q4 = !disabled,
                "KILN_NO_DRAFT_PRUNE" => flags.draft_prune = !disabled,
                "KILN_NO_CUDA_DRAFTER" => flags.cuda_drafter = !disabled,
                "KILN_NO_CUDA_DRAFTER_BLAS" => flags.cuda_drafter_blas = !disabled,
                "KILN_NO_CUDA_DRAFT_HEAD_K8" => flags.cuda_draft_head_k8 = !disabled,
                "KILN_NO_CUDA_DRAFTER_Q8" => flags.cuda_drafter_q8 = !disabled,
                "KILN_NO_CUDA_DEVICE_TAPS" => flags.cuda_device_taps = !disabled,
                "KILN_NO_CUDA_DRAFTER_FUSED_ATTN" => flags.cuda_drafter_fused_attn = !disabled,
                other => unreachable!("flag {other} is in REGISTRY but not handled here"),
            }
        }
        (flags, warnings)
    }
}

/// `KILN_*` variables that are not kill switches (settings of the server, tests and test tools; the CUDA kernel
/// constants of a tuning run, the launches left out to time a step, where the kernel check writes its cubins) and
/// therefore must not be warned about.
pub const NON_FLAG_VARS: &[&str] = &[
    "KILN_CUDA_DEFINES",
    "KILN_CUDA_TIMING_SKIP",
    "KILN_CUBIN_DIR",
    "KILN_API_KEY",
    "KILN_LOG",
    "KILN_TEST_ASSETS",
    "KILN_TEST_SEED",
    "KILN_BASE_URL",
    "KILN_SERVER_PID",
    "KILN_READ_TIMEOUT",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_all_on() {
        let (f, w) = Flags::from_lookup(&[]);
        assert_eq!(f, Flags::default());
        assert!(f.quant_act && f.simd);
        assert!(w.is_empty());
        assert!(REGISTRY.iter().all(|r| r.default_on));
    }

    #[test]
    fn kill_switches_disable() {
        let (f, w) =
            Flags::from_lookup(&vars(&[("KILN_NO_QUANT_ACT", "1"), ("KILN_NO_SIMD", "0")]));
        assert!(!f.quant_act);
        assert!(f.simd);
        assert!(w.is_empty());
    }

    #[test]
    fn unknown_and_malformed_are_warned() {
        let (f, w) = Flags::from_lookup(&vars(&[
            ("KILN_NO_QANT_ACT", "1"),
            ("KILN_NO_SIMD", "maybe"),
            ("KILN_TEST_ASSETS", "/x"),
            ("KILN_API_KEY", "secret"),
            ("KILN_CUDA_DEFINES", "-DGV_U=8"),
            ("KILN_CUDA_TIMING_SKIP", "attn_output"),
            ("PATH", "/bin"),
        ]));
        assert_eq!(f, Flags::default());
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("KILN_NO_QANT_ACT"));
        assert!(w[1].contains("KILN_NO_SIMD"));
    }

    #[test]
    fn every_registry_entry_is_handled() {
        for info in REGISTRY {
            let (f, _) = Flags::from_lookup(&vars(&[(info.env, "1")]));
            assert_ne!(f, Flags::default(), "{} changes nothing", info.env);
        }
    }
}
