//! Directory mode and Kubernetes mode feed the same apply path: a `ConfigSource` publishes
//! bundles, `apply_loop` compiles and applies them, an erroneous bundle is refused and the last
//! good policy stays in force.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kinf_handler::ApplyOutcome;
use kinf_handler::bundle::{AfterApply, ConfigSource, DirSource, apply_loop};
use kinf_handler::gateway::{Gateway, GatewayOptions};

const GOOD: &str = "apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w, namespace: d }
spec:
  endpoints: [\"127.0.0.1:1\"]
  models: [ { name: m } ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p, namespace: d }
spec:
  destinations: [ { kind: InferenceWorkerSet, name: w } ]
";

async fn until(mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached");
}

#[tokio::test]
async fn a_directory_source_feeds_the_apply_loop_and_a_broken_bundle_keeps_the_last_good() {
    let dir = std::env::temp_dir().join(format!("kinf-dirsource-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.yaml"), GOOD).unwrap();
    let gw = Gateway::new(GatewayOptions::default());
    let outcomes: Arc<parking_lot::Mutex<Vec<ApplyOutcome>>> = Arc::default();
    let applied_hooks = Arc::new(AtomicUsize::new(0));
    let after: AfterApply = {
        let o = outcomes.clone();
        Arc::new(move |_gw, _b, outcome, _d| o.lock().push(outcome.clone()))
    };
    let on_applied: kinf_handler::serve::OnApplied = {
        let n = applied_hooks.clone();
        Arc::new(move |_gw, _p| {
            n.fetch_add(1, Ordering::SeqCst);
        })
    };
    let (tx, rx) = tokio::sync::watch::channel(None);
    let source: Box<dyn ConfigSource> = Box::new(DirSource {
        dir: dir.clone(),
        every: Duration::from_millis(50),
        last: None,
    });
    let task = tokio::spawn(source.run(tx));
    let looping = tokio::spawn(apply_loop(gw.clone(), rx, on_applied, Some(after)));
    until(|| applied_hooks.load(Ordering::SeqCst) == 1).await;
    assert!(gw.store.is_ready());

    std::fs::write(dir.join("a.yaml"), GOOD.replace("name: m", "nme: m")).unwrap();
    until(|| outcomes.lock().len() == 2).await;
    assert!(gw.store.last_rejected().is_some());
    assert_eq!(
        gw.store.current().unwrap().generation,
        1,
        "the last good one stays"
    );
    assert!(matches!(
        outcomes.lock().last(),
        Some(ApplyOutcome::Refused { .. })
    ));

    std::fs::write(dir.join("a.yaml"), GOOD.replace("name: m", "name: m2")).unwrap();
    until(|| applied_hooks.load(Ordering::SeqCst) == 2).await;
    assert_eq!(gw.store.current().unwrap().generation, 2);
    assert!(gw.store.last_rejected().is_none());
    // Unchanged content publishes nothing more.
    let n = outcomes.lock().len();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(outcomes.lock().len(), n);
    task.abort();
    looping.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_identity_is_the_pod_name_else_the_host_name() {
    use kinf_handler::kube::default_identity;
    let dir = std::env::temp_dir().join(format!("kinf-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let host = dir.join("hostname");
    std::fs::write(&host, "vm-7\n").unwrap();
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    assert_eq!(
        default_identity(
            env(&[("POD_NAME", "kinference-0"), ("HOSTNAME", "h")]),
            &host
        ),
        "kinference-0"
    );
    assert_eq!(default_identity(env(&[("HOSTNAME", "h")]), &host), "h");
    // `HOSTNAME` is usually not exported outside a pod: the kernel's host name.
    assert_eq!(default_identity(env(&[]), &host), "vm-7");
    let missing = dir.join("none");
    assert_eq!(
        default_identity(env(&[]), &missing),
        format!("kinference-{}", std::process::id())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
