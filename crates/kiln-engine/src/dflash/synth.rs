//! Random-weight drafters in the z-lab format, for tests and efficiency measurements: `config.json` plus bf16
//! `model.safetensors`, every value from a seeded splitmix64 stream, so a drafter is reproducible byte for byte.

use crate::error::{Error, Result};
use safetensors::tensor::{serialize, TensorView};
use safetensors::Dtype;
use std::path::Path;

/// The shape of a random drafter.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftSpec {
    /// Hidden size (the target's).
    pub hidden: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Drafter layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Vocabulary (the target's).
    pub vocab: usize,
    /// Block size.
    pub block_size: usize,
    /// Target layers.
    pub num_target_layers: usize,
    /// Tapped target layers.
    pub target_layer_ids: Vec<usize>,
    /// Mask token id.
    pub mask_token_id: u32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Seed.
    pub seed: u64,
    /// Sliding-window layers: the window W and, per layer, whether it is a sliding layer (written as
    /// `use_sliding_window`, `sliding_window` and `layer_types`); none: every layer full attention.
    pub sliding: Option<(usize, Vec<bool>)>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` bf16 values: `center + U(-amp, amp)`.
fn values(state: &mut u64, n: usize, center: f32, amp: f32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        let u = (splitmix(state) >> 40) as f32 / (1u64 << 24) as f32;
        let v = center + amp * (2.0 * u - 1.0);
        out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
    }
    out
}

/// The shape of a drafter for the target GGUF at `target`, as z-lab builds them: the target's hidden size, FFN
/// width, heads and RoPE base, `n_layer` layers, `block_size`, taps by [`super::default_layer_ids`], and the
/// mask token `mask_token_id` (any id inside the target's embedding table).
pub fn draft_spec_for(
    target: &Path,
    n_layer: usize,
    block_size: usize,
    mask_token_id: Option<u32>,
    seed: u64,
) -> Result<DraftSpec> {
    let file = kiln_gguf::GgufFile::open(target)?;
    let arch = crate::Arch::from_name(file.metadata().get_str("general.architecture")?)?;
    let n_vocab = file
        .tensor("token_embd.weight")
        .and_then(|t| t.shape.get(1).copied())
        .ok_or_else(|| Error::Config(format!("{}: no token_embd.weight", target.display())))?
        as usize;
    let hp = crate::Hparams::from_gguf(arch, file.metadata(), n_vocab)?;
    if n_layer == 0 || block_size < 2 {
        return Err(Error::Config(format!(
            "a drafter needs at least one layer and a block of two (got {n_layer} layers, block {block_size})"
        )));
    }
    let mask = mask_token_id.unwrap_or(n_vocab as u32 - 1);
    if mask as usize >= n_vocab {
        return Err(Error::Config(format!(
            "mask token {mask} is outside the target's {n_vocab}-entry vocabulary"
        )));
    }
    Ok(DraftSpec {
        hidden: hp.n_embd,
        n_ff: hp.n_ff,
        n_layer,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        vocab: n_vocab,
        block_size,
        num_target_layers: hp.n_layer,
        target_layer_ids: super::default_layer_ids(hp.n_layer, n_layer),
        mask_token_id: mask,
        rope_theta: hp.rope_theta,
        seed,
        sliding: None,
    })
}

/// Writes a random drafter of `spec` into `dir` (created if needed).
pub fn write_random_drafter(dir: &Path, spec: &DraftSpec) -> Result<()> {
    let io = |e: std::io::Error| Error::Config(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let s = spec;
    let mut config = serde_json::json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": s.hidden,
        "intermediate_size": s.n_ff,
        "num_hidden_layers": s.n_layer,
        "num_attention_heads": s.n_head,
        "num_key_value_heads": s.n_head_kv,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "attention_bias": false,
        "rms_norm_eps": 1e-6,
        "rope_theta": s.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": 40960,
        "vocab_size": s.vocab,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "block_size": s.block_size,
        "num_target_layers": s.num_target_layers,
        "dflash_config": {"mask_token_id": s.mask_token_id, "target_layer_ids": s.target_layer_ids},
    });
    if let Some((window, layers)) = &s.sliding {
        config["use_sliding_window"] = true.into();
        config["sliding_window"] = (*window).into();
        config["layer_types"] = layers
            .iter()
            .map(|&sl| {
                if sl {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect::<Vec<_>>()
            .into();
    }
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| Error::Config(format!("draft config: {e}")))?;
    std::fs::write(dir.join("config.json"), text).map_err(io)?;

    let (h, hd) = (s.hidden, s.head_dim);
    let (qd, kvd) = (s.n_head * hd, s.n_head_kv * hd);
    let mut shapes: Vec<(String, Vec<usize>, bool)> = Vec::new();
    for i in 0..s.n_layer {
        let n = |x: &str| format!("layers.{i}.{x}.weight");
        shapes.push((n("input_layernorm"), vec![h], true));
        shapes.push((n("post_attention_layernorm"), vec![h], true));
        shapes.push((n("self_attn.q_proj"), vec![qd, h], false));
        shapes.push((n("self_attn.k_proj"), vec![kvd, h], false));
        shapes.push((n("self_attn.v_proj"), vec![kvd, h], false));
        shapes.push((n("self_attn.o_proj"), vec![h, qd], false));
        shapes.push((n("self_attn.q_norm"), vec![hd], true));
        shapes.push((n("self_attn.k_norm"), vec![hd], true));
        shapes.push((n("mlp.gate_proj"), vec![s.n_ff, h], false));
        shapes.push((n("mlp.up_proj"), vec![s.n_ff, h], false));
        shapes.push((n("mlp.down_proj"), vec![h, s.n_ff], false));
    }
    shapes.push((
        "fc.weight".into(),
        vec![h, s.target_layer_ids.len() * h],
        false,
    ));
    shapes.push(("hidden_norm.weight".into(), vec![h], true));
    shapes.push(("norm.weight".into(), vec![h], true));
    let mut state = s.seed;
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, shape, is_norm)| {
            let n: usize = shape.iter().product();
            let bytes = if is_norm {
                values(&mut state, n, 1.0, 0.1)
            } else {
                values(&mut state, n, 0.0, 1.0 / (shape[1] as f32).sqrt())
            };
            (name, shape, bytes)
        })
        .collect();
    let views = data
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::BF16, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Config(format!("draft tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        serialize(views, None).map_err(|e| Error::Config(format!("draft safetensors: {e}")))?;
    std::fs::write(dir.join("model.safetensors"), bytes).map_err(io)
}
