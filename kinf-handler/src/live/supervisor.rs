//! [`LiveIngest`]: starts and stops the scraper and KV-subscriber tasks of every endpoint of
//! every worker set, and reports their status and counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use kinf_lang::CompiledPolicy;
use kinf_lang::compiled::KvEventsInfo;
use kinf_router::ClusterState;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use super::SharedState;
use super::config::LiveConfig;
use super::http_get::HttpGet;
use super::kv_subscriber::{KvTarget, run_kv_subscriber};
use super::scraper::{ScrapeTarget, run_scraper};
use super::status::{EndpointStats, EndpointStatus, KvStatus, ScrapeStatus};

/// What is ingested from one endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSpec {
    /// `namespace/name` of the worker set (the [`ClusterState::worker_sets`] key).
    pub worker_set: Arc<str>,
    /// `host:port`.
    pub address: Arc<str>,
    /// Metrics path.
    pub metrics_path: Arc<str>,
    /// Scrape (and health-check) interval.
    pub metrics_interval: Duration,
    /// KV-event publisher settings; `None`: no subscription.
    pub kv_events: Option<KvEventsInfo>,
}

impl EndpointSpec {
    /// The endpoints of every worker set of a policy (static endpoints only: endpoints chosen
    /// by a label selector are not in the policy; pass them to [`LiveIngest::sync_endpoints`]).
    pub fn from_policy(policy: &CompiledPolicy) -> Vec<EndpointSpec> {
        let mut out = Vec::new();
        for d in &policy.destinations {
            let Some(w) = &d.worker_set else { continue };
            let key = ClusterState::key(&d.namespace, &d.name);
            for a in &w.endpoints {
                out.push(EndpointSpec {
                    worker_set: key.clone(),
                    address: a.clone(),
                    metrics_path: w.metrics_path.clone(),
                    metrics_interval: w.metrics_interval,
                    kv_events: w.kv_events.clone(),
                });
            }
        }
        out
    }
}

/// The tasks of one endpoint. Each is restarted only when its own settings change: a KV
/// subscriber restarted because the scrape interval changed would lose its place in the
/// sequence (without a replay socket its next message is a gap from 0, which resets what the
/// index knows of the endpoint; vLLM never reports the blocks it still caches again).
struct Running {
    spec: EndpointSpec,
    stats: Arc<EndpointStats>,
    scraper: JoinHandle<()>,
    kv: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.scraper.abort();
        if let Some(t) = &self.kv {
            t.abort();
        }
    }
}

type Key = (Arc<str>, Arc<str>);

/// Live ingestion for all endpoints: one scraper task per endpoint, plus one KV-subscriber task
/// per endpoint of worker sets with KV events. Tasks stop when their endpoint disappears (on
/// [`LiveIngest::sync`]) or when this is dropped.
pub struct LiveIngest {
    shared: Arc<SharedState>,
    config: LiveConfig,
    http: HttpGet,
    running: Mutex<BTreeMap<Key, Running>>,
    /// Where the scrapers and subscribers run; `None`: the caller's runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for LiveIngest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveIngest")
            .field("config", &self.config)
            .field("endpoints", &self.running.lock().len())
            .finish()
    }
}

impl LiveIngest {
    /// Starts ingestion for a policy's endpoints (must be called within a tokio runtime).
    pub fn start(shared: Arc<SharedState>, policy: &CompiledPolicy) -> Self {
        let mut ingest = Self::with_config(shared, LiveConfig::default());
        if let Some(h) = ingest_runtime() {
            ingest = ingest.on_runtime(h);
        }
        ingest.sync(policy);
        ingest
    }

    /// No endpoints yet; tasks use `config`.
    pub fn with_config(shared: Arc<SharedState>, config: LiveConfig) -> Self {
        LiveIngest {
            shared,
            config,
            http: HttpGet::new(),
            running: Mutex::new(BTreeMap::new()),
            runtime: None,
        }
    }

    /// Runs the scrapers and subscribers on `runtime` (e.g. a thread of their own, so that
    /// decoding KV events never competes with requests for the request workers) instead of the
    /// runtime that calls [`sync`](Self::sync).
    pub fn on_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    fn spawn_task<F>(&self, f: F) -> JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.runtime {
            Some(h) => h.spawn(f),
            None => tokio::spawn(f),
        }
    }

    /// Follows a new policy: stops the tasks of endpoints that disappeared or whose settings
    /// changed, starts those of new ones, leaves the others running.
    pub fn sync(&self, policy: &CompiledPolicy) {
        self.sync_endpoints(EndpointSpec::from_policy(policy));
    }

    /// Like [`LiveIngest::sync`], from an explicit endpoint list.
    pub fn sync_endpoints(&self, specs: Vec<EndpointSpec>) {
        let mut running = self.running.lock();
        let mut want: BTreeMap<Key, EndpointSpec> = BTreeMap::new();
        for s in specs {
            want.insert((s.worker_set.clone(), s.address.clone()), s);
        }
        running.retain(|k, _| want.contains_key(k));
        for (k, spec) in want {
            match running.get_mut(&k) {
                Some(r) => self.update(r, spec),
                None => {
                    let r = self.spawn(spec);
                    running.insert(k, r);
                }
            }
        }
    }

    fn spawn(&self, spec: EndpointSpec) -> Running {
        let stats = EndpointStats::new(spec.kv_events.is_some());
        let scraper = self.spawn_scraper(&spec, &stats);
        let kv = self.spawn_kv(&spec, &stats);
        Running {
            spec,
            stats,
            scraper,
            kv,
        }
    }

    /// Follows changed settings of a running endpoint: a new scraper (with fresh `scrape`
    /// counters) when its `metrics` settings changed, a new KV subscriber (with fresh `kv`
    /// counters) when its `kvEvents` did; the other task keeps running.
    fn update(&self, r: &mut Running, spec: EndpointSpec) {
        if r.spec == spec {
            return;
        }
        if (&r.spec.metrics_path, r.spec.metrics_interval)
            != (&spec.metrics_path, spec.metrics_interval)
        {
            r.scraper.abort();
            *r.stats.scrape.lock() = ScrapeStatus {
                ready: true,
                ..ScrapeStatus::default()
            };
            r.scraper = self.spawn_scraper(&spec, &r.stats);
        }
        if r.spec.kv_events != spec.kv_events {
            if let Some(t) = r.kv.take() {
                t.abort();
            }
            *r.stats.kv.lock() = spec.kv_events.is_some().then(KvStatus::default);
            r.kv = self.spawn_kv(&spec, &r.stats);
        }
        r.spec = spec;
    }

    fn spawn_scraper(&self, spec: &EndpointSpec, stats: &Arc<EndpointStats>) -> JoinHandle<()> {
        let (shared, config, stats, http) = (
            self.shared.clone(),
            self.config,
            stats.clone(),
            self.http.clone(),
        );
        let target = ScrapeTarget {
            worker_set: spec.worker_set.clone(),
            address: spec.address.clone(),
            metrics_path: spec.metrics_path.clone(),
            interval: spec.metrics_interval,
        };
        self.spawn_task(supervised(
            Task::Scraper,
            target.address.clone(),
            stats.clone(),
            shared.clone(),
            config.retry_delay,
            move || {
                run_scraper(
                    shared.clone(),
                    target.clone(),
                    config,
                    stats.clone(),
                    http.clone(),
                )
            },
        ))
    }

    fn spawn_kv(&self, spec: &EndpointSpec, stats: &Arc<EndpointStats>) -> Option<JoinHandle<()>> {
        let kv = spec.kv_events.as_ref()?;
        let (shared, config, stats, http) = (
            self.shared.clone(),
            self.config,
            stats.clone(),
            self.http.clone(),
        );
        let target = KvTarget {
            worker_set: spec.worker_set.clone(),
            address: spec.address.clone(),
            kv: kv.clone(),
        };
        Some(self.spawn_task(supervised(
            Task::KvSubscriber(target.worker_set.clone()),
            target.address.clone(),
            stats.clone(),
            shared.clone(),
            config.retry_delay,
            move || {
                run_kv_subscriber(
                    shared.clone(),
                    target.clone(),
                    config,
                    stats.clone(),
                    http.clone(),
                )
            },
        )))
    }

    /// Stops every task.
    pub fn shutdown(&self) {
        self.running.lock().clear();
    }

    /// The endpoints being ingested, sorted by worker set and address.
    pub fn endpoints(&self) -> Vec<EndpointSpec> {
        self.running
            .lock()
            .values()
            .map(|r| r.spec.clone())
            .collect()
    }

    /// Per-endpoint status, sorted by worker set and address (serializable, camelCase).
    pub fn status(&self) -> Vec<EndpointStatus> {
        let stats: Vec<(Key, Arc<EndpointStats>)> = self
            .running
            .lock()
            .iter()
            .map(|(k, r)| (k.clone(), r.stats.clone()))
            .collect();
        stats
            .into_iter()
            .map(|((ws, addr), s)| EndpointStatus {
                worker_set: ws.to_string(),
                address: addr.to_string(),
                scrape: s.scrape.lock().clone(),
                kv: s.kv.lock().clone(),
            })
            .collect()
    }

    /// The status of one endpoint.
    pub fn endpoint_status(&self, worker_set: &str, address: &str) -> Option<EndpointStatus> {
        self.status()
            .into_iter()
            .find(|s| s.worker_set == worker_set && s.address == address)
    }

    /// Appends the ingestion metrics in Prometheus text format (with `# HELP`/`# TYPE`).
    pub fn render_metrics(&self, out: &mut String) {
        render_metrics(&self.status(), out);
    }
}

/// Which task [`supervised`] runs.
enum Task {
    Scraper,
    /// The KV subscriber of an endpoint of this worker set.
    KvSubscriber(Arc<str>),
}

/// Runs the task `start()` returns until it ends; when it panics, logs it and starts it again
/// after `retry_delay`. A panic would otherwise end the endpoint's ingestion for good and
/// silently: a dead KV subscriber leaves the endpoint's index as it was, `connected` true and
/// no error, and a dead scraper leaves its last load in place without the endpoint ever going
/// stale. (The zeromq crate panics on some input a peer controls: an unexpected ZMTP command,
/// a connection lost right after the handshake.)
///
/// A restarted KV subscriber has lost its place in the event stream, and a panic may have left
/// a batch half applied: the endpoint's index is reset first, as for a restart of the worker
/// (the new subscriber catches up from the replay buffer when there is one).
async fn supervised<F, Fut>(
    task: Task,
    address: Arc<str>,
    stats: Arc<EndpointStats>,
    shared: Arc<SharedState>,
    retry_delay: Duration,
    mut start: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::FutureExt;
    loop {
        let Err(panic) = std::panic::AssertUnwindSafe(start()).catch_unwind().await else {
            return;
        };
        let why = crate::panic_message(&*panic);
        let now = shared.now_ms();
        match &task {
            Task::Scraper => {
                tracing::error!(endpoint = %address, panic = %why, "metrics scraper panicked: restarting it");
                let mut s = stats.scrape.lock();
                s.last_error = Some(format!("scraper panicked: {why}"));
                s.last_error_ms = Some(now);
            }
            Task::KvSubscriber(worker_set) => {
                tracing::error!(endpoint = %address, panic = %why, "KV-event subscriber panicked: resetting the endpoint's prefix index and restarting it");
                shared.with(|st| {
                    if let Some(ws) = st.worker_sets.get_mut(&**worker_set) {
                        ws.reset_endpoint(&address);
                    }
                });
                stats.kv(|k| {
                    k.connected = false;
                    k.resets += 1;
                    k.reconnects += 1;
                    k.error(format!("subscriber panicked: {why}"), now);
                });
            }
        }
        tokio::time::sleep(retry_delay).await;
    }
}

impl Drop for LiveIngest {
    fn drop(&mut self) {
        self.running.get_mut().clear();
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders a status snapshot as Prometheus text (see `docs/reference/live-state.md`).
pub fn render_metrics(status: &[EndpointStatus], out: &mut String) {
    type Get = fn(&EndpointStatus) -> Vec<(&'static str, f64)>;
    let families: [(&str, &str, &str, Get); 15] = [
        (
            "kinference_scrapes_total",
            "counter",
            "Metrics scrapes by result.",
            |s| {
                vec![
                    ("result=\"ok\"", s.scrape.scrapes_ok as f64),
                    ("result=\"error\"", s.scrape.scrapes_failed as f64),
                ]
            },
        ),
        (
            "kinference_health_checks_total",
            "counter",
            "Health checks by result.",
            |s| {
                vec![
                    ("result=\"ok\"", s.scrape.health_ok as f64),
                    ("result=\"error\"", s.scrape.health_failed as f64),
                ]
            },
        ),
        (
            "kinference_endpoint_stale",
            "gauge",
            "1 when the endpoint's metrics are stale.",
            |s| vec![("", f64::from(u8::from(s.scrape.stale)))],
        ),
        (
            "kinference_endpoint_ready",
            "gauge",
            "1 when the endpoint passes health checks.",
            |s| vec![("", f64::from(u8::from(s.scrape.ready)))],
        ),
        (
            "kinference_endpoint_implausible_samples_total",
            "counter",
            "Scrapes with a load value missing, not a number or implausible (the previous one was kept).",
            |s| vec![("", s.scrape.implausible_samples as f64)],
        ),
        (
            "kinference_block_size_mismatch",
            "gauge",
            "1 when the endpoint reports another block size than its worker set's prefix index uses.",
            |s| vec![("", f64::from(u8::from(s.scrape.block_size_mismatch)))],
        ),
        (
            "kinference_kv_connected",
            "gauge",
            "1 when connected to every KV-event publisher of the endpoint.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", f64::from(u8::from(k.connected)))])
            },
        ),
        (
            "kinference_kv_event_batches_total",
            "counter",
            "KV-event messages received.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.messages as f64)])
            },
        ),
        (
            "kinference_kv_events_total",
            "counter",
            "KV events applied to the prefix index.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.events as f64)])
            },
        ),
        (
            "kinference_kv_event_decode_errors_total",
            "counter",
            "KV-event messages that did not decode.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.decode_errors as f64)])
            },
        ),
        (
            "kinference_kv_event_gaps_total",
            "counter",
            "KV-event sequence gaps.",
            |s| s.kv.as_ref().map_or(vec![], |k| vec![("", k.gaps as f64)]),
        ),
        (
            "kinference_kv_event_missed_total",
            "counter",
            "KV-event batches skipped over by gaps.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.missed as f64)])
            },
        ),
        (
            "kinference_kv_replays_total",
            "counter",
            "Replays by result.",
            |s| {
                s.kv.as_ref().map_or(vec![], |k| {
                    vec![
                        ("result=\"ok\"", k.replays as f64),
                        ("result=\"error\"", k.replay_failures as f64),
                    ]
                })
            },
        ),
        (
            "kinference_kv_resets_total",
            "counter",
            "Resets of the endpoint's prefix index.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.resets as f64)])
            },
        ),
        (
            "kinference_kv_publisher_restarts_total",
            "counter",
            "KV-event publisher restarts seen.",
            |s| {
                s.kv.as_ref()
                    .map_or(vec![], |k| vec![("", k.restarts as f64)])
            },
        ),
    ];
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in status {
            let base = format!(
                "worker_set=\"{}\",endpoint=\"{}\"",
                escape(&s.worker_set),
                escape(&s.address)
            );
            for (extra, v) in get(s) {
                let sep = if extra.is_empty() { "" } else { "," };
                let _ = writeln!(out, "{name}{{{base}{sep}{extra}}} {v}");
            }
        }
    }
}

/// The process's ingestion runtime: one thread (`kinf-ingest`) that runs every scraper and
/// KV-event subscriber, so that decoding events and updating the prefix index never take a
/// request worker (with `--busy-poll` there is only one). Built on first use and kept for the
/// life of the process; `None` (ingestion then runs on the caller's runtime) if the thread
/// cannot be started.
fn ingest_runtime() -> Option<tokio::runtime::Handle> {
    static RT: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kinf-ingest")
            .enable_all()
            .build()
            .map_err(|e| tracing::warn!(error = %e, "no ingestion thread; ingesting on the request workers"))
            .ok()
    })
    .as_ref()
    .map(|rt| rt.handle().clone())
}
