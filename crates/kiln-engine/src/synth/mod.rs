//! `kiln synth`: GGUF files with random weights, real shapes and real tokenizer metadata, deterministic by seed.
//!
//! The file is written in one streaming pass ([`kiln_gguf::GgufWriter`]): metadata and tensor infos first, then
//! each tensor's data generated just before it is written (in parallel chunks, see `random.rs`), so peak memory
//! is one tensor (the Qwen3-8B Q4_K_M LM head: 0.5 GB), not the model.
//!
//! Weights: matrices are drawn with std `1/sqrt(fan_in)` (activations keep their scale through any depth; every
//! sub-layer is preceded by an RMSNorm), norm weights uniformly in 1 ± 0.1, the MoE router with std
//! `2/sqrt(hidden)` (clear routing gaps), and the embedding / LM head with std `3/sqrt(hidden)` so the logits
//! have a std of about 3: peaked enough that the top-1 token is usually separated from the runner-up.
//! Quantized tensors are random valid blocks whose dequantized values follow the same distributions.
//!
//! ```
//! use kiln_engine::synth::{find_preset, plan, Arch, QuantScheme, SynthSpec};
//! let spec = SynthSpec {
//!     preset: find_preset(Arch::Qwen3, "8b")?.clone(),
//!     quant: QuantScheme::Q4KM,
//!     seed: 0,
//! };
//! let bytes: u64 = plan(&spec).iter().map(|t| t.bytes()).sum();
//! assert_eq!(format!("{:.2}", bytes as f64 / (1u64 << 30) as f64), "4.68"); // llama.cpp's file: 4.68 GiB
//! # Ok::<(), kiln_engine::synth::SynthError>(())
//! ```

mod presets;
mod quant_mix;
mod random;
mod tokenizer;

use std::io::Write;
use std::path::Path;

use kiln_gguf::{GgufWriter, Value};
use kiln_quant::GgmlType;

pub use presets::{find_preset, Preset, PRESETS};
pub use quant_mix::{tensor_type, use_more_bits, QuantScheme, TensorRole};
pub use random::Init;

/// Model architectures `kiln synth` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama (SmolLM2): no QK-norm.
    Llama,
    /// Qwen3 dense: QK-norm, GQA.
    Qwen3,
    /// Qwen3 MoE: Qwen3 attention, routed experts, no shared expert.
    Qwen3Moe,
}

impl Arch {
    /// The GGUF `general.architecture` value.
    pub const fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// Parses `llama`, `qwen3`, `qwen3moe`.
    pub fn from_name(s: &str) -> Result<Arch, SynthError> {
        [Arch::Llama, Arch::Qwen3, Arch::Qwen3Moe]
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| SynthError::UnknownArch(s.to_owned()))
    }
}

/// Why synthesis failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynthError {
    /// Not one of llama, qwen3, qwen3moe.
    #[error("unknown architecture '{0}' (expected llama, qwen3 or qwen3moe)")]
    UnknownArch(String),
    /// No such preset for the architecture.
    #[error("unknown {arch} preset '{name}' (available: {available})")]
    UnknownPreset {
        /// The architecture.
        arch: &'static str,
        /// The requested name.
        name: String,
        /// The presets that exist for it.
        available: String,
    },
    /// Not a supported `--quant`.
    #[error("unknown quantization '{0}' (expected one of {all})", all = QuantScheme::all_names())]
    UnknownQuant(String),
    /// The tokenizer metadata does not fit the model.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The GGUF writer refused something.
    #[error(transparent)]
    Gguf(#[from] kiln_gguf::Error),
    /// Creating the output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The output path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// What to synthesize.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// The shape.
    pub preset: Preset,
    /// Tensor types.
    pub quant: QuantScheme,
    /// Seed of every random value in the file.
    pub seed: u64,
}

/// Where the tokenizer metadata comes from.
#[derive(Debug, Clone)]
pub enum TokenizerSource {
    /// The built-in byte-level tokenizer (see `tokenizer.rs`), padded to the preset's vocabulary.
    Builtin,
    /// `tokenizer.*` keys (e.g. from `kiln_tokenizer`), padded with unused tokens to the preset's vocabulary.
    Metadata(Vec<(String, Value)>),
}

/// One tensor of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// GGUF tensor name.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Shape in ggml order (row length first).
    pub shape: Vec<u64>,
    /// Role, for type selection.
    pub role: TensorRole,
    /// Distribution of the values.
    pub init: Init,
}

impl PlannedTensor {
    /// Bytes of the tensor's data.
    pub fn bytes(&self) -> u64 {
        let rows: u64 = self.shape[1..].iter().product();
        // Plans only pick types whose blocks divide the row (quant_mix falls back otherwise).
        self.ty.row_bytes(self.shape[0]).unwrap_or(0) * rows
    }

    fn elems(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }
}

/// Progress of [`synthesize`], reported after each tensor.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// The tensor just written.
    pub tensor: &'a str,
    /// Tensor data bytes written so far.
    pub done_bytes: u64,
    /// Tensor data bytes in the whole file.
    pub total_bytes: u64,
}

/// Every tensor of the model, in file order, with its type and init.
pub fn plan(spec: &SynthSpec) -> Vec<PlannedTensor> {
    let p = &spec.preset;
    let (d, nl) = (p.n_embd as u64, p.n_layer);
    let q_dim = (p.n_head * p.head_dim) as u64;
    let kv_dim = (p.n_head_kv * p.head_dim) as u64;
    let std_in = |fan_in: u64| Init::Std(1.0 / (fan_in as f32).sqrt());
    let norm = Init::Around {
        center: 1.0,
        spread: 0.1,
    };
    let vocab_std = Init::Std(3.0 / (d as f32).sqrt());
    let mut out = Vec::new();
    let mut add = |name: String, role: TensorRole, layer: usize, shape: Vec<u64>, init: Init| {
        let ty = tensor_type(spec.quant, role, layer, nl, shape[0] as usize, p.tied);
        out.push(PlannedTensor {
            name,
            ty,
            shape,
            role,
            init,
        });
    };
    let vocab = p.vocab as u64;
    add(
        "token_embd.weight".into(),
        TensorRole::TokenEmbd,
        0,
        vec![d, vocab],
        vocab_std,
    );
    for l in 0..nl {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        add(n("attn_norm"), TensorRole::Norm, l, vec![d], norm);
        add(
            n("attn_q"),
            TensorRole::Matrix,
            l,
            vec![d, q_dim],
            std_in(d),
        );
        add(
            n("attn_k"),
            TensorRole::Matrix,
            l,
            vec![d, kv_dim],
            std_in(d),
        );
        add(
            n("attn_v"),
            TensorRole::AttnV,
            l,
            vec![d, kv_dim],
            std_in(d),
        );
        add(
            n("attn_output"),
            TensorRole::Matrix,
            l,
            vec![q_dim, d],
            std_in(q_dim),
        );
        if p.arch != Arch::Llama {
            let hd = p.head_dim as u64;
            add(n("attn_q_norm"), TensorRole::Norm, l, vec![hd], norm);
            add(n("attn_k_norm"), TensorRole::Norm, l, vec![hd], norm);
        }
        add(n("ffn_norm"), TensorRole::Norm, l, vec![d], norm);
        if p.n_expert > 0 {
            let (e, ff) = (p.n_expert as u64, p.expert_ff as u64);
            let router = Init::Std(2.0 / (d as f32).sqrt());
            add(n("ffn_gate_inp"), TensorRole::Router, l, vec![d, e], router);
            add(
                n("ffn_gate_exps"),
                TensorRole::Matrix,
                l,
                vec![d, ff, e],
                std_in(d),
            );
            add(
                n("ffn_up_exps"),
                TensorRole::Matrix,
                l,
                vec![d, ff, e],
                std_in(d),
            );
            add(
                n("ffn_down_exps"),
                TensorRole::FfnDown,
                l,
                vec![ff, d, e],
                std_in(ff),
            );
        } else {
            let ff = p.n_ff as u64;
            add(n("ffn_gate"), TensorRole::Matrix, l, vec![d, ff], std_in(d));
            add(n("ffn_up"), TensorRole::Matrix, l, vec![d, ff], std_in(d));
            add(
                n("ffn_down"),
                TensorRole::FfnDown,
                l,
                vec![ff, d],
                std_in(ff),
            );
        }
    }
    add(
        "output_norm.weight".into(),
        TensorRole::Norm,
        0,
        vec![d],
        norm,
    );
    if !p.tied {
        add(
            "output.weight".into(),
            TensorRole::Output,
            0,
            vec![d, vocab],
            vocab_std,
        );
    }
    out
}

/// The `general.*` and architecture keys (llama.cpp's names), without the tokenizer.
pub fn model_metadata(spec: &SynthSpec) -> Vec<(String, Value)> {
    let p = &spec.preset;
    let a = p.arch.name();
    let u = |x: usize| Value::U32(x as u32);
    let mut m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), a.into()),
        (
            "general.name".into(),
            format!("kiln synth {a} {} {}", p.name, spec.quant.name())
                .as_str()
                .into(),
        ),
        (
            "general.file_type".into(),
            Value::U32(spec.quant.file_type()),
        ),
        ("general.quantization_version".into(), Value::U32(2)),
        ("kiln.synth.preset".into(), p.name.into()),
        ("kiln.synth.seed".into(), Value::U64(spec.seed)),
    ];
    let mut arch = |k: &str, v: Value| m.push((format!("{a}.{k}"), v));
    arch("context_length", u(p.ctx_len));
    arch("embedding_length", u(p.n_embd));
    arch("block_count", u(p.n_layer));
    arch("feed_forward_length", u(p.n_ff));
    arch("attention.head_count", u(p.n_head));
    arch("attention.head_count_kv", u(p.n_head_kv));
    arch("attention.key_length", u(p.head_dim));
    arch("attention.value_length", u(p.head_dim));
    arch("rope.dimension_count", u(p.head_dim));
    arch("rope.freq_base", Value::F32(p.rope_base));
    arch("attention.layer_norm_rms_epsilon", Value::F32(p.rms_eps));
    arch("vocab_size", u(p.vocab));
    if p.n_expert > 0 {
        arch("expert_count", u(p.n_expert));
        arch("expert_used_count", u(p.n_expert_used));
        arch("expert_feed_forward_length", u(p.expert_ff));
    }
    m
}

/// Writes the model to `out` and returns it. `progress` is called after each tensor.
pub fn synthesize<W: Write>(
    spec: &SynthSpec,
    tokenizer: TokenizerSource,
    out: W,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<W, SynthError> {
    let tok = match tokenizer {
        TokenizerSource::Builtin => tokenizer::builtin(spec.preset.vocab)?,
        TokenizerSource::Metadata(mut m) => {
            tokenizer::pad_vocab(&mut m, spec.preset.vocab)?;
            m
        }
    };
    let tensors = plan(spec);
    let mut w = GgufWriter::new();
    for (k, v) in model_metadata(spec).into_iter().chain(tok) {
        w.add(&k, v)?;
    }
    for t in &tensors {
        w.add_tensor(&t.name, t.ty, &t.shape)?;
    }
    let total_bytes: u64 = tensors.iter().map(PlannedTensor::bytes).sum();
    let mut data = w.begin(out)?;
    let mut buf: Vec<u8> = Vec::new();
    let mut done_bytes = 0;
    for t in &tensors {
        buf.clear();
        buf.resize(t.bytes() as usize, 0);
        random::fill_tensor(
            t.ty,
            t.init,
            random::tensor_seed(spec.seed, &t.name),
            &mut buf,
        );
        debug_assert_eq!(
            buf.len(),
            t.ty.row_bytes(t.elems() as u64).unwrap_or(0) as usize
        );
        data.write_tensor_data(&t.name, &buf)?;
        done_bytes += buf.len() as u64;
        progress(Progress {
            tensor: &t.name,
            done_bytes,
            total_bytes,
        });
    }
    Ok(data.finish()?)
}

/// [`synthesize`] into a new file at `path` (buffered). Returns the file's size in bytes.
pub fn synthesize_to_file(
    spec: &SynthSpec,
    tokenizer: TokenizerSource,
    path: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<u64, SynthError> {
    let io = |source| SynthError::Io {
        path: path.display().to_string(),
        source,
    };
    let f = std::fs::File::create(path).map_err(io)?;
    let w = synthesize(
        spec,
        tokenizer,
        std::io::BufWriter::with_capacity(8 << 20, f),
        progress,
    )?;
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    Ok(f.metadata().map_err(io)?.len())
}

#[cfg(test)]
mod tests;
