//! Measurement: the library side of `kiln bench` and `kiln score`.
//!
//! - [`run_test`] runs one llama-bench test (`pp512`, `tg128 @ d4096`: see [`TestSpec`]) with an untimed
//!   warm-up and returns the seconds of each timed run; [`render_bench`] prints [`BenchRecord`]s as a Markdown
//!   table, CSV or JSON in llama-bench's shape.
//! - [`frontiers`] and [`run_frontiers`] are ds4-bench's frontier mode: prefill of each new interval up to each
//!   context frontier, then N decoded tokens, with the KV state rolled back between frontiers (untimed).
//!   [`FrontierLogits`] is the documented file of full logits at a frontier.
//! - [`WindowPlan`] and [`score`] compute perplexity exactly as llama-perplexity does (non-overlapping windows,
//!   BOS substitution, second half scored, same error formula), write top-K dumps in the
//!   [`crate::fidelity::LogitDump`] format and compare against them ([`Comparison`]).
//!
//! - [`run_spec_test`] measures DFlash speculative generation against plain generation in one run (τ, the
//!   acceptance histogram, the per-round draft/verify/bookkeeping split); [`render_spec`] prints [`SpecRecord`]s.
//!
//! Snapshot/restore of the KV state is [`crate::Session::truncate`]: positions past a slot's length are never
//! read, so rolling the length back restores the earlier state exactly without copying the cache.

mod frontier;
mod perplexity;
mod render;
mod runs;
mod spec;
mod stats;

pub use frontier::{
    frontiers, prompt_tokens_needed, run_frontiers, FrontierLogits, FrontierOptions,
    FrontierRecord, FRONTIER_LOGITS_MAGIC, FRONTIER_LOGITS_VERSION,
};
pub use perplexity::{
    score, token_nll, Comparison, NllSum, ProgressFn, ScoreOptions, ScoreResult, ScoreSeq,
    WindowPlan, CONFIDENT_MARGIN,
};
pub use render::{
    csv_field, human_params, human_size, json_num, json_str, render_bench, render_frontiers,
    BenchRecord, Format, BENCH_FIELDS, FRONTIER_FIELDS,
};
pub use runs::{bench_tokens, kv_bytes, params_label, run_test, test_matrix, ModelInfo, TestSpec};
pub use spec::{
    hist_label, render_spec, run_spec_test, SpecRecord, SpecRun, SpecTest, SPEC_FIELDS,
};
pub use stats::Stats;
