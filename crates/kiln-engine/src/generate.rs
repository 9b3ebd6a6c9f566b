//! The generation loop for one sequence: chunked prefill of the prompt, then one token per step (sample, then
//! decode it on the next step), stopping on a stop token (EOS/EOT), the token budget or the slot's context.
//! Stop strings work on text, which the engine does not decode: [`StopMatcher`] holds back text that might begin
//! a stop string and reports a match, for callers that detokenize.

use crate::error::Result;
use crate::sampler::{Sampler, SamplerError, SamplerParams};
use crate::session::Session;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (EOS/EOT) or a stop string.
    Stop,
    /// The token budget or the context limit.
    Length,
}

impl FinishReason {
    /// "stop" or "length" (the OpenAI API's names).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What one step produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// A generated token (not a stop token).
    Token(u32),
    /// Generation is over; further steps return the same.
    Finished(FinishReason),
}

/// Generation settings.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation (EOS, EOT); they are not returned.
    pub stop_tokens: Vec<u32>,
    /// Sampling.
    pub sampler: SamplerParams,
}

/// Generates from one slot of a session.
pub struct Generator<'s, 'm> {
    session: &'s mut Session<'m>,
    slot: usize,
    sampler: Sampler,
    params: GenerateParams,
    history: Vec<u32>,
    logits: Vec<f32>,
    /// The next token when it was chosen with the decode step (a plain-argmax sampler: the backend picks it
    /// where the logits are), else `None` and the sampler draws from `logits`.
    chosen: Option<u32>,
    pending: Option<u32>,
    generated: usize,
    finished: Option<FinishReason>,
}

impl<'s, 'm> Generator<'s, 'm> {
    /// Appends `prompt` to `slot` (after whatever the slot already holds: pass the new tokens only) and prepares
    /// to generate. `prompt` must not be empty unless the slot already has logits to continue from (it never does
    /// here), so an empty prompt is an error.
    pub fn new(
        session: &'s mut Session<'m>,
        slot: usize,
        prompt: &[u32],
        params: GenerateParams,
    ) -> Result<Self> {
        if prompt.is_empty() {
            return Err(crate::Error::Batch(
                "empty prompt: nothing to condition generation on".into(),
            ));
        }
        let sampler = Sampler::new(params.sampler.clone())
            .map_err(|e: SamplerError| crate::Error::Config(e.to_string()))?;
        let logits = session.prefill(slot, prompt)?;
        Ok(Generator {
            session,
            slot,
            sampler,
            params,
            history: prompt.to_vec(),
            logits,
            chosen: None,
            pending: None,
            generated: 0,
            finished: None,
        })
    }

    /// Produces the next token, or the reason generation ended.
    pub fn step(&mut self) -> Result<StepOutcome> {
        if let Some(r) = self.finished {
            return Ok(StepOutcome::Finished(r));
        }
        if let Some(t) = self.pending.take() {
            if self.session.len(self.slot) >= self.session.slot_ctx() {
                return Ok(self.finish(FinishReason::Length));
            }
            if self.params.sampler.is_plain_argmax() {
                self.chosen = Some(self.session.decode_argmax(self.slot, t)?);
            } else {
                self.session.decode_into(self.slot, t, &mut self.logits)?;
            }
        }
        if self.generated >= self.params.max_tokens {
            return Ok(self.finish(FinishReason::Length));
        }
        let t = match self.chosen.take() {
            Some(t) => t,
            None => self.sampler.sample(&self.logits, &self.history),
        };
        if self.params.stop_tokens.contains(&t) {
            return Ok(self.finish(FinishReason::Stop));
        }
        self.generated += 1;
        self.history.push(t);
        self.pending = Some(t);
        Ok(StepOutcome::Token(t))
    }

    /// Ends generation early (a stop string matched, the user interrupted): the last sampled token is not
    /// decoded, and further steps report `reason`.
    pub fn stop(&mut self, reason: FinishReason) {
        self.finish(reason);
    }

    fn finish(&mut self, reason: FinishReason) -> StepOutcome {
        self.pending = None;
        self.finished = Some(reason);
        StepOutcome::Finished(reason)
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Prompt plus generated tokens.
    pub fn history(&self) -> &[u32] {
        &self.history
    }
}

/// Finds stop strings in streamed text. [`StopMatcher::push`] returns the text that is safe to emit now: text
/// that could still turn out to start a stop string is held back until it can't.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds `text`. Returns `(emit, stopped)`: `emit` is text to output; when `stopped`, a stop string was found
    /// and `emit` is everything before it.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let emit = self.held[..at].to_string();
            self.held.clear();
            return (emit, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.held.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        (emit, false)
    }

    /// The text still held back (to emit when generation ends without a match).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_prefixes() {
        let mut m = StopMatcher::new(&["</end>".to_string()]);
        assert_eq!(m.push("hello </"), ("hello ".to_string(), false));
        assert_eq!(m.push("e"), (String::new(), false));
        assert_eq!(m.push("x more"), ("</ex more".to_string(), false));
        assert_eq!(m.push("ok</en"), ("ok".to_string(), false));
        assert_eq!(m.push("d> tail"), (String::new(), true));
    }

    #[test]
    fn stop_matcher_without_stops_passes_through() {
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("abc"), ("abc".to_string(), false));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn stop_matcher_multibyte() {
        let mut m = StopMatcher::new(&["é!".to_string()]);
        assert_eq!(m.push("caf"), ("caf".to_string(), false));
        assert_eq!(m.push("é"), (String::new(), false));
        assert_eq!(m.push("?"), ("é?".to_string(), false));
        assert_eq!(m.push("é!"), (String::new(), true));
    }
}
