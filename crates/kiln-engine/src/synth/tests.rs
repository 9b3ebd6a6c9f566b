//! Tests of the synthesizer: plans, metadata, determinism, the Q4_K_M size arithmetic.

use super::*;
use kiln_gguf::GgufFile;

fn spec(arch: Arch, preset: &str, quant: &str, seed: u64) -> SynthSpec {
    SynthSpec {
        preset: find_preset(arch, preset).unwrap().clone(),
        quant: QuantScheme::from_name(quant).unwrap(),
        seed,
    }
}

fn write(s: &SynthSpec) -> Vec<u8> {
    let mut calls = 0;
    let out = synthesize(s, TokenizerSource::Builtin, Vec::new(), &mut |_| calls += 1).unwrap();
    assert_eq!(calls, plan(s).len());
    out
}

const GIB: f64 = (1u64 << 30) as f64;

#[test]
fn tiny_presets_write_valid_files_with_the_planned_tensors() {
    for arch in [Arch::Llama, Arch::Qwen3, Arch::Qwen3Moe] {
        for quant in [
            "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
            "q4_k_m",
        ] {
            let s = spec(arch, "tiny", quant, 1);
            let bytes = write(&s);
            let f = GgufFile::from_bytes(bytes).unwrap();
            let m = f.metadata();
            assert_eq!(m.get_str("general.architecture").unwrap(), arch.name());
            let a = arch.name();
            assert_eq!(
                m.get_u64(&format!("{a}.block_count")).unwrap(),
                s.preset.n_layer as u64
            );
            assert_eq!(
                m.get_u64(&format!("{a}.attention.head_count_kv")).unwrap(),
                2
            );
            assert_eq!(m.get_u64(&format!("{a}.attention.key_length")).unwrap(), 64);
            assert_eq!(
                m.get_arr_str("tokenizer.ggml.tokens").unwrap().len(),
                s.preset.vocab
            );
            let p = plan(&s);
            assert_eq!(f.tensors().len(), p.len(), "{a} {quant}");
            for t in &p {
                let got = f.tensor(&t.name).unwrap();
                assert_eq!((got.ty, &got.shape), (t.ty, &t.shape), "{}", t.name);
                // Every tensor dequantizes to finite values.
                let mut x = vec![0f32; t.elems()];
                kiln_quant::dequantize(t.ty, f.tensor_data(got), &mut x).unwrap();
                assert!(x.iter().all(|v| v.is_finite()), "{}", t.name);
            }
            assert_eq!(f.tensor("output.weight").is_none(), s.preset.tied);
            assert_eq!(
                f.tensor("blk.0.attn_q_norm.weight").is_some(),
                arch != Arch::Llama
            );
            assert_eq!(
                f.tensor("blk.0.ffn_gate_exps.weight").is_some(),
                arch == Arch::Qwen3Moe
            );
        }
    }
}

#[test]
fn same_seed_same_bytes() {
    let a = write(&spec(Arch::Qwen3Moe, "tiny", "q4_k_m", 5));
    assert_eq!(a, write(&spec(Arch::Qwen3Moe, "tiny", "q4_k_m", 5)));
    assert_ne!(a, write(&spec(Arch::Qwen3Moe, "tiny", "q4_k_m", 6)));
}

#[test]
fn weights_have_the_documented_scale() {
    let s = spec(Arch::Qwen3, "tiny", "f32", 3);
    let f = GgufFile::from_bytes(write(&s)).unwrap();
    let stats = |name: &str| {
        let t = f.tensor(name).unwrap();
        let x: Vec<f32> = f
            .tensor_data(t)
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mean = x.iter().sum::<f32>() / x.len() as f32;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / x.len() as f32;
        (mean, var.sqrt())
    };
    let (m, sd) = stats("blk.0.attn_q.weight");
    assert!(
        m.abs() < 0.005 && (sd - 1.0 / 16.0).abs() < 0.002,
        "{m} {sd}"
    );
    let (m, sd) = stats("blk.1.ffn_down.weight");
    assert!(
        m.abs() < 0.005 && (sd - 1.0 / 512f32.sqrt()).abs() < 0.002,
        "{m} {sd}"
    );
    let (m, sd) = stats("output_norm.weight");
    assert!((m - 1.0).abs() < 0.02 && sd < 0.1, "{m} {sd}");
}

#[test]
fn q4_k_m_sizes_follow_the_llama_cpp_mix() {
    // Qwen3-8B by hand: Q4_K is 144 B / 256, Q6_K 210 B / 256. Q6_K: output, and attn_v + ffn_down on the 18
    // use_more_bits layers of 36; everything else Q4_K; norms F32.
    let (d, ff, kv, v, l) = (4096u64, 12288u64, 1024u64, 151_936u64, 36u64);
    let q4 = |n: u64| n / 256 * 144;
    let q6 = |n: u64| n / 256 * 210;
    let per_layer_q4 = q4(d * d) * 2 + q4(d * kv) + q4(d * ff) * 2;
    let want = q4(d * v)
        + q6(d * v)
        + l * per_layer_q4
        + 18 * (q6(d * kv) + q6(ff * d))
        + 18 * (q4(d * kv) + q4(ff * d))
        + 4 * (l * (2 * d + 2 * 128) + d);
    let s = spec(Arch::Qwen3, "8b", "q4_k_m", 0);
    let got: u64 = plan(&s).iter().map(PlannedTensor::bytes).sum();
    assert_eq!(got, want);
    assert_eq!(format!("{:.2}", got as f64 / GIB), "4.68");
    let types: std::collections::BTreeMap<String, usize> =
        plan(&s).iter().fold(Default::default(), |mut m, t| {
            *m.entry(t.ty.name().to_string()).or_default() += 1;
            m
        });
    // 36 × 11 tensors + embd + output_norm + output; Q6_K: output + 18 attn_v + 18 ffn_down.
    assert_eq!(types["q6_K"], 37);
    assert_eq!(types["f32"], 36 * 4 + 1);
    assert_eq!(types["q4_K"], 36 * 11 + 3 - 37 - 145);
    // The tiny model's file is exactly header + aligned tensor data.
    let s = spec(Arch::Qwen3, "tiny", "q4_k_m", 0);
    let f = GgufFile::from_bytes(write(&s)).unwrap();
    let data: u64 = plan(&s).iter().map(PlannedTensor::bytes).sum();
    let last = f.tensors().iter().map(|t| t.offset + t.size).max().unwrap();
    assert!(last >= data);
}

#[test]
fn real_tokenizer_metadata_is_padded_to_the_vocab() {
    let s = spec(Arch::Qwen3, "tiny", "f16", 0);
    let meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::from("gpt2")),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::from(vec!["a", "b", "c"]),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::from(vec![1i32, 1, 3]),
        ),
    ];
    let out = synthesize(&s, TokenizerSource::Metadata(meta), Vec::new(), &mut |_| {}).unwrap();
    let f = GgufFile::from_bytes(out).unwrap();
    let toks = f.metadata().get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        (toks.len(), toks[2].as_str(), toks[3].as_str()),
        (512, "c", "[PAD3]")
    );
    let too_many = vec![(
        "tokenizer.ggml.tokens".to_string(),
        Value::from((0..600).map(|i| i.to_string()).collect::<Vec<_>>()),
    )];
    let err = synthesize(
        &s,
        TokenizerSource::Metadata(too_many),
        Vec::new(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("600 tokens"), "{err}");
}

#[test]
fn names_and_presets_resolve_with_clear_errors() {
    assert_eq!(Arch::from_name("Qwen3MoE").unwrap(), Arch::Qwen3Moe);
    assert!(Arch::from_name("gpt2")
        .unwrap_err()
        .to_string()
        .contains("gpt2"));
    let e = find_preset(Arch::Qwen3, "70b").unwrap_err().to_string();
    assert!(e.contains("0.6b, 8b, tiny"), "{e}");
    let moe = find_preset(Arch::Qwen3Moe, "30b-a3b").unwrap();
    assert_eq!(
        (moe.n_layer, moe.n_expert, moe.n_expert_used, moe.expert_ff),
        (48, 128, 8, 768)
    );
    // The 30B-A3B Q4_K_M lands near llama.cpp's 17.3 GiB file.
    let s = SynthSpec {
        preset: moe.clone(),
        quant: QuantScheme::Q4KM,
        seed: 0,
    };
    let gib = plan(&s).iter().map(PlannedTensor::bytes).sum::<u64>() as f64 / GIB;
    assert!((gib - 17.3).abs() < 0.2, "{gib}");
}
