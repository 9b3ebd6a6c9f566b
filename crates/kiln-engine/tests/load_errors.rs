//! Loading fails with an error naming the problem: missing tensor, wrong shape, unknown architecture, refused
//! RoPE scaling; an unused extra tensor is a warning.

mod common;
use common::*;
use kiln_engine::{Error, LoadOptions, Model};
use kiln_quant::GgmlType;

fn load_err(tag: &str, meta: &[(String, kiln_gguf::Value)], ts: &[T]) -> String {
    let p = write(tag, meta, ts);
    let r = Model::load(&p, LoadOptions::default());
    let _ = std::fs::remove_file(&p);
    match r {
        Ok(_) => panic!("{tag}: loading succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiny_models_of_every_arch_load() {
    for arch in ["llama", "qwen3", "qwen3moe"] {
        let p = tiny_file(arch, GgmlType::Q8_0);
        let m = Model::load(&p, LoadOptions::default()).unwrap();
        let _ = std::fs::remove_file(&p);
        assert_eq!(m.hparams().n_layer, LAYERS);
        assert_eq!(m.n_vocab(), VOCAB as usize);
        assert!(m.warnings().is_empty(), "{arch}: {:?}", m.warnings());
    }
}

#[test]
fn missing_tensor_is_named() {
    let (meta, mut ts) = tiny("qwen3", GgmlType::F32);
    ts.retain(|t| t.name != "blk.1.attn_k_norm.weight");
    let e = load_err("missing", &meta, &ts);
    assert!(
        e.contains("'blk.1.attn_k_norm.weight'") && e.contains("missing"),
        "{e}"
    );
    assert!(e.contains("[32]"), "expected shape not reported: {e}");
}

#[test]
fn wrong_shape_is_named_with_both_shapes() {
    let (meta, mut ts) = tiny("llama", GgmlType::F32);
    let t = ts
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    t.shape = vec![D, HEADS * HD / 2];
    t.data.truncate(t.data.len() / 2);
    let e = load_err("shape", &meta, &ts);
    assert_eq!(
        e,
        "tensor 'blk.0.attn_q.weight' has shape [64, 64], expected [64, 128]"
    );
}

#[test]
fn unknown_arch_is_refused() {
    let (mut meta, ts) = tiny("llama", GgmlType::F32);
    meta[0].1 = "mamba".into();
    let e = load_err("arch", &meta, &ts);
    assert!(e.contains("unknown architecture 'mamba'"), "{e}");
}

#[test]
fn yarn_rope_scaling_is_refused() {
    let (mut meta, ts) = tiny("qwen3", GgmlType::F32);
    meta.push(("qwen3.rope.scaling.type".into(), "yarn".into()));
    meta.push(("qwen3.rope.scaling.factor".into(), 4f32.into()));
    let e = load_err("yarn", &meta, &ts);
    assert!(e.contains("RoPE scaling type 'yarn'"), "{e}");
}

#[test]
fn missing_key_is_named() {
    let (mut meta, ts) = tiny("llama", GgmlType::F32);
    meta.retain(|(k, _)| k != "llama.attention.layer_norm_rms_epsilon");
    let e = load_err("key", &meta, &ts);
    assert!(e.contains("llama.attention.layer_norm_rms_epsilon"), "{e}");
}

#[test]
fn extra_tensor_is_a_warning() {
    let (meta, mut ts) = tiny("llama", GgmlType::F32);
    ts.push(T {
        name: "blk.0.attn_q.bias".into(),
        ty: GgmlType::F32,
        shape: vec![HEADS * HD],
        data: vec![0; (HEADS * HD * 4) as usize],
    });
    let p = write("extra", &meta, &ts);
    let m = Model::load(&p, LoadOptions::default()).unwrap();
    let _ = std::fs::remove_file(&p);
    assert_eq!(m.warnings().len(), 1);
    assert!(m.warnings()[0].contains("blk.0.attn_q.bias"));
}

#[test]
fn errors_are_typed() {
    let (meta, mut ts) = tiny("llama", GgmlType::F32);
    ts.retain(|t| t.name != "output_norm.weight");
    let p = write("typed", &meta, &ts);
    let r = Model::load(&p, LoadOptions::default());
    let _ = std::fs::remove_file(&p);
    assert!(matches!(r, Err(Error::MissingTensor { .. })));
}
