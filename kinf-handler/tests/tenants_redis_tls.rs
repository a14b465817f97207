//! The limiter over a real `redis-server` that speaks only TLS (`rediss://`): admissions
//! succeed with the server's CA given (`--limiter-tls-ca`), and fail closed against an
//! untrusted certificate; the flags refuse a CA without a TLS URL and a file without a
//! certificate.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kinf_handler::tenants::{
    FailMode, LimitError, Limiter, TokenEstimate, store_from_flags_with_ca,
};
use support::redis::{free_port, redis_installed, req, tokens_and_concurrency, wait_listening};

/// `redis-server` listening with TLS only, its certificate self-signed for `localhost`.
struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The server's certificate (its own CA), PEM.
    ca: Vec<u8>,
}

impl TlsRedis {
    fn start() -> Option<TlsRedis> {
        if !redis_installed() {
            return None;
        }
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("kinf-redis-tls-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca = ck.cert.pem().into_bytes();
        std::fs::write(dir.join("cert.pem"), &ca).unwrap();
        std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
        let file = |f: &str| dir.join(f).to_str().unwrap().to_owned();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &file("cert.pem")])
            .args(["--tls-key-file", &file("key.pem")])
            .args(["--tls-ca-cert-file", &file("cert.pem")])
            .args(["--tls-auth-clients", "no"])
            .args(["--dir", dir.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_listening(&[port]);
        Some(TlsRedis {
            child,
            port,
            dir,
            ca,
        })
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn limiter(url: &str, ca: Option<Vec<u8>>) -> Limiter {
    let store = store_from_flags_with_ca(url, FailMode::Closed, Some("tls:"), ca)
        .map_err(|e| e.to_string())
        .unwrap();
    Limiter::new(&tokens_and_concurrency(), store)
}

fn estimate(prompt: u64, output: u64) -> TokenEstimate {
    TokenEstimate { prompt, output }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_over_tls_with_the_servers_ca_and_refused_without_trust() {
    let Some(server) = TlsRedis::start() else {
        return;
    };
    let url = format!("rediss://localhost:{}/0", server.port);
    // Trusting the server's CA: budgets work as over plain TCP.
    let l = limiter(&url, Some(server.ca.clone()));
    let r = l
        .admit(&req("a", 3000, 1000), estimate(3000, 1000))
        .await
        .unwrap();
    assert_eq!(r.headers().tokens.unwrap().remaining, 2000);
    let r2 = l
        .admit(&req("a", 1000, 500), estimate(1000, 500))
        .await
        .unwrap();
    assert_eq!(r2.headers().tokens.unwrap().remaining, 500);
    drop((r, r2));
    // Not trusting it (the system's trust store, or another CA): the handshake fails, and the
    // closed fail mode refuses, quickly.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    for ca in [None, Some(other.cert.pem().into_bytes())] {
        let l = limiter(&url, ca.clone());
        let started = Instant::now();
        match l.admit(&req("b", 10, 10), estimate(10, 10)).await {
            Err(LimitError::Unavailable(_)) => {}
            other => panic!("custom CA {}: {other:?}", ca.is_some()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    // Plain TCP against the TLS port gets no answer either.
    let l = limiter(&format!("redis://localhost:{}/0", server.port), None);
    assert!(matches!(
        l.admit(&req("c", 10, 10), estimate(10, 10)).await,
        Err(LimitError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_tls_ca_needs_a_tls_url_and_a_certificate() {
    let pem = rcgen::generate_simple_self_signed(vec!["localhost".into()])
        .unwrap()
        .cert
        .pem()
        .into_bytes();
    for url in [
        "memory",
        "redis://127.0.0.1:1/0",
        "redis+cluster://127.0.0.1:1",
    ] {
        let e = store_from_flags_with_ca(url, FailMode::Closed, None, Some(pem.clone()))
            .err()
            .unwrap();
        assert!(e.contains("--limiter-tls-ca"), "{url}: {e}");
    }
    for bad in [
        &b""[..],
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ] {
        let e = store_from_flags_with_ca(
            "rediss://127.0.0.1:1/0",
            FailMode::Closed,
            None,
            Some(bad.to_vec()),
        )
        .err()
        .unwrap();
        assert!(e.contains("no PEM certificate"), "{e}");
    }
    for url in [
        "rediss://127.0.0.1:1/0",
        "rediss+cluster://127.0.0.1:1,127.0.0.1:2",
    ] {
        assert!(store_from_flags_with_ca(url, FailMode::Closed, None, Some(pem.clone())).is_ok());
        assert!(store_from_flags_with_ca(url, FailMode::Closed, None, None).is_ok());
    }
}
