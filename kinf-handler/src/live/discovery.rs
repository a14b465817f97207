//! Discovery of a worker's KV-event publishers from vLLM's `GET /kv_event_sources` (0.32+).
//!
//! The response maps each data-parallel rank to its `kv_events_config`, e.g.
//! `{"0": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
//! "replay_endpoint": "tcp://*:5558", "topic": "kv@pod-a@tiny", …}}`. A wildcard bind address
//! (`*`, `0.0.0.0`, `::`) is replaced by the worker's host.

/// Where one publisher (one data-parallel rank) can be reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSource {
    /// Data-parallel rank (the response's key).
    pub rank: String,
    /// `tcp://host:port` of the `PUB` socket.
    pub endpoint: String,
    /// `tcp://host:port` of the replay `ROUTER` socket, when configured.
    pub replay_endpoint: Option<String>,
    /// The topic.
    pub topic: String,
}

/// The host part of `host:port` (IPv6 in brackets kept as is).
pub fn host_of(address: &str) -> &str {
    match address.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => address,
    }
}

/// `tcp://host:port` for a port of the worker at `address`.
pub fn tcp_endpoint(address: &str, port: u16) -> String {
    format!("tcp://{}:{port}", host_of(address))
}

/// Rewrites a publisher's bind address into one reachable from here.
pub fn reachable_endpoint(bind: &str, worker_address: &str) -> Result<String, String> {
    let Some(rest) = bind.strip_prefix("tcp://") else {
        return Err(format!("publisher endpoint `{bind}` is not tcp://"));
    };
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("publisher endpoint `{bind}` has no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("publisher endpoint `{bind}` has an invalid port"))?;
    match host {
        "*" | "0.0.0.0" | "::" | "[::]" | "" => Ok(tcp_endpoint(worker_address, port)),
        _ => Ok(format!("tcp://{host}:{port}")),
    }
}

/// Parses a `/kv_event_sources` body for the worker at `worker_address`. Ranks with events
/// disabled or a non-zmq publisher are skipped; none left is an error.
pub fn parse_sources(body: &[u8], worker_address: &str) -> Result<Vec<KvSource>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("kv_event_sources: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("kv_event_sources: expected a JSON object")?;
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for (rank, cfg) in obj {
        let enabled = cfg
            .get("enable_kv_cache_events")
            .and_then(|b| b.as_bool())
            .unwrap_or(true);
        let publisher = cfg
            .get("publisher")
            .and_then(|p| p.as_str())
            .unwrap_or("zmq");
        if !enabled || publisher != "zmq" {
            skipped.push(format!(
                "rank {rank}: events disabled or publisher `{publisher}`"
            ));
            continue;
        }
        let endpoint = cfg
            .get("endpoint")
            .and_then(|e| e.as_str())
            .ok_or_else(|| format!("kv_event_sources: rank {rank} has no endpoint"))?;
        let replay_endpoint = match cfg.get("replay_endpoint").and_then(|e| e.as_str()) {
            Some(r) if !r.is_empty() => Some(reachable_endpoint(r, worker_address)?),
            _ => None,
        };
        out.push(KvSource {
            rank: rank.clone(),
            endpoint: reachable_endpoint(endpoint, worker_address)?,
            replay_endpoint,
            topic: cfg
                .get("topic")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_owned(),
        });
    }
    if out.is_empty() {
        return Err(format!(
            "kv_event_sources: no zmq publisher ({})",
            skipped.join("; ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn fixture() {
        let body = include_bytes!("../../../testdata/vllm-0.32.0-cpu/kv_event_sources.json");
        let s = parse_sources(body, "10.0.0.7:8000").unwrap();
        assert_eq!(
            s,
            vec![KvSource {
                rank: "0".into(),
                endpoint: "tcp://10.0.0.7:5557".into(),
                replay_endpoint: Some("tcp://10.0.0.7:5558".into()),
                topic: "kv@pod-a@tiny".into(),
            }]
        );
    }

    #[test]
    fn hosts_and_disabled() {
        assert_eq!(host_of("[::1]:8000"), "[::1]");
        assert_eq!(host_of("pod"), "pod");
        assert_eq!(
            reachable_endpoint("tcp://10.1.1.1:9", "x:1").unwrap(),
            "tcp://10.1.1.1:9"
        );
        assert!(reachable_endpoint("ipc:///tmp/x", "x:1").is_err());
        let off =
            br#"{"0":{"enable_kv_cache_events":false,"publisher":"null","endpoint":"tcp://*:1"}}"#;
        assert!(parse_sources(off, "h:1").is_err());
    }
}
