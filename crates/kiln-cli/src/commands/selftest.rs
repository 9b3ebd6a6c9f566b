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
    /// Also time the kernels on a Qwen3-8B decode step's shapes (GB/s against the bytes each must read).
    #[arg(long)]
    pub bench: bool,
    /// Run only these configurations of the sweep (1-based, comma-separated; default all seven): e.g. `--config 1`
    /// keeps a compute-sanitizer pass over the default kernels short.
    #[arg(long, value_delimiter = ',')]
    pub config: Vec<usize>,
}

pub fn run(args: Args) -> Result<()> {
    args.device.check()?;
    match args.device {
        Device::Cpu => bail!("kiln selftest tests a GPU's kernels: use --device cuda[:N] (the CPU path is covered by cargo test)"),
        Device::Cuda(n) => cuda(n, args.bench, &args.config),
    }
}

#[cfg(feature = "cuda")]
fn cuda(n: usize, bench: bool, only: &[usize]) -> Result<()> {
    if let Some(c) = only.iter().find(|&&c| !(1..=7).contains(&c)) {
        bail!("--config {c}: the sweep has configurations 1 to 7");
    }
    // Every kernel family: the default fast paths, then every kill switch at once (generic matmul on GGUF
    // layouts, unfused ops, whole-context attention) with the f32-activation reference matmul.
    let simple = kiln_cuda::Options {
        fast_gemv: false,
        fused: false,
        split_kv: false,
        split_direct: false,
        prep_in_split: false,
        prep_rows_in_split: false,
        attn_head_split: false,
        attn_fit_grid: false,
        gemv_stage: false,
        early_weights: false,
        graphs: false,
        prefill_mma: false,
        block_mma: false,
        block_tile16: false,
        block_direct: false,
        block_ring: false,
        block_n8: false,
        flash_attn: false,
        k8: false,
        prefill_k8: false,
        moe_group: false,
        moe_gather_quant: false,
        prefill_blas: false,
        prefill_blas_float: false,
        pdl: false,
        l2_prefetch: false,
        reference: true,
    };
    let mut failed = 0;
    let mut total = 0;
    // The fast paths on per-32 activations too (KILN_NO_CUDA_K8: the per-32 GEMV, block and prefill kernels),
    // with the split-KV attention's prep and merge as kernels of their own (KILN_NO_CUDA_SPLIT_DIRECT,
    // KILN_NO_CUDA_PREP_IN_SPLIT).
    let per32 = kiln_cuda::Options {
        k8: false,
        split_direct: false,
        prep_in_split: false,
        ..kiln_cuda::Options::default()
    };
    // The K8 GEMVs of 4 outputs a block with their in-kernel switches off
    // (KILN_NO_CUDA_GEMV_STAGE, KILN_NO_CUDA_EARLY_WEIGHTS: kernels compiled with other defines), a split-KV attention block per KV head (KILN_NO_CUDA_ATTN_HEAD_SPLIT: no
    // 2-block clusters either), the MoE grouping's f32 gather (KILN_NO_CUDA_MOE_GATHER_QUANT), and the K8 block
    // kernel's 4-warp 32-output tiles for every launch (KILN_NO_CUDA_BLOCK_DIRECT and KILN_NO_CUDA_BLOCK_TILE16;
    // the self-test's launches are small, so without the direct kernel they all take 16-output tiles).
    let k8_plain = kiln_cuda::Options {
        block_direct: false,
        block_tile16: false,
        gemv_stage: false,
        early_weights: false,
        attn_head_split: false,
        attn_fit_grid: false,
        moe_gather_quant: false,
        ..kiln_cuda::Options::default()
    };
    for (i, (label, opts)) in [
        ("fast paths", kiln_cuda::Options::default()),
        (
            "fast paths on per-32 activations, prep and merge kernels",
            per32,
        ),
        (
            "fast paths, K8 GEMVs of 4 outputs a block unstaged and waiting first, a block per KV head, f32 MoE gather, 32-output block tiles",
            k8_plain,
        ),
        ("kill switches + reference", simple),
        (
            "fast paths, the 4-warp K8 block kernel on 16-output tiles",
            kiln_cuda::Options {
                block_direct: false,
                ..kiln_cuda::Options::default()
            },
        ),
        (
            "fast paths, the direct K8 block kernel's weights in registers (no shared-memory ring)",
            kiln_cuda::Options {
                block_ring: false,
                ..kiln_cuda::Options::default()
            },
        ),
        (
            "fast paths, the direct K8 block kernel's 16-row form for blocks of up to 8 rows too",
            kiln_cuda::Options {
                block_n8: false,
                ..kiln_cuda::Options::default()
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        if !only.is_empty() && !only.contains(&(i + 1)) {
            continue;
        }
        let t0 = std::time::Instant::now();
        let dev = kiln_cuda::Device::open(n, opts)?;
        println!(
            "device {n}: {} ({}), configuration {}: {label}, kernels {} in {:.2} s",
            dev.name,
            dev.arch,
            i + 1,
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
        for c in &checks {
            println!(
                "{} {:<64} err {:.3e} (tol {:.0e})",
                if c.ok() { "ok  " } else { "FAIL" },
                c.name,
                c.err,
                c.tol
            );
            failed += usize::from(!c.ok());
        }
        total += checks.len();
    }
    if failed > 0 {
        bail!("{failed} of {total} kernel checks failed");
    }
    println!("all {total} kernel checks passed");
    if bench {
        let dev = kiln_cuda::Device::open(n, kiln_cuda::Options::default())?;
        println!("| kernel | µs | GB/s |\n| --- | ---: | ---: |");
        for t in kiln_cuda::bench::run(&dev)? {
            println!("| {} | {:.2} | {:.0} |", t.name, t.us, t.gbps());
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn cuda(_n: usize, _bench: bool, _only: &[usize]) -> Result<()> {
    bail!("this kiln binary has no CUDA backend (build with --features cuda)")
}
