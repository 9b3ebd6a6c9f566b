//! [`Summary`]: what `kiln info` prints about a file, computed here so the CLI only formats it.

use crate::file::GgufFile;
use crate::value::Value;
use kiln_quant::GgmlType;

/// Hyperparameter keys shown for an architecture, as suffixes of `{arch}.`; those present are reported in this
/// order.
pub const HPARAM_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "vocab_size",
];

/// A file's overview: identity, hyperparameters, tokenizer and quantization mix.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// GGUF version.
    pub version: u32,
    /// File size in bytes.
    pub file_size: u64,
    /// `general.architecture`, when present and a string.
    pub architecture: Option<String>,
    /// `general.name`, when present and a string.
    pub name: Option<String>,
    /// `{arch}.{suffix}` values for the [`HPARAM_KEYS`] present, as (suffix, value).
    pub hparams: Vec<(String, Value)>,
    /// `tokenizer.ggml.model` (e.g. `gpt2`, `llama`).
    pub tokenizer_model: Option<String>,
    /// `tokenizer.ggml.pre` (the pre-tokenizer name).
    pub tokenizer_pre: Option<String>,
    /// Length of `tokenizer.ggml.tokens`.
    pub vocab_size: Option<usize>,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Total elements over all tensors.
    pub parameter_count: u64,
    /// Total tensor data bytes.
    pub tensor_bytes: u64,
    /// Per tensor type: counts and bytes, largest byte share first.
    pub quant_mix: Vec<TypeShare>,
}

/// One tensor type's share of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeShare {
    /// The type.
    pub ty: GgmlType,
    /// Tensors of this type.
    pub tensors: usize,
    /// Elements in them.
    pub elements: u64,
    /// Bytes of data in them.
    pub bytes: u64,
}

impl Summary {
    /// Summarizes `file`. Never fails: keys that are absent or of an unexpected type are left out.
    pub fn of(file: &GgufFile) -> Summary {
        let md = file.metadata();
        let string = |k: &str| md.opt_str(k).ok().flatten().map(str::to_owned);
        let architecture = string("general.architecture");
        let hparams = match &architecture {
            Some(arch) => HPARAM_KEYS
                .iter()
                .filter_map(|s| {
                    md.get(&format!("{arch}.{s}"))
                        .map(|v| ((*s).to_owned(), v.clone()))
                })
                .collect(),
            None => Vec::new(),
        };
        let mut quant_mix: Vec<TypeShare> = Vec::new();
        for t in file.tensors() {
            let i = match quant_mix.iter().position(|s| s.ty == t.ty) {
                Some(i) => i,
                None => {
                    quant_mix.push(TypeShare {
                        ty: t.ty,
                        tensors: 0,
                        elements: 0,
                        bytes: 0,
                    });
                    quant_mix.len() - 1
                }
            };
            let s = &mut quant_mix[i];
            s.tensors += 1;
            // Validated sizes sum to at most the file size; elements to at most 4 × i64::MAX per tensor, so
            // saturate rather than trust a pathological count.
            s.elements = s.elements.saturating_add(t.n_elements());
            s.bytes += t.size;
        }
        quant_mix.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ty.cmp(&b.ty)));
        Summary {
            version: file.version(),
            file_size: file.file_size(),
            name: string("general.name"),
            hparams,
            tokenizer_model: string("tokenizer.ggml.model"),
            tokenizer_pre: string("tokenizer.ggml.pre"),
            vocab_size: md
                .opt_array("tokenizer.ggml.tokens")
                .ok()
                .flatten()
                .map(|a| a.len()),
            tensor_count: file.tensors().len(),
            parameter_count: quant_mix
                .iter()
                .fold(0u64, |a, s| a.saturating_add(s.elements)),
            tensor_bytes: quant_mix.iter().map(|s| s.bytes).sum(),
            quant_mix,
            architecture,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufWriter;

    #[test]
    fn summary_counts_types_and_reads_arch_keys() {
        let mut w = GgufWriter::new();
        w.add("general.architecture", "llama").unwrap();
        w.add("llama.block_count", 2u32).unwrap();
        w.add("qwen3.block_count", 9u32).unwrap();
        w.add("tokenizer.ggml.tokens", vec!["a", "b", "c"]).unwrap();
        w.add_tensor("x", GgmlType::F32, &[4, 2]).unwrap();
        w.add_tensor("y", GgmlType::Q8_0, &[32]).unwrap();
        w.add_tensor("z", GgmlType::F32, &[1]).unwrap();
        let mut d = w.begin(Vec::new()).unwrap();
        d.write_tensor_data("x", &[0; 32]).unwrap();
        d.write_tensor_data("y", &[0; 34]).unwrap();
        d.write_tensor_data("z", &[0; 4]).unwrap();
        let f = GgufFile::from_bytes(d.finish().unwrap()).unwrap();
        let s = Summary::of(&f);
        assert_eq!(s.architecture.as_deref(), Some("llama"));
        assert_eq!(s.hparams, vec![("block_count".to_owned(), Value::U32(2))]);
        assert_eq!(s.vocab_size, Some(3));
        assert_eq!(s.tensor_count, 3);
        assert_eq!(s.parameter_count, 8 + 32 + 1);
        assert_eq!(s.tensor_bytes, 32 + 34 + 4);
        assert_eq!(s.quant_mix[0].ty, GgmlType::F32);
        assert_eq!((s.quant_mix[0].tensors, s.quant_mix[0].bytes), (2, 36));
        assert_eq!((s.quant_mix[1].tensors, s.quant_mix[1].bytes), (1, 34));
    }
}
