//! CPU mixture-of-experts FFN (Qwen3-MoE routing).
//!
//! Per row: router logits → softmax over all experts → the `n_used` largest (ties to the lower index) → weights
//! renormalised to sum to one when `norm_topk` (Qwen3-MoE's `norm_topk_prob`, llama.cpp's `norm_w`). Rows are then
//! grouped by expert so each expert's three matrices are read once per call for all rows that chose it; each
//! row's expert outputs are kept apart and summed in ascending expert order at the end, so a row's result does not
//! depend on the other rows (batch invariance).

use super::{matmul::matmul, swiglu_slice, CpuBackend};
use crate::backend::MoeFfn;
use crate::error::{Error, Result};

pub(crate) fn moe_ffn(
    be: &CpuBackend,
    out: &mut [f32],
    x: &[f32],
    n_rows: usize,
    m: &MoeFfn,
) -> Result<()> {
    let router = m.router.view();
    let d = router.cols;
    let n_exp = router.rows;
    let k = m.n_used;
    let ff = m.gate.shape[1] as usize;
    if out.len() < n_rows * d || x.len() < n_rows * d || k == 0 || k > n_exp {
        return Err(Error::Batch("moe_ffn: bad buffers or expert count".into()));
    }
    // Routing.
    let mut logits = vec![0f32; n_rows * n_exp];
    matmul(be, &mut logits, &router, x, n_rows)?;
    // choice[row * k + i] = (expert, weight), sorted by expert index.
    let mut choice: Vec<(usize, f32)> = Vec::with_capacity(n_rows * k);
    let mut order: Vec<usize> = (0..n_exp).collect();
    for lr in logits.chunks_exact_mut(n_exp) {
        let max = lr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in lr.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in lr.iter_mut() {
            *v /= sum;
        }
        order.sort_by(|&a, &b| lr[b].total_cmp(&lr[a]).then(a.cmp(&b)));
        let mut top: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, lr[e])).collect();
        if m.norm_topk {
            let s: f32 = top.iter().map(|t| t.1).sum();
            for t in &mut top {
                t.1 /= s;
            }
        }
        top.sort_by_key(|t| t.0);
        choice.extend(top);
    }
    // Expert computations, grouped by expert. ys[(row * k + i) * d ..] holds expert i's output for the row.
    let mut ys = vec![0f32; n_rows * k * d];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n_exp];
    for (slot, &(e, _)) in choice.iter().enumerate() {
        members[e].push(slot);
    }
    let mut xs = Vec::new();
    let mut g = Vec::new();
    let mut u = Vec::new();
    let mut h = Vec::new();
    let mut y = Vec::new();
    for (e, slots) in members.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let n = slots.len();
        xs.clear();
        for &s in slots {
            let r = s / k;
            xs.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        g.resize(n * ff, 0.0);
        u.resize(n * ff, 0.0);
        h.resize(n * ff, 0.0);
        y.resize(n * d, 0.0);
        matmul(be, &mut g, &m.gate.expert(e), &xs, n)?;
        matmul(be, &mut u, &m.up.expert(e), &xs, n)?;
        swiglu_slice(&mut h, &g, &u);
        matmul(be, &mut y, &m.down.expert(e), &h, n)?;
        for (i, &s) in slots.iter().enumerate() {
            ys[s * d..(s + 1) * d].copy_from_slice(&y[i * d..(i + 1) * d]);
        }
    }
    for r in 0..n_rows {
        let o = &mut out[r * d..(r + 1) * d];
        o.fill(0.0);
        for i in 0..k {
            let (_, w) = choice[r * k + i];
            let yr = &ys[(r * k + i) * d..(r * k + i + 1) * d];
            for (a, &b) in o.iter_mut().zip(yr) {
                *a += w * b;
            }
        }
    }
    Ok(())
}
