//! Compares teacher-forced logits of the quantized-activation path and the reference path: top-1 agreement and
//! the top candidates at the last position.
use kiln_engine::{Flags, LoadOptions, Model};

fn top(l: &[f32], n: usize) -> Vec<(usize, f32)> {
    let mut v: Vec<(usize, f32)> = l.iter().copied().enumerate().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(n);
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let prompt: Vec<u32> = args[2..]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::new();
    let mut nv = 0;
    for flags in [Flags::default(), Flags::reference()] {
        let model = Model::load(
            &args[1],
            LoadOptions {
                flags,
                ..LoadOptions::default()
            },
        )?;
        nv = model.n_vocab();
        outs.push(model.teacher_forced_logits(&prompt)?);
    }
    let n = prompt.len();
    let mut agree = 0;
    for i in 0..n {
        let a = top(&outs[0][i * nv..(i + 1) * nv], 1)[0].0;
        let b = top(&outs[1][i * nv..(i + 1) * nv], 1)[0].0;
        agree += (a == b) as usize;
    }
    println!("top-1 agreement {agree}/{n}");
    println!("quant last: {:?}", top(&outs[0][(n - 1) * nv..], 5));
    println!("ref   last: {:?}", top(&outs[1][(n - 1) * nv..], 5));
    Ok(())
}
