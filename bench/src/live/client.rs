//! The built-in load generator: a streaming OpenAI chat client (hyper, keep-alive) that
//! measures each request's time to first token and end-to-end latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::workload::Session;
use crate::procs::Http;

/// How requests are offered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// Sessions arrive as a Poisson process of this many per simulated second (multiturn:
    /// conversations arrive at rate / turns, so that requests arrive at ≈ rate).
    Poisson(f64),
    /// A closed loop: this many sessions in flight.
    Concurrency(usize),
}

impl Load {
    /// Parses `poisson:RATE` or `concurrency:C`.
    pub fn parse(s: &str) -> Result<Load, String> {
        let bad = || format!("bad --load {s:?}: want poisson:RATE or concurrency:C");
        let (k, v) = s.split_once(':').ok_or_else(bad)?;
        match k {
            "poisson" => match v.parse::<f64>() {
                Ok(r) if r > 0.0 && r.is_finite() => Ok(Load::Poisson(r)),
                _ => Err(bad()),
            },
            "concurrency" => match v.parse::<usize>() {
                Ok(c) if c > 0 => Ok(Load::Concurrency(c)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }

    /// A short tag for file names: `poisson-0.5`, `c16`.
    pub fn tag(self) -> String {
        match self {
            Load::Poisson(r) => format!("poisson-{r}"),
            Load::Concurrency(c) => format!("c{c}"),
        }
    }
}

/// One request's outcome (wall-clock seconds).
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Session index.
    pub session: usize,
    /// Turn index within the session.
    pub turn: usize,
    /// When it was sent, from the run's start.
    pub sent_s: f64,
    /// Time to the first content token.
    pub ttft_s: Option<f64>,
    /// Time to the end of the response.
    pub e2e_s: f64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    /// Content chunks received (output tokens).
    pub output_tokens: u64,
    /// `x-kinference-endpoint`, when the router says.
    pub endpoint: Option<String>,
    /// Why it failed (`None`: success).
    pub error: Option<String>,
}

/// What one streamed chat completion gave.
struct Reply {
    ttft: Option<Duration>,
    text: String,
    chunks: u64,
    usage: Value,
    endpoint: Option<String>,
}

/// Sends one streamed chat completion and reads it to the end.
async fn chat_stream(client: &Http, url: &str, body: Bytes, t0: Instant) -> Result<Reply, String> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let endpoint = resp
        .headers()
        .get("x-kinference-endpoint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = resp.into_body();
    if status != 200 {
        let b = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        ));
    }
    let mut reply = Reply {
        ttft: None,
        text: String::new(),
        chunks: 0,
        usage: Value::Null,
        endpoint,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        // Complete lines only; an event is one `data:` line in OpenAI's SSE.
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(payload) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let payload = payload.trim();
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(payload) else {
                return Err(format!("bad SSE chunk: {payload:.200}"));
            };
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str()
                && !c.is_empty()
            {
                if reply.ttft.is_none() {
                    reply.ttft = Some(t0.elapsed());
                }
                reply.chunks += 1;
                reply.text.push_str(c);
            }
            if v["usage"].is_object() {
                reply.usage = v["usage"].clone();
            }
        }
    }
    if !done {
        return Err("stream ended without [DONE]".into());
    }
    Ok(reply)
}

/// The run's shared context.
pub struct Driver {
    /// HTTP client.
    pub client: Http,
    /// `http://HOST:PORT/v1/chat/completions` of the router.
    pub url: String,
    /// Served model name.
    pub model: String,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl Driver {
    /// Runs one session's turns in order (each turn's prompt is the conversation so far).
    async fn session(self: &Arc<Self>, idx: usize, s: &Session, start: Instant) -> Vec<Record> {
        let mut messages: Vec<Value> = Vec::new();
        let mut out = Vec::with_capacity(s.turns.len());
        for (t, turn) in s.turns.iter().enumerate() {
            messages.push(json!({"role": "user", "content": turn.content}));
            let body = json!({
                "model": self.model, "messages": messages, "max_tokens": turn.max_tokens,
                "stream": true, "stream_options": {"include_usage": true},
            });
            let body = Bytes::from(body.to_string());
            let t0 = Instant::now();
            let sent_s = t0.duration_since(start).as_secs_f64();
            let r =
                tokio::time::timeout(self.timeout, chat_stream(&self.client, &self.url, body, t0))
                    .await
                    .unwrap_or_else(|_| Err(format!("timed out after {:?}", self.timeout)));
            let e2e_s = t0.elapsed().as_secs_f64();
            let mut rec = Record {
                session: idx,
                turn: t,
                sent_s,
                e2e_s,
                ..Record::default()
            };
            match r {
                Ok(reply) => {
                    rec.ttft_s = reply.ttft.map(|d| d.as_secs_f64());
                    rec.prompt_tokens = reply.usage["prompt_tokens"].as_u64();
                    rec.cached_tokens =
                        reply.usage["prompt_tokens_details"]["cached_tokens"].as_u64();
                    rec.output_tokens = reply.chunks;
                    rec.endpoint = reply.endpoint;
                    if reply.chunks == 0 {
                        rec.error = Some("no content tokens".into());
                    }
                    messages.push(json!({"role": "assistant", "content": reply.text}));
                }
                Err(e) => rec.error = Some(e),
            }
            let failed = rec.error.is_some();
            out.push(rec);
            if failed {
                // The rest of the conversation cannot be sent: count its turns as failed.
                for t2 in t + 1..s.turns.len() {
                    out.push(Record {
                        session: idx,
                        turn: t2,
                        sent_s,
                        error: Some("conversation aborted by an earlier failure".into()),
                        ..Record::default()
                    });
                }
                break;
            }
        }
        out
    }

    /// Offers `sessions` under `load`; sessions that would start after `duration_sim_s`
    /// (simulated seconds) are not sent. Returns the records and the wall time from the first
    /// send to the last completion.
    pub async fn run(
        self: Arc<Self>,
        sessions: Arc<Vec<Session>>,
        load: Load,
        arrivals: Vec<f64>,
        duration_sim_s: Option<f64>,
    ) -> (Vec<Record>, f64) {
        let start = Instant::now();
        let limit = duration_sim_s.map(|d| Duration::from_secs_f64(d / self.speed));
        let mut tasks = Vec::new();
        match load {
            Load::Poisson(_) => {
                for (i, at) in arrivals.iter().enumerate().take(sessions.len()) {
                    let at = Duration::from_secs_f64(at / self.speed);
                    if limit.is_some_and(|l| at > l) {
                        break;
                    }
                    let me = self.clone();
                    let sessions = sessions.clone();
                    tasks.push(tokio::spawn(async move {
                        tokio::time::sleep_until((start + at).into()).await;
                        me.session(i, &sessions[i], start).await
                    }));
                }
            }
            Load::Concurrency(c) => {
                let next = Arc::new(AtomicUsize::new(0));
                for _ in 0..c {
                    let me = self.clone();
                    let sessions = sessions.clone();
                    let next = next.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= sessions.len() || limit.is_some_and(|l| start.elapsed() > l) {
                                break;
                            }
                            out.extend(me.session(i, &sessions[i], start).await);
                        }
                        out
                    }));
                }
            }
        }
        let mut records = Vec::new();
        for t in tasks {
            if let Ok(r) = t.await {
                records.extend(r);
            }
        }
        let wall = start.elapsed().as_secs_f64();
        records.sort_by_key(|r| (r.session, r.turn));
        (records, wall)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn loads_parse_and_tag() {
        assert_eq!(Load::parse("poisson:0.5"), Ok(Load::Poisson(0.5)));
        assert_eq!(Load::parse("concurrency:16"), Ok(Load::Concurrency(16)));
        assert!(Load::parse("poisson:0").is_err());
        assert!(Load::parse("concurrency:x").is_err());
        assert!(Load::parse("closed").is_err());
        assert_eq!(Load::Poisson(0.5).tag(), "poisson-0.5");
        assert_eq!(Load::Concurrency(8).tag(), "c8");
    }
}
