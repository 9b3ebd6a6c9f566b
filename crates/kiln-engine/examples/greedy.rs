//! Greedy decoding from token ids given on the command line: `greedy MODEL N ID...`; prints ids and timings.
//! `THREADS=n` sets the worker threads (example-only knob; the CLI has `-t`).
use kiln_engine::{Flags, LoadOptions, Model, Session, SessionConfig};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let model = Model::load(
        &args[1],
        LoadOptions {
            flags,
            threads: std::env::var("THREADS")
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
            ..LoadOptions::default()
        },
    )?;
    let n: usize = args[2].parse()?;
    let prompt: Vec<u32> = args[3..]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let mut s = Session::new(&model, SessionConfig::default())?;
    let t0 = Instant::now();
    let mut logits = s.prefill(0, &prompt)?;
    let t1 = Instant::now();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map(|(i, _)| i as u32)
            .unwrap_or(0);
        out.push(t);
        logits = s.decode(0, t)?;
    }
    let t2 = Instant::now();
    println!("{out:?}");
    eprintln!(
        "prompt {} tok {:.1} tok/s, gen {} tok {:.1} tok/s",
        prompt.len(),
        prompt.len() as f64 / (t1 - t0).as_secs_f64(),
        n,
        n as f64 / (t2 - t1).as_secs_f64()
    );
    Ok(())
}
