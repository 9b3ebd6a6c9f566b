//! `kiln score` end to end on the real SmolLM2: the JSON summary on two small windows of the committed text,
//! a top-K dump compared with itself (exact), teacher-forced scoring of a token file, and refusing a reference
//! made with another window size.

use std::path::PathBuf;
use std::process::Command;

fn smollm2() -> String {
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
    p.to_str().unwrap().to_string()
}

const TEXT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../bench/data/stdlib-docs.txt"
);

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap()
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let out = kiln(args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn score_dump_and_self_comparison() {
    let m = smollm2();
    let dir = std::env::temp_dir().join(format!("kiln-score-cli-{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let base = [
        "score", "-m", &m, "-f", TEXT, "-c", "64", "--chunks", "2", "-t", "2", "--json",
    ];

    let a = json_of(&[&base[..], &["--dump-logits", d]].concat());
    // Two windows of 64, positions 32..62 scored: 31 tokens each.
    assert_eq!(a["n_tokens"], 62);
    assert_eq!(a["n_windows"], 2);
    let ppl = a["ppl"].as_f64().unwrap();
    // An instruct model of 135M parameters on English prose with 32+ tokens of context.
    assert!(ppl > 2.0 && ppl < 200.0, "{ppl}");
    assert!(a["ppl_err"].as_f64().unwrap() > 0.0);
    assert!(a.get("kl_mean").is_none());
    assert!(dir.join("topk.kdump").exists());

    let b = json_of(&[&base[..], &["--ref-logits", d]].concat());
    assert_eq!(b["ppl"], a["ppl"]);
    assert_eq!(b["top1"], 1.0);
    // The dump keeps the log-sum-exp as f32: self-KL is zero up to that rounding.
    assert!(b["kl_max"].as_f64().unwrap() < 1e-6, "{b}");
    assert_eq!(b["max_abs_dlogit"], 0.0);
    assert!(b["dp_n"].as_u64().unwrap() > 30, "{b}");

    // A reference scored with other windows is refused with a reason.
    let out = kiln(&[
        "score",
        "-m",
        &m,
        "-f",
        TEXT,
        "-c",
        "48",
        "--chunks",
        "2",
        "-t",
        "2",
        "--ref-logits",
        d,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-c 64"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn human_output_states_the_method() {
    let m = smollm2();
    let out = kiln(&[
        "score", "-m", &m, "-f", TEXT, "-c", "32", "--chunks", "1", "-t", "2",
    ]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.starts_with("Final estimate: PPL = "), "{stdout}");
    assert!(stdout.contains("(15 tokens scored)"));
    assert!(
        stderr.contains("non-overlapping windows of 32 tokens"),
        "{stderr}"
    );
    assert!(stderr.contains("second half"));
}

#[test]
fn teacher_forced_token_file() {
    let m = smollm2();
    let f = std::env::temp_dir().join(format!("kiln-score-ids-{}.txt", std::process::id()));
    std::fs::write(&f, "1 504 3458 314 260 3977 28\n\n1 2 3 4 5\n").unwrap();
    let v = json_of(&[
        "score",
        "-m",
        &m,
        "-f",
        f.to_str().unwrap(),
        "--teacher-forced",
        "-t",
        "2",
        "--json",
    ]);
    assert_eq!(v["n_tokens"], 6 + 4);
    assert_eq!(v["n_windows"], 2);
    assert!(v["ppl"].as_f64().unwrap() > 1.0);
    std::fs::write(&f, "1 2 x\n").unwrap();
    let out = kiln(&[
        "score",
        "-m",
        &m,
        "-f",
        f.to_str().unwrap(),
        "--teacher-forced",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
    let _ = std::fs::remove_file(&f);
}
