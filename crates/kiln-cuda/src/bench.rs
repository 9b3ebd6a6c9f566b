//! Kernel timings on the shapes of a Qwen3-8B decode step (`kiln selftest --device cuda --bench`): each GEMV
//! kernel against the bytes it must read (GB/s, to compare with the card's ~4 TB/s copy rate), the fused row
//! kernels, attention at three depths, the row kernels, attention and a GEMV inside a CUDA graph (what a decode
//! step pays), the cost of one graph node, and reading a logits row back. Weights are
//! random bytes (timing only: the self-test checks the arithmetic).

use crate::device::{AttnShape, DBuf, Device, MoeShape};
use crate::error::{drv, Result};
use kiln_quant::GgmlType;

/// One timed kernel or sequence.
#[derive(Clone, Debug)]
pub struct Timing {
    /// What ran.
    pub name: String,
    /// Microseconds per run (median of the batches).
    pub us: f64,
    /// Bytes it must move (0 when not meaningful).
    pub bytes: f64,
}

impl Timing {
    /// Achieved bandwidth in GB/s (0 when `bytes` is 0).
    pub fn gbps(&self) -> f64 {
        if self.bytes > 0.0 {
            self.bytes / self.us / 1e3
        } else {
            0.0
        }
    }
}

/// Median microseconds per call of `f`, over 5 batches of `reps` calls timed with device events.
fn time(dev: &Device, reps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up (also the first-launch costs)
    let mut samples = Vec::new();
    for _ in 0..5 {
        let ctx = dev.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(flags).map_err(drv("creating an event"))?;
        let end = ctx.new_event(flags).map_err(drv("creating an event"))?;
        start
            .record(dev.stream())
            .map_err(drv("recording an event"))?;
        for _ in 0..reps {
            f()?;
        }
        end.record(dev.stream())
            .map_err(drv("recording an event"))?;
        let ms = start.elapsed_ms(&end).map_err(drv("timing"))?;
        samples.push(ms as f64 * 1e3 / reps as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Microseconds a call of `f` inside a CUDA graph: `reps` calls captured once as one pass (graph key `key`) and
/// replayed, as a decode step runs them (programmatic dependent launch on where the GPU has it). Back-to-back plain
/// launches of a short kernel (`time`) measure the host's launch rate instead.
fn time_in_graph(
    dev: &Device,
    key: u64,
    reps: usize,
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let us = time(dev, 5, &mut || {
        dev.run_pass([u64::MAX - key, 0, 0, 0, 0], true, &mut || {
            for _ in 0..reps {
                f()?;
            }
            Ok(())
        })
    })?;
    Ok(us / reps as f64)
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Keep f16 scale bytes away from NaN/Inf patterns: clear bit 6 of every byte (values stay random).
            (s >> 24) as u8 & 0xBF
        })
        .collect()
}

fn random_floats(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n, seed)
        .into_iter()
        .map(|b| b as f32 / 96.0 - 1.0)
        .collect()
}

/// Runs every timing on `dev`.
pub fn run(dev: &Device) -> Result<Vec<Timing>> {
    let mut out = Vec::new();
    let d = 4096usize;
    let x = dev.upload(&random_floats(16 * 12288, 1))?;
    // GEMV: Qwen3-8B's matrices (q/o 4096², k/v 1024×4096, gate/up 12288×4096, down 4096×12288, head 151936×4096).
    use GgmlType::*;
    let shapes = [
        ("attn_q", d, d),
        ("attn_k", d, 1024),
        ("ffn_up", d, 12288),
        ("ffn_down", 12288, d),
        ("output", d, 151936),
    ];
    for ty in [Q4_K, Q6_K, Q8_0] {
        for &(name, cols, rows) in &shapes {
            if name == "output" && ty != Q6_K {
                continue;
            }
            let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
            let bytes = random_bytes(rows * rb, (rows * 31 + cols) as u64);
            for gemv in [true, false] {
                let w = dev.upload_weight(name, ty, cols, rows, &bytes, gemv)?;
                let kind = if w.is_repacked() { "gemv" } else { "generic" };
                for n in [1usize, 16] {
                    if !gemv && n > 1 {
                        continue;
                    }
                    let mut o = dev.alloc(n * rows)?;
                    let us = time(dev, 20, &mut || dev.matmul(&mut o, &w, &x, n, false))?;
                    out.push(Timing {
                        name: format!("{kind} {ty} {name} {rows}x{cols} n={n}"),
                        us,
                        bytes: (rows * rb) as f64,
                    });
                }
            }
        }
    }
    // The tensor-core prefill matmul on 512 rows (a prefill pass), ffn_up's shape.
    let xp = dev.upload(&random_floats(512 * d, 3))?;
    dev.set_pass(&[], &[], &[], true)?;
    for ty in [Q4_K, Q6_K, Q8_0] {
        let (cols, rows, n) = (d, 12288usize, 512usize);
        let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
        let w = dev.upload_weight("ffn_up", ty, cols, rows, &random_bytes(rows * rb, 7), true)?;
        let mut o = dev.alloc(n * rows)?;
        let us = time(dev, 10, &mut || dev.matmul(&mut o, &w, &xp, n, false))?;
        let tops = 2.0 * (n * rows * cols) as f64 / (us * 1e6);
        out.push(Timing {
            name: format!("mmq {ty} ffn_up {rows}x{cols} n={n} ({tops:.0} TOP/s)"),
            us,
            bytes: (rows * rb) as f64,
        });
    }
    dev.set_pass(&[], &[], &[], false)?;
    // Row kernels.
    let nw = dev.upload(&random_floats(12288, 2))?;
    let mut h = dev.alloc(16 * 12288)?;
    let us = time(dev, 50, &mut || dev.rms_norm(&mut h, &x, &nw, 1, d, 1e-6))?;
    out.push(Timing {
        name: "rms_norm(+q8) 1x4096".into(),
        us,
        bytes: 0.0,
    });
    let us = time(dev, 50, &mut || dev.swiglu(&mut h, &x, &x, 12288))?;
    out.push(Timing {
        name: "swiglu(+q8) 12288".into(),
        us,
        bytes: 0.0,
    });
    // Attention, Qwen3-8B heads (32 / 8 × 128), one decode row at two depths of a 40960-position slot.
    let shape = AttnShape {
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        scale: 1.0 / 128f32.sqrt(),
        theta: 1e6,
        freq_scale: 1.0,
        neox: true,
        eps: 1e-6,
    };
    let ctx = 40960usize;
    let mut kv = dev.alloc_kv(1, 1, ctx, 1024, true)?;
    dev.reserve_attention(16, 32, 128, ctx)?;
    let (mut q, mut k) = (dev.alloc(16 * 4096)?, dev.alloc(16 * 1024)?);
    let v = dev.upload(&random_floats(16 * 1024, 3))?;
    let (qn, kn) = (
        dev.upload(&random_floats(128, 4))?,
        dev.upload(&random_floats(128, 5))?,
    );
    let mut att = dev.alloc(16 * 4096)?;
    let mut attend = || {
        dev.attention_fused(
            &mut att,
            &mut q,
            &mut k,
            &v,
            &mut kv,
            0,
            1,
            &shape,
            Some((&qn, &kn)),
            0,
        )
    };
    for pos in [100usize, 4000, 32768] {
        dev.set_pass(&[], &[(0, pos)], &[], false)?;
        let us = time(dev, 20, &mut attend)?;
        out.push(Timing {
            name: format!("attention fused 32/8x128 @ pos {pos}"),
            us,
            bytes: (pos * 1024 * 2 * 2) as f64,
        });
    }
    // The same row kernels and attention inside a graph (what a decode step pays for them), and the one-row
    // GEMV over 4 copies of ffn_up (113 MB, more than L2 holds: each call reads its weights from memory).
    dev.set_pass(&[], &[(0, 100)], &[], false)?;
    let us = time_in_graph(dev, 1, 50, &mut || {
        dev.rms_norm(&mut h, &x, &nw, 1, d, 1e-6)
    })?;
    out.push(Timing {
        name: "in a graph: rms_norm(+q8) 1x4096".into(),
        us,
        bytes: 0.0,
    });
    let us = time_in_graph(dev, 2, 50, &mut || dev.swiglu(&mut h, &x, &x, 12288))?;
    out.push(Timing {
        name: "in a graph: swiglu(+q8) 12288".into(),
        us,
        bytes: 0.0,
    });
    let us = time_in_graph(dev, 3, 20, &mut attend)?;
    out.push(Timing {
        name: "in a graph: attention fused 32/8x128 @ pos 100".into(),
        us,
        bytes: 0.0,
    });
    // One-row GEMVs over 4 copies of a matrix (each more than L2 holds): ffn_up (the staged Q4_K body, 4,096
    // wide), and ffn_down in Q4_K (staged, 12,288 wide) and Q6_K (staged).
    for (key, (name, ty, rows, cols)) in [
        ("ffn_up", Q4_K, 12288, d),
        ("ffn_down", Q4_K, d, 12288),
        ("ffn_down", Q6_K, d, 12288),
    ]
    .into_iter()
    .enumerate()
    {
        let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
        let ws = (0..4)
            .map(|i| {
                dev.upload_weight(name, ty, cols, rows, &random_bytes(rows * rb, 40 + i), true)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut o = dev.alloc(rows)?;
        let mut i = 0;
        let us = time_in_graph(dev, 4 + key as u64, 20, &mut || {
            i += 1;
            dev.matmul(&mut o, &ws[i % 4], &x, 1, false)
        })?;
        out.push(Timing {
            name: format!("in a graph: gemv {ty} {name} {rows}x{cols} n=1 (4 copies)"),
            us,
            bytes: (rows * rb) as f64,
        });
    }
    // MoE routing + experts (Qwen3-30B-A3B shape: 128 experts, 8 used, 768 wide FFN, 2048 model width).
    let m = MoeShape {
        n_exp: 128,
        k: 8,
        ff: 768,
        width: 2048,
        norm_topk: true,
    };
    let mk = |name: &str, cols: usize, rows: usize, seed: u64| {
        let rb = Q4_K.row_bytes(cols as u64).unwrap_or(0) as usize;
        dev.upload_experts(name, Q4_K, cols, rows, 128, &random_bytes(rows * rb, seed))
    };
    let router = dev.upload_weight(
        "router",
        GgmlType::F32,
        2048,
        128,
        &random_floats(2048 * 128, 6)
            .iter()
            .flat_map(|v| (v * 0.01).to_le_bytes())
            .collect::<Vec<u8>>(),
        false,
    )?;
    let (gate, up, down) = (
        mk("gate", 2048, 768 * 128, 7)?,
        mk("up", 2048, 768 * 128, 8)?,
        mk("down", 768, 2048 * 128, 9)?,
    );
    let mut mo = dev.alloc(2048)?;
    let xm: DBuf = dev.upload(&random_floats(2048, 10))?;
    let us = time(dev, 20, &mut || {
        dev.moe_ffn(&mut mo, &xm, 1, &router, &gate, &up, &down, &m)
    })?;
    out.push(Timing {
        name: "moe_ffn 30B-A3B shape, 1 row (8 experts)".into(),
        us,
        bytes: (8 * 3 * 768 * 2048) as f64 * 144.0 / 256.0,
    });
    // One graph node: a pass of 200 tiny kernels, replayed.
    let mut tiny = dev.alloc(32)?;
    let one = dev.alloc(32)?;
    let mut f = || -> Result<()> {
        for _ in 0..200 {
            dev.add(&mut tiny, &one, 32)?;
        }
        Ok(())
    };
    dev.set_pass(&[], &[], &[], false)?;
    let us = time_in_graph(dev, 0, 1, &mut f)?;
    out.push(Timing {
        name: "graph node (200 tiny kernels, per node)".into(),
        us: us / 200.0,
        bytes: 0.0,
    });
    let us = time(dev, 5, &mut || {
        for _ in 0..200 {
            dev.add(&mut tiny, &one, 32)?;
        }
        Ok(())
    })?;
    out.push(Timing {
        name: "plain launch (200 tiny kernels, per launch)".into(),
        us: us / 200.0,
        bytes: 0.0,
    });
    // Reading one Qwen3 logits row back (host wall clock: it synchronizes).
    let logits = dev.alloc(151936)?;
    let mut host = vec![0f32; 151936];
    let t0 = std::time::Instant::now();
    for _ in 0..20 {
        dev.read(&logits, &mut host)?;
    }
    out.push(Timing {
        name: "read 151936 logits to the host".into(),
        us: t0.elapsed().as_secs_f64() * 1e6 / 20.0,
        bytes: 151936.0 * 4.0,
    });
    Ok(out)
}
