//! Per-block scalar reference functions, one pair per format, for code that works block by block (the
//! dot products and their tests). Each is bit-identical to ggml's reference C code for that block.

pub use crate::float::{bf16_to_f32, f32_to_bf16};
pub use crate::iquants::{dequantize_iq2_xxs, dequantize_iq4_nl, quantize_iq4_nl, IQ4_NL_VALUES};
pub use crate::kquants::{
    dequantize_q2_k, dequantize_q3_k, dequantize_q4_k, dequantize_q5_k, dequantize_q6_k,
    dequantize_q8_k, quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k,
    quantize_q8_k,
};
pub use crate::legacy::{
    dequantize_q4_0, dequantize_q4_1, dequantize_q5_0, dequantize_q5_1, dequantize_q8_0,
    dequantize_q8_1, quantize_q4_0, quantize_q4_1, quantize_q5_0, quantize_q5_1, quantize_q8_0,
    quantize_q8_1,
};
