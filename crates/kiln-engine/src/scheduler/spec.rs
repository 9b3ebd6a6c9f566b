//! Speculative requests inside the continuous-batching scheduler. A running speculative request contributes a
//! DFlash verify block `[pending, d1 … d(v−1)]` to the step's batch instead of one decode row: the drafter
//! proposes on the engine thread while the batch is planned, and the block's rows share the step's one target
//! forward with the other requests' decode rows and prefill chunks.
//!
//! After the forward, the block is walked exactly as a plain request's decode rows would be, one row at a
//! time: the target's choice at row i (argmax or a sample, from the request's own sampler and history) is
//! emitted with the same stop-token, `max_tokens`, context and cancellation checks as
//! [`Scheduler::sample_into`], and the walk goes on only while the next draft equals it. The rows whose tokens
//! were right stay in the KV cache (the rest are rolled back with [`Session::truncate`]) and their tapped
//! hidden states extend the drafter's context. Rows of a block are bit-identical to decode rows (batch
//! invariance), so the emitted tokens equal the plain path's.
//!
//! The block size `v` is the drafter's block (or, with auto drafts, the chooser's count + 1; forced requests
//! keep the whole block), capped by the slot's free positions and the request's remaining budget, so the last
//! row never runs past either (as a plain decode row never does).
//!
//! [`Session::truncate`]: crate::Session::truncate

use super::{logprobs_of, Event, Finish, RowKind, Scheduler};
use crate::dflash::spec::{extend_context, force_drafts};
use crate::error::Result;
use crate::session::{Batch, BatchRow, Output};
use std::sync::atomic::Ordering;

impl<'s, 'm> Scheduler<'s, 'm> {
    /// Adds slot `s`'s verify block (its pending token plus the drafter's proposals) to the batch being planned.
    pub(super) fn plan_verify(
        &mut self,
        s: usize,
        rows: &mut Vec<BatchRow>,
        kinds: &mut Vec<RowKind>,
    ) {
        let Some(drafter) = self.drafter.clone() else {
            return;
        };
        let slot_ctx = self.session.slot_ctx();
        let model = self.session.model();
        let n_vocab = model.n_vocab();
        let slot = &mut self.slots[s];
        let Some(job) = slot.job.as_ref() else {
            return;
        };
        let Some(pending) = job.pending else {
            return;
        };
        let len = slot.cache.len();
        // The drafter's block fits the context; the drafts (verify rows after the first) also the token budget.
        let block = drafter
            .config()
            .block_size
            .min(slot_ctx.saturating_sub(len));
        let want = job
            .req
            .max_tokens
            .saturating_sub(job.generated)
            .saturating_sub(1);
        // With auto drafts (not for forced requests, which measure a chosen acceptance): the chooser's count.
        let forced = job.spec.as_ref().is_some_and(|sp| sp.forced.is_some());
        let scored = !forced
            && slot
                .draft
                .as_ref()
                .is_some_and(|st| drafter.scores_drafts(st));
        let auto = if forced {
            None
        } else {
            drafter.auto_drafts().map(|mut a| a.choose(scored))
        };
        let want = auto.map_or(want, |k| k.min(want));
        if slot.draft.is_none() {
            match drafter.new_state(model.backend(), slot_ctx) {
                Ok(st) => slot.draft = Some(st),
                Err(e) => {
                    if let Some(job) = slot.job.take() {
                        self.end(job, None, Some(format!("drafter: {e}")));
                    }
                    return;
                }
            }
        }
        let Some(st) = slot.draft.as_mut() else {
            return;
        };
        // The round's clock starts at its proposals (a new state's buffers are set-up, not a round's cost).
        let t_round = std::time::Instant::now();
        let mut drafts = match drafter.propose(model.backend(), st, pending, block, want) {
            Ok(d) => d,
            Err(e) => {
                if let Some(job) = slot.job.take() {
                    self.end(job, None, Some(format!("drafter: {e}")));
                }
                return;
            }
        };
        if let Some(f) = job.spec.as_ref().and_then(|sp| sp.forced.as_ref()) {
            force_drafts(f, &mut drafts, job.generated, n_vocab);
        }
        if let (true, Some(a)) = (scored, drafter.auto_drafts()) {
            drafts.truncate(a.cut(st.margins()));
        }
        slot.round = auto.map(|_| (t_round, drafts.len()));
        for (i, token) in std::iter::once(pending).chain(drafts).enumerate() {
            rows.push(BatchRow {
                slot: s,
                pos: len + i,
                token,
                logits: true,
            });
            kinds.push(RowKind::Verify { slot: s });
        }
    }

    /// Appends the tapped hidden states of this batch's prefill rows of speculative requests to their slots'
    /// drafter contexts (one append per run of consecutive rows).
    pub(super) fn prefill_features(&mut self, batch: &Batch, kinds: &[RowKind], out: &Output) {
        let Some(drafter) = self.drafter.clone() else {
            return;
        };
        let mut i = 0;
        while i < kinds.len() {
            let RowKind::Prefill { slot: s } = kinds[i] else {
                i += 1;
                continue;
            };
            let n = kinds[i..]
                .iter()
                .take_while(|k| matches!(k, RowKind::Prefill { slot } if *slot == s))
                .count();
            let slot = &mut self.slots[s];
            let speculative = slot.job.as_ref().is_some_and(|j| j.spec.is_some());
            if let (true, Some(st)) = (speculative, slot.draft.as_mut()) {
                // The context must continue exactly where this chunk starts; it always does, because the
                // context is truncated to the reused prefix on admission and prefill runs in order.
                let r = if st.len() == batch.rows[i].pos {
                    extend_context(self.session, &drafter, st, out, i, n)
                } else {
                    Err(crate::Error::Batch(format!(
                        "drafter context holds {} positions, the prefill chunk starts at {}",
                        st.len(),
                        batch.rows[i].pos
                    )))
                };
                if let Err(e) = r {
                    slot.draft = None;
                    if let Some(job) = slot.job.take() {
                        self.end(job, None, Some(format!("drafter: {e}")));
                    }
                }
            }
            i += n;
        }
    }

    /// Walks slot `s`'s verify block (`rows`, batch rows `start..`, logits from `logit_base`): emits tokens,
    /// keeps the right rows in the cache, extends the drafter's context. Returns the tokens generated.
    pub(super) fn verify(
        &mut self,
        s: usize,
        rows: &[BatchRow],
        out: &Output,
        start: usize,
        logit_base: usize,
    ) -> Result<usize> {
        let slot_ctx = self.session.slot_ctx();
        let len = self.slots[s].cache.len();
        let v = rows.len();
        let mut produced = 0;
        let mut kept = 0;
        let mut finish = None;
        if let Some(job) = self.slots[s].job.as_mut() {
            job.pending = None;
            for i in 0..v {
                let logits = out.row(logit_base + i);
                let token = job.sampler.sample(logits, &job.history);
                // Row i's input token is right (row 0 is the pending token, later rows were accepted drafts).
                kept = i + 1;
                if job.req.stop_tokens.contains(&token) {
                    finish = Some(Finish::Stop);
                    break;
                }
                let logprobs = job.req.top_logprobs.map(|k| logprobs_of(logits, token, k));
                job.generated += 1;
                job.history.push(token);
                produced += 1;
                let delivered = job.req.sink.send(Event::Token {
                    id: token,
                    logprobs,
                });
                if !delivered {
                    finish = Some(Finish::Cancelled);
                    break;
                }
                if job.generated >= job.req.max_tokens || len + i + 1 >= slot_ctx {
                    finish = Some(Finish::Length);
                    break;
                }
                if i + 1 < v && rows[i + 1].token == token {
                    continue;
                }
                job.pending = Some(token);
                break;
            }
        }
        let slot = &mut self.slots[s];
        let round = slot.round.take();
        slot.cache.extend(rows[..kept].iter().map(|r| r.token));
        self.session.truncate(s, len + kept)?;
        let c = &self.shared.counters;
        c.spec_rounds.fetch_add(1, Ordering::Relaxed);
        c.spec_tokens.fetch_add(produced as u64, Ordering::Relaxed);
        if let Some(reason) = finish {
            if let Some(job) = slot.job.take() {
                self.end(job, Some(reason), None);
            }
            return Ok(produced);
        }
        let drafter = self.drafter.clone();
        if let (Some(d), Some(st)) = (drafter, slot.draft.as_mut()) {
            let r = extend_context(self.session, &d, st, out, start, kept);
            match r {
                Err(e) => {
                    slot.draft = None;
                    if let Some(job) = slot.job.take() {
                        self.end(job, None, Some(format!("drafter: {e}")));
                    }
                }
                // The round's time: its proposals to its context update, the step's other rows included (they
                // share the one forward, so a verify row's cost is measured as the batch pays it).
                Ok(()) => {
                    if let (Some((t0, k)), Some(mut a)) = (round, d.auto_drafts()) {
                        let m = &st.margins()[..st.margins().len().min(k)];
                        a.observe(k, kept - 1, t0.elapsed().as_secs_f64(), m);
                    }
                }
            }
        }
        Ok(produced)
    }
}
