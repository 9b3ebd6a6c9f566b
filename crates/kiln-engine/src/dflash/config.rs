//! The drafter's `config.json` (z-lab DFlash format: an HF Qwen3 config plus `block_size`, `num_target_layers`
//! and `dflash_config.{mask_token_id, target_layer_ids}`), parsed strictly: unknown fields and DFlash2 checkpoints
//! are refused, because silently ignoring a field with a meaning would give wrong drafts.

use crate::backend::BlockAttn;
use crate::error::{Error, Result};
use crate::hparams::Hparams;
use serde_json::{Map, Value};

/// Fields of an HF Qwen3 config that carry no meaning for inference here (bookkeeping, training-only) or that
/// are checked explicitly below.
const KNOWN_FIELDS: &[&str] = &[
    "architectures",
    "attention_bias",
    "attention_dropout",
    "auto_map",
    "block_size",
    "bos_token_id",
    "dflash_config",
    "dtype",
    "eos_token_id",
    "final_logit_softcapping",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "input_embedding_scale",
    "intermediate_size",
    "is_causal",
    "layer_types",
    "max_position_embeddings",
    "max_window_layers",
    "model_type",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_target_layers",
    "output_multiplier",
    "pad_token_id",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "use_sliding_window",
    "vocab_size",
];

/// Keys of `dflash_config` understood here. DFlash2's (`conv_*`, `selector_*`) are refused by name.
const KNOWN_DFLASH_FIELDS: &[&str] = &[
    "mask_token_id",
    "target_layer_ids",
    "block_size",
    "input_embedding_scale",
    "output_multiplier",
    "final_logit_softcapping",
];

/// Most drafter layers accepted (published drafters have 1 to 8).
const MAX_LAYERS: usize = 1024;
/// Largest width, head count or vocabulary accepted.
const MAX_DIM: usize = 1 << 24;
/// Largest block accepted (published drafters use 16; a verify block is a batch of this many rows).
const MAX_BLOCK: usize = 256;

/// A DFlash drafter's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftConfig {
    /// Hidden size (must equal the target's).
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
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Vocabulary (must equal the target's).
    pub vocab: usize,
    /// Block size B: one anchor plus B−1 drafted tokens.
    pub block_size: usize,
    /// Layer count of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// Target layers (0-based) whose output hidden states form the context features.
    pub target_layer_ids: Vec<usize>,
    /// Token id that fills the block's draft positions.
    pub mask_token_id: u32,
    /// Multiplier of the block's input embeddings (`input_embedding_scale`, 1 when absent).
    pub input_embedding_scale: f32,
    /// Multiplier of the draft logits (`output_multiplier`, 1 when absent).
    pub output_multiplier: f32,
    /// Logit soft-capping (`final_logit_softcapping`; none when absent or ≤ 0).
    pub softcap: Option<f32>,
    /// Per drafter layer, which positions its block rows see.
    pub layer_attn: Vec<BlockAttn>,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(format!("draft config.json: {}", msg.into()))
}

fn get_usize(m: &Map<String, Value>, key: &str) -> Result<usize> {
    m.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| bad(format!("'{key}' is missing or not a non-negative integer")))
}

fn get_f32(m: &Map<String, Value>, key: &str) -> Result<Option<f32>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|f| Some(f as f32))
            .ok_or_else(|| bad(format!("'{key}' is not a number"))),
    }
}

/// `dflash_config.key`, falling back to the top level (the reference reads both places, dflash_config first).
fn draft_value<'a>(
    top: &'a Map<String, Value>,
    dc: &'a Map<String, Value>,
    key: &str,
) -> Option<&'a Value> {
    dc.get(key).or_else(|| top.get(key))
}

impl DraftConfig {
    /// Parses the text of a `config.json`.
    pub fn parse(text: &str) -> Result<DraftConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let top = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
        if let Some(archs) = top.get("architectures").and_then(Value::as_array) {
            for a in archs.iter().filter_map(Value::as_str) {
                if a.contains("DFlash2") {
                    return Err(Error::Unsupported(format!(
                        "draft architecture '{a}' (DFlash2: dynamic convolutions and a candidate selector); \
                         kiln runs DFlash (DFlashDraftModel) drafters"
                    )));
                }
            }
        }
        let empty = Map::new();
        let dc = match top.get("dflash_config") {
            None => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(bad("'dflash_config' is not an object")),
        };
        for k in dc.keys() {
            if k.starts_with("conv_") || k.starts_with("selector_") {
                return Err(Error::Unsupported(format!(
                    "draft config field 'dflash_config.{k}' belongs to DFlash2, which kiln does not run"
                )));
            }
            if !KNOWN_DFLASH_FIELDS.contains(&k.as_str()) {
                return Err(bad(format!("unknown field 'dflash_config.{k}'")));
            }
        }
        for k in top.keys() {
            if !KNOWN_FIELDS.contains(&k.as_str()) {
                return Err(bad(format!(
                    "unknown field '{k}' (refused rather than ignored: it may change the drafter's meaning)"
                )));
            }
        }
        if let Some(a) = top.get("hidden_act").and_then(Value::as_str) {
            if a != "silu" {
                return Err(Error::Unsupported(format!(
                    "draft hidden_act '{a}' (silu only)"
                )));
            }
        }
        if top.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err(Error::Unsupported("draft attention_bias = true".into()));
        }
        if !matches!(top.get("rope_scaling"), None | Some(Value::Null)) {
            return Err(Error::Unsupported("draft rope_scaling".into()));
        }
        // transformers ≥ 5 writes `rope_parameters` instead of `rope_theta` + `rope_scaling`.
        let mut rope_theta = get_f32(top, "rope_theta")?;
        match top.get("rope_parameters") {
            None | Some(Value::Null) => {}
            Some(Value::Object(rp)) => {
                let ty = rp
                    .get("rope_type")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if ty != "default" {
                    return Err(Error::Unsupported(format!("draft rope_type '{ty}'")));
                }
                if let Some(k) = rp
                    .keys()
                    .find(|k| !["rope_type", "rope_theta"].contains(&k.as_str()))
                {
                    return Err(bad(format!("unknown field 'rope_parameters.{k}'")));
                }
                rope_theta = get_f32(rp, "rope_theta")?.or(rope_theta);
            }
            Some(_) => return Err(bad("'rope_parameters' is not an object")),
        }
        let hidden = get_usize(top, "hidden_size")?;
        let n_head = get_usize(top, "num_attention_heads")?;
        let head_dim = match top.get("head_dim") {
            Some(_) => get_usize(top, "head_dim")?,
            None => hidden / n_head.max(1),
        };
        let n_layer = get_usize(top, "num_hidden_layers")?;
        // Sizes that allocate before any tensor is checked against them are bounded here, so a hostile config
        // is an error rather than an allocation failure.
        if n_layer > MAX_LAYERS {
            return Err(bad(format!(
                "num_hidden_layers {n_layer} (a drafter has at most {MAX_LAYERS})"
            )));
        }
        let num_target_layers = get_usize(top, "num_target_layers")?;
        let target_layer_ids = match draft_value(top, dc, "target_layer_ids") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|v| v as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("'target_layer_ids' holds a non-integer"))?,
            Some(_) => return Err(bad("'target_layer_ids' is not an array")),
            None => default_layer_ids(num_target_layers, n_layer),
        };
        let mask_token_id = draft_value(top, dc, "mask_token_id")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("'dflash_config.mask_token_id' is missing or not an integer"))?;
        let block_size = draft_value(top, dc, "block_size")
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| bad("'block_size' is not an integer"))
            })
            .transpose()?
            .unwrap_or(16) as usize;
        let scalar = |key: &str| -> Result<Option<f32>> {
            match dc.get(key) {
                Some(_) => get_f32(dc, key),
                None => get_f32(top, key),
            }
        };
        let layer_attn = layer_attn(top, n_layer)?;
        let cfg = DraftConfig {
            hidden,
            n_ff: get_usize(top, "intermediate_size")?,
            n_layer,
            n_head,
            n_head_kv: get_usize(top, "num_key_value_heads")?,
            head_dim,
            rms_eps: get_f32(top, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(1e6),
            vocab: get_usize(top, "vocab_size")?,
            block_size,
            num_target_layers,
            target_layer_ids,
            mask_token_id: u32::try_from(mask_token_id)
                .map_err(|_| bad("'mask_token_id' does not fit in 32 bits"))?,
            input_embedding_scale: scalar("input_embedding_scale")?.unwrap_or(1.0),
            output_multiplier: scalar("output_multiplier")?.unwrap_or(1.0),
            softcap: scalar("final_logit_softcapping")?.filter(|&c| c > 0.0),
            layer_attn,
        };
        if cfg.n_layer == 0 || cfg.n_head == 0 || cfg.n_head_kv == 0 || cfg.head_dim == 0 {
            return Err(bad("layers, heads and head_dim must be positive"));
        }
        for (key, v) in [
            ("hidden_size", cfg.hidden),
            ("intermediate_size", cfg.n_ff),
            ("num_attention_heads", cfg.n_head),
            ("num_key_value_heads", cfg.n_head_kv),
            ("head_dim", cfg.head_dim),
            ("vocab_size", cfg.vocab),
        ] {
            // Products of two of these (tensor shapes) stay far inside 64 bits.
            if v > MAX_DIM {
                return Err(bad(format!("{key} {v} (at most {MAX_DIM})")));
            }
        }
        if !cfg.n_head.is_multiple_of(cfg.n_head_kv) {
            return Err(bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                cfg.n_head, cfg.n_head_kv
            )));
        }
        if !cfg.head_dim.is_multiple_of(2) {
            return Err(bad("head_dim must be even (RoPE rotates pairs)"));
        }
        if !(2..=MAX_BLOCK).contains(&cfg.block_size) {
            return Err(bad(format!(
                "block_size {} (must be 2 to {MAX_BLOCK})",
                cfg.block_size
            )));
        }
        if cfg.target_layer_ids.is_empty() {
            return Err(bad("'target_layer_ids' is empty"));
        }
        Ok(cfg)
    }

    /// Checks the drafter against the target it will draft for.
    pub fn validate_target(&self, hp: &Hparams) -> Result<()> {
        if self.hidden != hp.n_embd {
            return Err(Error::Config(format!(
                "draft hidden_size {} differs from the target's embedding length {}",
                self.hidden, hp.n_embd
            )));
        }
        if self.vocab != hp.n_vocab {
            return Err(Error::Config(format!(
                "draft vocab_size {} differs from the target's vocabulary {}",
                self.vocab, hp.n_vocab
            )));
        }
        if self.num_target_layers != hp.n_layer {
            return Err(Error::Config(format!(
                "draft was trained for a target of {} layers; this target has {}",
                self.num_target_layers, hp.n_layer
            )));
        }
        // The reference reads HF hidden_states[id + 1]; for the last layer that entry is after the final norm,
        // which kiln's taps do not give, so the last layer is refused rather than tapped wrongly.
        if let Some(&l) = self.target_layer_ids.iter().find(|&&l| l + 1 >= hp.n_layer) {
            return Err(Error::Config(format!(
                "draft target_layer_ids holds {l}; the target has {} layers (ids must be < {})",
                hp.n_layer,
                hp.n_layer.saturating_sub(1)
            )));
        }
        if self.mask_token_id as usize >= hp.n_vocab {
            return Err(Error::Config(format!(
                "draft mask_token_id {} is outside the target's embedding table ({} rows)",
                self.mask_token_id, hp.n_vocab
            )));
        }
        Ok(())
    }
}

/// Each layer's [`BlockAttn`], derived as transformers' Qwen3Config and the reference's attention module do: the
/// window is `sliding_window` only when `use_sliding_window` is true; `layer_types` defaults to sliding layers
/// from `max_window_layers` on when there is a window; a layer is causal when it is a sliding layer, unless
/// `is_causal` says otherwise for every layer; only sliding layers take the window.
fn layer_attn(top: &Map<String, Value>, n_layer: usize) -> Result<Vec<BlockAttn>> {
    let flag = |key: &str| -> Result<Option<bool>> {
        match top.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(format!("'{key}' is not a boolean"))),
        }
    };
    let window = match top.get("sliding_window") {
        _ if flag("use_sliding_window")? != Some(true) => None,
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(w) if w >= 1 => Some(w as usize),
            _ => return Err(bad("'sliding_window' is not a positive integer")),
        },
    };
    let sliding: Vec<bool> = match top.get("layer_types") {
        None | Some(Value::Null) => {
            let from = match top.get("max_window_layers") {
                None | Some(Value::Null) => 28,
                Some(_) => get_usize(top, "max_window_layers")?,
            };
            (0..n_layer)
                .map(|i| window.is_some() && i >= from)
                .collect()
        }
        Some(Value::Array(a)) => {
            if a.len() != n_layer {
                return Err(bad(format!(
                    "'layer_types' has {} entries for {n_layer} layers",
                    a.len()
                )));
            }
            a.iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(false),
                    Some("sliding_attention") => Ok(true),
                    _ => Err(Error::Unsupported(format!(
                        "draft layer type {t} (full_attention and sliding_attention only)"
                    ))),
                })
                .collect::<Result<_>>()?
        }
        Some(_) => return Err(bad("'layer_types' is not an array")),
    };
    let is_causal = flag("is_causal")?;
    Ok(sliding
        .into_iter()
        .map(|s| BlockAttn {
            causal: is_causal.unwrap_or(s),
            window: if s { window } else { None },
        })
        .collect())
}

/// The reference's default tapping rule: one middle layer for a 1-layer drafter, else evenly from 1 to L−3.
pub fn default_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Vec<usize> {
    if num_draft_layers == 1 {
        return vec![num_target_layers / 2];
    }
    let (start, end) = (1.0f64, num_target_layers as f64 - 3.0);
    (0..num_draft_layers)
        .map(|i| {
            let x = start + i as f64 * (end - start) / (num_draft_layers - 1) as f64;
            // Python's round() is round-half-to-even.
            let r = x.round();
            let r = if (x - x.trunc() - 0.5).abs() < 1e-12 && r % 2.0 != 0.0 {
                r - 1.0
            } else {
                r
            };
            r.max(0.0) as usize
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        serde_json::json!({
            "architectures": ["DFlashDraftModel"], "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": 512, "block_size": 4,
            "num_target_layers": 3, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 1]}
        })
    }

    #[test]
    fn parses_and_refuses() {
        let c = DraftConfig::parse(&base().to_string()).unwrap();
        assert_eq!(c.target_layer_ids, vec![0, 1]);
        assert_eq!(c.block_size, 4);
        let mut v = base();
        v["mystery"] = 1.into();
        let e = DraftConfig::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("unknown field 'mystery'"), "{e}");
        let mut v = base();
        v["architectures"] = serde_json::json!(["DFlash2DraftModel"]);
        let e = DraftConfig::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("DFlash2"), "{e}");
        for (key, n, want) in [
            (
                "num_hidden_layers",
                40_737_095_516u64,
                "num_hidden_layers 40737095516",
            ),
            ("block_size", 1 << 40, "block_size 1099511627776"),
            ("head_dim", 1 << 40, "head_dim 1099511627776"),
        ] {
            let mut v = base();
            v[key] = n.into();
            let e = DraftConfig::parse(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let mut v = base();
        v["dflash_config"]["conv_kernel_size"] = 4.into();
        let e = DraftConfig::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("DFlash2"), "{e}");
    }

    #[test]
    fn reads_a_transformers_5_save_pretrained_config() {
        // Written by the reference model class's save_pretrained (tools/make_random_dflash_drafter.py).
        let c = DraftConfig::parse(include_str!(
            "../../tests/fixtures/dflash/save_pretrained_config.json"
        ))
        .unwrap();
        assert_eq!(c.rope_theta, 100000.0);
        assert_eq!(c.target_layer_ids, vec![2, 15, 27]);
        assert_eq!(
            (c.hidden, c.n_head, c.n_head_kv, c.head_dim),
            (576, 9, 3, 64)
        );
        assert_eq!((c.block_size, c.mask_token_id), (16, 0));
        let mut v: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/dflash/save_pretrained_config.json"
        ))
        .unwrap();
        v["rope_parameters"]["rope_type"] = "yarn".into();
        let e = DraftConfig::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("rope_type 'yarn'"), "{e}");
    }

    #[test]
    fn layer_attention_as_transformers_derives_it() {
        let attn = |f: &dyn Fn(&mut Value)| {
            let mut v = base();
            v["num_hidden_layers"] = 2.into();
            f(&mut v);
            DraftConfig::parse(&v.to_string()).map(|c| c.layer_attn)
        };
        let (full, causal) = (
            BlockAttn::FULL,
            BlockAttn {
                causal: true,
                window: None,
            },
        );
        let sliding = |w| BlockAttn {
            causal: true,
            window: Some(w),
        };
        assert_eq!(attn(&|_| {}).unwrap(), vec![full, full]);
        // Sliding layers from max_window_layers on when there is a window.
        let w = |v: &mut Value| {
            v["use_sliding_window"] = true.into();
            v["sliding_window"] = 8.into();
            v["max_window_layers"] = 1.into();
        };
        assert_eq!(attn(&w).unwrap(), vec![full, sliding(8)]);
        // Without use_sliding_window the window is dropped (Qwen3Config), a sliding layer stays causal.
        let lt = |v: &mut Value| {
            v["sliding_window"] = 8.into();
            v["layer_types"] = serde_json::json!(["full_attention", "sliding_attention"]);
        };
        assert_eq!(attn(&lt).unwrap(), vec![full, causal]);
        // is_causal overrides the layer type's causality, for every layer.
        let nc = |v: &mut Value| {
            w(v);
            v["is_causal"] = false.into();
        };
        let open = BlockAttn {
            causal: false,
            window: Some(8),
        };
        assert_eq!(attn(&nc).unwrap(), vec![full, open]);
        assert_eq!(
            attn(&|v| v["is_causal"] = true.into()).unwrap(),
            vec![causal, causal]
        );
        let e = attn(&|v| v["layer_types"] = serde_json::json!(["full_attention"])).unwrap_err();
        assert!(e.to_string().contains("1 entries for 2 layers"), "{e}");
        let e = attn(&|v| {
            v["layer_types"] = serde_json::json!(["full_attention", "chunked_attention"])
        })
        .unwrap_err();
        assert!(e.to_string().contains("chunked_attention"), "{e}");
        let e = attn(&|v| {
            w(v);
            v["sliding_window"] = 0.into();
        })
        .unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
    }

    #[test]
    fn spans_match_the_reference_mask() {
        // The reference's `_attention_mask` element by element: query at p (the block's rows end at `end`), key q.
        let visible = |a: BlockAttn, p: i64, q: i64| {
            let mut v = true;
            if a.causal {
                v &= q <= p;
            }
            if let Some(w) = a.window.map(|w| w as i64) {
                v &= p - q < w;
                if !a.causal {
                    v &= q - p < w;
                }
            }
            v
        };
        for causal in [false, true] {
            for window in [None, Some(1), Some(2), Some(5)] {
                let a = BlockAttn { causal, window };
                for end in 1usize..12 {
                    for p in end.saturating_sub(4)..end {
                        let (lo, hi) = a.span(p, end);
                        let want: Vec<usize> = (0..end)
                            .filter(|&q| visible(a, p as i64, q as i64))
                            .collect();
                        assert_eq!((lo..hi).collect::<Vec<_>>(), want, "{a:?} row {p} of {end}");
                    }
                }
            }
        }
    }

    #[test]
    fn default_ids_match_reference_rule() {
        // Qwen3 36 layers, 5 draft layers: [1, 9, 17, 25, 33] per the paper.
        assert_eq!(default_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
        assert_eq!(default_layer_ids(30, 1), vec![15]);
    }
}
