//! `kiln selftest --device cuda[:N]`: compiles (or loads from the cache) the GPU kernels and runs each against a
//! host reference, including batch invariance; prints one line per check and fails if any check fails.

use crate::commands::bench::Device;
use anyhow::{bail, Result};

/// Arguments of `kiln selftest`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Device to test (`cuda` or `cuda:N`; `cpu` has nothing to test here).
    #[arg(long, default_value = "cuda")]
    pub device: Device,
}

pub fn run(args: Args) -> Result<()> {
    args.device.check()?;
    match args.device {
        Device::Cpu => bail!("kiln selftest tests a GPU's kernels: use --device cuda[:N] (the CPU path is covered by cargo test)"),
        Device::Cuda(n) => cuda(n),
    }
}

#[cfg(feature = "cuda")]
fn cuda(n: usize) -> Result<()> {
    let t0 = std::time::Instant::now();
    let dev = kiln_cuda::Device::open(n)?;
    println!(
        "device {n}: {} ({}), kernels {} in {:.2} s",
        dev.name,
        dev.arch,
        if dev.cache_hit {
            "from the cache"
        } else {
            "compiled"
        },
        t0.elapsed().as_secs_f64()
    );
    if let Some(w) = &dev.warning {
        eprintln!("kiln: warning: {w}");
    }
    let checks = kiln_cuda::selftest::run(&dev)?;
    let mut failed = 0;
    for c in &checks {
        println!(
            "{} {:<58} err {:.3e} (tol {:.0e})",
            if c.ok() { "ok  " } else { "FAIL" },
            c.name,
            c.err,
            c.tol
        );
        failed += usize::from(!c.ok());
    }
    if failed > 0 {
        bail!("{failed} of {} kernel checks failed", checks.len());
    }
    println!("all {} kernel checks passed", checks.len());
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn cuda(_n: usize) -> Result<()> {
    bail!("this kiln binary has no CUDA backend (build with --features cuda)")
}
