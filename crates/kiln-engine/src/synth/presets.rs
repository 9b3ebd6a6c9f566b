//! Model shapes for `kiln synth`: the published configurations of real models, and tiny ones for tests.
//!
//! Real shapes (from the models' published `config.json`):
//! - Qwen3-0.6B: 28 layers, hidden 1024, intermediate 3072, 16 heads / 8 KV heads, head_dim 128, vocab 151936,
//!   tied embeddings, rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 40960.
//! - Qwen3-8B: 36 layers, hidden 4096, intermediate 12288, 32 / 8 heads, head_dim 128, untied, otherwise as 0.6B.
//! - Qwen3-30B-A3B: 48 layers, hidden 2048, intermediate 6144 (dense, unused by the MoE blocks), 32 / 4 heads,
//!   head_dim 128, 128 experts, 8 used (normalised top-k), moe_intermediate_size 768, untied.
//! - SmolLM2-135M: llama, 30 layers, hidden 576, intermediate 1536, 9 / 3 heads (head_dim 64), vocab 49152, tied,
//!   rope_theta 100000, rms_norm_eps 1e-5, max_position_embeddings 8192.
//!
//! Tiny presets (`tiny`, one per architecture) exist for tests: hidden 256 (so the K-quants' 256-element blocks
//! fit every row), a head_dim that differs from hidden / heads (as in real Qwen3), GQA, and a 512-entry
//! vocabulary served by the built-in byte-level tokenizer (see `tokenizer.rs`): with the real 151k vocabulary
//! the embedding alone would dwarf the model and make every test fixture large.

use super::{Arch, SynthError};

/// A model shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// Preset name as given to `--preset`.
    pub name: &'static str,
    /// Architecture.
    pub arch: Arch,
    /// Decoder layers.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Dense FFN intermediate size (for MoE: the config's `intermediate_size`, written as metadata only).
    pub n_ff: usize,
    /// Attention heads.
    pub n_head: usize,
    /// KV heads (GQA).
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Rows of the embedding / LM head.
    pub vocab: usize,
    /// Experts per MoE layer (0 for dense models).
    pub n_expert: usize,
    /// Experts routed per token.
    pub n_expert_used: usize,
    /// Intermediate size of one expert.
    pub expert_ff: usize,
    /// Whether the LM head reuses the embedding (no `output.weight`).
    pub tied: bool,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Training context length (metadata).
    pub ctx_len: usize,
}

impl Preset {
    /// Whether this is a test-sized preset (built-in tokenizer by default).
    pub fn is_tiny(&self) -> bool {
        self.name == "tiny"
    }
}

const QWEN3_VOCAB: usize = 151_936;

// A table row reads best with positional fields; a builder would triple the table.
#[allow(clippy::too_many_arguments)]
const fn dense(
    name: &'static str,
    arch: Arch,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    heads: (usize, usize, usize),
    vocab: usize,
    tied: bool,
    rope_base: f32,
    rms_eps: f32,
    ctx_len: usize,
) -> Preset {
    Preset {
        name,
        arch,
        n_layer,
        n_embd,
        n_ff,
        n_head: heads.0,
        n_head_kv: heads.1,
        head_dim: heads.2,
        vocab,
        n_expert: 0,
        n_expert_used: 0,
        expert_ff: 0,
        tied,
        rope_base,
        rms_eps,
        ctx_len,
    }
}

const fn moe(base: Preset, n_expert: usize, n_expert_used: usize, expert_ff: usize) -> Preset {
    Preset {
        n_expert,
        n_expert_used,
        expert_ff,
        ..base
    }
}

/// Every preset, by architecture.
pub const PRESETS: &[Preset] = &[
    dense(
        "0.6b",
        Arch::Qwen3,
        28,
        1024,
        3072,
        (16, 8, 128),
        QWEN3_VOCAB,
        true,
        1e6,
        1e-6,
        40960,
    ),
    dense(
        "8b",
        Arch::Qwen3,
        36,
        4096,
        12288,
        (32, 8, 128),
        QWEN3_VOCAB,
        false,
        1e6,
        1e-6,
        40960,
    ),
    dense(
        "tiny",
        Arch::Qwen3,
        3,
        256,
        512,
        (4, 2, 64),
        512,
        false,
        1e6,
        1e-6,
        4096,
    ),
    moe(
        dense(
            "30b-a3b",
            Arch::Qwen3Moe,
            48,
            2048,
            6144,
            (32, 4, 128),
            QWEN3_VOCAB,
            false,
            1e6,
            1e-6,
            40960,
        ),
        128,
        8,
        768,
    ),
    moe(
        dense(
            "tiny",
            Arch::Qwen3Moe,
            2,
            256,
            512,
            (4, 2, 64),
            512,
            false,
            1e6,
            1e-6,
            4096,
        ),
        8,
        2,
        256,
    ),
    dense(
        "smollm2-135m",
        Arch::Llama,
        30,
        576,
        1536,
        (9, 3, 64),
        49152,
        true,
        1e5,
        1e-5,
        8192,
    ),
    dense(
        "tiny",
        Arch::Llama,
        2,
        256,
        512,
        (4, 2, 64),
        512,
        true,
        1e4,
        1e-5,
        4096,
    ),
];

/// The preset `name` of `arch`.
pub fn find_preset(arch: Arch, name: &str) -> Result<&'static Preset, SynthError> {
    PRESETS
        .iter()
        .find(|p| p.arch == arch && p.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| SynthError::UnknownPreset {
            arch: arch.name(),
            name: name.to_owned(),
            available: PRESETS
                .iter()
                .filter(|p| p.arch == arch)
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}
