//! `kinf-sim serve`: a real-time simulated vLLM 0.32 worker.
//!
//! One task owns an [`Engine`] and advances it to the wall clock
//! (× `--speed`) ([`driver`]); an axum server speaks vLLM's HTTP API ([`openai`],
//! [`anthropic`], [`metrics_text`]); a ZMQ publisher sends KV events in vLLM's frames and serves
//! replay ([`kv_publisher`]); [`faults`] injects failures. See `docs/reference/kinf-sim.md`.

pub mod anthropic;
pub mod args;
pub mod driver;
pub mod faults;
pub mod http;
pub mod kv_publisher;
pub mod metrics_text;
pub mod openai;
pub mod sse;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

pub use args::ServeArgs;
pub use faults::{Faults, MetricsBreak};
use tokio::task::JoinHandle;

use crate::{Engine, EngineOptions, PROFILE_NAMES, Profile};

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// The bound HTTP address.
    pub http: SocketAddr,
    /// The KV-event PUB endpoint (`tcp://host:port`), if enabled.
    pub kv_events: Option<String>,
    /// The replay ROUTER endpoint, if enabled.
    pub replay: Option<String>,
    task: JoinHandle<()>,
}

impl Server {
    /// The startup line printed on stdout:
    /// `{"http":"127.0.0.1:PORT","kv_events":"tcp://…"|null,"replay":"tcp://…"|null}`.
    pub fn startup_line(&self) -> String {
        serde_json::json!({
            "http": self.http.to_string(),
            "kv_events": self.kv_events,
            "replay": self.replay,
        })
        .to_string()
    }

    /// Waits until the HTTP server stops.
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    /// Stops the HTTP server (the engine and publisher tasks end with the runtime).
    pub fn stop(&self) {
        self.task.abort();
    }
}

fn port_of(endpoint: &str) -> &str {
    endpoint.rsplit(':').next().unwrap_or("")
}

/// Binds every socket and starts serving.
pub async fn start(args: ServeArgs) -> Result<Server, String> {
    let mut profile = Profile::by_name(&args.profile).ok_or_else(|| {
        format!(
            "unknown profile `{}` (known: {})",
            args.profile,
            PROFILE_NAMES.join(", ")
        )
    })?;
    if let Some(b) = args.block_size {
        profile.block_size = b;
    }
    if let Some(n) = args.num_gpu_blocks {
        profile.num_gpu_blocks = n;
    }
    if let Some(m) = args.max_model_len {
        profile.max_model_len = m;
    }
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err("--speed must be a positive number".into());
    }
    let tokens = tokens::Tokens::load(args.tokenizer.as_deref(), profile.vocab_size)?;
    let engine = Engine::new(
        profile.clone(),
        EngineOptions {
            kv_events: args.kv_events_port.is_some(),
            token_outputs: true,
        },
    )
    .map_err(|e| e.to_string())?;
    let faults = faults::SharedFaults::new(args.faults.clone(), args.seed);
    let (kv_endpoints, kv_tx) = match args.kv_events_port {
        Some(port) => {
            let (ep, tx) = kv_publisher::start(
                &args.host,
                port,
                args.replay_port,
                args.topic.clone(),
                faults.clone(),
                args.replay_buffer,
            )
            .await?;
            (Some(ep), Some(tx))
        }
        None => (None, None),
    };
    let clock = driver::Clock::new(args.speed);
    let driver = driver::Driver::spawn(engine, clock, kv_tx);
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| format!("binding {}:{}: {e}", args.host, args.port))?;
    let http_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let wildcard = if args.host == "0.0.0.0" || args.host == "::" {
        "*".to_owned()
    } else {
        args.host.clone()
    };
    // Field order as vLLM 0.32 writes it (see `fixtures/vllm-0.32.0-cpu/kv_event_sources.json`).
    let (enabled, publisher, endpoint, replay) = match &kv_endpoints {
        Some(ep) => (
            true,
            "zmq",
            sse::js(&format!("tcp://{wildcard}:{}", port_of(&ep.publisher))),
            ep.replay.as_ref().map_or_else(
                || "null".to_owned(),
                |r| sse::js(&format!("tcp://{wildcard}:{}", port_of(r))),
            ),
        ),
        None => (false, "null", "null".to_owned(), "null".to_owned()),
    };
    let kv_sources = format!(
        "{{\"0\":{{\"enable_kv_cache_events\":{enabled},\"publisher\":\"{publisher}\",\
         \"endpoint\":{endpoint},\"replay_endpoint\":{replay},\"buffer_steps\":{},\
         \"hwm\":100000,\"max_queue_size\":100000,\"topic\":{}}}}}",
        args.replay_buffer,
        sse::js(&args.topic)
    );
    let state = Arc::new(http::AppState {
        names: args.served_names(),
        root: args.model.clone(),
        max_model_len: profile.max_model_len,
        block_size: profile.block_size,
        num_gpu_blocks: profile.num_gpu_blocks,
        driver,
        tokens,
        faults,
        seed: args.seed,
        clock,
        counter: AtomicU64::new(0),
        kv_sources,
    });
    let app = http::router(state);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("HTTP server: {e}");
        }
    });
    Ok(Server {
        http: http_addr,
        kv_events: kv_endpoints.as_ref().map(|e| e.publisher.clone()),
        replay: kv_endpoints.and_then(|e| e.replay),
        task,
    })
}

/// Runs the server until it stops (or Ctrl-C), printing the startup line first.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    let server = start(args).await?;
    println!("{}", server.startup_line());
    {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    tokio::select! {
        () = server.wait() => Ok(()),
        r = tokio::signal::ctrl_c() => r.map_err(|e| e.to_string()),
    }
}
