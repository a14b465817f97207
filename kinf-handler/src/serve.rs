//! `kinference serve`: the gateway on a directory of YAML resources, reloaded live.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kinf_lang::CompiledPolicy;

use crate::config_dir;
use crate::gateway::{Gateway, GatewayOptions};
use crate::policy_store::ApplyOutcome;

/// Settings of `kinference serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The configuration directory (or one file).
    pub config: PathBuf,
    /// Client-facing listener.
    pub listen: SocketAddr,
    /// Admin listener (`/admin/status`); `None`: the admin routes are served on `listen`.
    pub admin_listen: Option<SocketAddr>,
    /// gRPC listener (`kinference.handler.v1.Handler` and Envoy's `ExternalProcessor`);
    /// `None`: no gRPC.
    pub grpc_listen: Option<SocketAddr>,
    /// How often the configuration directory is checked for changes.
    pub reload_interval: Duration,
    /// Longest wait for an upstream's response headers.
    pub upstream_timeout: Duration,
    /// Token-rate-limit store: `memory` or a Redis URL (`redis://HOST:PORT/DB`, ...).
    pub limiter_store: String,
    /// PEM file of the authorities that sign the Redis servers' TLS certificates (`rediss`
    /// URLs); `None`: the system's trust store.
    pub limiter_tls_ca: Option<PathBuf>,
    /// PEM files of the client certificate chain and key presented to Redis over TLS.
    pub limiter_tls_client: Option<(PathBuf, PathBuf)>,
    /// What a Redis limiter does when Redis is unreachable.
    pub limiter_fail_mode: crate::tenants::FailMode,
    /// Prefix of the limiter's Redis keys (`None`: `kinf:rl:`).
    pub limiter_key_prefix: Option<String>,
    /// Service objectives to export attainment for.
    pub slo_file: Option<PathBuf>,
    /// Kubernetes mode: resources come from the API server instead of `config` (which then
    /// only anchors relative paths).
    pub kubernetes: Option<crate::kube::KubeOptions>,
    /// Connection-level limits of the HTTP listeners (header count and size, head deadline).
    pub http_limits: crate::listen::HttpLimits,
    /// Longest wait for a client's whole request body (408 past it).
    pub body_read_timeout: Duration,
    /// Certificate and key for TLS on every listener (HTTP, admin, gRPC); `None`: plain TCP.
    pub tls: Option<crate::listen::TlsFiles>,
    /// Where a request goes whose host no front door answers.
    pub unknown_hosts: crate::gateway::runtime::UnknownHosts,
    /// On SIGTERM/SIGINT: how long `/readyz` answers 503 while connections are still accepted,
    /// before the listener closes (load balancers take a moment to stop sending requests).
    pub shutdown_delay: Duration,
}

/// Called with each newly applied policy (starts and stops live-state ingestion).
pub type OnApplied = Arc<dyn Fn(&Arc<Gateway>, &Arc<CompiledPolicy>) + Send + Sync>;

/// Reads the configuration and applies it when it changed since `last`: its YAML, or an API
/// key file the YAML names ([`config_dir::Watch`]). Returns the new content hash.
///
/// As the directory watcher does ([`crate::bundle::DirSource`]), a change is applied only once
/// it has settled: read again [`crate::bundle::SETTLE`] later, the content is the same. A file
/// caught mid-save at startup (truncated, yet valid YAML) is thus not applied. A directory
/// still changing after [`SETTLE_READS`] reads applies nothing (`last` is returned), and the
/// watcher applies it once it settles. Blocks the calling thread for the settle reads.
pub fn reload(
    gw: &Arc<Gateway>,
    dir: &Path,
    last: Option<u64>,
    on_applied: &OnApplied,
) -> Option<u64> {
    let read = config_dir::Watch::new(dir).read_settled(last, SETTLE_READS, crate::bundle::SETTLE);
    let (sources, h) = match read {
        Ok(config_dir::Settled::Changed(sources, h)) => (sources, h),
        Ok(config_dir::Settled::Unchanged) => return last,
        Ok(config_dir::Settled::Changing) => {
            tracing::warn!(
                "the configuration kept changing while it was read; it is applied once it settles"
            );
            return last;
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the configuration; the last good policy stays in force");
            return last;
        }
    };
    if let ApplyOutcome::Applied { .. } = gw.apply(&sources)
        && let Some(applied) = gw.store.current()
    {
        on_applied(gw, &applied.policy);
    }
    Some(h)
}

/// The most reads [`reload`] makes of a changing configuration before it gives up (about one
/// second of [`crate::bundle::SETTLE`] apart).
pub const SETTLE_READS: usize = 10;

/// Directory mode's reloads: polls the configuration `dir` every `every` (a
/// [`crate::bundle::DirSource`]: its YAML and the API key files the YAML names) and applies
/// each change ([`crate::bundle::apply_loop`]) until the task is aborted. `last`: the hash
/// [`reload`] returned for what is in force.
pub fn watch_directory(
    gw: Arc<Gateway>,
    dir: PathBuf,
    every: Duration,
    last: Option<u64>,
    on_applied: OnApplied,
) -> tokio::task::JoinHandle<()> {
    let source: Box<dyn crate::bundle::ConfigSource> =
        Box::new(crate::bundle::DirSource { dir, every, last });
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        tokio::join!(
            source.run(tx),
            crate::bundle::apply_loop(gw, rx, on_applied, None)
        );
    })
}

/// Runs the server until SIGINT/SIGTERM.
pub async fn serve(opts: ServeOptions, on_applied: OnApplied) -> std::io::Result<()> {
    let base_dir = config_dir::base_dir(&opts.config);
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path)
            .map_err(|e| std::io::Error::other(format!("{flag} {}: {e}", path.display())))
    };
    let tls = crate::tenants::RedisTls {
        ca: match &opts.limiter_tls_ca {
            Some(path) => Some(read("--limiter-tls-ca", path)?),
            None => None,
        },
        client: match &opts.limiter_tls_client {
            Some((cert, key)) => Some((
                read("--limiter-tls-cert", cert)?,
                read("--limiter-tls-key", key)?,
            )),
            None => None,
        },
    };
    let limit_store = crate::tenants::store_from_flags_with_tls(
        &opts.limiter_store,
        opts.limiter_fail_mode,
        opts.limiter_key_prefix.as_deref(),
        tls,
    )
    .map_err(std::io::Error::other)?;
    let gw = Gateway::new(GatewayOptions {
        base_dir,
        upstream_timeout: opts.upstream_timeout,
        limit_store,
        body_read_timeout: opts.body_read_timeout,
        ambient_aws: opts
            .kubernetes
            .as_ref()
            .map(|k| k.ambient_aws.clone())
            .unwrap_or_default(),
        unknown_hosts: opts.unknown_hosts,
    });
    if let Some(path) = &opts.slo_file {
        let slos = crate::accounting::SloSet::from_file(path)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        gw.metrics.set_slos(slos);
    }
    let mut controller = None;
    let last = match &opts.kubernetes {
        Some(k) => {
            let client = crate::kube::client()
                .await
                .map_err(|e| std::io::Error::other(format!("Kubernetes client: {e}")))?;
            let c = crate::kube::Controller::new(client, k.clone());
            c.start(gw.clone(), on_applied.clone());
            controller = Some(c);
            None
        }
        None => {
            let (gw, dir, on_applied) = (gw.clone(), opts.config.clone(), on_applied.clone());
            tokio::task::spawn_blocking(move || reload(&gw, &dir, None, &on_applied))
                .await
                .map_err(std::io::Error::other)?
        }
    };
    if opts.kubernetes.is_none() && !gw.store.is_ready() {
        tracing::error!("no policy in force: /readyz answers 503 until the configuration compiles");
    }
    let (http_tls, grpc_tls) = match &opts.tls {
        Some(files) => (
            Some(crate::listen::http_tls_config(files).map_err(std::io::Error::other)?),
            Some(crate::grpc::tls::grpc_tls_config(files).map_err(std::io::Error::other)?),
        ),
        None => (None, None),
    };
    let limits = opts.http_limits;
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let local = listener.local_addr()?;
    let app;
    let admin_addr = match opts.admin_listen {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a).await?;
            let addr = l.local_addr()?;
            let admin = gw.admin_router();
            app = gw.router();
            let tls = http_tls.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    crate::listen::serve_http(l, admin, limits, tls, std::future::pending()).await
                {
                    tracing::error!(error = %e, "admin listener failed");
                }
            });
            addr
        }
        None => {
            app = gw.router_with_admin();
            local
        }
    };
    // Set once the shutdown delay is over: the gRPC listener stops accepting then, as the HTTP
    // one does, and its open streams (Envoy's ext_proc exchanges) may finish.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut grpc_task = None;
    let grpc_addr = match opts.grpc_listen {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a).await?;
            let addr = l.local_addr()?;
            let gw = gw.clone();
            let tls = grpc_tls.clone();
            let head_timeout = limits.header_read_timeout;
            let shutdown = async move {
                let mut stop = stop;
                let _ = stop.wait_for(|s| *s).await;
            };
            grpc_task = Some(tokio::spawn(async move {
                let served = match tls {
                    Some(tls) => {
                        crate::grpc::tls::serve_grpc_tls(gw, l, tls, head_timeout, shutdown).await
                    }
                    None => {
                        crate::grpc::serve_grpc_with_shutdown(gw, l, head_timeout, shutdown).await
                    }
                };
                if let Err(e) = served {
                    tracing::error!(error = %e, "gRPC listener failed");
                }
            }));
            Some(addr.to_string())
        }
        None => None,
    };
    // One line on stdout so scripts and tests can find the ports.
    println!(
        "{}",
        serde_json::json!({
            "listen": local.to_string(),
            "admin": admin_addr.to_string(),
            "grpc": grpc_addr,
            "tls": opts.tls.is_some(),
        })
    );
    tracing::info!(%local, admin = %admin_addr, "kinference listening");
    // Directory mode: the directory is a `ConfigSource` polled every `reload_interval`,
    // applied by the same loop as Kubernetes mode's bundles.
    let watcher = opts.kubernetes.is_none().then(|| {
        watch_directory(
            gw.clone(),
            opts.config.clone(),
            opts.reload_interval,
            last,
            on_applied,
        )
    });
    // On a signal: fail `/readyz` and give up the Lease at once (another replica takes over
    // status within seconds), keep accepting for `shutdown_delay` while load balancers catch
    // up, then close the listener and let open requests finish.
    let drain = async {
        shutdown_signal().await;
        gw.begin_draining();
        if let Some(c) = &controller {
            c.release_lease().await;
        }
        if !opts.shutdown_delay.is_zero() {
            tracing::info!(delay = ?opts.shutdown_delay, "draining: /readyz answers 503, still accepting");
            tokio::time::sleep(opts.shutdown_delay).await;
        }
        let _ = stopping.send(true);
    };
    let result = crate::listen::serve_http(listener, app, limits, http_tls, drain).await;
    // The gRPC listener drains meanwhile; its open streams get the same grace as HTTP's.
    if let Some(task) = grpc_task
        && tokio::time::timeout(crate::listen::SHUTDOWN_GRACE, task)
            .await
            .is_err()
    {
        tracing::warn!("gRPC streams still open after the shutdown grace period");
    }
    if let Some(w) = watcher {
        w.abort();
    }
    result
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
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
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}
