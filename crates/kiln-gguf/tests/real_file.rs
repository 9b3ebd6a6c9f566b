//! The real SmolLM2-135M (Q4_1) test model: its metadata as the `gguf` Python package reads it, and every
//! tensor dequantized by kiln-quant matching the Python package's dequantization
//! (fixture: tools/gen_gguf_dequant_checksums.py).

use kiln_gguf::{GgufFile, Summary};
use kiln_quant::GgmlType;
use std::path::PathBuf;

fn asset(name: &str) -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "test asset {} is missing: run tools/fetch-test-assets.sh",
        path.display()
    );
    path
}

fn smollm2() -> GgufFile {
    GgufFile::open(asset("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap()
}

#[test]
fn smollm2_metadata_matches_the_python_reader() {
    let f = smollm2();
    let md = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.file_size(), 98_362_432);
    assert_eq!(f.alignment(), 32);
    assert_eq!(md.len(), 33);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(md.get_u32("llama.context_length").unwrap(), 8192);
    assert_eq!(md.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(md.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(md.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(md.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(md.get_u32("llama.rope.dimension_count").unwrap(), 64);
    assert_eq!(md.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        md.get_f32("llama.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-5 // stored as f32 9.999999747378752e-06
    );
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let tokens = md.get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        md.get_arr_i32("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        md.get_arr_str("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(md.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(md.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert!(!md.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(md
        .get_str("tokenizer.chat_template")
        .unwrap()
        .starts_with("{% for message in messages %}"));
    assert_eq!(md.opt_arr_f32("tokenizer.ggml.scores").unwrap(), None);

    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (t.ty, t.shape.as_slice(), t.offset),
        (GgmlType::Q8_0, &[576, 49152][..], 1_785_664)
    );
    assert_eq!(f.tensors()[0].name, "token_embd.weight");

    let s = Summary::of(&f);
    assert_eq!(s.parameter_count, 134_515_008);
    let mix: Vec<(GgmlType, usize)> = s.quant_mix.iter().map(|q| (q.ty, q.tensors)).collect();
    assert_eq!(
        mix,
        [
            (GgmlType::Q4_1, 210),
            (GgmlType::Q8_0, 1),
            (GgmlType::F32, 61)
        ]
    );
    assert_eq!(
        s.tensor_bytes,
        f.tensors().iter().map(|t| t.size).sum::<u64>()
    );
}

/// One line of the checksum fixture.
struct Expected {
    name: String,
    ty: String,
    n: u64,
    sum: f64,
    sum_abs: f64,
    sum_sq: f64,
    samples: Vec<(usize, u32)>,
}

fn expected() -> Vec<Expected> {
    let text = include_str!("fixtures/smollm2_dequant.txt");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(w.len(), 14, "{l}");
            Expected {
                name: w[0].to_owned(),
                ty: w[1].to_owned(),
                n: w[2].parse().unwrap(),
                sum: w[3].parse().unwrap(),
                sum_abs: w[4].parse().unwrap(),
                sum_sq: w[5].parse().unwrap(),
                samples: w[6..]
                    .iter()
                    .map(|s| {
                        let (i, b) = s.split_once(':').unwrap();
                        (i.parse().unwrap(), u32::from_str_radix(b, 16).unwrap())
                    })
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn smollm2_every_tensor_dequantizes_like_the_python_package() {
    let f = smollm2();
    let want = expected();
    assert_eq!(want.len(), f.tensors().len());
    let mut out = Vec::new();
    for (t, e) in f.tensors().iter().zip(&want) {
        assert_eq!(
            (&t.name, t.ty.name().to_lowercase(), t.n_elements()),
            (&e.name, e.ty.clone(), e.n)
        );
        out.clear();
        out.resize(t.n_elements() as usize, f32::NAN);
        kiln_quant::dequantize(t.ty, f.tensor_data(t), &mut out).unwrap();
        let (mut sum, mut sum_abs, mut sum_sq) = (0f64, 0f64, 0f64);
        for &x in &out {
            let x = f64::from(x);
            sum += x;
            sum_abs += x.abs();
            sum_sq += x * x;
        }
        // Sums differ only by summation order (numpy sums pairwise), far below 1e-9 of the magnitude.
        let close = |a: f64, b: f64, scale: f64| (a - b).abs() <= 1e-9 * scale.max(1e-30);
        assert!(
            close(sum, e.sum, e.sum_abs),
            "{}: sum {sum} vs {}",
            t.name,
            e.sum
        );
        assert!(
            close(sum_abs, e.sum_abs, e.sum_abs),
            "{}: sum_abs {sum_abs} vs {}",
            t.name,
            e.sum_abs
        );
        assert!(
            close(sum_sq, e.sum_sq, e.sum_sq),
            "{}: sum_sq {sum_sq} vs {}",
            t.name,
            e.sum_sq
        );
        for k in 0..8u64 {
            let i = ((k * 0x9E37_79B1 + 12345) % e.n) as usize;
            assert_eq!(e.samples[k as usize].0, i, "fixture index formula");
            assert_eq!(
                out[i].to_bits(),
                e.samples[k as usize].1,
                "{}: element {i} is {} (python: {})",
                t.name,
                out[i],
                f32::from_bits(e.samples[k as usize].1)
            );
        }
    }
}
