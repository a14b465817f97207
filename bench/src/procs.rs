//! Child processes and HTTP helpers shared by the benchmarks that run real programs
//! (`kinf-bench proxy`, `kinf-bench live`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A keep-alive HTTP/1 client.
pub type Http = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive client with `TCP_NODELAY` and a large idle pool.
pub fn http_client() -> Http {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(Duration::from_secs(600))
        .build(connector)
}

/// A child process killed when dropped.
pub struct Proc {
    /// For messages.
    pub name: String,
    /// The process.
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name` next to the running executable (where cargo puts the workspace's binaries).
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The peers venv (scripts/peers/setup.sh): `$KINF_PEERS_VENV` or
/// `~/.cache/kinference/peers-venv`.
pub fn peers_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("KINF_PEERS_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/kinference/peers-venv")
}

/// Spawns `cmd` with stderr to `log`, and returns it with the first stdout line (JSON).
pub fn spawn_with_line(
    name: &str,
    mut cmd: Command,
    log: &Path,
    timeout: Duration,
) -> Result<(Proc, Value), String> {
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err));
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    let Some(out) = child.stdout.take() else {
        return Err(format!("{name}: no stdout"));
    };
    let proc = Proc {
        name: name.to_owned(),
        child,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let first = lines.next();
        let _ = tx.send(first);
        // Keep draining so that the child never blocks on a full pipe.
        for _ in lines {}
    });
    match rx.recv_timeout(timeout) {
        Ok(Some(Ok(line))) => {
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| format!("{name}: bad startup line {line:?}: {e}"))?;
            Ok((proc, v))
        }
        _ => Err(format!(
            "{} printed no startup line (log: {})",
            proc.name,
            log.display()
        )),
    }
}

/// Spawns `cmd` with stdout and stderr to `log` (for programs without a startup line).
pub fn spawn_logged(name: &str, mut cmd: Command, log: &Path) -> Result<Proc, String> {
    let f = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let f2 = f.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(f))
        .stderr(Stdio::from(f2));
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Proc {
        name: name.to_owned(),
        child,
    })
}

/// The last `n` lines of a log file, joined with ` | `.
pub fn log_tail(log: &Path, n: usize) -> String {
    let tail = std::fs::read_to_string(log).unwrap_or_default();
    let mut lines: Vec<&str> = tail.lines().rev().take(n).collect();
    lines.reverse();
    lines.join(" | ")
}

/// A port that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// `GET url` with a 5 s timeout: status and body, `None` on any failure.
pub async fn get(client: &Http, url: &str) -> Option<(u16, Bytes)> {
    let req = http::Request::get(url).body(Full::new(Bytes::new())).ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .ok()?
        .ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// `POST url` with a JSON body: status and body.
pub async fn post(client: &Http, url: &str, body: Bytes) -> Result<(u16, Bytes), String> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

/// Polls `check` every 100 ms until it is true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
