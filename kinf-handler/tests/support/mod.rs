//! Shared support of the end-to-end tests: in-process kinf-sim workers and gateway, and the
//! switch that decides whether tests needing outside programs (Python SDKs, real vLLM) run.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub mod redis;
pub mod replay;

use std::io::Write as _;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::reload;
use serde_json::Value;

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

/// The `tiny-llama` test tokenizer's directory, as an absolute path.
pub fn tiny_tokenizer() -> String {
    root()
        .join("testdata/tokenizers/tiny-llama")
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

/// Starts an in-process kinf-sim worker on a free port serving `tiny-llama` with the `tiny`
/// profile at `speed` × real time, with `extra` arguments after those.
pub async fn tiny_sim(speed: &str, extra: &[&str]) -> kinf_sim::serve::Server {
    let mut args = vec![
        "--port",
        "0",
        "--model",
        "tiny-llama",
        "--profile",
        "tiny",
        "--speed",
        speed,
    ];
    args.extend_from_slice(extra);
    sim(&args).await
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

/// A free TCP port on 127.0.0.1 (bound and released; for servers that need a port number).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP port that is free on every interface and lies below the kernel's ephemeral range, for
/// servers that bind late (real vLLM binds its KV-event sockets seconds after start). A port from
/// [`free_port`] is an ephemeral one, and the kernel may hand it to any process's outgoing or
/// port-0 socket meanwhile (vLLM opens many); ports below the range are only taken by explicit
/// binds.
pub fn spare_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.max(10_001));
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let port = from + (h.finish() % u64::from(to - from)) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {from}..{to}");
}

/// Whether `bin` is an executable file in a directory of `PATH`.
pub fn on_path(bin: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// The path of `bin`, or `None` after saying loudly that the test is skipped; with
/// `KINF_REQUIRE_E2E=1` a missing binary fails the test instead.
pub fn required_bin(bin: &str, what: &str) -> Option<PathBuf> {
    if let Some(p) = on_path(bin) {
        return Some(p);
    }
    if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") {
        panic!("`{bin}` is not on PATH and KINF_REQUIRE_E2E=1: {what}");
    }
    // Straight to stderr: `eprintln!` would be captured by the test harness.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPED: `{bin}` is not on PATH ({what}); scripts/test.sh runs this test !!!!!\n"
    );
    None
}

/// POSTs `body` as JSON to `http://addr{path}` with `headers`; the status, headers and the
/// body parsed as JSON (`Null` when it is not JSON).
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, Value) {
    let (status, h, bytes) = post_raw(addr, path, body, headers).await;
    (
        status,
        h,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// POSTs `body` as JSON to `http://addr{path}` with `headers`; the response, its body not read
/// yet (for streams).
pub async fn post_response(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    client
        .request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap()
}

/// [`post_json`] returning the raw body.
pub async fn post_raw(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, Bytes) {
    let resp = post_response(addr, path, body, headers).await;
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, h, bytes)
}

/// GETs `http://addr{path}`: the status and the body as text.
pub async fn get_text(addr: SocketAddr, path: &str) -> (u16, String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A `kinference serve` child process, killed when the test ends however it ends, with the
/// JSON line it prints once listening (`{"listen": …, "admin": …, "grpc": …}`).
pub struct ServeProcess {
    child: std::process::Child,
    /// The start-up line.
    pub ports: Value,
}

impl ServeProcess {
    /// Starts `kinference serve --config dir ARGS…` and waits for its start-up line.
    pub fn start<I, S>(dir: &Path, args: I) -> ServeProcess
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kinference"))
            .args(["serve", "--config"])
            .arg(dir)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        ServeProcess { child, ports }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as Kubernetes does to stop a pod.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `dir/bundle.yaml`: worker set `t/tiny` serving `tiny-llama` at `worker`, with
/// `extra` appended to its spec (lines indented by two spaces), and pool `t/pool` over it.
pub fn write_tiny_bundle(dir: &Path, worker: &str, extra: &str) {
    std::fs::write(
        dir.join("bundle.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama }} ]
{extra}---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
"#
        ),
    )
    .unwrap();
}
