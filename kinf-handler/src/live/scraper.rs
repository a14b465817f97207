//! Per-endpoint metrics scraper and health checker.
//!
//! Every interval the task `GET`s `http://{address}{metrics_path}` and `http://{address}/health`
//! concurrently (timeout: the interval, at least [`LiveConfig::min_timeout`]). A successful
//! scrape pushes a [`LoadSample`] into the endpoint's load window and records vLLM's cache
//! configuration. The endpoint is marked `stale` when no scrape succeeded for
//! [`LiveConfig::stale_after_intervals`] intervals (un-stale on the next success), and not
//! `ready` after [`LiveConfig::unready_after_failures`] consecutive failed health checks (ready
//! again on the first success). Readiness comes from `/health` only (between those two
//! events it is left as it is: the gateway marks an endpoint down when a connection is
//! refused); staleness from `/metrics` only. A worker that passed its last health check and
//! whose models are not known yet also gets a `GET /v1/models` in the same tick (its models and
//! their `max_model_len`; again after a restart, and 30 s after a failed read).

use std::sync::Arc;
use std::time::Duration;

use kinf_router::state::LoadSample;
use tokio::time::MissedTickBehavior;

use super::SharedState;
use super::config::LiveConfig;
use super::http_get::HttpGet;
use super::prom_text::parse_vllm;
use super::status::EndpointStats;

/// After a failed or unparsable `GET /v1/models`, how long before the next try.
const MODELS_RETRY: Duration = Duration::from_secs(30);

/// What one scraper task scrapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// `namespace/name` of the worker set.
    pub worker_set: Arc<str>,
    /// `host:port`.
    pub address: Arc<str>,
    /// Metrics path (`/metrics`).
    pub metrics_path: Arc<str>,
    /// Scrape interval.
    pub interval: Duration,
}

/// Runs the scraper of one endpoint until the task is aborted.
pub async fn run_scraper(
    shared: Arc<SharedState>,
    target: ScrapeTarget,
    config: LiveConfig,
    stats: Arc<EndpointStats>,
    http: HttpGet,
) {
    let interval = target.interval.max(Duration::from_millis(1));
    let timeout = interval.max(config.min_timeout);
    let metrics_url = format!("http://{}{}", target.address, target.metrics_path);
    let health_url = format!("http://{}/health", target.address);
    let models_url = format!("http://{}/v1/models", target.address);
    let stale_after_ms =
        (interval.as_millis() as u64).saturating_mul(u64::from(config.stale_after_intervals));
    let started_ms = shared.now_ms();
    // The worker set's block-size resyncs seen ([`WorkerSetState::block_size_resyncs`]): when
    // it grows, the KV subscriber catches up again at the new size.
    //
    // [`WorkerSetState::block_size_resyncs`]: kinf_router::state::WorkerSetState::block_size_resyncs
    let mut seen_resyncs = shared.with(|st| {
        st.worker_sets
            .get(&*target.worker_set)
            .map(|ws| ws.block_size_resyncs)
    });
    // Whether the last sample had a value replaced (unknown or implausible), to warn once.
    let mut replacing = false;
    let mut models_retry_at: Option<tokio::time::Instant> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // The models the worker serves, with their `max_model_len`: read, beside the scrape,
        // once the worker passed its last health check, and again after it restarts; after a
        // failed read not again for `MODELS_RETRY`.
        let read_models = {
            let s = stats.scrape.lock();
            s.served_models.is_none() && s.health_ok > 0 && s.health_consecutive_failures == 0
        } && models_retry_at.is_none_or(|t| tokio::time::Instant::now() >= t);
        let (metrics, health, models) = tokio::join!(
            http.get(&metrics_url, timeout),
            http.get(&health_url, timeout),
            async {
                if read_models {
                    Some(http.get(&models_url, timeout).await)
                } else {
                    None
                }
            }
        );
        match models.map(|r| r.ok().as_deref().and_then(parse_models)) {
            Some(Some(m)) => {
                // The router leaves out a worker set whose context is too short for a request
                // (`Request::required_context`).
                let lens: Vec<(Arc<str>, u64)> = m
                    .iter()
                    .filter_map(|x| Some((Arc::from(x.id.as_str()), x.max_model_len?)))
                    .collect();
                shared.with(|st| {
                    if let Some(ws) = st.worker_sets.get_mut(&*target.worker_set) {
                        ws.set_max_model_lens(&target.address, lens);
                    }
                });
                stats.scrape.lock().served_models = Some(m);
                models_retry_at = None;
            }
            Some(None) => models_retry_at = Some(tokio::time::Instant::now() + MODELS_RETRY),
            None => {}
        }
        let now = shared.now_ms();
        let parsed = metrics.and_then(|body| {
            let text = std::str::from_utf8(&body).map_err(|_| "body is not utf-8".to_owned())?;
            parse_vllm(text).map_err(|e| format!("{metrics_url}: {e}"))
        });
        let mut s = stats.scrape.lock();
        let mut restarted = false;
        let mut turned_unready = false;
        let sample = match parsed {
            Ok(m) => {
                s.last_success_ms = Some(now);
                s.consecutive_failures = 0;
                s.scrapes_ok += 1;
                if m.cache_config.is_some() {
                    s.cache_config = m.cache_config;
                }
                if let Some(t) = m.process_start_s {
                    if s.process_start_s.is_some_and(|before| before != t) {
                        restarted = true;
                        s.worker_restarts += 1;
                    }
                    s.process_start_s = Some(t);
                }
                // Unknown values (NaN) take the previous sample's (LoadWindow::push).
                Some(LoadSample {
                    at_ms: now,
                    queued: m.waiting.unwrap_or(f64::NAN),
                    running: m.running.unwrap_or(f64::NAN),
                    kv_usage: m.kv_usage.unwrap_or(f64::NAN),
                })
            }
            Err(e) => {
                s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                s.scrapes_failed += 1;
                tracing::debug!(endpoint = %target.address, error = %e, "scrape failed");
                s.last_error = Some(e);
                s.last_error_ms = Some(now);
                None
            }
        };
        let healthy = health.is_ok();
        match health {
            Ok(_) => {
                s.health_consecutive_failures = 0;
                s.health_ok += 1;
                s.ready = true;
            }
            Err(e) => {
                s.health_consecutive_failures = s.health_consecutive_failures.saturating_add(1);
                s.health_failed += 1;
                s.last_health_error = Some(e);
                if s.health_consecutive_failures >= config.unready_after_failures {
                    if s.ready {
                        tracing::warn!(endpoint = %target.address, "endpoint not ready: health checks failing");
                        turned_unready = true;
                    }
                    s.ready = false;
                }
            }
        }
        let last_ok = s.last_success_ms.unwrap_or(started_ms);
        let stale = now.saturating_sub(last_ok) >= stale_after_ms;
        if stale && !s.stale {
            tracing::warn!(endpoint = %target.address, "endpoint metrics stale");
        }
        s.stale = stale;
        // Written only on evidence: a passing health check makes the endpoint ready, failing
        // ones past the threshold make it not ready. In between it is left as it is, so that an
        // endpoint the gateway marked down after a refused connection is not made ready again
        // by the next scrape before the health checks have caught up.
        let ready = if healthy {
            Some(true)
        } else if !s.ready {
            Some(false)
        } else {
            None
        };
        let scraped_bs = s.cache_config.as_ref().and_then(|c| c.block_size);
        // A new worker process has an empty cache: what the index holds for the endpoint is
        // the old process's. Reset it here; the KV subscriber is told below (its sequence
        // numbers and connection belong to the old process too).
        // The KV subscriber may have seen this restart already (its stream went back to 0
        // after the new process started) and reset the index, then applied what the new
        // process published: resetting again would lose that (without a replay socket), and
        // count the restart twice.
        // (The two clocks are the worker's and this host's: a restart the stream showed up to
        // 5 s "before" the new process started is taken for this one.)
        // Whatever the KV stream already showed, a new process may serve other models or lengths.
        let process_changed = restarted;
        let seen_by_kv = stats
            .kv
            .lock()
            .as_ref()
            .and_then(|k| k.last_restart_unix_s)
            .zip(s.process_start_s)
            .is_some_and(|(seen, started)| seen >= started - 5.0);
        if restarted && seen_by_kv {
            tracing::info!(endpoint = %target.address, "worker process restarted (process_start_time_seconds changed); its KV events already showed it");
            restarted = false;
        }
        if restarted {
            tracing::info!(endpoint = %target.address, "worker process restarted (process_start_time_seconds changed): resetting its prefix index");
        }
        let applied = shared.with(|st| {
            let ws = st.worker_sets.get_mut(&*target.worker_set)?;
            if restarted {
                ws.reset_endpoint(&target.address);
            }
            if let Some(b) = scraped_bs
                && ws.observe_block_size(&target.address, b as usize)
            {
                tracing::info!(
                    worker_set = %target.worker_set,
                    block_size = b,
                    "adopted the block size the workers report"
                );
            }
            let bs = ws.block_size;
            let resyncs = ws.block_size_resyncs;
            let i = ws.position(&target.address)?;
            // Through the worker set's methods, which keep its load floor current.
            let pushed = sample.map(|sample| {
                let plausible = ws.push_load(i, sample);
                let kept = ws.endpoints.get(i).and_then(|e| e.load.latest()).copied();
                (kept, plausible)
            });
            ws.set_stale(i, stale);
            if let Some(r) = ready {
                ws.set_ready(i, r);
            }
            Some((
                scraped_bs.is_some_and(|b| b as usize != bs),
                pushed,
                resyncs,
            ))
        });
        let (mismatch, pushed, resyncs) = applied.unwrap_or((false, None, 0));
        if mismatch && !s.block_size_mismatch {
            tracing::warn!(
                endpoint = %target.address,
                scraped = ?scraped_bs,
                "vLLM block size differs from the one the worker set's prefix index uses (configured, or adopted from its other workers); this worker's KV events are not indexed"
            );
        }
        s.block_size_mismatch = mismatch;
        if pushed.is_none()
            && let Some(l) = sample
        {
            // Not in the cluster state (yet): shown as scraped.
            s.last_sample = Some([l.queued, l.running, l.kv_usage]);
        }
        if let Some((kept, plausible)) = pushed {
            s.last_sample = kept.map(|l| [l.queued, l.running, l.kv_usage]);
            if !plausible {
                s.implausible_samples += 1;
                if !replacing {
                    tracing::warn!(
                        endpoint = %target.address,
                        "vLLM load metrics missing, not a number or implausible; keeping the previous values"
                    );
                }
            }
            replacing = !plausible;
        }
        drop(s);
        if applied.is_some() {
            if seen_resyncs.is_some_and(|seen| seen != resyncs) {
                tracing::info!(
                    worker_set = %target.worker_set,
                    endpoint = %target.address,
                    "the worker set's block size changed: its KV events are caught up again"
                );
                stats.resync.send_modify(|n| *n += 1);
            }
            seen_resyncs = Some(resyncs);
        }
        if turned_unready {
            stats.unready.send_modify(|n| *n += 1);
        }
        if restarted {
            stats.kv(|k| {
                k.restarts += 1;
                k.resets += 1;
            });
            stats.incarnation.send_modify(|n| *n += 1);
        }
        // A new process may serve other models or lengths: read them again.
        if process_changed {
            stats.scrape.lock().served_models = None;
            shared.with(|st| {
                if let Some(ws) = st.worker_sets.get_mut(&*target.worker_set) {
                    ws.set_max_model_lens(&target.address, Vec::new());
                }
            });
        }
    }
}

/// The models of a vLLM `/v1/models` body: `data[].id` with `data[].max_model_len`.
fn parse_models(body: &[u8]) -> Option<Vec<super::status::ServedModelInfo>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| {
                Some(super::status::ServedModelInfo {
                    id: m.get("id")?.as_str()?.to_owned(),
                    max_model_len: m.get("max_model_len").and_then(serde_json::Value::as_u64),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn served_models_are_read_from_vllms_model_list() {
        let body = include_bytes!("../../../testdata/vllm-0.32.0-cpu/models.json");
        let m = parse_models(body).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].id.as_str(), m[0].max_model_len),
            ("tiny-llama", Some(2048))
        );
        // An OpenAI-style list without lengths; not a list at all.
        let m = parse_models(br#"{"data":[{"id":"a"}]}"#).unwrap();
        assert_eq!(m[0].max_model_len, None);
        assert!(parse_models(b"<html>").is_none());
    }
}
