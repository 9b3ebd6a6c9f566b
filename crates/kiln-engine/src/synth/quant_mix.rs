//! Which GGML type each tensor gets: a uniform type, or llama.cpp's Q4_K_M mix.
//!
//! Q4_K_M follows llama.cpp's `llama_tensor_get_type` (llama-quant.cpp) for the tensors these architectures have:
//! - `output.weight` (or `token_embd.weight` when the embedding is tied and doubles as the LM head) → Q6_K;
//! - `attn_v.weight` and `ffn_down*` (dense or experts) → Q6_K on the layers where `use_more_bits` holds (the
//!   first and last eighth of the layers, and every third one in between), Q4_K elsewhere;
//! - every other matrix, `token_embd.weight` included → Q4_K;
//! - 1-D tensors (norms) and the MoE router `ffn_gate_inp` stay F32 (llama.cpp never quantizes them).
//!
//! A row length that is not a whole number of the chosen type's blocks falls back the way llama.cpp does
//! (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then F16 if even 32 does not divide it). Uniform types apply to
//! every matrix (including the LM head, unlike llama-quantize) with the same fallbacks.
//! Qwen3-8B with this mix is 4.68 GiB, like llama.cpp's file (tested in `mod.rs`).

use kiln_quant::GgmlType;

/// The types `kiln synth` can write.
pub(crate) const SUPPORTED: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// A `--quant` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantScheme {
    /// Every matrix in this type (norms and routers stay F32).
    Uniform(GgmlType),
    /// llama.cpp's Q4_K_M per-tensor mix.
    Q4KM,
}

impl QuantScheme {
    /// Parses `f32`, `f16`, `bf16`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`, `q4_k`, `q5_k`, `q6_k`, `q4_k_m`
    /// (case-insensitive).
    pub fn from_name(name: &str) -> Option<QuantScheme> {
        if name.eq_ignore_ascii_case("q4_k_m") {
            return Some(QuantScheme::Q4KM);
        }
        let ty = GgmlType::from_name(name)?;
        SUPPORTED.contains(&ty).then_some(QuantScheme::Uniform(ty))
    }

    /// The name `from_name` accepts.
    pub fn name(self) -> String {
        match self {
            QuantScheme::Uniform(t) => t.name().to_lowercase(),
            QuantScheme::Q4KM => "q4_k_m".into(),
        }
    }

    /// Every accepted name, for error messages.
    pub fn all_names() -> String {
        let mut v: Vec<String> = SUPPORTED.iter().map(|t| t.name().to_lowercase()).collect();
        v.push("q4_k_m".into());
        v.join(", ")
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`) for this scheme. Uniform K-quants have no ftype of
    /// their own; they are labelled with the "_S" variant of the same type (its main type).
    pub fn file_type(self) -> u32 {
        match self {
            QuantScheme::Q4KM => 15,
            QuantScheme::Uniform(t) => match t {
                GgmlType::F32 => 0,
                GgmlType::F16 => 1,
                GgmlType::Q4_0 => 2,
                GgmlType::Q4_1 => 3,
                GgmlType::Q8_0 => 7,
                GgmlType::Q5_0 => 8,
                GgmlType::Q5_1 => 9,
                GgmlType::Q4_K => 14,
                GgmlType::Q5_K => 16,
                GgmlType::Q6_K => 18,
                GgmlType::BF16 => 32,
                // Not in SUPPORTED: `from_name` never builds these.
                GgmlType::Q8_1
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q8_K
                | GgmlType::IQ2_XXS
                | GgmlType::IQ4_NL => 0,
            },
        }
    }
}

/// What a tensor is, as far as type selection cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// `token_embd.weight`.
    TokenEmbd,
    /// `output.weight`.
    Output,
    /// A 1-D norm weight.
    Norm,
    /// `attn_v.weight`.
    AttnV,
    /// `ffn_down.weight` / `ffn_down_exps.weight`.
    FfnDown,
    /// `ffn_gate_inp.weight` (MoE router).
    Router,
    /// Any other matrix.
    Matrix,
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    // The first test short-circuits, so `i - n / 8` cannot underflow.
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type of a tensor with `role`, in `layer` of `n_layer`, rows of `row_len` elements; `tied` says whether
/// the embedding doubles as the LM head.
pub fn tensor_type(
    scheme: QuantScheme,
    role: TensorRole,
    layer: usize,
    n_layer: usize,
    row_len: usize,
    tied: bool,
) -> GgmlType {
    if matches!(role, TensorRole::Norm | TensorRole::Router) {
        return GgmlType::F32;
    }
    let want = match scheme {
        QuantScheme::Uniform(t) => t,
        QuantScheme::Q4KM => match role {
            TensorRole::Output => GgmlType::Q6_K,
            TensorRole::TokenEmbd if tied => GgmlType::Q6_K,
            TensorRole::AttnV | TensorRole::FfnDown if use_more_bits(layer, n_layer) => {
                GgmlType::Q6_K
            }
            _ => GgmlType::Q4_K,
        },
    };
    fallback(want, row_len)
}

fn fallback(mut ty: GgmlType, row_len: usize) -> GgmlType {
    loop {
        if row_len.is_multiple_of(ty.block_elems()) {
            return ty;
        }
        ty = match ty {
            GgmlType::Q4_K => GgmlType::Q5_0,
            GgmlType::Q5_K => GgmlType::Q5_1,
            GgmlType::Q6_K => GgmlType::Q8_0,
            _ => return GgmlType::F16,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_36_layers() {
        let more: Vec<usize> = (0..36).filter(|&i| use_more_bits(i, 36)).collect();
        assert_eq!(
            more,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
        );
    }

    #[test]
    fn q4_k_m_rules() {
        let t = |role, layer, row, tied| tensor_type(QuantScheme::Q4KM, role, layer, 36, row, tied);
        assert_eq!(t(TensorRole::Output, 0, 4096, false), GgmlType::Q6_K);
        assert_eq!(t(TensorRole::TokenEmbd, 0, 4096, false), GgmlType::Q4_K);
        assert_eq!(t(TensorRole::TokenEmbd, 0, 4096, true), GgmlType::Q6_K);
        assert_eq!(t(TensorRole::AttnV, 0, 4096, false), GgmlType::Q6_K);
        assert_eq!(t(TensorRole::AttnV, 4, 4096, false), GgmlType::Q4_K);
        assert_eq!(t(TensorRole::FfnDown, 6, 12288, false), GgmlType::Q6_K);
        assert_eq!(t(TensorRole::Matrix, 0, 4096, false), GgmlType::Q4_K);
        assert_eq!(t(TensorRole::Norm, 0, 4096, false), GgmlType::F32);
        assert_eq!(t(TensorRole::Router, 0, 4096, false), GgmlType::F32);
        // SmolLM2's 576-wide rows do not hold 256-element blocks.
        assert_eq!(t(TensorRole::Matrix, 0, 576, false), GgmlType::Q5_0);
        assert_eq!(t(TensorRole::Output, 0, 576, false), GgmlType::Q8_0);
        assert_eq!(t(TensorRole::Matrix, 0, 40, false), GgmlType::F16);
    }

    #[test]
    fn names_parse() {
        assert_eq!(QuantScheme::from_name("Q4_K_M"), Some(QuantScheme::Q4KM));
        assert_eq!(
            QuantScheme::from_name("q6_k"),
            Some(QuantScheme::Uniform(GgmlType::Q6_K))
        );
        assert_eq!(QuantScheme::from_name("iq2_xxs"), None);
        assert_eq!(QuantScheme::from_name("q8_k"), None);
        for t in SUPPORTED {
            let s = QuantScheme::Uniform(t);
            assert_eq!(QuantScheme::from_name(&s.name()), Some(s));
        }
    }
}
