//! Hyperparameters read from GGUF metadata (`{arch}.…` keys), shared by the three architectures.
//!
//! Every key that changes the arithmetic is either honoured or refused with an error: RoPE scaling types other
//! than "none"/"linear", partial rotary dimensions and llama3-style frequency factors are refused rather than
//! silently ignored.

use crate::error::{Error, Result};
use kiln_gguf::Metadata;

/// The architectures kiln has a model definition for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 2/3 without frequency factors): normal (interleaved-pair) RoPE.
    Llama,
    /// Qwen3 dense: QK-norm, NEOX RoPE.
    Qwen3,
    /// Qwen3 mixture of experts: Qwen3 attention, routed experts, no shared expert.
    Qwen3Moe,
}

impl Arch {
    /// The architecture named by `general.architecture`.
    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            other => Err(Error::UnknownArch(other.to_string())),
        }
    }

    /// The name used as the metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// The model's shape and numeric constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    /// Architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Dense FFN inner size (0 for MoE models).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Per-head dimension of queries and keys (and values: kiln requires them equal).
    pub head_dim: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub n_vocab: usize,
    /// Training context length.
    pub n_ctx_train: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Position multiplier from linear RoPE scaling (1.0 when unscaled).
    pub rope_freq_scale: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Experts (MoE only; 0 otherwise).
    pub n_expert: usize,
    /// Experts used per token (MoE only).
    pub n_expert_used: usize,
    /// Expert FFN inner size (MoE only).
    pub n_ff_exp: usize,
    /// Whether the top-k routing weights are renormalised to sum to one (MoE only).
    pub norm_topk: bool,
}

/// Reads a required integer key.
fn req(meta: &Metadata, key: &str) -> Result<usize> {
    match meta.opt_u64(key)? {
        Some(v) => usize::try_from(v).map_err(|_| Error::BadMetadata {
            key: key.to_string(),
            reason: format!("{v} does not fit in memory"),
        }),
        None => Err(Error::MissingKey {
            key: key.to_string(),
        }),
    }
}

fn opt(meta: &Metadata, key: &str) -> Result<Option<usize>> {
    Ok(meta.opt_u64(key)?.map(|v| v as usize))
}

fn positive(key: &str, v: usize) -> Result<usize> {
    if v == 0 {
        return Err(Error::BadMetadata {
            key: key.to_string(),
            reason: "must be positive".into(),
        });
    }
    Ok(v)
}

impl Hparams {
    /// Reads the hyperparameters of `arch` from `meta`. `n_vocab` comes from the embedding tensor's shape.
    pub fn from_gguf(arch: Arch, meta: &Metadata, n_vocab: usize) -> Result<Hparams> {
        let a = arch.name();
        let k = |s: &str| format!("{a}.{s}");
        let n_layer = positive(&k("block_count"), req(meta, &k("block_count"))?)?;
        let n_embd = positive(&k("embedding_length"), req(meta, &k("embedding_length"))?)?;
        let n_head = positive(
            &k("attention.head_count"),
            req(meta, &k("attention.head_count"))?,
        )?;
        let n_head_kv = positive(
            &k("attention.head_count_kv"),
            opt(meta, &k("attention.head_count_kv"))?.unwrap_or(n_head),
        )?;
        if n_head % n_head_kv != 0 {
            return Err(Error::BadMetadata {
                key: k("attention.head_count_kv"),
                reason: format!("{n_head_kv} does not divide the {n_head} query heads"),
            });
        }
        let head_dim = match opt(meta, &k("attention.key_length"))? {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(Error::BadMetadata {
                        key: k("attention.head_count"),
                        reason: format!("{n_head} heads do not divide embedding length {n_embd}"),
                    });
                }
                n_embd / n_head
            }
        };
        let head_dim = positive(&k("attention.key_length"), head_dim)?;
        if !head_dim.is_multiple_of(2) || head_dim > crate::cpu::MAX_HEAD_DIM {
            return Err(Error::BadMetadata {
                key: k("attention.key_length"),
                reason: format!(
                    "head dimension {head_dim} must be even and at most {}",
                    crate::cpu::MAX_HEAD_DIM
                ),
            });
        }
        if let Some(vd) = opt(meta, &k("attention.value_length"))? {
            if vd != head_dim {
                return Err(Error::Unsupported(format!(
                    "{a}.attention.value_length {vd} differs from key length {head_dim}"
                )));
            }
        }
        if let Some(rd) = opt(meta, &k("rope.dimension_count"))? {
            if rd != head_dim {
                return Err(Error::Unsupported(format!(
                    "partial rotary embedding ({a}.rope.dimension_count = {rd}, head dimension {head_dim})"
                )));
            }
        }
        let rope_theta = meta.opt_f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
        let rope_freq_scale = rope_scaling(meta, a)?;
        let rms_eps = meta
            .opt_f32(&k("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| Error::MissingKey {
                key: k("attention.layer_norm_rms_epsilon"),
            })?;
        let n_ctx_train = opt(meta, &k("context_length"))?.unwrap_or(0);

        let (n_ff, n_expert, n_expert_used, n_ff_exp, norm_topk) = match arch {
            Arch::Llama | Arch::Qwen3 => (
                positive(
                    &k("feed_forward_length"),
                    req(meta, &k("feed_forward_length"))?,
                )?,
                0,
                0,
                0,
                false,
            ),
            Arch::Qwen3Moe => {
                let n_expert = positive(&k("expert_count"), req(meta, &k("expert_count"))?)?;
                let used = positive(&k("expert_used_count"), req(meta, &k("expert_used_count"))?)?;
                if used > n_expert {
                    return Err(Error::BadMetadata {
                        key: k("expert_used_count"),
                        reason: format!("{used} exceeds the {n_expert} experts"),
                    });
                }
                let ff_exp = positive(
                    &k("expert_feed_forward_length"),
                    req(meta, &k("expert_feed_forward_length"))?,
                )?;
                if opt(meta, &k("expert_shared_count"))?.unwrap_or(0) > 0 {
                    return Err(Error::Unsupported(format!(
                        "{a} with shared experts ({a}.expert_shared_count)"
                    )));
                }
                // llama.cpp builds qwen3moe with normalised top-k weights (Qwen3-MoE's norm_topk_prob = true);
                // a file may say otherwise with expert_weights_norm.
                let norm = meta.opt_bool(&k("expert_weights_norm"))?.unwrap_or(true);
                (0, n_expert, used, ff_exp, norm)
            }
        };
        Ok(Hparams {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rope_theta,
            rope_freq_scale,
            rms_eps,
            n_expert,
            n_expert_used,
            n_ff_exp,
            norm_topk,
        })
    }
}

/// The position multiplier implied by `{arch}.rope.scaling.*`: 1.0 when absent or "none", 1/factor for "linear";
/// any other type (yarn, longrope, llama3 …) is refused.
fn rope_scaling(meta: &Metadata, a: &str) -> Result<f32> {
    let ty_key = format!("{a}.rope.scaling.type");
    let factor_key = format!("{a}.rope.scaling.factor");
    let factor = meta.opt_f32(&factor_key)?;
    // Old files carried only a linear scale.
    let old = meta.opt_f32(&format!("{a}.rope.scale_linear"))?;
    match meta.opt_str(&ty_key)? {
        None | Some("none") => {
            if let Some(s) = old.filter(|&s| s != 1.0) {
                return linear(&format!("{a}.rope.scale_linear"), s);
            }
            if let Some(f) = factor.filter(|&f| f != 1.0 && f != 0.0) {
                return Err(Error::Unsupported(format!(
                    "{factor_key} = {f} without a scaling type"
                )));
            }
            Ok(1.0)
        }
        Some("linear") => linear(&factor_key, factor.unwrap_or(1.0)),
        Some(other) => Err(Error::Unsupported(format!(
            "RoPE scaling type '{other}' ({ty_key}); kiln implements none and linear"
        ))),
    }
}

fn linear(key: &str, factor: f32) -> Result<f32> {
    if !(factor.is_finite() && factor > 0.0) {
        return Err(Error::BadMetadata {
            key: key.to_string(),
            reason: format!("scaling factor {factor} is not positive"),
        });
    }
    Ok(1.0 / factor)
}
