//! `kiln info` on the real SmolLM2 test model, and on a truncated copy (one error line, exit status 1).

use std::path::PathBuf;
use std::process::Command;

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

fn kiln(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn info_prints_the_smollm2_summary() {
    let model = asset("SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = kiln(&["info".as_ref(), model.as_os_str()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().map(str::trim_end).collect();
    for want in [
        "size          93.81 MiB (98362432 bytes)",
        "gguf          version 3, alignment 32, 33 metadata keys",
        "architecture  llama",
        "name          Smollm2 135M 8k Lc100K Mix1 Ep2",
        "tokenizer     gpt2 (pre: smollm), 49152 tokens",
    ] {
        assert!(lines.contains(&want), "missing {want:?} in:\n{stdout}");
    }
    let line = |prefix: &str| {
        lines
            .iter()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{stdout}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("block_count"), ["block_count", "30"]);
    assert_eq!(
        line("attention.head_count_kv"),
        ["attention.head_count_kv", "3"]
    );
    assert_eq!(line("rope.freq_base"), ["rope.freq_base", "100000"]);
    assert_eq!(line("tensors")[1], "272,");
    assert_eq!(line("tensors")[4], "(134515008),");
    assert_eq!(line("q4_1")[..3], ["q4_1", "210", "106168320"]);
    assert_eq!(line("q8_0")[..2], ["q8_0", "1"]);
    assert_eq!(line("f32")[..2], ["f32", "61"]);
}

#[test]
fn info_on_a_truncated_file_is_one_error_line_and_status_1() {
    let bytes = std::fs::read(asset("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-cli-info");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, len) in [
        ("cut-in-metadata.gguf", 100_000),
        ("cut-in-data.gguf", bytes.len() - 1000),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, &bytes[..len]).unwrap();
        let out = kiln(&["info".as_ref(), path.as_os_str()]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("kiln: error: "), "{stderr}");
        assert!(stderr.contains(name), "{stderr}");
        if name == "cut-in-data.gguf" {
            assert!(
                stderr.contains("tensor 'output_norm.weight'")
                    || stderr.contains("ends past the end of the file"),
                "{stderr}"
            );
        } else {
            // 49152 strings of at least 8 bytes each cannot be in the 98893 bytes left: rejected before reading.
            assert!(
                stderr.trim_end().ends_with(
                    "cut-in-metadata.gguf: metadata key 'tokenizer.ggml.tokens': array element count 49152 \
                     at offset 1099 cannot fit in the 98893 bytes left"
                ),
                "{stderr}"
            );
        }
    }
    let out = kiln(&["info".as_ref(), dir.join("missing.gguf").as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8(out.stderr).unwrap().lines().count(), 1);
}
