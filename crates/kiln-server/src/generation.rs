//! One generation as the HTTP layer sees it: submits token ids to the scheduler, then turns the engine's token
//! events into text pieces — UTF-8-safe streaming detokenization, then stop strings — and a final piece with
//! the finish reason and token counts. Dropping a [`Generation`] before it ends (the client went away) cancels
//! the request, so its slot is freed at the next engine step.

use crate::error::ApiError;
use crate::params::GenOptions;
use crate::state::{AppState, Ready};
use kiln_engine::scheduler::{Event, Finish, Request, Speculative, Ticket, TokenLogprobs};
use kiln_engine::StopMatcher;
use kiln_tokenizer::{StreamDecoder, Tokenizer};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// One generated token with its log-probability, for `logprobs` responses.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenInfo {
    /// The token's text (U+FFFD for a partial character).
    pub text: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives: (text, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Token counts for `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Prompt tokens.
    pub prompt: usize,
    /// Generated tokens.
    pub completion: usize,
}

/// What [`Generation::next`] yields.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// New text (possibly empty when only log-probabilities are new).
    Text {
        /// The text.
        text: String,
        /// Log-probabilities of the tokens that produced it, when asked for.
        logprobs: Vec<TokenInfo>,
    },
    /// The end: OpenAI's finish reason and the token counts.
    End {
        /// `stop` or `length`.
        finish: &'static str,
        /// Token counts.
        counts: Counts,
    },
    /// The engine failed; the generation is over.
    Error(String),
}

/// A running generation; see the module docs.
pub struct Generation {
    rx: mpsc::UnboundedReceiver<Event>,
    ticket: Ticket,
    tok: Arc<Tokenizer>,
    state: Arc<AppState>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    counts: Counts,
    started: Instant,
    first_token: bool,
    /// The final piece, when text had to be returned first.
    end: Option<Piece>,
    finished: bool,
}

impl Generation {
    /// Submits `prompt`. `default_max` applies when the request gives no `max_tokens` (`None`: until the
    /// context is full).
    pub fn start(
        state: &Arc<AppState>,
        ready: &Ready,
        prompt: Vec<u32>,
        opts: &GenOptions,
        default_max: Option<usize>,
        started: Instant,
    ) -> Result<Generation, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sampler = opts.sampler.clone();
        if !opts.seeded {
            sampler.seed = state.fresh_seed();
        }
        let prompt_len = prompt.len();
        // A request's own `speculative` wins; otherwise the server's default applies when a drafter is loaded.
        let speculative = opts
            .speculative
            .unwrap_or(state.cfg.draft_default && ready.handle.has_drafter())
            .then(Speculative::default);
        let request = Request {
            speculative,
            max_tokens: opts.max_tokens.or(default_max).unwrap_or(usize::MAX),
            stop_tokens: ready.tok.eos_ids().to_vec(),
            sampler,
            top_logprobs: opts.logprobs,
            // A send fails only once the receiver is gone, i.e. the client left: that cancels the request.
            sink: Box::new(move |ev| tx.send(ev).is_ok()),
            prompt,
        };
        let ticket = ready.handle.submit(request)?;
        Ok(Generation {
            rx,
            ticket,
            tok: ready.tok.clone(),
            state: state.clone(),
            decoder: StreamDecoder::new(true),
            stop: StopMatcher::new(&opts.stop),
            counts: Counts {
                prompt: prompt_len,
                completion: 0,
            },
            started,
            first_token: true,
            end: None,
            finished: false,
        })
    }

    fn info(&self, id: u32, lp: &TokenLogprobs) -> TokenInfo {
        let piece = |id: u32| {
            let bytes = self
                .tok
                .token_bytes(id)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (text, bytes) = piece(id);
        TokenInfo {
            text,
            bytes,
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(t, l)| {
                    let (s, b) = piece(t);
                    (s, b, l)
                })
                .collect(),
        }
    }

    fn finish(&mut self, finish: &'static str, text: String) -> Piece {
        self.finished = true;
        let end = Piece::End {
            finish,
            counts: self.counts,
        };
        if text.is_empty() {
            end
        } else {
            self.end = Some(end);
            Piece::Text {
                text,
                logprobs: Vec::new(),
            }
        }
    }

    /// The next piece; `None` after the end.
    pub async fn next(&mut self) -> Option<Piece> {
        if let Some(p) = self.end.take() {
            return Some(p);
        }
        if self.finished {
            return None;
        }
        loop {
            let Some(ev) = self.rx.recv().await else {
                self.finished = true;
                return Some(Piece::Error("the engine dropped the request".into()));
            };
            match ev {
                Event::Token { id, logprobs } => {
                    if self.first_token {
                        self.first_token = false;
                        self.state
                            .metrics
                            .ttft(self.started.elapsed().as_secs_f64());
                    }
                    self.counts.completion += 1;
                    let info = logprobs.as_ref().map(|lp| self.info(id, lp));
                    let text = match self.decoder.push(&self.tok, id) {
                        Ok(t) => t,
                        Err(e) => {
                            self.ticket.cancel();
                            self.finished = true;
                            return Some(Piece::Error(e.to_string()));
                        }
                    };
                    let (emit, stopped) = self.stop.push(&text);
                    if stopped {
                        // The engine may already be computing the next token; it is discarded.
                        self.ticket.cancel();
                        return Some(self.finish("stop", emit));
                    }
                    if !emit.is_empty() || info.is_some() {
                        return Some(Piece::Text {
                            text: emit,
                            logprobs: info.into_iter().collect(),
                        });
                    }
                }
                Event::Done { reason, .. } => {
                    let tail = self.decoder.finish();
                    let (mut emit, stopped) = self.stop.push(&tail);
                    if !stopped {
                        emit.push_str(&self.stop.flush());
                    }
                    let finish = match reason {
                        Finish::Length if !stopped => "length",
                        _ => "stop",
                    };
                    return Some(self.finish(finish, emit));
                }
                Event::Error(msg) => {
                    self.finished = true;
                    return Some(Piece::Error(msg));
                }
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            // Counted before the slot is released, so a client that sees the server idle sees the count.
            self.state.metrics.disconnect();
            self.ticket.cancel();
        }
    }
}
