//! `kiln chat` end to end on the real SmolLM2: two turns from stdin get two replies (history kept, the second
//! turn refers to the first), and end of input exits cleanly with status 0.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

#[test]
fn two_turns_then_eof() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env_remove("KILN_NO_SIMD")
        .env_remove("KILN_NO_QUANT_ACT")
        .arg("chat")
        .arg("-m")
        .arg(smollm2())
        .args(["--temp", "0", "-n", "24", "-t", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"My name is Ada. Say hello to me.\nWhat is my name?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Two replies were generated (one speed line each).
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("tok/s")).collect();
    assert_eq!(reports.len(), 2, "{stderr}");
    assert!(!stdout.contains("<|im"), "{stdout}");
    // The second turn's prompt is only the new turn: the first turn's tokens were reused from the cache.
    let prompt_tokens = |l: &str| -> usize {
        let rest = &l[l.find("prompt ").unwrap() + 7..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(
        prompt_tokens(reports[1]) < prompt_tokens(reports[0]),
        "{stderr}"
    );
    // History is kept: the second reply differs from the answer to the same question asked without it.
    let replies: Vec<&str> = stdout
        .split("> ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(replies.len(), 2, "{stdout}");
    let fresh = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            "--chat",
            "-p",
            "What is my name?",
            "--temp",
            "0",
            "-n",
            "24",
            "-t",
            "2",
        ])
        .arg("-m")
        .arg(smollm2())
        .output()
        .unwrap();
    let fresh = String::from_utf8(fresh.stdout).unwrap();
    assert!(!fresh.trim().is_empty());
    assert_ne!(
        replies[1],
        fresh.trim(),
        "the second turn ignored the first"
    );
}
