//! A real `redis-server` for the limiter's tests, and the limits and requests they use.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kinf_lang::compiled::CompiledLimit;
use kinf_policy::TokenCount;
use kinf_router::Request;

/// A `redis-server` child process without persistence (but with a directory of its own, so
/// that a restart after `SAVE` finds the same data), killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

/// Whether `redis-server` is on PATH (saying so on stderr when not; a failure with
/// `KINF_REQUIRE_E2E=1`).
pub fn redis_installed() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") {
            panic!("redis-server is not on PATH and KINF_REQUIRE_E2E=1");
        }
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!! SKIPPED: redis-server is not on PATH; the Redis limiter tests did not run !!!!!\n"
        );
    }
    found
}

/// `redis-server` with `args`, its output discarded.
pub fn spawn_redis<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `redis-cli` on `port` (over TLS trusting `tls_dir/cert.pem` when `tls_dir` is given): its
/// output.
pub fn redis_cli(tls_dir: Option<&std::path::Path>, port: u16, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    if let Some(d) = tls_dir {
        cmd.args(["--tls", "--cacert", d.join("cert.pem").to_str().unwrap()]);
    }
    let out = cmd
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools, installed with redis-server)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `check` holds, polling every 50 ms; fails with `what` after `secs`.
pub fn wait_until(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A self-signed certificate for `127.0.0.1` written to `dir/cert.pem` (key in
/// `dir/key.pem`), for servers that speak TLS and clients that trust it (as its own CA): the
/// PEM.
pub fn self_signed_localhost(dir: &std::path::Path) -> Vec<u8> {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    let pem = ck.cert.pem().into_bytes();
    std::fs::write(dir.join("cert.pem"), &pem).unwrap();
    pem
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (10 s at most) until every one of `ports` accepts connections.
pub fn wait_listening(ports: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for &p in ports {
        while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl RedisServer {
    /// `redis-server` on a free port, with its RDB file in a directory of its own (so that a
    /// restart after `SAVE` finds the same data), or `None` when it is not installed.
    pub fn start(name: &str) -> Option<RedisServer> {
        if !redis_installed() {
            return None;
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("kinf-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = RedisServer {
            child: None,
            port,
            dir,
        };
        s.restart();
        Some(s)
    }

    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_listening(&[self.port]);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A limit named `name` that bounds nothing yet (tests set the bounds they need).
pub fn limit(name: &str) -> CompiledLimit {
    CompiledLimit {
        name: name.into(),
        condition: None,
        tokens_per_minute: None,
        count: TokenCount::Total,
        requests_per_minute: None,
        concurrent_requests: None,
        when_exceeded: Default::default(),
    }
}

/// `p/tpm` (6,000 tokens and 100 requests a minute) and `p/conc` (2 in flight).
pub fn tokens_and_concurrency() -> Vec<std::sync::Arc<CompiledLimit>> {
    vec![
        std::sync::Arc::new(CompiledLimit {
            tokens_per_minute: Some(6000),
            requests_per_minute: Some(100),
            ..limit("p/tpm")
        }),
        std::sync::Arc::new(CompiledLimit {
            concurrent_requests: Some(2),
            when_exceeded: Default::default(),
            ..limit("p/conc")
        }),
    ]
}

/// A request of `tenant` for model `qwen`.
pub fn req(tenant: &str, prompt: u32, max_tokens: u32) -> Request {
    let mut r = Request::new("qwen", prompt);
    r.tenant = Some(tenant.into());
    r.max_tokens = max_tokens;
    r
}
