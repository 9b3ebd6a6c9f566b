//! The HTTP routes. Every handler reads its body itself (size limit → 413, read timeout → 408, bad JSON → 400)
//! so that every error, including extractor failures, leaves in OpenAI's error shape.

use crate::error::ApiError;
use crate::generation::{Counts, Generation, Piece, TokenInfo};
use crate::params::{self, GenOptions, Prompt};
use crate::state::{unix_time, AppState, Ready};
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// The router with every route, the auth check and request counting.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Checks the API key (all routes but /health and /metrics) and counts responses by route and status.
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let public = route == "/health" || route == "/metrics";
    let resp = match &st.cfg.api_key {
        Some(key) if !public && !authorized(req.headers(), key) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
        )
        .into_response(),
        _ => next.run(req).await,
    };
    st.metrics.request(&route, resp.status().as_u16());
    resp
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let Some(got) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    // Compare without an early exit, so the time taken does not reveal how much of the key matched.
    let (a, b) = (got.as_bytes(), key.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Reads and parses a JSON body within the size limit and the read timeout.
async fn read_json(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let too_big = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body exceeds {limit} bytes"),
        )
    };
    // An oversized body is still read (and dropped) up to this much, so that a client that sends its whole
    // body before reading gets the 413 instead of a reset connection; beyond it the connection is just closed.
    let drain_cap = limit.saturating_mul(4).min(64 << 20);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > drain_cap as u64) {
        return Err(too_big());
    }
    let read = async {
        let mut buf = Vec::new();
        let mut seen = 0usize;
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body_read_failed",
                    format!("cannot read the body: {e}"),
                )
            })?;
            seen = seen.saturating_add(chunk.len());
            if seen > drain_cap {
                return Err(too_big());
            }
            if seen <= limit {
                buf.extend_from_slice(&chunk);
            }
        }
        if seen > limit {
            return Err(too_big());
        }
        Ok(buf)
    };
    let bytes = tokio::time::timeout(st.cfg.read_timeout, read)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body did not arrive in time",
            )
        })??;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not valid JSON: {e}"),
        )
    })
}

fn check_model(ready: &Ready, opts: &GenOptions) -> Result<(), ApiError> {
    match &opts.model {
        Some(m) if *m != ready.model_id => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "model '{m}' does not exist; this server serves '{}'",
                ready.model_id
            ),
            param: Some("model".into()),
            code: "model_not_found",
        }),
        _ => Ok(()),
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.ready() {
        Ok(r) => {
            let s = r.handle.stats();
            Json(json!({
                "status": "ok",
                "slots_total": s.slots,
                "slots_busy": s.active,
                "slots_idle": s.slots as u64 - s.active.min(s.slots as u64),
                "queue": s.queued,
            }))
            .into_response()
        }
        Err(e) => (
            e.status,
            Json(json!({"status": if e.status == StatusCode::SERVICE_UNAVAILABLE { "loading" } else { "error" },
                        "error": e.body()["error"]})),
        )
            .into_response(),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let stats = st.ready.get().map(|r| r.handle.stats());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(stats.as_ref()),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = st.ready()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": r.model_id,
            "object": "model",
            "created": r.created,
            "owned_by": "kiln",
            "meta": {"n_ctx_per_request": r.handle.slot_ctx(), "n_vocab": r.handle.n_vocab()},
        }],
    })))
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let r = st.ready()?;
    let v = read_json(&st, &headers, body).await?;
    let o = params::object(&v)?;
    let content = match o.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(ApiError::invalid("content", "'content' must be a string")),
    };
    let flag = |name: &str, default: bool| match o.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("'{name}' must be a boolean"),
        )),
    };
    let add_special = flag("add_special", false)?;
    let parse_special = flag("parse_special", false)?;
    let with_pieces = flag("with_pieces", false)?;
    let tok = r.tok.clone();
    let ids = tokio::task::spawn_blocking(move || tok.encode(&content, add_special, parse_special))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": r.tok.token_piece(id).unwrap_or_default()}))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let r = st.ready()?;
    let v = read_json(&st, &headers, body).await?;
    let o = params::object(&v)?;
    let ids = match o.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>(),
        _ => None,
    }
    .ok_or_else(|| ApiError::invalid("tokens", "'tokens' must be an array of token ids"))?;
    let n_vocab = r.tok.vocab_size();
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {n_vocab} tokens"),
        ));
    }
    let text = r.tok.decode(&ids, false)?;
    Ok(Json(json!({ "content": text })))
}

/// Which endpoint a generation answers, for the response shapes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

struct Meta {
    api: Api,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let t0 = Instant::now();
    let result = async {
        let r = st.ready()?;
        let v = read_json(&st, &headers, body).await?;
        let req = params::chat(&v)?;
        check_model(r, &req.opts)?;
        let tok = r.tok.clone();
        let messages = req.messages;
        let prompt = tokio::task::spawn_blocking(move || {
            kiln_tokenizer::apply_chat_template_ids(&tok, &messages, true, &Value::Null)
        })
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
        let gen = Generation::start(&st, r, prompt, &req.opts, None, t0)?;
        let meta = Meta {
            api: Api::Chat,
            id: format!("chatcmpl-{}", st.next_id()),
            model: r.model_id.clone(),
            created: unix_time(),
            include_usage: req.opts.include_usage,
        };
        Ok::<_, ApiError>(respond(gen, meta, req.opts.stream, req.opts.logprobs.is_some()).await)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let t0 = Instant::now();
    let result = async {
        let r = st.ready()?;
        let v = read_json(&st, &headers, body).await?;
        let req = params::completion(&v)?;
        check_model(r, &req.opts)?;
        let prompt = match req.prompt {
            Prompt::Tokens(t) => t,
            // A raw completion prompt is the client's own template: special-token text in it is parsed, as
            // llama.cpp's server does (chat messages, in contrast, never are).
            Prompt::Text(text) => {
                let tok = r.tok.clone();
                tokio::task::spawn_blocking(move || {
                    let add_bos = tok.add_bos();
                    tok.encode(&text, add_bos, true)
                })
                .await
                .map_err(|e| {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                })??
            }
        };
        // OpenAI's default for completions is 16 tokens.
        let gen = Generation::start(&st, r, prompt, &req.opts, Some(16), t0)?;
        let meta = Meta {
            api: Api::Completion,
            id: format!("cmpl-{}", st.next_id()),
            model: r.model_id.clone(),
            created: unix_time(),
            include_usage: req.opts.include_usage,
        };
        Ok::<_, ApiError>(respond(gen, meta, req.opts.stream, req.opts.logprobs.is_some()).await)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

fn usage_json(c: Counts) -> Value {
    json!({
        "prompt_tokens": c.prompt,
        "completion_tokens": c.completion,
        "total_tokens": c.prompt + c.completion,
    })
}

/// Log-probabilities in the endpoint's shape (chat: `content` entries; completions: parallel arrays).
fn logprobs_json(api: Api, infos: &[TokenInfo]) -> Value {
    match api {
        Api::Chat => json!({
            "content": infos.iter().map(|t| json!({
                "token": t.text,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(s, b, l)| json!({"token": s, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
        Api::Completion => json!({
            "tokens": infos.iter().map(|t| &t.text).collect::<Vec<_>>(),
            "token_logprobs": infos.iter().map(|t| t.logprob).collect::<Vec<_>>(),
            "top_logprobs": infos.iter().map(|t| {
                t.top.iter().map(|(s, _, l)| (s.clone(), json!(l))).collect::<serde_json::Map<_, _>>()
            }).collect::<Vec<_>>(),
        }),
    }
}

fn engine_error(msg: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "generation_failed", msg)
}

async fn respond(gen: Generation, meta: Meta, stream: bool, want_logprobs: bool) -> Response {
    if stream {
        return stream_response(gen, meta, want_logprobs);
    }
    let mut gen = gen;
    let mut text = String::new();
    let mut infos = Vec::new();
    let (finish, counts) = loop {
        match gen.next().await {
            Some(Piece::Text { text: t, logprobs }) => {
                text.push_str(&t);
                infos.extend(logprobs);
            }
            Some(Piece::End { finish, counts }) => break (finish, counts),
            Some(Piece::Error(msg)) => return engine_error(msg).into_response(),
            None => {
                return engine_error("generation ended without a result".into()).into_response()
            }
        }
    };
    let lp = if want_logprobs {
        logprobs_json(meta.api, &infos)
    } else {
        Value::Null
    };
    let choice = match meta.api {
        Api::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": finish,
        }),
        Api::Completion => {
            json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish})
        }
    };
    let object = match meta.api {
        Api::Chat => "chat.completion",
        Api::Completion => "text_completion",
    };
    Json(json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage_json(counts),
    }))
    .into_response()
}

fn chunk(meta: &Meta, choice: Value, usage: Option<Value>) -> SseEvent {
    let object = match meta.api {
        Api::Chat => "chat.completion.chunk",
        Api::Completion => "text_completion",
    };
    let mut v = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
    });
    if meta.include_usage {
        v["usage"] = usage.unwrap_or(Value::Null);
    }
    SseEvent::default().data(v.to_string())
}

fn delta_choice(
    api: Api,
    text: Option<&str>,
    lp: Value,
    finish: Option<&str>,
    first: bool,
) -> Value {
    match api {
        Api::Chat => {
            let mut delta = serde_json::Map::new();
            if first {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                delta.insert("content".into(), json!(t));
            }
            json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
        }
        Api::Completion => {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish})
        }
    }
}

/// Streams chunks as server-sent events. A task drives the generation and stops as soon as the response body
/// is dropped (client gone), which drops the [`Generation`] and cancels the request.
fn stream_response(mut gen: Generation, meta: Meta, want_logprobs: bool) -> Response {
    let (tx, mut rx) = mpsc::channel::<SseEvent>(32);
    tokio::spawn(async move {
        let send = |ev: SseEvent| tx.send(ev);
        let mut first = true;
        if meta.api == Api::Chat {
            let c = delta_choice(meta.api, Some(""), Value::Null, None, true);
            first = false;
            if send(chunk(&meta, c, None)).await.is_err() {
                return;
            }
        }
        loop {
            let piece = tokio::select! {
                p = gen.next() => p,
                _ = tx.closed() => return,
            };
            let ev = match piece {
                Some(Piece::Text { text, logprobs }) => {
                    let lp = if want_logprobs {
                        logprobs_json(meta.api, &logprobs)
                    } else {
                        Value::Null
                    };
                    let c = delta_choice(meta.api, Some(&text), lp, None, first);
                    first = false;
                    chunk(&meta, c, None)
                }
                Some(Piece::End { finish, counts }) => {
                    let c = delta_choice(meta.api, None, Value::Null, Some(finish), first);
                    if send(chunk(&meta, c, None)).await.is_err() {
                        return;
                    }
                    if meta.include_usage {
                        let _ = send(chunk(&meta, Value::Null, Some(usage_json(counts)))).await;
                    }
                    let _ = send(SseEvent::default().data("[DONE]")).await;
                    return;
                }
                Some(Piece::Error(msg)) => {
                    let _ =
                        send(SseEvent::default().data(engine_error(msg).body().to_string())).await;
                    return;
                }
                None => return,
            };
            if send(ev).await.is_err() {
                return;
            }
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>))
    });
    Sse::new(stream).into_response()
}
