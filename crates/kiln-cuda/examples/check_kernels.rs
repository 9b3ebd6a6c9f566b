//! Compiles every kernel through NVRTC for an architecture (default `sm_90a`) with the options kiln uses at
//! run time, without a GPU, prints each kernel's registers and spills, and writes the cubin to `$KILN_CUBIN_DIR`
//! when set; then compiles them once more with every in-kernel kill switch off (`option_defines`) and the K8
//! block kernel at 8 warps, so both sides of each compile. Used by tools/check-kernels.sh in CI:
//! `cargo run -p kiln-cuda --example check_kernels [-- sm_90a ...]` with libnvrtc on the library path.
use kiln_cuda::compile::{
    compile_cubin, compile_options, nvrtc_version, option_defines, resource_report, KERNEL_NAMES,
};

fn main() {
    let mut archs: Vec<String> = std::env::args().skip(1).collect();
    if archs.is_empty() {
        archs.push("sm_90a".into());
    }
    let (ma, mi) = match nvrtc_version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("check-kernels: {e}");
            std::process::exit(2);
        }
    };
    let mut failed = false;
    for arch in &archs {
        match compile_cubin(arch, &[]) {
            Ok(cubin) => {
                // Every kernel the backend loads must be a symbol of the cubin.
                let missing: Vec<&str> = KERNEL_NAMES
                    .iter()
                    .copied()
                    .filter(|k| {
                        !cubin
                            .windows(k.len() + 1)
                            .any(|w| &w[..k.len()] == k.as_bytes() && w[k.len()] == 0)
                    })
                    .collect();
                if missing.is_empty() {
                    println!(
                        "ok {arch}: {} kernels, cubin {} bytes (NVRTC {ma}.{mi}; options {})",
                        KERNEL_NAMES.len(),
                        cubin.len(),
                        compile_options(arch, &[]).join(" ")
                    );
                    // The cubin itself, for SASS inspection (tools/check-kernels.sh disassembles it).
                    if let Some(dir) = std::env::var_os("KILN_CUBIN_DIR") {
                        let path = std::path::Path::new(&dir).join(format!("{arch}.cubin"));
                        if let Err(e) = std::fs::write(&path, &cubin) {
                            eprintln!("FAIL writing {}: {e}", path.display());
                            failed = true;
                        }
                    }
                    match resource_report(arch) {
                        Ok(lines) => lines.iter().for_each(|l| println!("  {l}")),
                        Err(e) => eprintln!("no resource report: {e}"),
                    }
                } else {
                    eprintln!("FAIL {arch}: kernels missing from the cubin: {missing:?}");
                    failed = true;
                }
            }
            Err(e) => {
                eprintln!("FAIL {arch}: {e}");
                failed = true;
            }
        }
        let mut off = option_defines(&kiln_cuda::Options {
            gemv_stage: false,
            early_weights: false,
            ..kiln_cuda::Options::default()
        });
        // The K8 block kernel's other block size (B16_WARPS in gemv16.cu, a tuning define).
        off.push("-DB16_WARPS=8".to_string());
        match compile_cubin(arch, &off) {
            Ok(_) => println!("ok {arch} with {}", off.join(" ")),
            Err(e) => {
                eprintln!("FAIL {arch} with {}: {e}", off.join(" "));
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
