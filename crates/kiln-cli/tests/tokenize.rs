//! `kiln tokenize` on the real SmolLM2 test model: ids and pieces, `--json`, `--special`, and error exits.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "test asset {} is missing: run tools/fetch-test-assets.sh",
        path.display()
    );
    path
}

fn kiln(args: &[&str]) -> Output {
    let m = model();
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("tokenize")
        .arg("-m")
        .arg(&m)
        .args(args)
        .output()
        .expect("run kiln")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "kiln failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

#[test]
fn json_prints_exactly_the_ids() {
    // SmolLM2's GGUF has add_bos_token = false: no BOS. Ids from transformers' tokenizer for this model.
    let out = stdout(&kiln(&["--json", "Hello, world!"]));
    assert_eq!(out, "{\"ids\": [19556, 28, 905, 17]}\n");
}

#[test]
fn default_output_is_one_id_and_quoted_piece_per_line() {
    let out = stdout(&kiln(&["Hello, world!"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "  19556 \"Hello\"",
            "     28 \",\"",
            "    905 \" world\"",
            "     17 \"!\""
        ]
    );
}

#[test]
fn control_tokens_only_with_special() {
    let plain = stdout(&kiln(&["--json", "<|im_start|>user"]));
    assert!(!plain.contains("[1,") && !plain.contains("[1]"), "{plain}");
    let parsed = stdout(&kiln(&["--json", "--special", "<|im_start|>user"]));
    assert_eq!(parsed, "{\"ids\": [1, 4093]}\n");
}

#[test]
fn missing_model_is_one_error_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["tokenize", "-m", "/nonexistent/model.gguf", "x"])
        .output()
        .expect("run kiln");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn lines_tokenizes_each_line_on_its_own() {
    let dir = std::env::temp_dir().join(format!("kiln-tokenize-lines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("texts.txt");
    std::fs::write(&file, "Hello, world!\n\n<|im_start|>user\n").unwrap();
    let out = stdout(&kiln(&["--lines", file.to_str().unwrap()]));
    // One line per input line, each as the text alone tokenizes (an empty line has no ids; control-token text
    // stays plain without --special).
    let plain_ctl = stdout(&kiln(&["--json", "<|im_start|>user"]));
    assert_eq!(
        out,
        format!("{{\"ids\": [19556, 28, 905, 17]}}\n{{\"ids\": []}}\n{plain_ctl}")
    );
    let special = stdout(&kiln(&["--lines", file.to_str().unwrap(), "--special"]));
    assert_eq!(special.lines().nth(2), Some("{\"ids\": [1, 4093]}"));
    // TEXT and --lines together, or neither, are usage errors; a missing file names itself.
    assert!(!kiln(&["--lines", file.to_str().unwrap(), "x"])
        .status
        .success());
    assert!(!kiln(&[]).status.success());
    let missing = kiln(&["--lines", "/nonexistent/texts.txt"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/texts.txt"));
    std::fs::remove_dir_all(&dir).unwrap();
}
