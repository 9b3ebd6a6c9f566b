//! A host drafter's pass, timed alone: `draft_pass MODEL DRAFTER [CONTEXT]` prints the best of 150 calls (ms) of
//! the whole block's hidden states and of a proposing pass for 1, 3 and 15 drafts, after CONTEXT (300) made-up
//! context positions. Best-of, not mean: on a shared machine other tenants only ever add time.
//! The kill switches (`KILN_NO_…`) apply as in the CLI.
use kiln_engine::dflash::Drafter;
use kiln_engine::{Flags, LoadOptions, Model};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: draft_pass MODEL DRAFTER [CONTEXT]".into());
    }
    let context: usize = args.get(3).map_or(Ok(300), |c| c.parse())?;
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let model = Model::load(
        &args[1],
        LoadOptions {
            flags,
            ..LoadOptions::default()
        },
    )?;
    let d = Drafter::load(&args[2], &model)?;
    let be = model.backend();
    let c = d.config();
    let width = c.hidden * c.target_layer_ids.len();
    let ctx: Vec<f32> = (0..context * width)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut st = d.new_state(be, context + 2 * c.block_size)?;
    d.append_context(be, &mut st, &ctx)?;
    let mut block = vec![c.mask_token_id; c.block_size];
    block[0] = 28;
    let mut best = [f64::MAX; 4];
    for _ in 0..150 {
        let t = Instant::now();
        d.block_hidden(be, &mut st, &block)?;
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        for (b, k) in best[1..].iter_mut().zip([1, 3, 15]) {
            let t = Instant::now();
            d.propose(be, &mut st, 28, c.block_size, k)?;
            *b = b.min(t.elapsed().as_secs_f64());
        }
    }
    let ms = best.map(|s| s * 1e3);
    println!(
        "best of 150, ms: whole block {:.2}; proposing 1 draft {:.2}, 3 drafts {:.2}, 15 drafts {:.2}",
        ms[0], ms[1], ms[2], ms[3]
    );
    Ok(())
}
