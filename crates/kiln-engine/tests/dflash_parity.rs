//! Drafter parity with the reference `dflash` package (0.1.0, torch on the CPU): a random-weight drafter in the
//! z-lab format over the tiny synthetic Qwen3 target, two rounds (context features appended, block dropped), the
//! draft logits compared with the committed reference output (tools/gen_dflash_fixtures.py).
//!
//! The drafter (about 2 MB) and the target are not committed: both are regenerated here from fixed seeds and their
//! SHA-256 checked against the fixture, so a changed generator fails loudly instead of comparing different weights.
//! `cargo test -p kiln-engine --test dflash_parity -- --ignored write_oracle_inputs` with `KILN_DFLASH_OUT=DIR`
//! writes the two for the script (with `KILN_DFLASH_SLIDING=1`: the same weights with a sliding-window first
//! layer, fixtures in `tests/fixtures/dflash-sliding`).

use kiln_engine::dflash::{convert_to_gguf, write_random_drafter, DraftSpec, Drafter};
use kiln_engine::synth::{
    find_preset, synthesize_to_file, Arch, QuantScheme, SynthSpec, TokenizerSource,
};
use kiln_engine::{LoadOptions, Model};
use kiln_quant::GgmlType;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dflash");
const FIXTURES_SLIDING: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dflash-sliding");

/// The drafter; `sliding`: its first layer a sliding-window one (causal, window 3: narrower than both rounds'
/// context, so the window cuts every block row's view), the second full attention.
fn draft_spec(sliding: bool) -> DraftSpec {
    DraftSpec {
        hidden: 256,
        n_ff: 384,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        vocab: 512,
        block_size: 4,
        num_target_layers: 3,
        target_layer_ids: vec![0, 1],
        mask_token_id: 500,
        rope_theta: 1e6,
        seed: 2024,
        sliding: sliding.then(|| (3, vec![true, false])),
    }
}

/// Writes `target.gguf` and `drafter/` into `dir`.
fn write_inputs(dir: &Path, sliding: bool) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let target = dir.join("target.gguf");
    let spec = SynthSpec {
        preset: find_preset(Arch::Qwen3, "tiny").unwrap().clone(),
        quant: QuantScheme::Uniform(GgmlType::F32),
        seed: 99,
    };
    synthesize_to_file(&spec, TokenizerSource::Builtin, &target, &mut |_| {}).unwrap();
    let drafter = dir.join("drafter");
    write_random_drafter(&drafter, &draft_spec(sliding)).unwrap();
    (target, drafter)
}

fn sha(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read_f32(fixtures: &str, name: &str) -> Vec<f32> {
    let p = Path::new(fixtures).join(name);
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
#[ignore = "writes the oracle's inputs for tools/gen_dflash_fixtures.py"]
fn write_oracle_inputs() {
    let dir = std::env::var_os("KILN_DFLASH_OUT").expect("set KILN_DFLASH_OUT to a directory");
    write_inputs(
        Path::new(&dir),
        std::env::var_os("KILN_DFLASH_SLIDING").is_some(),
    );
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - z).collect()
}

/// Runs the rounds of the fixture in `fixtures` through `d`; returns (all draft logits, worst KL, max |Δlogit|,
/// top-1 rows checked).
fn run_rounds(
    m: &Model,
    d: &Drafter,
    fixtures: &str,
    meta: &serde_json::Value,
) -> (Vec<f32>, f64, f32, usize) {
    let n_vocab = m.n_vocab();
    let mut st = d.new_state(m.backend(), 4096).unwrap();
    let (mut worst_kl, mut worst_diff, mut top1_checked) = (0f64, 0f32, 0);
    let mut all = Vec::new();
    for (r, round) in meta["rounds"].as_array().unwrap().iter().enumerate() {
        let ctx = read_f32(fixtures, &format!("round{r}_ctx.f32"));
        let want = read_f32(fixtures, &format!("round{r}_logits.f32"));
        let block: Vec<u32> = round["block"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(st.len(), round["ctx_start"].as_u64().unwrap() as usize);
        d.append_context(m.backend(), &mut st, &ctx).unwrap();
        let h = d.block_hidden(m.backend(), &mut st, &block).unwrap();
        let got = d.logits(m.backend(), &h[256..]).unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.chunks(n_vocab).zip(want.chunks(n_vocab)) {
            let (lg, lw) = (log_softmax(g), log_softmax(w));
            let kl: f64 = lw.iter().zip(&lg).map(|(w, g)| w.exp() * (w - g)).sum();
            worst_kl = worst_kl.max(kl);
            for (a, b) in g.iter().zip(w) {
                worst_diff = worst_diff.max((a - b).abs());
            }
            let mut idx: Vec<usize> = (0..n_vocab).collect();
            idx.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
            if w[idx[0]] - w[idx[1]] >= 0.1 {
                top1_checked += 1;
                let gi = (0..n_vocab).max_by(|&a, &b| g[a].total_cmp(&g[b])).unwrap();
                assert_eq!(gi, idx[0], "round {r}: top-1 differs");
            }
        }
        all.extend_from_slice(&got);
    }
    (all, worst_kl, worst_diff, top1_checked)
}

fn load_meta(fixtures: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(Path::new(fixtures).join("meta.json")).unwrap())
        .unwrap()
}

/// Regenerates the inputs into `tag`'s temp dir and checks them against the fixture's hashes.
fn inputs(tag: &str, meta: &serde_json::Value, sliding: bool) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("kiln-dflash-parity-{}-{tag}", std::process::id()));
    let (target, drafter_dir) = write_inputs(&dir, sliding);
    let regen = "regenerate with tools/gen_dflash_fixtures.py";
    assert_eq!(
        sha(&target),
        meta["target_sha256"].as_str().unwrap(),
        "target changed: {regen}"
    );
    assert_eq!(
        sha(&drafter_dir.join("model.safetensors")),
        meta["drafter_sha256"].as_str().unwrap(),
        "drafter changed: {regen}"
    );
    (target, drafter_dir)
}

/// A fixture's inputs, loaded, and the drafter's logits over its rounds.
struct Checked {
    m: Model,
    target: PathBuf,
    drafter_dir: PathBuf,
    meta: serde_json::Value,
    logits: Vec<f32>,
}

/// Loads the inputs of the fixture in `fixtures` (regenerated under `tag`) and checks the drafter's logits against
/// the reference's there.
fn matches_reference(fixtures: &str, tag: &str, sliding: bool) -> Checked {
    let meta = load_meta(fixtures);
    let (target, drafter_dir) = inputs(tag, &meta, sliding);
    let m = Model::load(&target, LoadOptions::default()).unwrap();
    let d = Drafter::load(&drafter_dir, &m).unwrap();
    let (logits, kl, diff, top1) = run_rounds(&m, &d, fixtures, &meta);
    eprintln!(
        "dflash parity ({tag}): worst KL {kl:.3e}, max |Δlogit| {diff:.3e}, top-1 checked on {top1} rows"
    );
    assert!(kl <= 1e-4, "KL {kl}");
    assert!(diff <= 1e-2, "max |Δlogit| {diff}");
    assert!(top1 > 0);
    Checked {
        m,
        target,
        drafter_dir,
        meta,
        logits,
    }
}

#[test]
fn drafter_matches_reference() {
    matches_reference(FIXTURES, "ref", false);
}

#[test]
fn sliding_window_drafter_matches_reference() {
    let Checked {
        m,
        drafter_dir,
        meta,
        logits: got,
        ..
    } = matches_reference(FIXTURES_SLIDING, "sliding", true);
    // The same weights and inputs with full attention everywhere (the other fixture) give other drafts: the
    // window and the causal mask change what the rows see.
    let full: Vec<f32> = (0..2)
        .flat_map(|r| read_f32(FIXTURES, &format!("round{r}_logits.f32")))
        .collect();
    let moved = got
        .iter()
        .zip(&full)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(moved > 0.1, "sliding and full attention agree to {moved}");
    // Converted to GGUF, the layer types travel in the stored config.
    let bf16 = drafter_dir.with_extension("bf16.gguf");
    convert_to_gguf(&drafter_dir, &bf16, GgmlType::BF16).unwrap();
    let (again, ..) = run_rounds(
        &m,
        &Drafter::load(&bf16, &m).unwrap(),
        FIXTURES_SLIDING,
        &meta,
    );
    assert!(again == got, "the bf16 GGUF sliding drafter differs");
}

#[test]
fn converted_gguf_drafter() {
    let Checked {
        m,
        target,
        drafter_dir,
        meta,
        logits: want,
    } = matches_reference(FIXTURES, "gguf", false);
    // bf16 weights stored as bf16 are the same values: the same bits out.
    let bf16 = drafter_dir.with_extension("bf16.gguf");
    assert_eq!(
        convert_to_gguf(&drafter_dir, &bf16, GgmlType::BF16).unwrap(),
        0
    );
    let (got, ..) = run_rounds(&m, &Drafter::load(&bf16, &m).unwrap(), FIXTURES, &meta);
    assert!(
        got == want,
        "bf16 GGUF drafter differs from the safetensors one"
    );
    // Q8_0: close to the reference.
    let q8 = drafter_dir.with_extension("q8_0.gguf");
    convert_to_gguf(&drafter_dir, &q8, GgmlType::Q8_0).unwrap();
    let (_, kl, diff, _) = run_rounds(&m, &Drafter::load(&q8, &m).unwrap(), FIXTURES, &meta);
    eprintln!("dflash q8_0 drafter: worst KL {kl:.3e}, max |Δlogit| {diff:.3e}");
    assert!(kl <= 1e-2, "KL {kl}");
    // A target GGUF is not a drafter.
    let e = Drafter::load(&target, &m).unwrap_err().to_string();
    assert!(e.contains("not a converted DFlash drafter"), "{e}");
}
