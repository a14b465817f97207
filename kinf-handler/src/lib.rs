//! The Kinference server's building blocks. This first slice holds the configuration side:
//! reading a directory of YAML resources ([`config_dir`]) and the live policy store
//! ([`policy_store`]) that swaps a compiled policy in atomically and only when the whole bundle
//! compiles, keeping the last good one in force otherwise.

pub mod accounting;
pub mod bundle;
pub mod busy_poll;
pub mod config_dir;
pub mod gateway;
pub mod grpc;
pub mod kube;
pub mod listen;
pub mod live;
pub mod metrics;
pub mod policy_store;
pub mod providers;
pub mod serve;
pub mod tenants;

/// The message a panic was raised with (`panic!` with a literal or a formatted string), or
/// `(no message)` for any other payload: what the tasks that survive a panic log and report.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

pub use policy_store::{ApplyOutcome, PolicyStore};

/// The hook run on each applied policy: starts live-state ingestion (metrics scrapers, KV-event
/// subscribers) for the policy's endpoints the first time, and re-syncs it after (endpoints that
/// disappeared stop, new ones start, unchanged ones keep running).
pub fn live_hook() -> serve::OnApplied {
    let ingest: std::sync::Arc<parking_lot::Mutex<Option<std::sync::Arc<live::LiveIngest>>>> =
        std::sync::Arc::default();
    std::sync::Arc::new(move |gw, policy| {
        let mut slot = ingest.lock();
        match &*slot {
            Some(li) => li.sync(policy),
            None => {
                let li = std::sync::Arc::new(live::LiveIngest::start(gw.state.clone(), policy));
                gw.live.store(Some(std::sync::Arc::new(
                    Box::new(IngestStatus(li.clone())) as Box<dyn gateway::LiveStatus>,
                )));
                *slot = Some(li);
            }
        }
    })
}

/// [`gateway::LiveStatus`] of a [`live::LiveIngest`].
struct IngestStatus(std::sync::Arc<live::LiveIngest>);

impl gateway::LiveStatus for IngestStatus {
    fn status_json(&self) -> serde_json::Value {
        serde_json::to_value(self.0.status()).unwrap_or_default()
    }

    fn render_metrics(&self, out: &mut String) {
        self.0.render_metrics(out);
    }
}
