//! A minimal HTTP/1 GET client for scrapes, health checks and discovery.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Largest body read (a vLLM `/metrics` is ≈60 KB).
pub const MAX_BODY: usize = 16 << 20;

/// A pooled HTTP/1 client.
#[derive(Clone, Debug)]
pub struct HttpGet {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for HttpGet {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpGet {
    /// A client with keep-alive connections.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        HttpGet { client }
    }

    /// `GET url` within `timeout`; the body of a 2xx response, or an error in words.
    pub async fn get(&self, url: &str, timeout: Duration) -> Result<Bytes, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("invalid url {url}: {e}"))?;
        let fut = async {
            let resp = self
                .client
                .get(uri)
                .await
                .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("GET {url}: reading body: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("GET {url}: HTTP {}", status.as_u16()));
            }
            Ok(body)
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("GET {url}: timed out after {timeout:?}")),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
