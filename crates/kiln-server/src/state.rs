//! Shared server state: the configuration, the metrics, and — once the engine thread has loaded the model —
//! the scheduler handle and tokenizer. Routes that need the model answer 503 until then.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ServerConfig;
use axum::http::StatusCode;
use kiln_engine::scheduler::Handle;
use kiln_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What exists once the model is loaded.
pub struct Ready {
    /// Submits to the engine thread's scheduler.
    pub handle: Handle,
    /// The model's tokenizer.
    pub tok: Arc<Tokenizer>,
    /// The model's name in the API (`model` field).
    pub model_id: String,
    /// Unix time the model became ready.
    pub created: u64,
}

/// State shared by every handler.
pub struct AppState {
    /// The configuration.
    pub cfg: ServerConfig,
    /// Set once by the engine thread.
    pub ready: OnceLock<Ready>,
    /// Counters.
    pub metrics: Metrics,
    /// Set when the engine thread stopped with an error.
    pub engine_failed: AtomicBool,
    ids: AtomicU64,
}

impl AppState {
    /// Fresh state for `cfg`.
    pub fn new(cfg: ServerConfig) -> AppState {
        AppState {
            cfg,
            ready: OnceLock::new(),
            metrics: Metrics::default(),
            engine_failed: AtomicBool::new(false),
            ids: AtomicU64::new(0),
        }
    }

    /// The loaded model, or 503 while loading.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        if self.engine_failed.load(Ordering::Relaxed) {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "engine_failed",
                "the inference engine stopped; see the server log",
            ));
        }
        self.ready.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "model_loading",
                "the model is still loading",
            )
        })
    }

    /// A unique id suffix for responses.
    pub fn next_id(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{:x}{:06x}", unix_time(), n)
    }

    /// A seed for a request that gave none: differs per request and per run.
    pub fn fresh_seed(&self) -> u64 {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // splitmix64 of time and counter, so consecutive requests get unrelated seeds.
        let mut z = t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Seconds since the Unix epoch.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
