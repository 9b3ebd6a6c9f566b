//! The speculative decoding loop. Each round: the block `[pending, d1 … d(v−1)]` (drafts from the drafter, or
//! forced ones) is verified in ONE target forward; walking the block, the target's choice at row i (greedy argmax
//! or a sample) is emitted, and the walk goes on only while the next draft equals that choice. The target KV is
//! rolled back to the rows whose tokens were right, and their tapped hidden states extend the drafter's context.
//!
//! Exactness: row i's logits are bit-identical to a plain decode step (batch invariance), the sampler is called
//! once per emitted token with the same history in the same order as [`crate::Generator`], and stop tokens, the
//! token budget and the context limit are checked at the same points, so the output equals plain generation's —
//! for greedy and, with the same seed, for sampling (drafts act as point masses: accepting while the draft
//! equals the target's own sample is exact for the target distribution).

use super::drafter::{DraftState, Drafter};
use crate::error::{Error, Result};
use crate::generate::{FinishReason, GenerateParams};
use crate::sampler::Sampler;
use crate::session::{Batch, BatchRow, Output, Session};
use std::time::{Duration, Instant};

/// Replaces the drafter's proposals (the drafter still runs, so the cost is real) to force a chosen acceptance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forced {
    /// The continuation plain generation produces (recorded beforehand); block row j's draft becomes the
    /// continuation's token at that point. Empty: the drafter's own proposals are used.
    pub continuation: Vec<u32>,
    /// Accept at most this many drafts per round (drafts after it are corrupted).
    pub cap: Option<usize>,
    /// Block rows (1..B) whose draft is corrupted (replaced by a token that is not the right one).
    pub corrupt: Vec<usize>,
}

/// How a verify row's emitted token is chosen.
// The hidden variant is a selectable (wrong) rule used by a test, not a non-exhaustive placeholder.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acceptance {
    /// The target's own choice (greedy argmax or a sample) is emitted; the walk goes on while the next draft
    /// equals it. Exact for the target distribution.
    #[default]
    Exact,
    /// Deliberately WRONG, for tests only: when the next draft is the target's argmax, it is emitted without
    /// sampling (a plausible bug that over-produces likely tokens). The distribution test runs it to show that
    /// it detects a biased speculative sampler.
    #[doc(hidden)]
    BiasedArgmaxForTests,
}

/// Counters of a speculative run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Target verify forwards.
    pub rounds: usize,
    /// Tokens emitted by verify rounds (the first token comes from the prompt's prefill).
    pub round_tokens: usize,
    /// `hist[a]`: rounds that accepted `a` drafts.
    pub hist: Vec<usize>,
    /// Wall time in the drafter (context update and proposals).
    pub draft_time: Duration,
    /// Wall time in the target's verify forwards.
    pub verify_time: Duration,
    /// Wall time of the prompt's prefill (target forwards and the drafter's context), so a caller can time
    /// generation alone, as a plain run's prefill is timed apart from its decode.
    pub prefill_time: Duration,
    /// Wall time making the drafter's state (its buffers; zero where the caller keeps a state across
    /// generations, as `kiln bench` and the server do).
    pub state_time: Duration,
    /// GPU time of the drafter's passes (context update and proposals), with GPU timing on
    /// ([`Drafter::set_gpu_timing`]); `None` otherwise.
    pub draft_gpu: Option<Duration>,
    /// GPU time of the target's verify passes, with GPU timing on ([`crate::Model::set_gpu_timing`]).
    pub verify_gpu: Option<Duration>,
}

/// Adds `t` (a GPU time, when there is one) to `sum`.
pub(crate) fn add_gpu(sum: &mut Option<Duration>, t: Option<Duration>) {
    if let Some(t) = t {
        *sum = Some(sum.unwrap_or_default() + t);
    }
}

impl SpecStats {
    /// τ: tokens emitted per target verify forward (accepted drafts plus the bonus token).
    pub fn tau(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.round_tokens as f64 / self.rounds as f64
        }
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct SpecOutput {
    /// Generated tokens (stop token excluded).
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish: FinishReason,
    /// Counters.
    pub stats: SpecStats,
}

/// Context features (`rows × taps·hidden`, taps in the drafter's order) of batch rows `start..start + rows` of a
/// forward pass that tapped the drafter's layers `ids` (the scheduler's batches hold other sequences' rows too).
pub(crate) fn features_of_rows(
    out: &Output,
    ids: &[usize],
    hidden: usize,
    start: usize,
    rows: usize,
) -> Result<Vec<f32>> {
    let mut f = vec![0f32; rows * ids.len() * hidden];
    for (t, &l) in ids.iter().enumerate() {
        let (_, h) = out
            .hidden
            .iter()
            .find(|(layer, _)| *layer == l)
            .ok_or_else(|| Error::Batch(format!("target layer {l} was not tapped")))?;
        let src = h
            .get(start * hidden..(start + rows) * hidden)
            .ok_or_else(|| Error::Batch(format!("tapped layer {l} holds too few rows")))?;
        for r in 0..rows {
            let dst = (r * ids.len() + t) * hidden;
            f[dst..dst + hidden].copy_from_slice(&src[r * hidden..(r + 1) * hidden]);
        }
    }
    Ok(f)
}

/// Extends the drafter's context with rows `start..start + n` of the pass that gave `out`: on the device when the
/// session kept that pass's taps there ([`Batch::keep_taps`]), through the host otherwise.
pub(crate) fn extend_context(
    session: &Session,
    drafter: &Drafter,
    dstate: &mut DraftState,
    out: &Output,
    start: usize,
    n: usize,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Some(taps) = session.device_taps() {
        return drafter.append_context_device(dstate, &taps, start, n);
    }
    let c = drafter.config();
    let f = features_of_rows(out, &c.target_layer_ids, c.hidden, start, n)?;
    drafter.append_context(session.model().backend(), dstate, &f)
}

/// Replaces `drafts` (block rows 1..) by the forced continuation: `emitted` tokens are out so far, the last of
/// them is the block's row 0.
pub(crate) fn force_drafts(f: &Forced, drafts: &mut [u32], emitted: usize, n_vocab: usize) {
    for (j0, d) in drafts.iter_mut().enumerate() {
        let j = j0 + 1; // block row
        if let Some(&c) = f.continuation.get(emitted - 1 + j) {
            *d = c;
        }
        if f.cap.is_some_and(|k| j > k) || f.corrupt.contains(&j) {
            *d = (*d + 1) % n_vocab as u32;
        }
    }
}

/// Generates from `prompt` in `slot` of `session` with `drafter`, speculatively. `on_token` sees each emitted
/// token in order and returns `true` to stop (a stop string matched): generation then ends with
/// [`FinishReason::Stop`] exactly as [`crate::Generator::stop`] would.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    session: &mut Session,
    slot: usize,
    drafter: &Drafter,
    prompt: &[u32],
    params: &GenerateParams,
    forced: Option<&Forced>,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecOutput> {
    generate_with(
        session,
        slot,
        drafter,
        prompt,
        params,
        forced,
        Acceptance::Exact,
        on_token,
    )
}

/// [`generate`] with a chosen [`Acceptance`] rule (only [`Acceptance::Exact`] is correct).
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    session: &mut Session,
    slot: usize,
    drafter: &Drafter,
    prompt: &[u32],
    params: &GenerateParams,
    forced: Option<&Forced>,
    acceptance: Acceptance,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecOutput> {
    let t0 = Instant::now();
    let mut dstate = drafter.new_state(session.model().backend(), session.slot_ctx())?;
    let state_time = t0.elapsed();
    let mut out = generate_in(
        session,
        slot,
        drafter,
        &mut dstate,
        prompt,
        params,
        forced,
        acceptance,
        on_token,
    )?;
    out.stats.state_time = state_time;
    Ok(out)
}

/// [`generate_with`] in a drafter state the caller keeps (emptied first): a state reused across generations
/// keeps its buffers, so the drafter's GPU passes replay the graphs captured the first time (a fresh state's
/// allocations and graph captures are per-request set-up, which `kiln bench` must not time as generation).
#[allow(clippy::too_many_arguments)]
pub(crate) fn generate_in(
    session: &mut Session,
    slot: usize,
    drafter: &Drafter,
    dstate: &mut DraftState,
    prompt: &[u32],
    params: &GenerateParams,
    forced: Option<&Forced>,
    acceptance: Acceptance,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecOutput> {
    if prompt.is_empty() {
        return Err(Error::Batch(
            "empty prompt: nothing to condition generation on".into(),
        ));
    }
    let mut sampler =
        Sampler::new(params.sampler.clone()).map_err(|e| Error::Config(e.to_string()))?;
    let dc = drafter.config();
    let ids = dc.target_layer_ids.clone();
    let n_vocab = session.model().n_vocab();
    let chunk = session.config().batch;
    // Greedy verification needs only each row's argmax: computed where the logits are (4 bytes a row from a GPU).
    let argmax_only = params.sampler.is_plain_argmax() && acceptance == Acceptance::Exact;
    let block_max = dc.block_size.min(chunk);
    let be = session.model().backend();
    // A GPU drafter reads the target's taps where they are.
    let keep_taps = drafter.takes_device_taps();
    drafter.truncate(dstate, 0);
    let base = session.len(slot);
    if base != 0 {
        return Err(Error::Batch(format!(
            "speculative generation starts from an empty slot; slot {slot} holds {base} positions"
        )));
    }

    // Prefill in the session's fixed chunks (the same boundaries as Session::prefill), tapping the drafter's
    // layers so every prompt token becomes drafter context.
    let t_prefill = Instant::now();
    let mut logits = Vec::new();
    for (c, toks) in prompt.chunks(chunk).enumerate() {
        let start = c * chunk;
        let batch = Batch {
            rows: toks
                .iter()
                .enumerate()
                .map(|(i, &token)| BatchRow {
                    slot,
                    pos: start + i,
                    token,
                    logits: start + i + 1 == prompt.len(),
                })
                .collect(),
            taps: ids.clone(),
            argmax_only: false,
            prefill: true,
            keep_taps,
        };
        let out = session.forward(&batch)?;
        extend_context(session, drafter, dstate, &out, 0, toks.len())?;
        if !out.logits.is_empty() {
            logits = out.logits;
        }
    }

    // GPU time from here on is generation's: the prefill's passes are left out, as its wall time is.
    session.model().take_gpu_time()?;
    drafter.take_gpu_time()?;
    let mut history = prompt.to_vec();
    let mut tokens: Vec<u32> = Vec::new();
    let mut stats = SpecStats {
        hist: vec![0; dc.block_size],
        prefill_time: t_prefill.elapsed(),
        ..SpecStats::default()
    };
    let done = |tokens: Vec<u32>, finish, stats| {
        Ok(SpecOutput {
            tokens,
            finish,
            stats,
        })
    };

    // The first token comes from the prompt's logits, as in plain generation.
    if params.max_tokens == 0 {
        return done(tokens, FinishReason::Length, stats);
    }
    let t = sampler.sample(&logits, &history);
    if params.stop_tokens.contains(&t) {
        return done(tokens, FinishReason::Stop, stats);
    }
    tokens.push(t);
    history.push(t);
    if on_token(t) {
        return done(tokens, FinishReason::Stop, stats);
    }
    let mut pending = t;
    // With auto drafts (not in forced runs, which measure a chosen acceptance), the drafts a round come from
    // measured acceptance and round times. The chooser is locked only to choose and to record a round: other
    // generations with the same drafter share it.
    let auto = forced.is_none();

    loop {
        let len = session.len(slot);
        let room = session.slot_ctx().saturating_sub(len);
        let budget = params.max_tokens - tokens.len();
        if room == 0 {
            return done(tokens, FinishReason::Length, stats);
        }
        if budget == 0 {
            // Plain generation decodes the last token before noticing the budget; do the same so the slot
            // ends in the same state.
            session.decode(slot, pending)?;
            return done(tokens, FinishReason::Length, stats);
        }
        // The drafter's block fits the context; the drafts (verify rows after the first) also the token budget.
        let t_round = Instant::now();
        let scored = auto && drafter.scores_drafts(dstate);
        let chosen = if auto {
            drafter.auto_drafts().map(|mut a| a.choose(scored))
        } else {
            None
        };
        let want = chosen.map_or(budget - 1, |k| k.min(budget - 1));
        let mut drafts = drafter.propose(be, dstate, pending, block_max.min(room), want)?;
        if let (true, Some(a)) = (scored, drafter.auto_drafts()) {
            drafts.truncate(a.cut(dstate.margins()));
        }
        stats.draft_time += t_round.elapsed();
        // The proposals came back, so the drafter's passes are done: this round's, and the context update at
        // the end of the last one (read here rather than there, where waiting for it would add a sync).
        add_gpu(&mut stats.draft_gpu, drafter.take_gpu_time()?);
        let v = drafts.len() + 1;
        if let Some(f) = forced {
            force_drafts(f, &mut drafts, tokens.len(), n_vocab);
        }
        let mut block = Vec::with_capacity(v);
        block.push(pending);
        block.extend_from_slice(&drafts);
        let batch = Batch {
            rows: block
                .iter()
                .enumerate()
                .map(|(i, &token)| BatchRow {
                    slot,
                    pos: len + i,
                    token,
                    logits: true,
                })
                .collect(),
            taps: ids.clone(),
            argmax_only,
            prefill: false,
            keep_taps,
        };
        let t0 = Instant::now();
        let out = session.forward(&batch)?;
        stats.verify_time += t0.elapsed();
        add_gpu(&mut stats.verify_gpu, session.model().take_gpu_time()?);
        stats.rounds += 1;
        let mut accepted = 0;
        let mut finish = None;
        for i in 0..v {
            let c = match acceptance {
                _ if argmax_only => out.argmax[i],
                Acceptance::BiasedArgmaxForTests
                    if i + 1 < v && super::drafter::argmax(out.row(i)) == block[i + 1] =>
                {
                    block[i + 1]
                }
                _ => sampler.sample(out.row(i), &history),
            };
            if params.stop_tokens.contains(&c) {
                finish = Some(FinishReason::Stop);
                break;
            }
            tokens.push(c);
            history.push(c);
            stats.round_tokens += 1;
            pending = c;
            if on_token(c) {
                finish = Some(FinishReason::Stop);
                break;
            }
            if i + 1 < v && block[i + 1] == c {
                accepted += 1;
            } else {
                break;
            }
        }
        // Rows 0..=accepted hold right tokens; the rest are rolled back.
        session.truncate(slot, len + accepted + 1)?;
        if let Some(h) = stats.hist.get_mut(accepted) {
            *h += 1;
        }
        if let Some(r) = finish {
            return done(tokens, r, stats);
        }
        let t0 = Instant::now();
        extend_context(session, drafter, dstate, &out, 0, accepted + 1)?;
        stats.draft_time += t0.elapsed();
        if let (Some(_), Some(mut a)) = (chosen, drafter.auto_drafts()) {
            let m = dstate.margins();
            let m = &m[..m.len().min(v - 1)];
            a.observe(v - 1, accepted, t_round.elapsed().as_secs_f64(), m);
        }
    }
}
