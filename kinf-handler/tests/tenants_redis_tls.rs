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
    FailMode, LimitError, Limiter, RedisTls, TokenEstimate, store_from_flags_with_tls,
};
use support::redis::{free_port, redis_installed, req, tokens_and_concurrency, wait_listening};

/// `redis-server` listening with TLS only.
struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The CA that signs the server's certificate, PEM.
    ca: Vec<u8>,
}

impl TlsRedis {
    /// With a certificate self-signed for `localhost` (its own CA), not asking for client
    /// certificates.
    fn start() -> Option<TlsRedis> {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = ck.cert.pem();
        Self::start_with(
            cert.as_bytes(),
            &cert,
            &ck.signing_key.serialize_pem(),
            false,
        )
    }

    /// With `cert` and `key` (PEM) signed by `ca`; `auth_clients`: asking clients for a
    /// certificate `ca` signs.
    fn start_with(ca: &[u8], cert: &str, key: &str, auth_clients: bool) -> Option<TlsRedis> {
        if !redis_installed() {
            return None;
        }
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("kinf-redis-tls-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), ca).unwrap();
        std::fs::write(dir.join("cert.pem"), cert).unwrap();
        std::fs::write(dir.join("key.pem"), key).unwrap();
        let file = |f: &str| dir.join(f).to_str().unwrap().to_owned();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &file("cert.pem")])
            .args(["--tls-key-file", &file("key.pem")])
            .args(["--tls-ca-cert-file", &file("ca.pem")])
            .args([
                "--tls-auth-clients",
                if auth_clients { "yes" } else { "no" },
            ])
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
            ca: ca.to_vec(),
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
    limiter_with(url, RedisTls { ca, client: None })
}

fn limiter_with(url: &str, tls: RedisTls) -> Limiter {
    let store = store_from_flags_with_tls(url, FailMode::Closed, Some("tls:"), tls)
        .map_err(|e| e.to_string())
        .unwrap();
    Limiter::new(&tokens_and_concurrency(), store)
}

/// `RedisTls` with only a CA.
fn ca_only(ca: &[u8]) -> RedisTls {
    RedisTls {
        ca: Some(ca.to_vec()),
        client: None,
    }
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
async fn tls_files_need_a_tls_url_and_what_they_should_hold() {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (pem, key) = (
        ck.cert.pem().into_bytes(),
        ck.signing_key.serialize_pem().into_bytes(),
    );
    let flags = |url: &str, tls: RedisTls| {
        store_from_flags_with_tls(url, FailMode::Closed, None, tls)
            .err()
            .unwrap_or_default()
    };
    for url in [
        "memory",
        "redis://127.0.0.1:1/0",
        "redis+cluster://127.0.0.1:1",
    ] {
        let e = flags(url, ca_only(&pem));
        assert!(e.contains("--limiter-tls-ca"), "{url}: {e}");
    }
    for bad in [&b""[..], key.as_slice()] {
        let e = flags("rediss://127.0.0.1:1/0", ca_only(bad));
        assert!(e.contains("--limiter-tls-ca: no PEM `CERTIFICATE`"), "{e}");
    }
    // A client certificate and key, each checked for what it holds.
    let client = |cert: &[u8], key: &[u8]| RedisTls {
        ca: None,
        client: Some((cert.to_vec(), key.to_vec())),
    };
    let e = flags("rediss://127.0.0.1:1/0", client(&key, &key));
    assert!(
        e.contains("--limiter-tls-cert: no PEM `CERTIFICATE`"),
        "{e}"
    );
    let e = flags("rediss://127.0.0.1:1/0", client(&pem, &pem));
    assert!(e.contains("--limiter-tls-key: no PEM `PRIVATE KEY`"), "{e}");
    for url in [
        "rediss://127.0.0.1:1/0",
        "rediss+cluster://127.0.0.1:1,127.0.0.1:2",
    ] {
        assert_eq!(flags(url, ca_only(&pem)), "");
        assert_eq!(flags(url, client(&pem, &key)), "");
        assert_eq!(flags(url, RedisTls::default()), "");
    }
}

/// A CA, and a server and a client certificate it signs.
struct Pki {
    ca: Vec<u8>,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa,
        KeyPair,
    };
    // Distinct names: OpenSSL takes a certificate whose subject is its issuer's name for a
    // self-signed one.
    let named = |sans: Vec<String>, cn: &str| {
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, cn);
        p
    };
    let mut params = named(Vec::new(), "kinference test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = named(vec![name.to_owned()], name)
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem().into_bytes(),
        server: leaf("localhost"),
        client: leaf("kinference"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_for_client_certificates_admits_only_with_one() {
    let pki = pki();
    let Some(server) = TlsRedis::start_with(&pki.ca, &pki.server.0, &pki.server.1, true) else {
        return;
    };
    let port = server.port;
    let url = format!("rediss://localhost:{port}/0");
    let with_client = limiter_with(
        &url,
        RedisTls {
            ca: Some(pki.ca.clone()),
            client: Some((
                pki.client.0.clone().into_bytes(),
                pki.client.1.clone().into_bytes(),
            )),
        },
    );
    let r = with_client
        .admit(&req("a", 100, 100), estimate(100, 100))
        .await;
    let outcome = r.map(|r| r.headers().tokens.unwrap().remaining);
    // Without a client certificate the server refuses the connection: closed.
    let without = limiter(&url, Some(pki.ca.clone()));
    let refused = without.admit(&req("b", 1, 1), estimate(1, 1)).await;
    assert_eq!(outcome.map_err(|e| format!("{e:?}")), Ok(5800));
    assert!(
        matches!(refused, Err(LimitError::Unavailable(_))),
        "{refused:?}"
    );
}
