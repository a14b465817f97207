//! Limiter cost per request: admit + complete, in memory and over a real Redis (started on a
//! free port when `redis-server` is on PATH; skipped otherwise).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures_util::FutureExt;
use kinf_handler::tenants::{
    FailMode, Limiter, MemoryStore, RedisConfig, RedisStore, TokenEstimate,
};
use kinf_lang::compiled::{CompiledLimit, RequestCond};
use kinf_policy::{Qos, TokenCount};
use kinf_router::Request;
use kinf_router::usage::TokenUsage;

fn limits() -> Vec<Arc<CompiledLimit>> {
    vec![
        // Every request, per tenant: tokens and requests.
        Arc::new(CompiledLimit {
            name: "team/tokens".into(),
            condition: None,
            tokens_per_minute: Some(1_000_000_000_000),
            count: TokenCount::Total,
            requests_per_minute: Some(1_000_000_000_000),
            concurrent_requests: None,
            when_exceeded: Default::default(),
        }),
        // Interactive requests: concurrency.
        Arc::new(CompiledLimit {
            name: "team/concurrency".into(),
            condition: Some(RequestCond {
                qos: Some(Qos::Interactive),
                ..RequestCond::default()
            }),
            tokens_per_minute: None,
            count: TokenCount::Total,
            requests_per_minute: None,
            concurrent_requests: Some(1_000_000),
            when_exceeded: Default::default(),
        }),
        // Another tenant's: does not match.
        Arc::new(CompiledLimit {
            name: "team/batch".into(),
            condition: Some(RequestCond {
                tenant: Some("batch-team".into()),
                ..RequestCond::default()
            }),
            tokens_per_minute: Some(1000),
            count: TokenCount::UncachedPrompt,
            requests_per_minute: None,
            concurrent_requests: None,
            when_exceeded: Default::default(),
        }),
    ]
}

fn requests() -> Vec<Request> {
    (0..64)
        .map(|i| {
            let mut r = Request::new("qwen", 1000);
            r.tenant = Some(format!("tenant-{i}").into());
            r.max_tokens = 256;
            r
        })
        .collect()
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let usage = TokenUsage::from_openai(1000, 600, 200);
    let reqs = requests();

    let l = Limiter::new(&limits(), Arc::new(MemoryStore::new()));
    let mut i = 0usize;
    c.bench_function("memory/admit+complete", |b| {
        b.iter(|| {
            i = (i + 1) % reqs.len();
            let r = &reqs[i];
            let res = l
                .admit(black_box(r), TokenEstimate::of(r))
                .now_or_never()
                .unwrap()
                .unwrap();
            res.complete(black_box(&usage));
        })
    });

    match start_redis() {
        None => eprintln!("\n!!!!! SKIPPED redis benchmark: redis-server is not on PATH !!!!!\n"),
        Some((mut child, port)) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let l = rt.block_on(async {
                let mut cfg = RedisConfig::new(format!("redis://127.0.0.1:{port}/0"));
                cfg.fail_mode = FailMode::Closed;
                Limiter::new(&limits(), Arc::new(RedisStore::new(cfg).unwrap()))
            });
            let mut i = 0usize;
            c.bench_function("redis/admit+complete", |b| {
                b.iter(|| {
                    i = (i + 1) % reqs.len();
                    let r = &reqs[i];
                    let res = rt
                        .block_on(l.admit(black_box(r), TokenEstimate::of(r)))
                        .unwrap();
                    // Settlement runs on a background task (not awaited by the caller).
                    res.complete(black_box(&usage));
                })
            });
            drop(rt);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    c.final_summary();
}

fn start_redis() -> Option<(std::process::Child, u16)> {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .ok()?;
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((child, port))
}
