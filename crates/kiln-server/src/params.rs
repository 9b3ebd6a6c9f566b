//! Request validation: a parsed JSON body in, typed settings out, or a 400 naming the field.
//!
//! Rules (OpenAI's API as real clients use it): unknown fields are ignored; `null` means "not given"; a known
//! field with the wrong JSON type or a value out of range is an error that names it; fields kiln knows but does
//! not implement (`n` > 1, `tools`, `response_format` other than text, …) are refused rather than ignored, so
//! no client silently gets a different answer than it asked for.

use crate::error::ApiError;
use kiln_engine::sampler::SamplerParams;
use kiln_tokenizer::Message;
use serde_json::{Map, Value};

/// Most stop strings (OpenAI's limit).
const MAX_STOPS: usize = 4;
/// Most alternatives per token in `top_logprobs` (chat) / `logprobs` (completions: 5).
const MAX_TOP_LOGPROBS: usize = 20;

/// Settings shared by both generation endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct GenOptions {
    /// `model`, when given.
    pub model: Option<String>,
    /// `max_tokens` / `max_completion_tokens`; `None` = until the context is full (or the endpoint default).
    pub max_tokens: Option<usize>,
    /// Sampling (seed filled in by the caller when not given).
    pub sampler: SamplerParams,
    /// Whether `seed` was given.
    pub seeded: bool,
    /// Stop strings (empty strings dropped).
    pub stop: Vec<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Log-probabilities: `Some(k)` alternatives per token.
    pub logprobs: Option<usize>,
    /// `speculative` (a kiln extension): decode with the server's DFlash drafter or not; `None` = the server's
    /// default (`kiln serve --draft`).
    pub speculative: Option<bool>,
}

/// A validated chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// Messages, roles checked.
    pub messages: Vec<Message>,
    /// Generation settings.
    pub opts: GenOptions,
}

/// A completion prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// A validated completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Generation settings.
    pub opts: GenOptions,
}

/// The top-level object of a body, or a 400.
pub fn object(v: &Value) -> Result<&Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::invalid("body", "the request body must be a JSON object"))
}

/// A field, with `null` read as absent.
fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn type_error(name: &str, expected: &str, got: &Value) -> ApiError {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::invalid(name, format!("'{name}' must be {expected}, got {kind}"))
}

fn get_bool(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    field(o, name)
        .map(|v| v.as_bool().ok_or_else(|| type_error(name, "a boolean", v)))
        .transpose()
}

fn get_str<'a>(o: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    field(o, name)
        .map(|v| v.as_str().ok_or_else(|| type_error(name, "a string", v)))
        .transpose()
}

/// A number in `[lo, hi]` (inclusive unless `lo_open`).
fn get_f32(
    o: &Map<String, Value>,
    name: &str,
    lo: f64,
    lo_open: bool,
    hi: f64,
) -> Result<Option<f32>, ApiError> {
    let Some(v) = field(o, name) else {
        return Ok(None);
    };
    let x = v.as_f64().ok_or_else(|| type_error(name, "a number", v))?;
    let ok = x.is_finite() && (if lo_open { x > lo } else { x >= lo }) && x <= hi;
    if !ok {
        let open = if lo_open { "(" } else { "[" };
        return Err(ApiError::invalid(
            name,
            format!("'{name}' must be in {open}{lo}, {hi}], got {x}"),
        ));
    }
    Ok(Some(x as f32))
}

/// An integer in `[lo, hi]`.
fn get_int(o: &Map<String, Value>, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    let Some(v) = field(o, name) else {
        return Ok(None);
    };
    let x = v
        .as_i64()
        .ok_or_else(|| type_error(name, "an integer", v))?;
    if x < lo || x > hi {
        return Err(ApiError::invalid(
            name,
            format!("'{name}' must be an integer in [{lo}, {hi}], got {x}"),
        ));
    }
    Ok(Some(x))
}

/// Fields kiln recognises and refuses unless they ask for the default behaviour.
fn refuse_unsupported(o: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(v) = field(o, "n") {
        if v.as_i64() != Some(1) {
            return Err(ApiError::unsupported("n", "only n = 1 is implemented"));
        }
    }
    if let Some(v) = field(o, "best_of") {
        if v.as_i64() != Some(1) {
            return Err(ApiError::unsupported(
                "best_of",
                "only best_of = 1 is implemented",
            ));
        }
    }
    for name in ["tools", "functions", "logit_bias"] {
        let empty = match field(o, name) {
            None => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(m)) => m.is_empty(),
            Some(_) => false,
        };
        if !empty {
            return Err(ApiError::unsupported(
                name,
                "tool calling and logit biases are not implemented",
            ));
        }
    }
    for name in ["tool_choice", "function_call"] {
        if let Some(v) = field(o, name) {
            if v.as_str() != Some("none") && v.as_str() != Some("auto") {
                return Err(ApiError::unsupported(
                    name,
                    "tool calling is not implemented",
                ));
            }
        }
    }
    if let Some(v) = field(o, "response_format") {
        let ty = v.get("type").and_then(Value::as_str);
        if ty != Some("text") {
            return Err(ApiError::unsupported(
                "response_format",
                "only {\"type\": \"text\"} is implemented (no JSON mode or schemas)",
            ));
        }
    }
    if get_bool(o, "echo")? == Some(true) {
        return Err(ApiError::unsupported(
            "echo",
            "echoing the prompt is not implemented",
        ));
    }
    if get_str(o, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "insertion is not implemented",
        ));
    }
    for name in ["audio", "prediction"] {
        if field(o, name).is_some() {
            return Err(ApiError::unsupported(name, "this input is not implemented"));
        }
    }
    Ok(())
}

/// Parses everything but the prompt/messages. `chat` selects the logprobs convention (chat: `logprobs: bool`
/// plus `top_logprobs`; completions: `logprobs: int`).
pub fn gen_options(o: &Map<String, Value>, chat: bool) -> Result<GenOptions, ApiError> {
    refuse_unsupported(o)?;
    let model = get_str(o, "model")?.map(String::from);
    let max_tokens = match get_int(o, "max_completion_tokens", 1, i64::MAX)? {
        Some(n) => Some(n),
        None => get_int(o, "max_tokens", 1, i64::MAX)?,
    }
    .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    // OpenAI's defaults: temperature 1, top_p 1, nothing else.
    let mut sampler = SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerParams::default()
    };
    if let Some(t) = get_f32(o, "temperature", 0.0, false, 2.0)? {
        sampler.temperature = t;
    }
    if let Some(p) = get_f32(o, "top_p", 0.0, true, 1.0)? {
        sampler.top_p = p;
    }
    if let Some(k) = get_int(o, "top_k", 0, i64::from(u32::MAX))? {
        sampler.top_k = k as usize;
    }
    if let Some(p) = get_f32(o, "min_p", 0.0, false, 1.0)? {
        sampler.min_p = p;
    }
    if let Some(p) = get_f32(o, "presence_penalty", -2.0, false, 2.0)? {
        sampler.presence_penalty = p;
    }
    if let Some(p) = get_f32(o, "frequency_penalty", -2.0, false, 2.0)? {
        sampler.frequency_penalty = p;
    }
    if let Some(p) = get_f32(o, "repeat_penalty", 0.0, true, 10.0)? {
        sampler.repeat_penalty = p;
    }
    let seed = match field(o, "seed") {
        None => None,
        // Any integer a client can send: negative seeds keep their bits.
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| type_error("seed", "an integer", v))?,
        ),
    };
    if let Some(s) = seed {
        sampler.seed = s;
    }
    let stop = match field(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::invalid(
                    "stop",
                    format!("'stop' holds at most {MAX_STOPS} strings, got {}", a.len()),
                ));
            }
            a.iter()
                .map(|s| {
                    s.as_str()
                        .map(String::from)
                        .ok_or_else(|| type_error("stop", "a string or an array of strings", s))
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(type_error("stop", "a string or an array of strings", v)),
    }
    .into_iter()
    .filter(|s: &String| !s.is_empty())
    .collect();
    let stream = get_bool(o, "stream")?.unwrap_or(false);
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => get_bool(so, "include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    "stream_options.include_usage",
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(v) => return Err(type_error("stream_options", "an object", v)),
    };
    let logprobs = if chat {
        let on = get_bool(o, "logprobs")?.unwrap_or(false);
        let top = get_int(o, "top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
        if top.is_some() && !on {
            return Err(ApiError::invalid(
                "top_logprobs",
                "'top_logprobs' needs 'logprobs': true",
            ));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        get_int(o, "logprobs", 0, 5)?.map(|k| k as usize)
    };
    let speculative = get_bool(o, "speculative")?;
    Ok(GenOptions {
        speculative,
        model,
        max_tokens,
        sampler,
        seeded: seed.is_some(),
        stop,
        stream,
        include_usage,
        logprobs,
    })
}

/// The roles a chat template understands; `developer` is OpenAI's newer name for `system`.
fn role(r: &str) -> Option<&'static str> {
    match r {
        "system" | "developer" => Some("system"),
        "user" => Some("user"),
        "assistant" => Some("assistant"),
        _ => None,
    }
}

/// A message's text: a string, or an array of `{"type": "text", "text": …}` parts.
fn content(i: usize, role: &str, v: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        None if role == "assistant" => Ok(String::new()),
        None => Err(ApiError::invalid(&param, format!("'{param}' is required"))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str);
                match (ty, p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}].text"),
                            "a text part needs a string 'text'",
                        ))
                    }
                    _ => {
                        return Err(ApiError::unsupported(
                            &format!("{param}[{j}]"),
                            "only text content parts are implemented",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(type_error(&param, "a string or an array of text parts", v)),
    }
}

/// Validates a chat completion body.
pub fn chat(v: &Value) -> Result<ChatRequest, ApiError> {
    let o = object(v)?;
    let msgs = match o.get("messages") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(type_error("messages", "an array of messages", v)),
        None => return Err(ApiError::invalid("messages", "'messages' is required")),
    };
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| type_error(&format!("messages[{i}]"), "an object", m))?;
        let r = match m.get("role") {
            Some(Value::String(r)) => r,
            Some(v) => return Err(type_error(&format!("messages[{i}].role"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    "every message needs a 'role'",
                ))
            }
        };
        let Some(r) = role(r) else {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("unknown role '{r}' (expected system, developer, user or assistant)"),
            ));
        };
        if field(m, "tool_calls").is_some() {
            return Err(ApiError::unsupported(
                &format!("messages[{i}].tool_calls"),
                "tool calling is not implemented",
            ));
        }
        let text = content(i, r, field(m, "content"))?;
        messages.push(Message::new(r, text));
    }
    Ok(ChatRequest {
        messages,
        opts: gen_options(o, true)?,
    })
}

/// Validates a (legacy) completion body.
pub fn completion(v: &Value) -> Result<CompletionRequest, ApiError> {
    let o = object(v)?;
    let bad = |v: &Value| {
        type_error(
            "prompt",
            "a string, an array of token ids, or a one-element array of either",
            v,
        )
    };
    let tokens = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        ApiError::invalid("prompt", "token ids must be integers in [0, 2^32)")
                    })
            })
            .collect()
    };
    let prompt = match field(o, "prompt") {
        None => return Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(t)] => Prompt::Tokens(tokens(t)?),
            a if a.iter().all(Value::is_number) => Prompt::Tokens(tokens(a)?),
            a if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "only one prompt per request is implemented",
                ))
            }
            _ => return Err(bad(field(o, "prompt").unwrap_or(&Value::Null))),
        },
        Some(v) => return Err(bad(v)),
    };
    Ok(CompletionRequest {
        prompt,
        opts: gen_options(o, false)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_err(v: Value) -> ApiError {
        chat(&v).expect_err("must be refused")
    }

    #[test]
    fn minimal_chat_uses_openai_defaults_and_ignores_unknown_fields() {
        let r = chat(
            &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                             "user": "u1", "metadata": {"a": 1}, "temperature": null}),
        )
        .unwrap();
        assert_eq!(r.messages, vec![Message::new("user", "hi")]);
        assert_eq!(r.opts.sampler.temperature, 1.0);
        assert_eq!(r.opts.sampler.top_p, 1.0);
        assert_eq!(r.opts.max_tokens, None);
        assert!(!r.opts.stream && !r.opts.seeded);
    }

    #[test]
    fn speculative_is_an_optional_boolean() {
        let base = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(chat(&base).unwrap().opts.speculative, None);
        for v in [true, false] {
            let mut b = base.clone();
            b["speculative"] = json!(v);
            assert_eq!(chat(&b).unwrap().opts.speculative, Some(v));
        }
        let mut b = base.clone();
        b["speculative"] = json!("yes");
        assert_eq!(chat_err(b).param.as_deref(), Some("speculative"));
    }

    #[test]
    fn parameters_are_read_and_ranges_enforced() {
        let r = chat(&json!({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": -1,
            "stop": ["x", ""], "presence_penalty": 1.5, "stream": true, "stream_options": {"include_usage": true},
            "logprobs": true, "top_logprobs": 2}))
        .unwrap();
        assert_eq!(r.messages, vec![Message::new("system", "ab")]);
        let o = r.opts;
        assert_eq!(o.max_tokens, Some(5));
        assert_eq!(
            (o.sampler.temperature, o.sampler.top_p, o.sampler.top_k),
            (0.0, 0.5, 3)
        );
        assert_eq!(o.sampler.seed, u64::MAX);
        assert_eq!(o.stop, vec!["x".to_string()]);
        assert!(o.stream && o.include_usage && o.seeded);
        assert_eq!(o.logprobs, Some(2));
        let m = json!([{"role": "user", "content": "hi"}]);
        for (k, v) in [
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-3)),
            ("max_tokens", json!(1.5)),
            ("max_tokens", json!("10")),
            ("temperature", json!(-0.1)),
            ("temperature", json!(2.5)),
            ("temperature", json!("hot")),
            ("top_p", json!(0)),
            ("top_p", json!(1.01)),
            ("top_k", json!(-1)),
            ("min_p", json!(2)),
            ("presence_penalty", json!(-3)),
            ("stop", json!(5)),
            ("stop", json!(["a", "b", "c", "d", "e"])),
            ("stream", json!("yes")),
            ("top_logprobs", json!(3)),
            ("seed", json!(1.5)),
        ] {
            let e = chat_err(json!({"messages": m, k: v}));
            assert_eq!(e.status, 400, "{k}={v}");
            assert_eq!(e.param.as_deref(), Some(k), "{k}={v}: {}", e.message);
        }
    }

    #[test]
    fn unsupported_fields_are_named() {
        let m = json!([{"role": "user", "content": "hi"}]);
        for (k, v) in [
            ("n", json!(2)),
            ("tools", json!([{"type": "function"}])),
            ("tool_choice", json!("required")),
            ("response_format", json!({"type": "json_object"})),
            ("logit_bias", json!({"1": 5})),
        ] {
            let e = chat_err(json!({"messages": m, k: v}));
            assert_eq!(e.param.as_deref(), Some(k));
            assert!(e.message.contains(k), "{}", e.message);
        }
        // The defaults are accepted.
        chat(&json!({"messages": m, "n": 1, "tools": [], "response_format": {"type": "text"}, "tool_choice": "none"}))
            .unwrap();
    }

    #[test]
    fn messages_are_checked() {
        assert_eq!(
            chat_err(json!({"messages": []})).param.as_deref(),
            Some("messages")
        );
        assert_eq!(chat_err(json!({})).param.as_deref(), Some("messages"));
        assert_eq!(
            chat_err(json!({"messages": "hi"})).param.as_deref(),
            Some("messages")
        );
        assert_eq!(
            chat_err(json!({"messages": [{"role": "wizard", "content": "x"}]}))
                .param
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            chat_err(json!({"messages": [{"role": "user", "content": 5}]}))
                .param
                .as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            chat_err(json!({"messages": [{"role": "user"}]}))
                .param
                .as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            chat_err(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}))
                .param
                .as_deref(),
            Some("messages[0].content[0]")
        );
        assert!(chat_err(json!([1, 2])).status == 400);
        let r = chat(&json!({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": null}]})).unwrap();
        assert_eq!(r.messages[1], Message::new("assistant", ""));
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| completion(&json!({"prompt": v})).map(|r| r.prompt);
        assert_eq!(p(json!("a")).unwrap(), Prompt::Text("a".into()));
        assert_eq!(p(json!(["a"])).unwrap(), Prompt::Text("a".into()));
        assert_eq!(p(json!([1, 2])).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(p(json!([[3]])).unwrap(), Prompt::Tokens(vec![3]));
        assert!(p(json!([-1])).is_err());
        assert!(p(json!(["a", "b"])).is_err());
        assert!(p(json!({"x": 1})).is_err());
        assert!(completion(&json!({})).is_err());
        let r = completion(&json!({"prompt": "a", "logprobs": 2})).unwrap();
        assert_eq!(r.opts.logprobs, Some(2));
        assert!(completion(&json!({"prompt": "a", "logprobs": 6})).is_err());
        assert!(completion(&json!({"prompt": "a", "echo": true})).is_err());
    }
}
