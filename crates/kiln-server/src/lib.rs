//! kiln-server: `kiln serve`, an OpenAI-compatible HTTP server with continuous batching.
//!
//! Data path of one request: HTTP body (size limit, read timeout) → [`params`] validation → chat template and
//! tokenizer → the engine's [`kiln_engine::scheduler`] (one engine thread, one forward batch per step for
//! every running request, chunked prefill, prefix reuse) → token events → [`generation`] (UTF-8-safe streaming
//! detokenization, stop strings) → JSON or server-sent events.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health` (503 while the
//! model loads — the socket is bound first), `GET /metrics` (Prometheus), `POST /tokenize`, `POST /detokenize`.
//! Errors use OpenAI's JSON shape ([`ApiError`]).
//!
//! Speculative decoding: with [`ServerConfig::draft`] (`kiln serve --draft DIR`), a DFlash drafter is loaded
//! next to the model and requests are decoded speculatively inside the batched scheduler — every request by
//! default, or only those that ask when [`ServerConfig::draft_default`] is off (`--draft-opt-in`). A request
//! chooses with the body field `"speculative": true|false` (a kiln extension; asking for it on a server
//! without a drafter is a 400). The output is the same either way; only the speed differs.
//!
//! ```no_run
//! let cfg = kiln_server::ServerConfig::new("model.gguf");
//! kiln_server::serve(cfg)?; // blocks until SIGINT/SIGTERM
//! # Ok::<(), kiln_server::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
pub mod generation;
mod metrics;
pub mod params;
mod routes;
mod state;

pub use error::{ApiError, Error};
pub use metrics::Metrics;
pub use routes::router;
pub use state::{AppState, Ready};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use kiln_engine::dflash::Drafter;
use kiln_engine::scheduler::{Scheduler, SchedulerConfig};
use kiln_engine::{Flags, LoadOptions, Model, Session, SessionConfig};
use kiln_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Everything `kiln serve` is configured with.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The GGUF model.
    pub model: PathBuf,
    /// Address to bind.
    pub host: String,
    /// Port to bind (0 = any free port; the chosen one is printed).
    pub port: u16,
    /// When set, every route but /health and /metrics needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Total context over all slots; each request gets `ctx / parallel`.
    pub ctx: usize,
    /// Sequence slots (requests decoded together).
    pub parallel: usize,
    /// CPU threads for the engine (0 = all cores).
    pub threads: usize,
    /// Run the model on this CUDA device (needs the `cuda` feature); None = the CPU.
    pub cuda_device: Option<usize>,
    /// Kill switches.
    pub flags: Flags,
    /// A DFlash drafter (z-lab directory or converted GGUF) for speculative requests.
    pub draft: Option<PathBuf>,
    /// Whether requests that do not say (`"speculative"`) are speculative when a drafter is loaded.
    pub draft_default: bool,
    /// Drafts proposed and verified per round at most, or `auto` (None: `auto` for a target on the CPU,
    /// 7 on a GPU; `DraftMax::default_for`).
    pub draft_max: Option<kiln_engine::dflash::DraftMax>,
    /// Scheduler settings (prefill chunk, queue capacity, prefix reuse).
    pub scheduler: SchedulerConfig,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Time allowed to send a request's headers, and separately its body (slow clients are cut off).
    pub read_timeout: Duration,
    /// On SIGINT/SIGTERM, how long running requests may take to finish before they are cancelled.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// Defaults: 127.0.0.1:8080, 4 slots sharing 8192 positions, no API key.
    pub fn new(model: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            model: model.into(),
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            ctx: 8192,
            parallel: 4,
            threads: 0,
            cuda_device: None,
            flags: Flags::default(),
            draft: None,
            draft_default: true,
            draft_max: None,
            scheduler: SchedulerConfig::default(),
            max_body_bytes: 8 << 20,
            read_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
        }
    }

    /// The model's name in the API: its file name without `.gguf`.
    pub fn model_id(&self) -> String {
        let name = self
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    }
}

/// Runs the server until SIGINT/SIGTERM (blocking; owns its async runtime).
pub fn serve(cfg: ServerConfig) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        // HTTP work is light; the cores belong to the engine.
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(cfg))
}

#[cfg(feature = "cuda")]
fn use_cuda(model: &mut Model, n: usize) -> Result<(), String> {
    model
        .use_cuda(n, None)
        .map_err(|e| format!("opening CUDA device {n}: {e}"))?;
    if let Some(be) = model.cuda() {
        let d = be.device();
        eprintln!("kiln serve: CUDA device {n}: {}", d.summary());
        if let Some(w) = &d.warning {
            eprintln!("kiln serve: warning: {w}");
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn use_cuda(_model: &mut Model, n: usize) -> Result<(), String> {
    Err(format!(
        "--device cuda:{n}: this build has no CUDA backend (build with --features cuda)"
    ))
}

/// Loads the model, then runs the scheduler until the handle is closed. Reports load success or failure on
/// `loaded` (the server answers 503 until then).
fn engine_main(state: Arc<AppState>, loaded: oneshot::Sender<Result<(), String>>) {
    let cfg = &state.cfg;
    type Setup = (Model, Tokenizer, Option<Arc<Drafter>>);
    let setup = || -> Result<Setup, String> {
        let mut model = Model::load(
            &cfg.model,
            LoadOptions {
                threads: cfg.threads,
                flags: cfg.flags,
                progress: None,
            },
        )
        .map_err(|e| e.to_string())?;
        match cfg.cuda_device {
            Some(n) => use_cuda(&mut model, n)?,
            None => model
                .warm_up()
                .map_err(|e| format!("warming up the model: {e}"))?,
        }
        let tok = Tokenizer::from_gguf(model.gguf()).map_err(|e| e.to_string())?;
        let drafter = match &cfg.draft {
            Some(dir) => {
                let mut d = Drafter::load(dir, &model)
                    .map_err(|e| format!("loading the drafter {}: {e}", dir.display()))?;
                let m = cfg
                    .draft_max
                    .unwrap_or_else(|| kiln_engine::dflash::DraftMax::default_for(&model, &d));
                m.apply(&mut d).map_err(|e| format!("--draft-max: {e}"))?;
                Some(Arc::new(d))
            }
            None => None,
        };
        Ok((model, tok, drafter))
    };
    let (model, tok, drafter) = match setup() {
        Ok(x) => x,
        Err(e) => {
            let _ = loaded.send(Err(e));
            return;
        }
    };
    if let Some(d) = &drafter {
        let dc = d.config();
        eprintln!(
            "kiln serve: DFlash drafter: {} layers, block {}, taps {:?}; speculative {}",
            dc.n_layer,
            dc.block_size,
            dc.target_layer_ids,
            if cfg.draft_default {
                "by default (\"speculative\": false opts out)"
            } else {
                "on request (\"speculative\": true)"
            }
        );
    }
    let batch = match &drafter {
        Some(d) => cfg
            .scheduler
            .session_batch_speculative(cfg.parallel, d.config().block_size),
        None => cfg.scheduler.session_batch(cfg.parallel),
    };
    let scfg = SessionConfig {
        n_ctx: cfg.ctx,
        n_slots: cfg.parallel,
        batch,
        ..SessionConfig::default()
    };
    let mut session = match Session::new(&model, scfg) {
        Ok(s) => s,
        Err(e) => {
            let _ = loaded.send(Err(e.to_string()));
            return;
        }
    };
    let made = Scheduler::new(&mut session, cfg.scheduler).and_then(|(s, h)| match drafter {
        Some(d) => s.with_drafter(d).map(|s| (s, h)),
        None => Ok((s, h)),
    });
    let (sched, handle) = match made {
        Ok(x) => x,
        Err(e) => {
            let _ = loaded.send(Err(e.to_string()));
            return;
        }
    };
    let _ = state.ready.set(Ready {
        handle,
        tok: Arc::new(tok),
        model_id: cfg.model_id(),
        created: state::unix_time(),
    });
    let _ = loaded.send(Ok(()));
    if let Err(e) = sched.run() {
        eprintln!("kiln serve: engine stopped: {e}");
        state.engine_failed.store(true, Ordering::Relaxed);
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// The server: binds first (so /health can say "loading"), loads the model on the engine thread, serves until a
/// signal, then stops accepting, lets running requests finish (up to the grace period, then cancels them) and
/// returns.
pub async fn run(cfg: ServerConfig) -> Result<(), Error> {
    if cfg.parallel == 0 || cfg.ctx < cfg.parallel * 2 {
        return Err(Error::Config(format!(
            "--ctx {} with --parallel {}: need at least one slot and 2 positions per slot",
            cfg.ctx, cfg.parallel
        )));
    }
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr()?;
    eprintln!(
        "kiln serve: listening on http://{local} (loading {})",
        cfg.model.display()
    );
    let model_path = cfg.model.display().to_string();
    let read_timeout = cfg.read_timeout;
    let grace = cfg.shutdown_grace;
    let state = Arc::new(AppState::new(cfg));
    let (loaded_tx, mut loaded_rx) = oneshot::channel();
    let engine_state = state.clone();
    let engine = std::thread::Builder::new()
        .name("kiln-engine".into())
        .spawn(move || engine_main(engine_state, loaded_tx))?;
    let app = routes::router(state.clone());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .keep_alive(true);
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut loading = true;
    let mut load_error = None;
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let Ok((stream, _)) = conn else {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let svc = TowerToHyperService::new(app.clone());
                let conn = http.serve_connection(TokioIo::new(stream), svc);
                let watched = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = watched.await;
                });
            }
            r = &mut loaded_rx, if loading => {
                loading = false;
                match r {
                    Ok(Ok(())) => eprintln!("kiln serve: model loaded, ready on http://{local}"),
                    Ok(Err(e)) => { load_error = Some(e); break; }
                    Err(_) => { load_error = Some("the engine thread ended while loading".into()); break; }
                }
            }
            _ = &mut signal => {
                eprintln!("kiln serve: shutting down");
                break;
            }
        }
    }
    drop(listener);
    if let Some(message) = load_error {
        return Err(Error::Load {
            path: model_path,
            message,
        });
    }
    if let Some(r) = state.ready.get() {
        r.handle.close();
    }
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(grace, &mut drained).await.is_err() {
        eprintln!("kiln serve: cancelling requests still running after {grace:?}");
        if let Some(r) = state.ready.get() {
            r.handle.abort();
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut drained).await;
    }
    if state.ready.get().is_some() {
        // The scheduler returns once its queue is closed and empty; give it a moment, never hang.
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::task::spawn_blocking(move || engine.join()),
        )
        .await;
    }
    Ok(())
}
