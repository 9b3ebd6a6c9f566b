//! `kiln bench --draft`: generation speed with and without a DFlash drafter, measured in one run on the same
//! session, prompt and token count, so the speed-up is a ratio of two numbers taken side by side.
//!
//! Each repetition generates `n_gen` tokens greedily, first plainly (one decode forward per token), then
//! speculatively. Both are timed from the end of the prompt's prefill to the last token (the prefill is the same
//! work in both and is left out of both; sparkinfer's bench timed AR with prefill and DFlash without, which
//! flatters the ratio). No stop tokens: every run generates exactly `n_gen` tokens, as llama-bench's `tg` does.
//!
//! The speculative run must emit exactly the plain run's tokens (SPEC_AGREE); a mismatch is an error, not a
//! number. With `force = Some(k)` the drafts are replaced by the plain run's continuation with at most `k`
//! accepted per round ([`Forced`]): the drafter still runs, so every cost is real, and τ = k + 1 can be chosen
//! on random-weight drafters (which accept almost nothing on their own).

use crate::bench::render::{csv_field, json_num, json_str, Format};
use crate::bench::runs::ModelInfo;
use crate::bench::stats::Stats;
use crate::dflash::{add_gpu, generate_in, Acceptance, Drafter, Forced, SpecStats};
use crate::error::{Error, Result};
use crate::generate::{GenerateParams, Generator, StepOutcome};
use crate::sampler::SamplerParams;
use crate::session::Session;
use std::time::{Duration, Instant};

/// One speculative test: `n_gen` tokens after a `prompt_len`-token prompt, drafts optionally forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecTest {
    /// Prompt tokens (prefilled untimed).
    pub prompt_len: usize,
    /// Tokens generated (timed).
    pub n_gen: usize,
    /// `Some(k)`: forced acceptance of at most k drafts per round (τ = k + 1); `None`: the drafter's proposals.
    pub force: Option<usize>,
}

impl SpecTest {
    /// `tg128 @ d512` (llama-bench's naming: the prompt is the depth).
    pub fn name(&self) -> String {
        if self.prompt_len > 1 {
            format!("tg{} @ d{}", self.n_gen, self.prompt_len)
        } else {
            format!("tg{}", self.n_gen)
        }
    }

    /// The forcing as printed: `own` (the drafter's own proposals) or `k=K`.
    pub fn force_label(&self) -> String {
        self.force
            .map_or_else(|| "own".into(), |k| format!("k={k}"))
    }
}

/// One timed repetition.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecRun {
    /// Seconds of plain generation (after prefill).
    pub ar_secs: f64,
    /// Seconds of speculative generation (after prefill).
    pub spec_secs: f64,
    /// GPU time of the plain run's decode passes (on a GPU; `None` on the CPU).
    pub ar_gpu: Option<Duration>,
    /// The speculative run's counters.
    pub stats: SpecStats,
}

/// A test's measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecRecord {
    /// The target model.
    pub model: ModelInfo,
    /// The drafter, as printed (`1L b16`).
    pub draft: String,
    /// Backend name.
    pub backend: String,
    /// Worker threads.
    pub threads: usize,
    /// The test.
    pub test: SpecTest,
    /// Timed repetitions.
    pub runs: Vec<SpecRun>,
}

impl SpecRecord {
    /// Plain generation tokens per second, over the runs.
    pub fn ar_tps(&self) -> Stats {
        let n = self.test.n_gen as f64;
        Stats::of(&self.runs.iter().map(|r| n / r.ar_secs).collect::<Vec<_>>())
    }

    /// Speculative generation tokens per second, over the runs.
    pub fn spec_tps(&self) -> Stats {
        let n = self.test.n_gen as f64;
        Stats::of(
            &self
                .runs
                .iter()
                .map(|r| n / r.spec_secs)
                .collect::<Vec<_>>(),
        )
    }

    /// Speed-up: the median over repetitions of (plain seconds ÷ speculative seconds). Each repetition runs both
    /// back to back, so a ratio taken within one repetition sees the same machine load; the median drops a
    /// repetition disturbed by something else running.
    pub fn speedup(&self) -> f64 {
        Stats::of(
            &self
                .runs
                .iter()
                .map(|r| r.ar_secs / r.spec_secs)
                .collect::<Vec<_>>(),
        )
        .median
    }

    /// The counters of all runs added together.
    pub fn total(&self) -> SpecStats {
        let mut t = SpecStats::default();
        for r in &self.runs {
            let s = &r.stats;
            t.rounds += s.rounds;
            t.round_tokens += s.round_tokens;
            if t.hist.len() < s.hist.len() {
                t.hist.resize(s.hist.len(), 0);
            }
            t.hist.iter_mut().zip(&s.hist).for_each(|(a, b)| *a += b);
            t.draft_time += s.draft_time;
            t.verify_time += s.verify_time;
            t.prefill_time += s.prefill_time;
            add_gpu(&mut t.draft_gpu, s.draft_gpu);
            add_gpu(&mut t.verify_gpu, s.verify_gpu);
        }
        t
    }

    /// GPU milliseconds (on a GPU): a plain decode step's, and a round's in the drafter and in the verify
    /// forward. Set against the wall times (1000 / AR t/s, [`SpecRecord::per_round_ms`]) they say how much of
    /// each is the host's: launches, copies back, waiting.
    pub fn gpu_ms(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        let t = self.total();
        let rounds = t.rounds.max(1) as f64;
        let mut ar = None;
        for r in &self.runs {
            add_gpu(&mut ar, r.ar_gpu);
        }
        let tokens = (self.test.n_gen * self.runs.len()).max(1) as f64;
        let ms = |d: Duration, n: f64| d.as_secs_f64() * 1e3 / n;
        (
            ar.map(|d| ms(d, tokens)),
            t.draft_gpu.map(|d| ms(d, rounds)),
            t.verify_gpu.map(|d| ms(d, rounds)),
        )
    }

    /// Milliseconds per verify round: (draft, verify, bookkeeping). Bookkeeping is the rest of the generation
    /// time: sampling, acceptance, KV rollback, feature copies, the first token's sampling.
    pub fn per_round_ms(&self) -> (f64, f64, f64) {
        let t = self.total();
        let rounds = t.rounds.max(1) as f64;
        let gen: f64 = self.runs.iter().map(|r| r.spec_secs).sum();
        let draft = t.draft_time.as_secs_f64();
        let verify = t.verify_time.as_secs_f64();
        (
            draft * 1e3 / rounds,
            verify * 1e3 / rounds,
            (gen - draft - verify).max(0.0) * 1e3 / rounds,
        )
    }
}

/// Plain greedy generation of `n_gen` tokens on slot 0 (emptied first); returns the tokens, the seconds after
/// prefill and the GPU time of the decode passes (on a GPU).
fn plain_run(
    session: &mut Session,
    prompt: &[u32],
    n_gen: usize,
) -> Result<(Vec<u32>, f64, Option<Duration>)> {
    session.truncate(0, 0)?;
    let model = session.model();
    let mut g = Generator::new(session, 0, prompt, greedy(n_gen))?;
    model.take_gpu_time()?; // the prefill's
    let t0 = Instant::now();
    let mut tokens = Vec::with_capacity(n_gen);
    while let StepOutcome::Token(t) = g.step()? {
        tokens.push(t);
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((tokens, secs, model.take_gpu_time()?))
}

fn greedy(n_gen: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n_gen,
        stop_tokens: Vec::new(),
        sampler: SamplerParams::greedy(),
    }
}

/// Runs `test` on slot 0 of `session` (which must hold `prompt.len() + n_gen` positions): one untimed warm-up
/// repetition, then `reps` timed ones, each plain then speculative. Fails when the speculative tokens differ
/// from the plain ones. On a GPU the passes' GPU time is taken too (two events a pass).
pub fn run_spec_test(
    session: &mut Session,
    drafter: &Drafter,
    prompt: &[u32],
    test: &SpecTest,
    reps: usize,
) -> Result<Vec<SpecRun>> {
    let need = prompt.len() + test.n_gen;
    if prompt.is_empty() || need > session.slot_ctx() {
        return Err(Error::Config(format!(
            "test {} needs a prompt and {need} KV positions; the session has {}",
            test.name(),
            session.slot_ctx()
        )));
    }
    let model = session.model();
    model.set_gpu_timing(true);
    drafter.set_gpu_timing(true);
    let runs = spec_reps(session, drafter, prompt, test, reps);
    model.set_gpu_timing(false);
    drafter.set_gpu_timing(false);
    runs
}

fn spec_reps(
    session: &mut Session,
    drafter: &Drafter,
    prompt: &[u32],
    test: &SpecTest,
    reps: usize,
) -> Result<Vec<SpecRun>> {
    let mut runs = Vec::with_capacity(reps);
    // One drafter state for every repetition, as a server slot keeps one across requests: its allocation and
    // the drafter's graph captures happen in the warm-up run, not in the timed ones.
    let mut dstate = drafter.new_state(session.model().backend(), session.slot_ctx())?;
    for rep in 0..=reps {
        let (want, ar_secs, ar_gpu) = plain_run(session, prompt, test.n_gen)?;
        let forced = test.force.map(|k| Forced {
            continuation: want.clone(),
            cap: Some(k),
            corrupt: Vec::new(),
        });
        session.truncate(0, 0)?;
        let t0 = Instant::now();
        let out = generate_in(
            session,
            0,
            drafter,
            &mut dstate,
            prompt,
            &greedy(test.n_gen),
            forced.as_ref(),
            Acceptance::Exact,
            &mut |_| false,
        )?;
        let total = t0.elapsed().as_secs_f64();
        if out.tokens != want {
            let at = out
                .tokens
                .iter()
                .zip(&want)
                .take_while(|(a, b)| a == b)
                .count();
            return Err(Error::Batch(format!(
                "test {}: speculative output differs from plain generation at token {at} \
                 ({} vs {} tokens): the verify rows are not batch-invariant",
                test.name(),
                out.tokens.len(),
                want.len()
            )));
        }
        // Run 0 is the warm-up.
        if rep > 0 {
            runs.push(SpecRun {
                ar_secs,
                ar_gpu,
                spec_secs: (total - out.stats.prefill_time.as_secs_f64()).max(1e-9),
                stats: out.stats,
            });
        }
    }
    session.truncate(0, 0)?;
    Ok(runs)
}

/// The columns of CSV and JSON output, in order.
pub const SPEC_FIELDS: &[&str] = &[
    "model_filename",
    "model_type",
    "draft",
    "backend",
    "n_threads",
    "test",
    "force",
    "n_gen",
    "prompt_len",
    "ar_avg_ts",
    "ar_stddev_ts",
    "spec_avg_ts",
    "spec_stddev_ts",
    "speedup",
    "tau",
    "rounds",
    "draft_ms_per_round",
    "verify_ms_per_round",
    "other_ms_per_round",
    "ar_gpu_ms_per_token",
    "draft_gpu_ms_per_round",
    "verify_gpu_ms_per_round",
    "accept_hist",
];

/// Renders speculative records as a Markdown table (llama-bench's shape plus τ, the per-round time split and the
/// acceptance-length histogram: `hist[a]` = rounds that accepted `a` drafts; on a GPU also the GPU time of a plain
/// step, a round's drafter and its verify), CSV or JSON.
pub fn render_spec(records: &[SpecRecord], format: Format) -> String {
    let rows: Vec<Vec<String>> = records.iter().map(row).collect();
    let gpu = records.iter().any(|r| r.gpu_ms() != (None, None, None));
    let gpu_cell = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    match format {
        Format::Md => {
            let mut head = vec![
                "model",
                "draft",
                "backend",
                "threads",
                "test",
                "force",
                "AR t/s",
                "DFlash t/s",
                "speed-up",
                "τ",
                "draft ms",
                "verify ms",
                "other ms",
            ];
            if gpu {
                head.extend(["AR GPU ms", "draft GPU ms", "verify GPU ms"]);
            }
            head.push("accepted: rounds");
            let cells: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    let (ar, sp) = (r.ar_tps(), r.spec_tps());
                    let (d, v, o) = r.per_round_ms();
                    let t = r.total();
                    let mut cells = vec![
                        r.model.desc.clone(),
                        r.draft.clone(),
                        r.backend.clone(),
                        r.threads.to_string(),
                        r.test.name(),
                        r.test.force_label(),
                        format!("{:.2} ± {:.2}", ar.mean, ar.sd),
                        format!("{:.2} ± {:.2}", sp.mean, sp.sd),
                        format!("{:.2}x", r.speedup()),
                        format!("{:.2}", t.tau()),
                        format!("{d:.2}"),
                        format!("{v:.2}"),
                        format!("{o:.2}"),
                    ];
                    if gpu {
                        let (a, dg, vg) = r.gpu_ms();
                        cells.extend([gpu_cell(a), gpu_cell(dg), gpu_cell(vg)]);
                    }
                    cells.push(hist_label(&t.hist));
                    cells
                })
                .collect();
            let widths: Vec<usize> = (0..head.len())
                .map(|c| {
                    cells
                        .iter()
                        .map(|r| r[c].chars().count())
                        .chain([head[c].chars().count()])
                        .max()
                        .unwrap_or(1)
                })
                .collect();
            let line = |v: Vec<String>| {
                let parts: Vec<String> = v
                    .iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(c, (s, &w))| {
                        let pad = w - s.chars().count();
                        // Text columns left-aligned, numbers right-aligned, as llama-bench does.
                        if c < 6 || c == head.len() - 1 {
                            format!("{s}{}", " ".repeat(pad))
                        } else {
                            format!("{}{s}", " ".repeat(pad))
                        }
                    })
                    .collect();
                format!("| {} |\n", parts.join(" | "))
            };
            let mut out = line(head.iter().map(|s| s.to_string()).collect());
            let rule: Vec<String> = widths
                .iter()
                .enumerate()
                .map(|(c, &w)| {
                    if c < 6 || c == head.len() - 1 {
                        "-".repeat(w)
                    } else {
                        format!("{}:", "-".repeat(w.saturating_sub(1)))
                    }
                })
                .collect();
            out += &format!("| {} |\n", rule.join(" | "));
            for c in cells {
                out += &line(c);
            }
            out
        }
        Format::Csv => {
            let mut out = SPEC_FIELDS.join(",") + "\n";
            for r in rows {
                let f: Vec<String> = r.iter().map(|s| csv_field(s)).collect();
                out += &(f.join(",") + "\n");
            }
            out
        }
        Format::Json => {
            let objs: Vec<String> = records
                .iter()
                .zip(&rows)
                .map(|(rec, r)| {
                    let kv: Vec<String> = SPEC_FIELDS
                        .iter()
                        .zip(r)
                        .map(|(k, v)| {
                            let text = matches!(
                                *k,
                                "model_filename" | "model_type" | "draft" | "backend" | "test"
                            ) || (*k == "force" && rec.test.force.is_none());
                            let val = if *k == "accept_hist" {
                                format!("[{v}]")
                            } else if text {
                                json_str(v)
                            } else {
                                v.clone()
                            };
                            format!("{}: {val}", json_str(k))
                        })
                        .collect();
                    format!("  {{{}}}", kv.join(", "))
                })
                .collect();
            format!("[\n{}\n]\n", objs.join(",\n"))
        }
    }
}

/// The CSV/JSON values of one record, in [`SPEC_FIELDS`] order (numbers as JSON numbers, NaN as `null`).
fn row(r: &SpecRecord) -> Vec<String> {
    let (ar, sp) = (r.ar_tps(), r.spec_tps());
    let (d, v, o) = r.per_round_ms();
    let (ag, dg, vg) = r.gpu_ms();
    let num = |x: Option<f64>| json_num(x.unwrap_or(f64::NAN));
    let t = r.total();
    vec![
        r.model.filename.clone(),
        r.model.desc.clone(),
        r.draft.clone(),
        r.backend.clone(),
        r.threads.to_string(),
        r.test.name(),
        r.test.force.map_or_else(|| "own".into(), |k| k.to_string()),
        r.test.n_gen.to_string(),
        r.test.prompt_len.to_string(),
        json_num(ar.mean),
        json_num(ar.sd),
        json_num(sp.mean),
        json_num(sp.sd),
        json_num(r.speedup()),
        json_num(t.tau()),
        t.rounds.to_string(),
        json_num(d),
        json_num(v),
        json_num(o),
        num(ag),
        num(dg),
        num(vg),
        t.hist
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(","),
    ]
}

/// `0:3 4:20 15:1`: the non-zero entries of an acceptance histogram (`accepted drafts: rounds`).
pub fn hist_label(hist: &[usize]) -> String {
    let parts: Vec<String> = hist
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(a, n)| format!("{a}:{n}"))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(force: Option<usize>) -> SpecRecord {
        let stats = SpecStats {
            rounds: 4,
            round_tokens: 10,
            hist: vec![1, 0, 2, 1],
            draft_time: Duration::from_millis(40),
            verify_time: Duration::from_millis(100),
            prefill_time: Duration::from_millis(7),
            ..SpecStats::default()
        };
        SpecRecord {
            model: ModelInfo {
                filename: "m.gguf".into(),
                desc: "llama 135M Q4_1".into(),
                size_bytes: 1,
                n_params: 1,
            },
            draft: "1L b4".into(),
            backend: "CPU".into(),
            threads: 2,
            test: SpecTest {
                prompt_len: 8,
                n_gen: 11,
                force,
            },
            runs: vec![
                SpecRun {
                    ar_secs: 1.0,
                    ar_gpu: None,
                    spec_secs: 0.2,
                    stats: stats.clone(),
                },
                SpecRun {
                    ar_secs: 1.0,
                    ar_gpu: None,
                    spec_secs: 0.2,
                    stats,
                },
            ],
        }
    }

    #[test]
    fn totals_and_per_round_split() {
        let r = record(Some(3));
        let t = r.total();
        assert_eq!((t.rounds, t.round_tokens), (8, 20));
        assert_eq!(t.hist, vec![2, 0, 4, 2]);
        assert!((t.tau() - 2.5).abs() < 1e-12);
        let (d, v, o) = r.per_round_ms();
        // 80 ms draft, 200 ms verify, 400 ms of generation over 8 rounds.
        assert!((d - 10.0).abs() < 1e-9 && (v - 25.0).abs() < 1e-9 && (o - 15.0).abs() < 1e-9);
        assert!((r.spec_tps().mean / r.ar_tps().mean - 5.0).abs() < 1e-9);
        // The median of per-repetition ratios: one disturbed repetition does not move it.
        let mut r3 = r.clone();
        r3.runs.push(SpecRun {
            ar_secs: 1.0,
            ar_gpu: None,
            spec_secs: 10.0,
            stats: r.runs[0].stats.clone(),
        });
        assert!((r3.speedup() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn renders_every_format() {
        let recs = [record(Some(3)), record(None)];
        let md = render_spec(&recs, Format::Md);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4, "{md}");
        assert!(lines[0].contains("DFlash t/s") && lines[0].contains("τ"));
        assert!(lines[2].contains("tg11 @ d8") && lines[2].contains("k=3"));
        assert!(lines[2].contains("5.00x") && lines[2].contains("0:2 2:4 3:2"));
        assert!(lines[3].contains("| own "), "{}", lines[3]);
        let csv = render_spec(&recs, Format::Csv);
        assert_eq!(csv.lines().next(), Some(SPEC_FIELDS.join(",").as_str()));
        assert!(
            csv.lines().nth(1).unwrap().ends_with(",\"2,0,4,2\""),
            "{csv}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render_spec(&recs, Format::Json)).unwrap();
        assert_eq!(json[0]["force"], 3);
        assert_eq!(json[1]["force"], "own");
        assert_eq!(json[0]["tau"], 2.5);
        assert_eq!(json[0]["accept_hist"], serde_json::json!([2, 0, 4, 2]));
        assert_eq!(json[0]["test"], "tg11 @ d8");
    }

    #[test]
    fn gpu_columns_only_with_gpu_times() {
        let cpu = record(Some(3));
        assert_eq!(cpu.gpu_ms(), (None, None, None));
        let md = render_spec(std::slice::from_ref(&cpu), Format::Md);
        assert!(!md.contains("GPU ms"), "{md}");
        let json: serde_json::Value =
            serde_json::from_str(&render_spec(std::slice::from_ref(&cpu), Format::Json)).unwrap();
        assert!(json[0]["verify_gpu_ms_per_round"].is_null());

        let mut gpu = cpu.clone();
        for r in &mut gpu.runs {
            r.ar_gpu = Some(Duration::from_millis(22)); // 11 tokens a run
            r.stats.draft_gpu = Some(Duration::from_millis(8)); // 4 rounds a run
            r.stats.verify_gpu = Some(Duration::from_millis(60));
        }
        let (a, d, v) = gpu.gpu_ms();
        assert!((a.unwrap() - 2.0).abs() < 1e-9, "{a:?}");
        assert!((d.unwrap() - 2.0).abs() < 1e-9 && (v.unwrap() - 15.0).abs() < 1e-9);
        let md = render_spec(&[gpu.clone(), cpu], Format::Md);
        let lines: Vec<&str> = md.lines().collect();
        assert!(
            lines[0].contains("| AR GPU ms | draft GPU ms | verify GPU ms | accepted: rounds |")
        );
        assert!(
            lines[2].contains("|      2.00 |         2.00 |         15.00 |"),
            "{md}"
        );
        assert!(
            lines[3].contains("|         - |            - |             - |"),
            "{md}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render_spec(&[gpu], Format::Json)).unwrap();
        assert_eq!(json[0]["verify_gpu_ms_per_round"], 15.0);
    }

    #[test]
    fn names_and_labels() {
        let t = |p, f| SpecTest {
            prompt_len: p,
            n_gen: 128,
            force: f,
        };
        assert_eq!(t(1, None).name(), "tg128");
        assert_eq!(t(512, Some(7)).name(), "tg128 @ d512");
        assert_eq!(t(1, Some(7)).force_label(), "k=7");
        assert_eq!(hist_label(&[0, 0]), "-");
    }
}
