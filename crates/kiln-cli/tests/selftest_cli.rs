//! `kiln selftest --device cuda` and `--device` parsing, on a machine without a GPU: clear errors, no panics.

use std::process::Command;

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("kiln runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn selftest_without_a_gpu_says_why() {
    let (ok, err) = kiln(&["selftest", "--device", "cuda:0"]);
    if cfg!(feature = "cuda") && std::path::Path::new("/dev/nvidiactl").exists() {
        // A GPU machine: the sweep itself must pass.
        assert!(ok, "{err}");
        return;
    }
    assert!(!ok);
    assert!(!err.contains("panicked"), "{err}");
    let want = if cfg!(feature = "cuda") {
        "no CUDA driver found (libcuda.so): use --device cpu"
    } else {
        "no CUDA backend"
    };
    assert!(err.contains(want), "{err}");
}

#[test]
fn device_names_are_checked() {
    let (ok, err) = kiln(&["selftest", "--device", "gpu"]);
    assert!(!ok);
    assert!(err.contains("cpu, cuda or cuda:N"), "{err}");
    let (ok, err) = kiln(&["selftest", "--device", "cpu"]);
    assert!(!ok);
    assert!(err.contains("use --device cuda"), "{err}");
}

#[test]
fn run_chat_serve_take_the_device_and_refuse_a_missing_one() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../.test-assets/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
    for cmd in [
        vec![
            "run", "-m", model, "-p", "hi", "-n", "1", "--device", "cuda:0",
        ],
        vec!["chat", "-m", model, "--device", "cuda"],
        vec!["serve", "-m", model, "--port", "0", "--device", "cuda:0"],
    ] {
        // With the cuda feature the command may really run (a GPU machine): only the parse error is checked.
        if !cfg!(feature = "cuda") {
            let (ok, err) = kiln(&cmd);
            assert!(!ok, "{cmd:?}");
            assert!(!err.contains("panicked"), "{cmd:?}: {err}");
            assert!(err.contains("no CUDA backend"), "{cmd:?}: {err}");
        }
        let (ok, err) = kiln(&[cmd[0], "-m", model, "--device", "tpu"]);
        assert!(!ok && err.contains("cpu, cuda or cuda:N"), "{err}");
    }
}
