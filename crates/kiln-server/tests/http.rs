//! The HTTP layer without a model: while the engine is still loading, /health says 503 "loading", generation
//! routes answer 503 in OpenAI's error shape, /metrics reports not ready, unknown routes are 404 and wrong
//! methods 405 (both JSON), and the API key guards every route but /health and /metrics.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kiln_server::{router, AppState, ServerConfig};
use std::sync::Arc;
use tower::ServiceExt;

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn error_of(body: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    let e = v["error"].clone();
    assert!(e["message"].is_string() && e["type"].is_string(), "{body}");
    e
}

#[tokio::test]
async fn loading_server_answers_every_route_in_shape() {
    let mut cfg = ServerConfig::new("model.gguf");
    cfg.api_key = Some("sekrit".into());
    let app = router(Arc::new(AppState::new(cfg)));

    let (s, b) = call(&app, "GET", "/health", None, "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(b.contains("\"loading\""), "{b}");
    let (s, b) = call(&app, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.contains("kiln_ready 0"), "{b}");

    let chat = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
    let (s, b) = call(&app, "POST", "/v1/chat/completions", None, chat).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&b)["type"], "authentication_error");
    let (s, _) = call(&app, "POST", "/v1/chat/completions", Some("wrong"), chat).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, b) = call(&app, "POST", "/v1/chat/completions", Some("sekrit"), chat).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&b)["code"], "model_loading");
    let (s, _) = call(&app, "GET", "/v1/models", Some("sekrit"), "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);

    let (s, b) = call(&app, "GET", "/v1/nothing", Some("sekrit"), "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&b)["code"], "not_found");
    let (s, b) = call(&app, "GET", "/v1/completions", Some("sekrit"), "").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    error_of(&b);

    // Requests are counted by route and status.
    let (_, b) = call(&app, "GET", "/metrics", None, "").await;
    assert!(
        b.contains("kiln_requests_total{route=\"/v1/chat/completions\",status=\"401\"} 2"),
        "{b}"
    );
}
