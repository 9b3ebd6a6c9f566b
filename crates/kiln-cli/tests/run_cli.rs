//! `kiln run` end to end on the real SmolLM2: greedy chat output is non-empty English-looking text, identical
//! across runs and thread counts; stdout holds only the generated text; stop strings and the context limit end
//! generation cleanly; a missing model is one error line and exit status 1.

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

/// Runs `kiln run` with `args`; returns (status ok, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let model = smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env_remove("KILN_NO_SIMD")
        .env_remove("KILN_NO_QUANT_ACT")
        .arg("run")
        .arg("-m")
        .arg(&model)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("stdout is valid UTF-8"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn greedy_chat_answer_is_sensible_and_deterministic() {
    let args = [
        "-p",
        "Name three colors.",
        "--chat",
        "-n",
        "24",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let (ok, text, err) = run(&args);
    assert!(ok, "{err}");
    // A sensible answer names colors (the model answers "1. Red 2. Blue 3. Green").
    let lower = text.to_lowercase();
    let colors = [
        "red", "blue", "green", "yellow", "orange", "purple", "black", "white", "pink",
    ];
    let named = colors.iter().filter(|c| lower.contains(*c)).count();
    assert!(named >= 2, "no sensible answer: {text:?}");
    assert!(!text.contains("<|im"), "control tokens leaked: {text:?}");
    // Diagnostics on stderr, not stdout.
    assert!(err.contains("tok/s"), "{err}");
    assert!(!text.contains("tok/s"));
    // Same text again, and with one thread (batch invariance makes threads irrelevant too).
    let (_, again, _) = run(&args);
    assert_eq!(text, again);
    let mut one = args.to_vec();
    one[8] = "1";
    let (_, single, _) = run(&one);
    assert_eq!(text, single);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let args = [
        "-p",
        "The ocean is",
        "-n",
        "16",
        "--temp",
        "0.9",
        "--seed",
        "7",
    ];
    let (ok, a, err) = run(&args);
    assert!(ok, "{err}");
    let (_, b, _) = run(&args);
    assert_eq!(a, b);
    assert!(!a.trim().is_empty());
}

#[test]
fn context_limit_ends_with_length() {
    let (ok, text, err) = run(&[
        "-p",
        "One two three four",
        "-n",
        "100",
        "-c",
        "12",
        "--temp",
        "0",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("finish: length"), "{err}");
    assert!(!text.trim().is_empty());
    // A prompt longer than the context is a clear error.
    let (ok, _, err) = run(&["-p", "one two three four five six seven", "-c", "4"]);
    assert!(!ok);
    assert!(err.contains("context holds 4"), "{err}");
}

#[test]
fn stop_string_is_not_printed() {
    let base = ["-p", "Count: 1, 2, 3, 4,", "-n", "30", "--temp", "0"];
    let (ok, full, err) = run(&base);
    assert!(ok, "{err}");
    // Stop at the first comma the model writes; the text before it is printed, the comma is not.
    let (ok, stopped, err) = run(&[&base[..], &["--stop", ","]].concat());
    assert!(ok, "{err}");
    assert!(err.contains("finish: stop"), "{err}");
    let cut = full
        .find(',')
        .expect("the model writes a comma when counting");
    assert_eq!(stopped.trim_end_matches('\n'), &full[..cut]);
}

#[test]
fn missing_model_is_one_error_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "-m", "/nonexistent/model.gguf", "-p", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("kiln: error:"), "{err}");
    assert!(out.stdout.is_empty());
}

/// A truncated model is one error line that says where the file ends, once (the engine's error shows the GGUF
/// reader's text, which is also its source).
#[test]
fn truncated_model_is_one_error_line_said_once() {
    let bytes = std::fs::read(smollm2()).unwrap();
    let path = std::env::temp_dir().join(format!("kiln-run-cli-cut-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg("-m")
        .arg(&path)
        .args(["-p", "hi"])
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("kiln: error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("kiln: error:"))
            .count(),
        1,
        "{err}"
    );
    let tail = line.rsplit(": ").next().unwrap();
    assert_eq!(line.matches(tail).count(), 1, "{line}");
    assert!(line.contains("file"), "{line}");
}

/// `kiln synth --arch dflash` writes a drafter of a target's shape that `kiln run --draft` loads, and greedy
/// speculative output equals plain output (a random drafter: almost every draft rejected, rollback every round).
#[test]
fn synthesized_drafter_runs_and_agrees_with_plain_greedy() {
    let dir = std::env::temp_dir().join(format!("kiln-run-cli-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (target, draft) = (dir.join("t.gguf"), dir.join("d.gguf"));
    let kiln = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .env_remove("KILN_NO_SIMD")
            .env_remove("KILN_NO_QUANT_ACT")
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kiln {args:?}: {stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (t, d) = (target.to_str().unwrap(), draft.to_str().unwrap());
    kiln(&[
        "synth", "--arch", "qwen3", "--preset", "tiny", "--quant", "q8_0", "-o", t,
    ]);
    let (_, made) = kiln(&[
        "synth",
        "--arch",
        "dflash",
        "--target",
        t,
        "--draft-layers",
        "2",
        "--block",
        "8",
        "--quant",
        "q8_0",
        "-o",
        d,
    ]);
    assert!(
        made.contains("DFlash drafter: 2 layers, hidden 256, block 8"),
        "{made}"
    );
    let gen = [
        "run",
        "-m",
        t,
        "-p",
        "hello there",
        "-n",
        "40",
        "--temp",
        "0",
    ];
    let (plain, _) = kiln(&gen);
    let (spec, log) = kiln(&[&gen[..], &["--draft", d]].concat());
    assert_eq!(spec, plain);
    assert!(log.contains("dflash tau"), "{log}");
    // The wall-time split: five parts in ms, each a disjoint share of the run, so none is negative.
    let split = log
        .lines()
        .find_map(|l| l.strip_prefix("kiln: dflash time: "))
        .unwrap_or_else(|| panic!("no time split in {log}"));
    let parts: Vec<f64> = split
        .split(", ")
        .map(|p| p.rsplit(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(parts.len(), 5, "{split}");
    assert!(parts.iter().all(|&v| v >= -0.05), "{split}");
    let _ = std::fs::remove_dir_all(&dir);
}
