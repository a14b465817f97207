//! TLS on every listener: `kinference serve --tls-cert --tls-key` with a certificate made at
//! test time; HTTPS (HTTP/1.1 and HTTP/2 by ALPN) on the client-facing and admin listeners,
//! gRPC over TLS, and plaintext refused on each.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kinf_handler::grpc::handler_v1::handler_client::HandlerClient;
use kinf_handler::grpc::handler_v1::{DecideRequest, Header};
use serde_json::{Value, json};
use support::{ServeProcess, free_port, temp_dir, write_tiny_bundle};

/// A self-signed certificate for `localhost` and 127.0.0.1 (PEM files in `dir`) and a client
/// configuration that trusts it, offering `alpn`.
fn make_cert(dir: &Path) -> rustls::pki_types::CertificateDer<'static> {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    ck.cert.der().clone()
}

fn client_config(
    cert: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    cfg
}

/// The gateway with TLS on every listener (certificate and key from `dir`).
fn start(dir: &Path) -> ServeProcess {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    ServeProcess::start(
        dir,
        [
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--admin-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--grpc-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--tls-cert".as_ref(),
            cert.as_os_str(),
            "--tls-key".as_ref(),
            key.as_os_str(),
        ],
    )
}

/// The configuration: a worker set on a closed local port (decisions only, no traffic).
fn write_config(dir: &Path) {
    write_tiny_bundle(dir, &format!("127.0.0.1:{}", free_port()), "");
}

fn port(v: &Value) -> u16 {
    v.as_str().unwrap().parse::<SocketAddr>().unwrap().port()
}

async fn https_get(
    mut cfg: rustls::ClientConfig,
    http2: bool,
    url: &str,
) -> Result<(u16, http::Version, Bytes), String> {
    // The connector offers ALPN itself (`http/1.1` or `h2`).
    cfg.alpn_protocols.clear();
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only();
    let connector = if http2 {
        b.enable_http2().build()
    } else {
        b.enable_http1().build()
    };
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector);
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(url.parse().unwrap()))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let (status, version) = (resp.status().as_u16(), resp.version());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((status, version, body))
}

async fn plain_get(url: &str) -> Result<u16, String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    match tokio::time::timeout(Duration::from_secs(5), client.get(url.parse().unwrap())).await {
        Ok(Ok(r)) => Ok(r.status().as_u16()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

fn decide_request() -> DecideRequest {
    DecideRequest {
        path: "/v1/chat/completions".into(),
        headers: vec![Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body: serde_json::to_vec(&json!({
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "hello"}],
        }))
        .unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_serves_tls_and_refuses_plaintext() {
    let dir = temp_dir("tls");
    write_config(&dir);
    let cert = make_cert(&dir);
    let server = start(&dir);
    let ports = &server.ports;
    assert_eq!(ports["tls"], true, "{ports}");
    let (main, admin, grpc) = (
        port(&ports["listen"]),
        port(&ports["admin"]),
        port(&ports["grpc"]),
    );

    // Client-facing listener: HTTPS over HTTP/1.1 and HTTP/2 (ALPN).
    let h1 = client_config(&cert, &[b"http/1.1"]);
    let (s, v, body) = https_get(
        h1.clone(),
        false,
        &format!("https://localhost:{main}/healthz"),
    )
    .await
    .unwrap();
    assert_eq!((s, v, &body[..]), (200, http::Version::HTTP_11, &b"ok"[..]));
    let h2 = client_config(&cert, &[b"h2"]);
    let (s, v, body) = https_get(h2, true, &format!("https://localhost:{main}/v1/models"))
        .await
        .unwrap();
    assert_eq!((s, v), (200, http::Version::HTTP_2));
    let models: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-llama");
    // Admin listener.
    let (s, _, body) = https_get(
        h1.clone(),
        false,
        &format!("https://localhost:{admin}/admin/status"),
    )
    .await
    .unwrap();
    assert_eq!(s, 200);
    assert!(serde_json::from_slice::<Value>(&body).unwrap()["policy"]["generation"].is_u64());
    // A client that does not trust the certificate is refused.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let untrusting = client_config(other.cert.der(), &[b"http/1.1"]);
    assert!(
        https_get(
            untrusting,
            false,
            &format!("https://localhost:{main}/healthz")
        )
        .await
        .is_err()
    );
    // Plaintext HTTP gets no answer on either listener.
    for p in [main, admin] {
        let r = plain_get(&format!("http://127.0.0.1:{p}/healthz")).await;
        assert!(r.is_err(), "plaintext on a TLS listener: {r:?}");
    }

    // gRPC over TLS (ALPN h2).
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_config(&cert, &[b"h2"])));
    let addr: SocketAddr = format!("127.0.0.1:{grpc}").parse().unwrap();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_uri: http::Uri| {
            let tls = tls.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let s = tls.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    let r = HandlerClient::new(channel)
        .decide(decide_request())
        .await
        .unwrap()
        .into_inner();
    assert!(r.outcome.is_some(), "{r:?}");
    // Plaintext gRPC on the TLS listener fails.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = HandlerClient::connect(format!("http://127.0.0.1:{grpc}")).await?;
        c.decide(decide_request())
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
    })
    .await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "plaintext gRPC on a TLS listener"
    );
}

#[tokio::test]
async fn a_bad_certificate_file_stops_the_server_with_a_message() {
    let dir = temp_dir("tls-bad");
    write_config(&dir);
    std::fs::write(dir.join("cert.pem"), "not a certificate").unwrap();
    std::fs::write(dir.join("key.pem"), "not a key").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinference"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&dir)
        .arg("--tls-cert")
        .arg(dir.join("cert.pem"))
        .arg("--tls-key")
        .arg(dir.join("key.pem"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS certificate"), "{err}");
    // `--tls-cert` alone is a usage error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinference"))
        .args(["serve", "--config"])
        .arg(&dir)
        .arg("--tls-cert")
        .arg(dir.join("cert.pem"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
}

/// An Ed448 private key (PKCS#8), made for this test: a valid key of a type that ring cannot
/// sign with.
const ED448_KEY: &str = "-----BEGIN PRIVATE KEY-----
MEcCAQAwBQYDK2VxBDsEOaLEXsxtYrdNAeCJHQfU0eThBalsdgdL8IpJVofPPZER
NRLZJ7cm5jblLe+cK7KUvTXP1u4KBcyddQ==
-----END PRIVATE KEY-----
";

#[test]
fn a_key_that_cannot_serve_the_certificate_is_named_at_startup() {
    use kinf_handler::listen::{TlsFiles, http_tls_config};
    let dir = temp_dir("tls-keys");
    make_cert(&dir);
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let err = |key_file: &str, content: &str| {
        let key = dir.join(key_file);
        std::fs::write(&key, content).unwrap();
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        };
        let e = http_tls_config(&files).map(|_| ()).unwrap_err();
        assert!(e.contains(&key.display().to_string()), "names the key: {e}");
        e
    };
    // The key of another certificate.
    let e = err("other.pem", &other.signing_key.serialize_pem());
    assert!(
        e.contains("does not belong to the certificate") && e.contains("cert.pem"),
        "{e}"
    );
    // A key type that cannot sign here.
    let e = err("ed448.pem", ED448_KEY);
    assert!(
        e.contains("unsupported private key") && e.contains("P-256"),
        "{e}"
    );
    // No usable PEM key: a certificate, or an encrypted key.
    let e = err("cert-as-key.pem", &other.cert.pem());
    assert!(e.contains("no private key in the file"), "{e}");
    let e = err(
        "encrypted.pem",
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    assert!(e.contains("encrypted keys are not supported"), "{e}");
    // An empty key file, and a missing one.
    let e = err("empty.pem", "");
    assert!(e.contains("no private key"), "{e}");
    let files = TlsFiles {
        cert: cert.clone(),
        key: dir.join("missing.pem"),
    };
    let missing = http_tls_config(&files).map(|_| ()).unwrap_err();
    assert!(missing.contains("missing.pem"), "{missing}");
    // The matching key loads.
    let files = TlsFiles {
        cert,
        key: dir.join("key.pem"),
    };
    assert!(http_tls_config(&files).is_ok());
}
