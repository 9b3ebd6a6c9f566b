//! `kiln bench` end to end on the real SmolLM2 with tiny sizes: JSON and CSV shapes, frontier mode with logit
//! dumps, and an A/B run (two child processes). No timing is asserted, only that rates were measured.

use std::path::PathBuf;
use std::process::Command;

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "test asset {} is missing: run tools/fetch-test-assets.sh",
        p.display()
    );
    p
}

fn kiln(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env_remove("KILN_NO_SIMD")
        .env_remove("KILN_NO_QUANT_ACT")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "kiln {args:?} failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-bench-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn bench_json_has_one_record_per_test() {
    let m = smollm2();
    let (out, _) = kiln(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "4",
        "-d",
        "0,8",
        "-r",
        "2",
        "-t",
        "2",
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let recs = v.as_array().unwrap();
    let tests: Vec<&str> = recs.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp16", "tg4", "pp16 @ d8", "tg4 @ d8"]);
    for r in recs {
        assert_eq!(r["model_filename"], "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            r["model_type"]
                .as_str()
                .unwrap()
                .starts_with("llama 135M Q4_1"),
            "{r}"
        );
        assert_eq!(r["n_threads"], 2);
        assert_eq!(r["backend"], "CPU");
        assert!(r["model_size"].as_u64().unwrap() > 80 << 20);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(recs[2]["n_depth"], 8);
    assert_eq!(recs[1]["n_gen"], 4);
}

#[test]
fn bench_markdown_table() {
    let m = smollm2();
    let (out, _) = kiln(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "2",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("| model") && lines[0].ends_with(" t/s |"),
        "{out}"
    );
    assert!(
        lines[2].contains("| llama 135M Q4_1 |") && lines[2].contains(" pp8 |"),
        "{out}"
    );
}

#[test]
fn frontier_csv_and_logit_dumps() {
    let m = smollm2();
    let dir = tmpdir("frontier");
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/data/stdlib-docs.txt"
    );
    let (out, _) = kiln(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-t",
        "2",
        "--ctx-start",
        "16",
        "--ctx-max",
        "40",
        "--step-mul",
        "2",
        "--gen-tokens",
        "3",
        "--prompt-file",
        text,
        "--teacher-forced-decode",
        "-o",
        "csv",
        "--dump-frontier-logits-dir",
        dir.to_str().unwrap(),
    ]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(
        rows[0],
        [
            "ctx_tokens",
            "prefill_tokens",
            "prefill_tps",
            "gen_tokens",
            "gen_tps",
            "gen_first_ms",
            "gen_steady_tokens",
            "gen_steady_tps",
            "kvcache_bytes"
        ]
    );
    let ctx: Vec<&str> = rows[1..].iter().map(|r| r[0]).collect();
    assert_eq!(ctx, ["16", "32", "40"]);
    // SmolLM2: 30 layers × 3 KV heads × 64 × f16 × (K and V) = 23040 bytes per position.
    assert_eq!(rows[1][8], "368640");
    assert_eq!(rows[2][1], "16");
    for r in &rows[1..] {
        assert_eq!(r[3], "3");
        assert!(r[2].parse::<f64>().unwrap() > 0.0 && r[7].parse::<f64>().unwrap() > 0.0);
    }
    for f in ["16", "32", "40"] {
        let b = std::fs::read(dir.join(format!("frontier-{f}.logits"))).unwrap();
        assert_eq!(b.len(), 24 + 4 * 49152);
        assert_eq!(&b[..8], b"KILNFLOG");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--ref-frontier-logits`: a rerun matches its own dump bit for bit; the reference mode (f32 activations) does
/// not, and gets a KL line instead.
#[test]
fn frontier_logits_against_a_reference_run() {
    let m = smollm2();
    let dir = tmpdir("frontier-ref");
    let base = [
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-t",
        "2",
        "--ctx-start",
        "16",
        "--ctx-max",
        "32",
        "--step-mul",
        "2",
        "--gen-tokens",
        "2",
    ];
    let with = |extra: &[&str], env: Option<(&str, &str)>| -> String {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
        c.env_remove("KILN_NO_SIMD").env_remove("KILN_NO_QUANT_ACT");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.args(base).args(extra).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let d = dir.to_str().unwrap();
    with(&["--dump-frontier-logits-dir", d], None);
    let same = with(&["--ref-frontier-logits", d], None);
    for f in [16, 32] {
        assert!(
            same.contains(&format!("frontier {f}: logits identical to the reference")),
            "{same}"
        );
    }
    let other = with(
        &["--ref-frontier-logits", d],
        Some(("KILN_NO_QUANT_ACT", "1")),
    );
    assert!(other.contains("frontier 16: KL "), "{other}");
    assert!(!other.contains("identical"), "{other}");
    let missing = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(base)
        .args(["--ref-frontier-logits", "/nonexistent-kiln-dir"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("reference logits"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ab_runs_both_arms_and_prints_the_ratio() {
    let m = smollm2();
    let (out, err) = kiln(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "2",
        "--ab",
        "KILN_NO_SIMD=1",
        "-o",
        "json",
    ]);
    assert_eq!(err.matches("arm A").count(), 2, "{err}");
    assert_eq!(err.matches("arm B").count(), 2, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["variant"], "KILN_NO_SIMD=1");
    let res = v["results"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    assert!(res[0]["metric"].as_str().unwrap().ends_with("pp8"));
    for r in res {
        let (a, b) = (
            r["a_median_ts"].as_f64().unwrap(),
            r["b_median_ts"].as_f64().unwrap(),
        );
        let ratio = r["ratio_b_over_a"].as_f64().unwrap();
        assert!((ratio - b / a).abs() < 1e-9);
        // Two repetitions: the ratio of the medians (the means) is a weighted mean of the two runs' ratios.
        let (lo, hi) = (
            r["pair_ratio_min"].as_f64().unwrap(),
            r["pair_ratio_max"].as_f64().unwrap(),
        );
        assert!(0.0 < lo && lo <= hi && hi.is_finite(), "{lo} {hi}");
        assert!(
            lo * (1.0 - 1e-9) <= ratio && ratio <= hi * (1.0 + 1e-9),
            "{lo} {ratio} {hi}"
        );
        let delta = r["us_per_token_b_minus_a"].as_f64().unwrap();
        assert!((delta - (1e6 / b - 1e6 / a)).abs() < 1e-6 * delta.abs().max(1.0));
    }
}

#[test]
fn bench_rejects_cuda_without_a_cuda_build() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "-m", "x.gguf", "--device", "cuda"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CUDA"));
}

#[test]
fn skip_each_needs_cuda_and_a_set() {
    let m = smollm2();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "0",
            "-n",
            "2",
            "-r",
            "1",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(&args)
            .output()
            .unwrap()
    };
    // On the CPU (or in a build without CUDA) it says why instead of timing anything.
    let cpu = run(&["--skip-each", "attn_q ffn_gate"]);
    assert!(!cpu.status.success());
    assert!(String::from_utf8_lossy(&cpu.stderr).contains("CUDA"));
    // With --ab it is refused by the parser: both would time variants.
    let both = run(&["--skip-each", "attn_q", "--ab", "KILN_NO_SIMD=1"]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
}

/// `--draft`: plain and speculative generation side by side. Forced acceptance of at most 3 drafts per round
/// gives τ = 11/3 for 12 tokens (the first comes from the prompt); the speculative output is checked against
/// the plain one inside the bench (a mismatch fails the command).
#[test]
fn bench_draft_reports_tau_histogram_and_split() {
    use kiln_engine::dflash::{write_random_drafter, DraftSpec};
    let m = smollm2();
    let dir = tmpdir("draft");
    write_random_drafter(
        &dir,
        &DraftSpec {
            hidden: 576,
            n_ff: 128,
            n_layer: 1,
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            vocab: 49152,
            block_size: 8,
            num_target_layers: 30,
            target_layer_ids: vec![2, 15, 27],
            mask_token_id: 0,
            rope_theta: 1e5,
            seed: 3,
            sliding: None,
        },
    )
    .unwrap();
    // `kiln bench` on SmolLM2 with this drafter, two threads, one timed run, JSON out, and `extra`.
    let draft_bench = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--draft",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(&["-r", "1", "-t", "2", "-o", "json"]);
        args.extend_from_slice(extra);
        serde_json::from_str(&kiln(&args).0).unwrap()
    };
    let v = draft_bench(&["--draft-force", "own,3,7", "-n", "12", "-d", "8"]);
    let recs = v.as_array().unwrap();
    let forces: Vec<String> = recs.iter().map(|r| r["force"].to_string()).collect();
    assert_eq!(forces, ["\"own\"", "3", "7"]);
    for r in recs {
        assert_eq!(r["test"], "tg12 @ d8");
        // Without --draft-max a target on the CPU gets `auto` (forced rows keep every draft all the same).
        assert_eq!(r["draft"], "1L b8 auto");
        assert!(r["ar_avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["spec_avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["verify_ms_per_round"].as_f64().unwrap() > 0.0, "{r}");
        let hist: Vec<u64> = r["accept_hist"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(hist.len(), 8);
        assert_eq!(hist.iter().sum::<u64>(), r["rounds"].as_u64().unwrap());
    }
    // 11 tokens in rounds of at most 4: 4 + 4 + 3.
    assert_eq!(recs[1]["rounds"], 3);
    assert!((recs[1]["tau"].as_f64().unwrap() - 11.0 / 3.0).abs() < 1e-9);
    assert_eq!(recs[1]["accept_hist"][3], 2);
    assert_eq!(recs[1]["accept_hist"][2], 1);
    // At most 7 per round: 8 + 3.
    assert_eq!(recs[2]["rounds"], 2);
    // `--draft-max` rows: every draft right (forced, up to 7), but at most N verified a round: 11 tokens in rounds
    // of 3 (3 + 3 + 3 + 2) at N = 2, of 6 (6 + 5) at N = 5.
    let v = draft_bench(&[
        "--draft-max",
        "2,5",
        "--draft-force",
        "7",
        "-n",
        "12",
        "-d",
        "8",
    ]);
    let recs = v.as_array().unwrap();
    let rows: Vec<(String, u64)> = recs
        .iter()
        .map(|r| {
            (
                r["draft"].as_str().unwrap().to_string(),
                r["rounds"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [("1L b8 max2".to_string(), 4), ("1L b8 max5".to_string(), 2)]
    );
    assert_eq!(recs[0]["accept_hist"][2], 3);
    assert_eq!(recs[0]["accept_hist"][3], 0);
    // `--draft-max auto` (the drafter's own drafts; forced rows keep every draft): its own row.
    let v = draft_bench(&["--draft-max", "auto,3", "-n", "12", "-d", "8"]);
    let recs = v.as_array().unwrap();
    assert_eq!(recs[0]["draft"], "1L b8 auto");
    assert_eq!(recs[1]["draft"], "1L b8 max3");
    assert!(recs[0]["rounds"].as_u64().unwrap() > 0, "{}", recs[0]);
    // Refused settings: the command fails and says why.
    let refused = |extra: &[&str], why: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["bench", "-m", m.to_str().unwrap(), "--draft"])
            .arg(&dir)
            .args(extra)
            .args(["-n", "4", "-r", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{extra:?}: {err}"
        );
    };
    refused(
        &["--draft-max", "most"],
        "'most' is not a draft count (N ≥ 1) or 'auto'",
    );
    // A K that does not fit the block.
    refused(&["--draft-force", "8"], "at most 7 drafts");
    // `--ab` takes `--draft`: the plain and the speculative speed of each arm.
    let v = draft_bench(&["--draft-force", "3", "-n", "6", "--ab", "KILN_NO_SIMD=1"]);
    let metrics: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metric"].as_str().unwrap())
        .collect();
    assert_eq!(metrics.len(), 2, "{metrics:?}");
    assert!(metrics[0].ends_with("tg6 AR"), "{metrics:?}");
    // The DFlash metric names the drafter and its drafts setting (`auto` on the CPU by default).
    assert!(
        metrics[1].ends_with("tg6 1L b8 auto k=3 DFlash"),
        "{metrics:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
