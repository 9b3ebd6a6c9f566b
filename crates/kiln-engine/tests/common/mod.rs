//! Helpers shared by the engine's integration tests: the test-asset location and a builder of tiny GGUF models
//! (random weights, real tensor layout) for the three architectures, which tests can break on purpose.
#![allow(dead_code)]

use kiln_gguf::GgufWriter;
use kiln_quant::GgmlType;
use std::path::PathBuf;

/// `.test-assets/` (or `KILN_TEST_ASSETS`); panics with instructions when the asset is missing.
pub fn asset(name: &str) -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "test asset {} is missing: run tools/fetch-test-assets.sh",
        p.display()
    );
    p
}

/// The real SmolLM2-135M-Instruct Q4_1 model.
pub fn smollm2() -> PathBuf {
    asset("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// One tensor of a tiny model.
pub struct T {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(name: &str, ty: GgmlType, shape: &[u64], seed: &mut u64, scale: f32) -> T {
    let n: u64 = shape.iter().product();
    let v = rand_vec(n as usize, seed, scale);
    let bytes = ty.row_bytes(shape[0]).unwrap() * (n / shape[0]);
    let mut data = vec![0u8; bytes as usize];
    kiln_quant::quantize(ty, &v, &mut data).unwrap();
    T {
        name: name.to_string(),
        ty,
        shape: shape.to_vec(),
        data,
    }
}

/// Tiny model geometry.
pub const D: u64 = 64;
pub const HEADS: u64 = 4;
pub const KV_HEADS: u64 = 2;
pub const HD: u64 = 32;
pub const FF: u64 = 96;
pub const VOCAB: u64 = 256;
pub const LAYERS: usize = 2;
pub const EXPERTS: u64 = 4;
pub const USED: u64 = 2;

/// The metadata and tensors of a tiny `arch` model with `ty` matrices (norms f32).
pub fn tiny(arch: &str, ty: GgmlType) -> (Vec<(String, kiln_gguf::Value)>, Vec<T>) {
    let mut seed = 42u64;
    let a = |k: &str| format!("{arch}.{k}");
    let mut meta: Vec<(String, kiln_gguf::Value)> = vec![
        ("general.architecture".into(), arch.into()),
        (a("block_count"), (LAYERS as u32).into()),
        (a("embedding_length"), (D as u32).into()),
        (a("attention.head_count"), (HEADS as u32).into()),
        (a("attention.head_count_kv"), (KV_HEADS as u32).into()),
        (a("attention.key_length"), (HD as u32).into()),
        (a("attention.value_length"), (HD as u32).into()),
        (a("rope.freq_base"), 10000f32.into()),
        (a("attention.layer_norm_rms_epsilon"), 1e-6f32.into()),
        (a("context_length"), 512u32.into()),
    ];
    let moe = arch == "qwen3moe";
    if moe {
        meta.push((a("expert_count"), (EXPERTS as u32).into()));
        meta.push((a("expert_used_count"), (USED as u32).into()));
        meta.push((a("expert_feed_forward_length"), (FF as u32).into()));
    } else {
        meta.push((a("feed_forward_length"), (FF as u32).into()));
    }
    let f = GgmlType::F32;
    let mut ts = vec![
        tensor("token_embd.weight", ty, &[D, VOCAB], &mut seed, 1.0),
        tensor("output_norm.weight", f, &[D], &mut seed, 1.0),
    ];
    if arch != "llama" {
        ts.push(tensor("output.weight", ty, &[D, VOCAB], &mut seed, 0.5));
    }
    let (qd, kvd) = (HEADS * HD, KV_HEADS * HD);
    for il in 0..LAYERS {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        ts.push(tensor(&n("attn_norm"), f, &[D], &mut seed, 1.0));
        ts.push(tensor(&n("attn_q"), ty, &[D, qd], &mut seed, 0.3));
        ts.push(tensor(&n("attn_k"), ty, &[D, kvd], &mut seed, 0.3));
        ts.push(tensor(&n("attn_v"), ty, &[D, kvd], &mut seed, 0.3));
        ts.push(tensor(&n("attn_output"), ty, &[qd, D], &mut seed, 0.3));
        if arch != "llama" {
            ts.push(tensor(&n("attn_q_norm"), f, &[HD], &mut seed, 1.0));
            ts.push(tensor(&n("attn_k_norm"), f, &[HD], &mut seed, 1.0));
        }
        ts.push(tensor(&n("ffn_norm"), f, &[D], &mut seed, 1.0));
        if moe {
            ts.push(tensor(&n("ffn_gate_inp"), f, &[D, EXPERTS], &mut seed, 1.0));
            ts.push(tensor(
                &n("ffn_gate_exps"),
                ty,
                &[D, FF, EXPERTS],
                &mut seed,
                0.3,
            ));
            ts.push(tensor(
                &n("ffn_up_exps"),
                ty,
                &[D, FF, EXPERTS],
                &mut seed,
                0.3,
            ));
            ts.push(tensor(
                &n("ffn_down_exps"),
                ty,
                &[FF, D, EXPERTS],
                &mut seed,
                0.3,
            ));
        } else {
            ts.push(tensor(&n("ffn_gate"), ty, &[D, FF], &mut seed, 0.3));
            ts.push(tensor(&n("ffn_up"), ty, &[D, FF], &mut seed, 0.3));
            ts.push(tensor(&n("ffn_down"), ty, &[FF, D], &mut seed, 0.3));
        }
    }
    (meta, ts)
}

/// Writes a model to a fresh file in the temp dir and returns its path.
pub fn write(tag: &str, meta: &[(String, kiln_gguf::Value)], ts: &[T]) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kiln-engine-test-{}-{tag}.gguf",
        std::process::id()
    ));
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(k, v.clone()).unwrap();
    }
    for t in ts {
        w.add_tensor(&t.name, t.ty, &t.shape).unwrap();
    }
    // Tests of one binary run in parallel threads and may write the same tag: write a private file and rename it
    // into place, so a reader never maps a file that is still being written.
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("{seq}.partial"));
    let file = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    let mut dw = w.begin(file).unwrap();
    for t in ts {
        dw.write_tensor_data(&t.name, &t.data).unwrap();
    }
    dw.finish().unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// Writes the tiny `arch` model unchanged.
pub fn tiny_file(arch: &str, ty: GgmlType) -> PathBuf {
    let (m, t) = tiny(arch, ty);
    write(&format!("{arch}-{}", ty.name()), &m, &t)
}
