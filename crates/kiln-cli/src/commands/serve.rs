//! `kiln serve`: the OpenAI-compatible server (kiln-server) with continuous batching over `--parallel` slots.

use anyhow::{Context, Result};
use kiln_engine::scheduler::SchedulerConfig;
use kiln_engine::Flags;
use kiln_server::ServerConfig;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `kiln serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (GGUF).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health and /metrics.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Total context in tokens, shared by the slots (each request gets ctx / parallel).
    #[arg(
        short = 'c',
        long = "ctx",
        visible_alias = "ctx-size",
        default_value_t = 8192
    )]
    pub ctx: usize,
    /// Requests decoded together (sequence slots).
    #[arg(long, visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Device to run on: cpu, cuda or cuda:N (CUDA needs a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: super::bench::Device,
    /// Worker threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Prefill chunk length: prompt tokens per sequence per step (also the most prefill rows in one step; default:
    /// 512 on CUDA, 64 on the CPU, where a step of 512 prompt rows would stall the running streams for long).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Most requests waiting for a slot before new ones get 503.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,
    /// Run every prompt in full instead of reusing a slot's cached prefix.
    #[arg(long = "no-prefix-reuse")]
    pub no_prefix_reuse: bool,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Seconds a client has to send a request's headers, and then its body.
    #[arg(long = "read-timeout", default_value_t = 10.0)]
    pub read_timeout: f64,
    /// DFlash drafter (z-lab directory or converted GGUF): requests are decoded speculatively inside the batched
    /// scheduler, with the same output. A request's `"speculative": false` opts out.
    #[arg(long, value_name = "DIR")]
    pub draft: Option<PathBuf>,
    /// With --draft: only requests that send `"speculative": true` are speculative.
    #[arg(long = "draft-opt-in", requires = "draft")]
    pub draft_opt_in: bool,
    /// With --draft: propose and verify at most N drafts a round (1 ≤ N < the drafter's block; default: `auto`
    /// on the CPU, 7 on a GPU): a shorter verify block costs less where a verify row is dear (a CPU) and τ is
    /// modest. `auto`: the count that measures fastest, chosen as requests run (on the CPU, each round also cut
    /// where the drafter's margins say the rest are unlikely to be accepted). Output unchanged.
    #[arg(long = "draft-max", value_name = "N|auto", requires = "draft")]
    pub draft_max: Option<kiln_engine::dflash::DraftMax>,
    /// Seconds running requests may take to finish on SIGINT/SIGTERM before they are cancelled.
    #[arg(long = "shutdown-grace", default_value_t = 10.0)]
    pub shutdown_grace: f64,
}

fn seconds(name: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .with_context(|| format!("--{name} {s}: not a valid number of seconds"))
}

pub fn run(args: Args) -> Result<()> {
    args.device.check()?;
    let cuda_device = match args.device {
        super::bench::Device::Cpu => None,
        super::bench::Device::Cuda(n) => Some(n),
    };
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("kiln: warning: {w}");
    }
    let cfg = ServerConfig {
        api_key: args.api_key.filter(|k| !k.is_empty()),
        host: args.host,
        port: args.port,
        ctx: args.ctx,
        parallel: args.parallel,
        threads: args.threads,
        cuda_device,
        flags,
        draft: args.draft,
        draft_default: !args.draft_opt_in,
        draft_max: args.draft_max,
        scheduler: SchedulerConfig {
            chunk: args.chunk.unwrap_or(args.device.default_batch()),
            queue_capacity: args.queue,
            prefix_reuse: !args.no_prefix_reuse,
            prefill_passes: None,
        },
        max_body_bytes: args.max_body,
        read_timeout: seconds("read-timeout", args.read_timeout)?,
        shutdown_grace: seconds("shutdown-grace", args.shutdown_grace)?,
        ..ServerConfig::new(args.model)
    };
    kiln_server::serve(cfg).context("kiln serve")
}
