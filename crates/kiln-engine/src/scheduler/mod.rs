//! Continuous batching for a server: one engine thread owns the [`Session`] and, each step, runs ONE forward
//! batch holding the decode row of every running request plus prefill chunks of newly admitted ones (on a
//! backend with prefill kernels, CUDA, each chunk in a pass of its own: [`SchedulerConfig::prefill_passes`]).
//!
//! - Requests are queued through a [`Handle`] (bounded FIFO; full → [`SubmitError::QueueFull`]) and join the
//!   running batch as soon as a slot is free, so a new request never waits for the others to finish.
//! - Prompts are prefilled in chunks that end at multiples of [`SchedulerConfig::chunk`] (counted from
//!   position 0 of the sequence), oldest request first, up to one chunk's worth of rows per step, interleaved with the decode rows:
//!   a long prompt does not stall running streams, and a sequence's chunk boundaries never depend on load.
//!   Together with the engine's batch-invariant rows this makes a request's output independent of its
//!   neighbours.
//! - Each slot keeps the tokens its cache holds; a new request takes the free slot with the longest common
//!   prefix and only runs the rest ([`Session::truncate`] rolls the cache back to the shared prefix).
//! - Cancellation ([`Ticket::cancel`], or a [`Sink`] that refuses an event because its client is gone) frees
//!   the slot at the next step. A request ends at its `max_tokens`, a stop token, or its slot's context
//!   ([`Finish::Length`]).
//!
//! - Speculative requests ([`Request::speculative`], with a drafter given to [`Scheduler::with_drafter`]) put a
//!   DFlash verify block (`[pending, drafts…]`, one row per draft) into the same batch instead of one decode
//!   row (the walk is in `scheduler/spec.rs`). Their output equals the plain path's token for token (greedy, and
//!   sampling with the same seed), because every verify row is bit-identical to a decode row and the sampler is
//!   called once per emitted token in the same order.
//!
//! Invariants: for every slot, `slots[i].cache == tokens whose K/V the session holds`, i.e.
//! `slots[i].cache.len() == session.len(i)`; a slot's drafter context, when it has one, covers a prefix of its
//! cache (`draft.len() <= cache.len()`).

mod plan;
mod queue;
mod spec;

pub use queue::{Handle, Stats, SubmitError, Ticket};

use crate::dflash::{DraftState, Drafter, Forced};
use crate::error::Result;
use crate::sampler::{Sampler, SamplerParams};
use crate::session::{Batch, BatchRow, Session};
use plan::FreeSlot;
use queue::{Queued, Shared};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Speculative decoding settings of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Speculative {
    /// Replaces the drafter's proposals (tests and measurements; see [`Forced`]). `None`: the drafter's own.
    pub forced: Option<Forced>,
}

/// Scheduler settings (the session provides the slots and their context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Prefill chunk length; also the most prefill rows in one step.
    pub chunk: usize,
    /// Most requests waiting for a slot.
    pub queue_capacity: usize,
    /// Reuse a slot's cached prompt prefix (off: every prompt is run in full).
    pub prefix_reuse: bool,
    /// Each prefill chunk in a pass of its own, marked [`Batch::prefill`] (the backend's prefill kernels), and the
    /// decode and verify rows in another; else every row of a step in one pass. `None`: split where the model's
    /// backend has prefill kernels ([`Model::has_prefill_kernels`]: CUDA), merged on the CPU, whose rows cost the
    /// same either way and share one read of the weights. Either way a row's bits depend only on its own
    /// sequence: a chunk's pass holds that chunk alone.
    ///
    /// [`Model::has_prefill_kernels`]: crate::Model::has_prefill_kernels
    pub prefill_passes: Option<bool>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            chunk: 64,
            queue_capacity: 64,
            prefix_reuse: true,
            prefill_passes: None,
        }
    }
}

impl SchedulerConfig {
    /// The session batch size this configuration needs with `n_slots` slots: one decode row per slot plus a
    /// prefill chunk.
    pub fn session_batch(&self, n_slots: usize) -> usize {
        self.chunk + n_slots
    }

    /// The session batch size with a drafter of block size `block`: every slot may hold a verify block.
    pub fn session_batch_speculative(&self, n_slots: usize, block: usize) -> usize {
        self.chunk + n_slots * block.max(1)
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token.
    Stop,
    /// `max_tokens`, or the slot's context is full.
    Length,
    /// Cancelled by the submitter or because the scheduler was aborted.
    Cancelled,
}

/// The sampled token's log-probability and the most likely alternatives (log-softmax of the model's logits,
/// before sampling settings).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// Log-probability of the generated token.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (stop tokens excluded).
    pub completion_tokens: usize,
    /// Prompt tokens whose cache was reused from the slot's previous request.
    pub reused_tokens: usize,
}

/// What the engine tells a request's [`Sink`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token (stop tokens are not sent).
    Token {
        /// Token id.
        id: u32,
        /// Present when the request asked for log-probabilities.
        logprobs: Option<TokenLogprobs>,
    },
    /// The request ended; no more events follow.
    Done {
        /// Why.
        reason: Finish,
        /// Token counts.
        usage: Usage,
    },
    /// The engine failed or was aborted; no more events follow.
    Error(String),
}

/// Receives a request's events on the engine thread; must not block. Returning `false` (the client is gone)
/// cancels the request.
pub trait Sink: Send {
    /// Delivers one event.
    fn send(&mut self, ev: Event) -> bool;
}

impl<F: FnMut(Event) -> bool + Send> Sink for F {
    fn send(&mut self, ev: Event) -> bool {
        self(ev)
    }
}

/// One generation request.
pub struct Request {
    /// Prompt token ids (BOS included when wanted).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (≥ 1); the slot's context may end it sooner.
    pub max_tokens: usize,
    /// Tokens that end generation (EOS/EOT); not sent.
    pub stop_tokens: Vec<u32>,
    /// Sampling settings.
    pub sampler: SamplerParams,
    /// `Some(k)`: report each token's log-probability and the `k` most likely tokens.
    pub top_logprobs: Option<usize>,
    /// `Some`: decode speculatively with the scheduler's drafter (refused on submit when it has none).
    pub speculative: Option<Speculative>,
    /// Where events go.
    pub sink: Box<dyn Sink>,
}

/// A request that holds a slot.
struct Job {
    req: Request,
    cancel: Arc<AtomicBool>,
    sampler: Sampler,
    /// Prompt plus generated tokens (the penalties' window).
    history: Vec<u32>,
    /// Next prompt position to prefill; `prompt.len()` once prefill is done.
    next: usize,
    /// Sampled, sent, not yet run through the model.
    pending: Option<u32>,
    generated: usize,
    reused: usize,
    /// Admission order.
    seq: u64,
    /// Set for a speculative request.
    spec: Option<Speculative>,
}

struct Slot {
    /// Tokens whose K/V the session holds for this slot.
    cache: Vec<u32>,
    last_used: u64,
    job: Option<Job>,
    /// The drafter's context for a prefix of `cache` (speculative requests only).
    draft: Option<DraftState>,
    /// With auto drafts: when this slot's round began (its proposals) and how many drafts it verifies.
    round: Option<(std::time::Instant, usize)>,
}

/// What a batch row is for.
#[derive(Clone, Copy)]
enum RowKind {
    Prefill {
        slot: usize,
    },
    Decode {
        slot: usize,
    },
    /// A row of a speculative verify block.
    Verify {
        slot: usize,
    },
}

impl RowKind {
    fn slot(self) -> usize {
        match self {
            RowKind::Prefill { slot } | RowKind::Decode { slot } | RowKind::Verify { slot } => slot,
        }
    }
}

/// The engine side of continuous batching; see the module docs.
pub struct Scheduler<'s, 'm> {
    session: &'s mut Session<'m>,
    cfg: SchedulerConfig,
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    /// Admission counter: orders prefill first-come first-served.
    admitted: u64,
    tick: u64,
    drafter: Option<Arc<Drafter>>,
    /// [`SchedulerConfig::prefill_passes`], resolved.
    prefill_passes: bool,
}

impl<'s, 'm> Scheduler<'s, 'm> {
    /// A scheduler over every slot of `session`, and the handle to submit to it. The session's batch size must
    /// be at least [`SchedulerConfig::session_batch`].
    pub fn new(session: &'s mut Session<'m>, cfg: SchedulerConfig) -> Result<(Self, Handle)> {
        let sc = session.config();
        if cfg.chunk == 0 || cfg.queue_capacity == 0 || sc.batch < cfg.session_batch(sc.n_slots) {
            return Err(crate::Error::Config(format!(
                "scheduler chunk {} and queue {} with {} slots need a session batch of at least {} (it is {})",
                cfg.chunk,
                cfg.queue_capacity,
                sc.n_slots,
                cfg.session_batch(sc.n_slots),
                sc.batch
            )));
        }
        for s in 0..sc.n_slots {
            session.truncate(s, 0)?;
        }
        let shared = Arc::new(Shared::new(
            cfg.queue_capacity,
            session.slot_ctx(),
            session.model().n_vocab(),
            sc.n_slots,
        ));
        let slots = (0..sc.n_slots)
            .map(|_| Slot {
                cache: Vec::new(),
                last_used: 0,
                job: None,
                draft: None,
                round: None,
            })
            .collect();
        let handle = Handle {
            shared: shared.clone(),
        };
        let prefill_passes = cfg
            .prefill_passes
            .unwrap_or_else(|| session.model().has_prefill_kernels());
        Ok((
            Scheduler {
                prefill_passes,
                session,
                cfg,
                shared,
                slots,
                admitted: 0,
                tick: 0,
                drafter: None,
            },
            handle,
        ))
    }

    /// Gives the scheduler a DFlash drafter (bound to the session's model) for speculative requests. The session
    /// batch must hold [`SchedulerConfig::session_batch_speculative`] rows.
    pub fn with_drafter(mut self, drafter: Arc<Drafter>) -> Result<Self> {
        let sc = self.session.config();
        let block = drafter.config().block_size;
        let need = self.cfg.session_batch_speculative(sc.n_slots, block);
        if sc.batch < need {
            return Err(crate::Error::Config(format!(
                "a drafter with block {block} and {} slots needs a session batch of at least {need} (it is {})",
                sc.n_slots, sc.batch
            )));
        }
        self.shared.has_drafter.store(true, Ordering::Relaxed);
        self.drafter = Some(drafter);
        Ok(self)
    }

    /// Runs until the handle is closed and every request has finished (or until aborted).
    pub fn run(mut self) -> Result<()> {
        loop {
            if self.shared.abort.load(Ordering::Relaxed) {
                self.abort_all();
                return Ok(());
            }
            if !self.step()? && !self.shared.wait(Duration::from_millis(200)) {
                return Ok(());
            }
        }
    }

    /// One scheduling step: drop cancelled requests, admit queued ones into free slots, run one batch and
    /// deliver its tokens. Returns whether any request is running or was run.
    pub fn step(&mut self) -> Result<bool> {
        self.tick += 1;
        self.reap_cancelled();
        self.admit()?;
        let passes = self.plan();
        if passes.is_empty() {
            return Ok(false);
        }
        let (mut produced, mut prompt_rows) = (0u64, 0u64);
        for (batch, kinds) in &passes {
            let (p, r) = self.run_pass(batch, kinds)?;
            produced += p;
            prompt_rows += r;
        }
        self.shared
            .counters
            .prompt_processed
            .fetch_add(prompt_rows, Ordering::Relaxed);
        self.shared.record_step(passes.len() as u64, produced);
        Ok(true)
    }

    /// Runs one pass of this step and delivers its rows' results; returns the tokens it produced and the
    /// prompt rows it processed. A failed pass ends only its own requests.
    fn run_pass(&mut self, batch: &Batch, kinds: &[RowKind]) -> Result<(u64, u64)> {
        let out = match self.session.forward(batch) {
            Ok(o) => o,
            Err(e) => {
                // Only the requests in this batch are affected; their slots start over from an empty cache.
                let msg = e.to_string();
                for k in kinds {
                    let slot = k.slot();
                    if let Some(job) = self.slots[slot].job.take() {
                        self.end(job, None, Some(msg.clone()));
                    }
                    self.slots[slot].cache.clear();
                    self.slots[slot].draft = None;
                    self.session.truncate(slot, 0)?;
                }
                return Ok((0, 0));
            }
        };
        self.prefill_features(batch, kinds, &out);
        let mut produced = 0u64;
        let mut prompt_rows = 0u64;
        let mut logit_idx = 0;
        let mut i = 0;
        while i < batch.rows.len() {
            let (row, kind) = (batch.rows[i], kinds[i]);
            let slot = match kind {
                RowKind::Prefill { slot } => {
                    prompt_rows += 1;
                    slot
                }
                RowKind::Decode { slot } => slot,
                RowKind::Verify { slot } => {
                    // A verify block: consecutive rows of one slot, every one with logits.
                    let n = kinds[i..]
                        .iter()
                        .take_while(|k| matches!(k, RowKind::Verify { slot: s } if *s == slot))
                        .count();
                    produced +=
                        self.verify(slot, &batch.rows[i..i + n], &out, i, logit_idx)? as u64;
                    logit_idx += n;
                    i += n;
                    continue;
                }
            };
            self.slots[slot].cache.push(row.token);
            i += 1;
            if !row.logits {
                continue;
            }
            debug_assert_eq!(out.rows.get(logit_idx), Some(&(i - 1)));
            let logits = out.row(logit_idx);
            logit_idx += 1;
            if self.sample_into(slot, logits) {
                produced += 1;
            }
        }
        Ok((produced, prompt_rows))
    }

    /// Ends cancelled requests (their slots keep their cache for reuse).
    fn reap_cancelled(&mut self) {
        for s in 0..self.slots.len() {
            let cancelled = self.slots[s]
                .job
                .as_ref()
                .is_some_and(|j| j.cancel.load(Ordering::Relaxed));
            if cancelled {
                if let Some(job) = self.slots[s].job.take() {
                    self.end(job, Some(Finish::Cancelled), None);
                }
            }
        }
    }

    /// Moves queued requests into free slots, each to the slot that reuses the most of its prompt.
    fn admit(&mut self) -> Result<()> {
        while self.slots.iter().any(|s| s.job.is_none()) {
            let Some(Queued { req, cancel }) = self.shared.pop() else {
                break;
            };
            let speculative = req.speculative.is_some() && self.drafter.is_some();
            let free: Vec<FreeSlot> = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.job.is_none())
                .map(|(index, s)| FreeSlot {
                    index,
                    reuse: if !self.cfg.prefix_reuse {
                        0
                    } else if speculative {
                        // The drafter needs context features for every reused position.
                        let have = s.draft.as_ref().map_or(0, DraftState::len);
                        plan::reusable(&s.cache, &req.prompt).min(have)
                    } else {
                        plan::reusable(&s.cache, &req.prompt)
                    },
                    last_used: s.last_used,
                })
                .collect();
            let Some(pick) = plan::choose_slot(&free) else {
                break;
            };
            let slot = &mut self.slots[pick.index];
            self.session.truncate(pick.index, pick.reuse)?;
            slot.cache.truncate(pick.reuse);
            if let Some(d) = &self.drafter {
                if speculative && slot.draft.is_none() {
                    // A state that cannot be allocated is made again (or reported) when the request verifies.
                    slot.draft = d
                        .new_state(self.session.model().backend(), self.session.slot_ctx())
                        .ok();
                }
                if let Some(st) = slot.draft.as_mut() {
                    d.truncate(st, pick.reuse);
                }
            }
            slot.last_used = self.tick;
            let c = &self.shared.counters;
            c.active.fetch_add(1, Ordering::Relaxed);
            c.prompt_tokens
                .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
            c.prompt_reused
                .fetch_add(pick.reuse as u64, Ordering::Relaxed);
            // Parameters were validated on submit, so this cannot fail; if it did, the request ends with the
            // error rather than the engine thread.
            match Sampler::new(req.sampler.clone()) {
                Ok(sampler) => {
                    self.admitted += 1;
                    slot.job = Some(Job {
                        seq: self.admitted,
                        history: req.prompt.clone(),
                        next: pick.reuse,
                        pending: None,
                        generated: 0,
                        reused: pick.reuse,
                        sampler,
                        spec: if speculative {
                            req.speculative.clone()
                        } else {
                            None
                        },
                        req,
                        cancel,
                    });
                }
                Err(e) => {
                    let job = Job {
                        history: Vec::new(),
                        next: 0,
                        pending: None,
                        generated: 0,
                        reused: 0,
                        seq: 0,
                        spec: None,
                        sampler: Sampler::new(SamplerParams::greedy())
                            .expect("greedy parameters are valid"),
                        req,
                        cancel,
                    };
                    self.end(job, None, Some(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// This step's passes: every pending decode row, then prefill chunks, oldest request first; in one pass, or
    /// the decode rows in one and each chunk in its own ([`SchedulerConfig::prefill_passes`]). Empty passes are
    /// left out.
    fn plan(&mut self) -> Vec<(Batch, Vec<RowKind>)> {
        let mut rows = Vec::new();
        let mut kinds = Vec::new();
        let mut prefilling = Vec::new();
        let mut tap = false;
        for s in 0..self.slots.len() {
            let Some(job) = &self.slots[s].job else {
                continue;
            };
            tap |= job.spec.is_some();
            if job.spec.is_some() && job.pending.is_some() {
                self.plan_verify(s, &mut rows, &mut kinds);
                continue;
            }
            let slot = &self.slots[s];
            let Some(job) = &slot.job else { continue };
            if let Some(token) = job.pending {
                rows.push(BatchRow {
                    slot: s,
                    pos: slot.cache.len(),
                    token,
                    logits: true,
                });
                kinds.push(RowKind::Decode { slot: s });
            } else if job.next < job.req.prompt.len() {
                let end = plan::chunk_end(job.next, job.req.prompt.len(), self.cfg.chunk);
                prefilling.push((s, end - job.next, job.seq));
            }
        }
        prefilling.sort_by_key(|&(_, _, seq)| seq);
        let candidates: Vec<(usize, usize)> = prefilling.iter().map(|&(s, n, _)| (s, n)).collect();
        let picked = plan::pick_prefill(&candidates, self.cfg.chunk);
        // (rows, kinds, prefill) of each pass; the first holds the decode and verify rows.
        let mut passes = vec![(rows, kinds, false)];
        for s in picked {
            if self.prefill_passes {
                passes.push((Vec::new(), Vec::new(), true));
            }
            let (rows, kinds, _) = passes.last_mut().expect("the decode pass is always there");
            let slot = &mut self.slots[s];
            let Some(job) = slot.job.as_mut() else {
                continue;
            };
            let n = job.req.prompt.len();
            let end = plan::chunk_end(job.next, n, self.cfg.chunk);
            for p in job.next..end {
                rows.push(BatchRow {
                    slot: s,
                    pos: p,
                    token: job.req.prompt[p],
                    logits: p + 1 == n,
                });
                kinds.push(RowKind::Prefill { slot: s });
            }
            job.next = end;
        }
        // Tapping costs a copy of a few hidden rows; only batches with a speculative request need it. A drafter
        // on the target's GPU reads them there.
        let (taps, keep_taps) = match &self.drafter {
            Some(d) if tap => (d.config().target_layer_ids.clone(), d.takes_device_taps()),
            _ => (Vec::new(), false),
        };
        passes
            .into_iter()
            .filter(|(rows, _, _)| !rows.is_empty())
            .map(|(rows, kinds, prefill)| {
                let batch = Batch {
                    rows,
                    taps: taps.clone(),
                    argmax_only: false,
                    prefill,
                    keep_taps,
                };
                (batch, kinds)
            })
            .collect()
    }

    /// Samples the next token of `slot`'s request from `logits`, delivers it and decides whether the request
    /// goes on. Returns whether a token was generated.
    fn sample_into(&mut self, s: usize, logits: &[f32]) -> bool {
        let slot_ctx = self.session.slot_ctx();
        let cached = self.slots[s].cache.len();
        let Some(job) = self.slots[s].job.as_mut() else {
            return false;
        };
        let token = job.sampler.sample(logits, &job.history);
        if job.req.stop_tokens.contains(&token) {
            if let Some(job) = self.slots[s].job.take() {
                self.end(job, Some(Finish::Stop), None);
            }
            return false;
        }
        let logprobs = job.req.top_logprobs.map(|k| logprobs_of(logits, token, k));
        job.generated += 1;
        job.history.push(token);
        let delivered = job.req.sink.send(Event::Token {
            id: token,
            logprobs,
        });
        let finish = if !delivered {
            Some(Finish::Cancelled)
        } else if job.generated >= job.req.max_tokens || cached >= slot_ctx {
            // The token is sent but never run: either the budget is spent or there is no position left for it.
            Some(Finish::Length)
        } else {
            job.pending = Some(token);
            None
        };
        if let Some(reason) = finish {
            if let Some(job) = self.slots[s].job.take() {
                self.end(job, Some(reason), None);
            }
        }
        true
    }

    /// Sends the final event of `job` (its slot is already free).
    fn end(&self, mut job: Job, reason: Option<Finish>, error: Option<String>) {
        let c = &self.shared.counters;
        c.active.fetch_sub(1, Ordering::Relaxed);
        c.finished.fetch_add(1, Ordering::Relaxed);
        let ev = match (reason, error) {
            (_, Some(msg)) => Event::Error(msg),
            (reason, None) => Event::Done {
                reason: reason.unwrap_or(Finish::Cancelled),
                usage: Usage {
                    prompt_tokens: job.req.prompt.len(),
                    completion_tokens: job.generated,
                    reused_tokens: job.reused,
                },
            },
        };
        let _ = job.req.sink.send(ev);
    }

    /// Ends every queued and running request with an error (abort).
    fn abort_all(&mut self) {
        for s in 0..self.slots.len() {
            if let Some(job) = self.slots[s].job.take() {
                self.end(job, None, Some("the server is shutting down".into()));
            }
        }
        for mut q in self.shared.drain() {
            let _ = q
                .req
                .sink
                .send(Event::Error("the server is shutting down".into()));
        }
    }
}

/// Log-softmax of `logits` at `token`, and the `k` most likely tokens (ties: lower id first).
pub fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let lp = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - lse)
    };
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if top.len() == k && top.last().is_some_and(|&(_, m)| l <= m) {
                continue;
            }
            let at = top.partition_point(|&(_, m)| m >= l);
            top.insert(at, (i as u32, l));
            top.truncate(k);
        }
    }
    TokenLogprobs {
        logprob: lp(token),
        top: top.into_iter().map(|(i, l)| (i, l - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalized_and_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let t = logprobs_of(&logits, 2, 3);
        let total: f32 = logits.iter().map(|&l| (l - 3.0 + t.top[0].1).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert_eq!(
            t.top.iter().map(|&(i, _)| i).collect::<Vec<_>>(),
            vec![1, 3, 2]
        );
        assert!((t.logprob - t.top[2].1).abs() < 1e-6);
        assert!(logprobs_of(&logits, 0, 0).top.is_empty());
    }
}
