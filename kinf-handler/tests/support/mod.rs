//! Shared support of the end-to-end tests: in-process kinf-sim workers and gateway, and the
//! switch that decides whether tests needing outside programs (Python SDKs, real vLLM) run.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::reload;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The value of `var`, or `None` after saying the test is skipped. With
/// `KINF_REQUIRE_E2E=1` (set by scripts/test.sh) a missing variable fails the test instead.
pub fn required_env(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") => {
            panic!("{var} is not set: {what} (scripts/test.sh sets it up)")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set ({what}); scripts/test.sh runs this test");
            None
        }
    }
}

/// Starts an in-process kinf-sim worker with `args` (after `kinf-sim serve`).
pub async fn sim(args: &[&str]) -> kinf_sim::serve::Server {
    let args = kinf_sim::serve::ServeArgs::from_args(args.iter().copied()).unwrap();
    kinf_sim::serve::start(args).await.unwrap()
}

/// A fresh temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "kinf-e2e-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts the gateway with live ingestion on the configuration in `dir`.
pub async fn gateway(dir: &Path) -> (Arc<Gateway>, SocketAddr) {
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(60),
        ..Default::default()
    });
    reload(&gw, dir, None, &kinf_handler::live_hook());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    (gw, addr)
}

/// Polls `f` every 50 ms until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
