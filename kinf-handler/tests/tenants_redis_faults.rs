//! The Redis limiter store when things go wrong: Redis restarting or slow while requests settle
//! or are admitted, keys expiring under long requests, and the memory store answering as the
//! Redis one does.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kinf_handler::tenants::store::BudgetKind;
use kinf_handler::tenants::{
    FailMode, LimitError, LimitStore, Limiter, MemoryStore, RedisConfig, RedisStore, TokenEstimate,
};
use kinf_lang::compiled::CompiledLimit;
use kinf_policy::TokenCount;
use kinf_router::usage::TokenUsage;
use support::redis::{RedisServer, limit, req};

fn config(server: &RedisServer) -> RedisConfig {
    let mut c = RedisConfig::new(server.url());
    c.fail_mode = FailMode::Closed;
    c.key_prefix = "test:rl:".into();
    c
}

/// A concurrency slot whose release fails because Redis is down is released once Redis is
/// back, not held until its lease expires (15 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_retried_after_redis_restart() {
    let Some(mut server) = RedisServer::start("settle") else {
        return;
    };
    let store = Arc::new(RedisStore::new(config(&server)).unwrap());
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            concurrent_requests: Some(1),
            ..limit("p/conc")
        })],
        store.clone(),
    );
    let r = req("t", 10, 10);
    let held = l.admit(&r, TokenEstimate::of(&r)).await.unwrap();
    match l.admit(&r, TokenEstimate::of(&r)).await {
        Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency),
        other => panic!("{other:?}"),
    }
    // Persist the slot, stop Redis, release while it is down, start it again with the slot.
    let () = redis::cmd("SAVE")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    server.kill();
    held.complete(&TokenUsage::from_openai(10, 0, 10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match l.admit(&r, TokenEstimate::of(&r)).await {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the slot released while Redis was down is still held: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.stats().snapshot().redis_errors >= 1);
}

/// An admission that times out on the gateway but then runs on a slow Redis does not keep a
/// concurrency slot that nobody releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_timeout_releases_its_slot() {
    let Some(server) = RedisServer::start("slow") else {
        return;
    };
    let store = Arc::new(RedisStore::new(config(&server)).unwrap());
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            concurrent_requests: Some(1),
            ..limit("p/conc")
        })],
        store,
    );
    let r = req("t", 10, 10);
    // Warm up the connection and the script cache.
    drop(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Block Redis for 800 ms (longer than the 250 ms admission timeout).
    let mut other = server.conn().await;
    let busy = tokio::spawn(async move {
        // The client may give up waiting (its own response timeout): the script runs on.
        let _: redis::RedisResult<i64> = redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                 while true do local n = redis.call('TIME') \
                 if n[1] * 1000000 + n[2] - s > 800000 then break end end return 1",
            )
            .arg(0)
            .query_async(&mut other)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    match l.admit(&r, TokenEstimate::of(&r)).await {
        Err(LimitError::Unavailable(_)) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    busy.await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The admission ran after the busy script; its slot must be released behind it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match l.admit(&r, TokenEstimate::of(&r)).await {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the slot of the timed-out admission is still held: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The key of a drained request bucket lives until the bucket is full again, however short the
/// configured TTL: it expiring early would hand out a fresh minute's worth of requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bucket_key_outlives_short_ttl() {
    let Some(server) = RedisServer::start("ttl") else {
        return;
    };
    let mut c = config(&server);
    c.key_ttl = Duration::from_millis(500);
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            requests_per_minute: Some(2),
            ..limit("p/rpm")
        })],
        Arc::new(RedisStore::new(c).unwrap()),
    );
    let r = req("t", 10, 10);
    drop(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
    drop(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    match l.admit(&r, TokenEstimate::of(&r)).await {
        Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Requests),
        other => panic!("a third request within the minute: {other:?}"),
    }
    let ttl: i64 = redis::cmd("PTTL")
        .arg("test:rl:b:p/rpm:{t:t}")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    assert!(ttl > 50_000, "{ttl}");
}

/// A request that outlives its bucket's key (a long stream) and used more than it reserved is
/// still charged its debt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debt_charged_after_key_expired() {
    let Some(server) = RedisServer::start("debt") else {
        return;
    };
    let mut c = config(&server);
    c.key_ttl = Duration::from_millis(1);
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(60_000),
            ..limit("p/tpm")
        })],
        Arc::new(RedisStore::new(c).unwrap()),
    );
    let r = req("t", 50, 50);
    let res = l.admit(&r, TokenEstimate::of(&r)).await.unwrap();
    // The key lives until the bucket is full again (100 ms) plus 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut conn = server.conn().await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg("test:rl:b:p/tpm:{t:t}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the key should have expired");
    // Reserved 100, used 30,100: a debt of 30,000.
    res.complete(&TokenUsage::from_openai(30_000, 0, 100));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg("test:rl:b:p/tpm:{t:t}")
            .query_async(&mut conn)
            .await
            .unwrap();
        if exists == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the debt was not charged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ttl: i64 = redis::cmd("PTTL")
        .arg("test:rl:b:p/tpm:{t:t}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        ttl > 20_000,
        "the recreated key must live until refilled: {ttl}"
    );
    let big = req("t", 39_000, 1000);
    match l.admit(&big, TokenEstimate::of(&big)).await {
        Err(LimitError::Exceeded(e)) => {
            assert_eq!(e.kind, BudgetKind::Tokens);
            let rem = e.headers.tokens.unwrap().remaining;
            assert!((30_000..32_000).contains(&rem), "{rem}");
        }
        other => panic!("the debt was forgotten: {other:?}"),
    }
}

/// Both stores report the same budgets on a 429: a limit checked before the refusing one shows
/// what it has (nothing was charged), not what it would have had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_on_429_headers() {
    let Some(server) = RedisServer::start("headers") else {
        return;
    };
    let limits = [
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(1000),
            ..limit("p/tpm")
        }),
        Arc::new(CompiledLimit {
            requests_per_minute: Some(1),
            ..limit("p/rpm")
        }),
    ];
    let stores: [Arc<dyn LimitStore>; 2] = [
        Arc::new(MemoryStore::new()),
        Arc::new(RedisStore::new(config(&server)).unwrap()),
    ];
    let mut seen = Vec::new();
    for store in stores {
        let l = Limiter::new(&limits, store);
        let r = req("t", 60, 40);
        drop(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
        let e = match l.admit(&r, TokenEstimate::of(&r)).await {
            Err(LimitError::Exceeded(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!((&*e.limit, e.kind), ("p/rpm", BudgetKind::Requests));
        let tokens = e.headers.tokens.unwrap();
        assert!(
            (900..=905).contains(&tokens.remaining),
            "remaining tokens {} (only the first request's 100 were charged)",
            tokens.remaining
        );
        assert_eq!(e.headers.requests.unwrap().remaining, 0);
        seen.push((e.kind, e.limit.clone(), tokens.limit));
    }
    assert_eq!(seen[0], seen[1]);
}

#[derive(Clone, Debug)]
enum Op {
    /// Admit a request of tenant `t` with `prompt` and `max_tokens`.
    Admit { t: u8, prompt: u32, out: u32 },
    /// Complete the `i`-th held reservation (modulo how many) with this usage.
    Complete { i: usize, prompt: u64, out: u64 },
    /// Drop the `i`-th held reservation without usage.
    Drop { i: usize },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0u8..2, 0u32..25, 0u32..25).prop_map(|(t, prompt, out)| Op::Admit { t, prompt, out }),
        1 => (0usize..8, 0u64..40, 0u64..40).prop_map(|(i, prompt, out)| Op::Complete { i, prompt, out }),
        1 => (0usize..8).prop_map(|i| Op::Drop { i }),
    ]
}

/// What an admission decided, as far as it is the same in every store at the same moment.
#[derive(Debug, PartialEq)]
enum Decision {
    Admitted {
        tokens: Option<u64>,
        requests: Option<u64>,
    },
    Refused {
        limit: String,
        kind: BudgetKind,
        tokens: Option<u64>,
        requests: Option<u64>,
    },
    Unavailable,
}

/// Runs `ops` against `store`, waiting after each settlement until a background one is
/// surely applied.
async fn decisions(store: Arc<dyn LimitStore>, ops: &[Op]) -> Vec<Decision> {
    let limits = [
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(60),
            requests_per_minute: Some(6),
            ..limit("p/total")
        }),
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(30),
            count: TokenCount::Output,
            concurrent_requests: Some(2),
            ..limit("p/output")
        }),
    ];
    let l = Limiter::new(&limits, store);
    let mut held = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Admit { t, prompt, out: o } => {
                let r = req(&format!("t{t}"), *prompt, *o);
                let remaining = |h: &kinf_handler::tenants::RateLimitHeaders| {
                    (
                        h.tokens.map(|b| b.remaining),
                        h.requests.map(|b| b.remaining),
                    )
                };
                out.push(match l.admit(&r, TokenEstimate::of(&r)).await {
                    Ok(res) => {
                        let (tokens, requests) = remaining(res.headers());
                        held.push(res);
                        Decision::Admitted { tokens, requests }
                    }
                    Err(LimitError::Exceeded(e)) => {
                        let (tokens, requests) = remaining(&e.headers);
                        Decision::Refused {
                            limit: e.limit.to_string(),
                            kind: e.kind,
                            tokens,
                            requests,
                        }
                    }
                    Err(LimitError::Unavailable(_)) => Decision::Unavailable,
                });
            }
            Op::Complete { i, prompt, out: o } if !held.is_empty() => {
                let res = held.remove(i % held.len());
                res.complete(&TokenUsage::from_openai(*prompt, 0, *o));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Op::Drop { i } if !held.is_empty() => {
                drop(held.remove(i % held.len()));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            _ => {}
        }
    }
    out
}

/// The memory store and the Redis store decide the same for the same sequence of admissions
/// and settlements, and report the same budgets. (Buckets are small enough, and a sequence
/// short enough, that what refills while it runs stays under one token.)
#[test]
fn memory_and_redis_decide_alike() {
    let Some(server) = RedisServer::start("props") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let case = std::sync::atomic::AtomicU64::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 24,
        failure_persistence: None,
        ..Default::default()
    });
    let strategy = proptest::collection::vec(op(), 1..10);
    runner
        .run(&strategy, |ops| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (memory, redis) = rt.block_on(async {
                let mut c = config(&server);
                c.key_prefix = format!("props{n}:");
                c.timeout = Duration::from_secs(2);
                let redis: Arc<dyn LimitStore> = Arc::new(RedisStore::new(c).unwrap());
                let memory: Arc<dyn LimitStore> = Arc::new(MemoryStore::new());
                (decisions(memory, &ops).await, decisions(redis, &ops).await)
            });
            proptest::prop_assert_eq!(memory, redis, "ops: {:?}", ops);
            Ok(())
        })
        .unwrap();
}

/// An admission whose caller goes away while Redis is slow (the client disconnected: hyper
/// drops the handler's future mid-admission) does not keep the concurrency slot it takes when
/// it runs: nobody would release it before its lease expired (15 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_admission_releases_its_slot() {
    let Some(server) = RedisServer::start("abandoned") else {
        return;
    };
    let mut c = config(&server);
    // Longer than Redis is kept busy below: only the caller gives up, not the store.
    c.timeout = Duration::from_secs(3);
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            concurrent_requests: Some(1),
            tokens_per_minute: Some(60_000),
            ..limit("p/conc")
        })],
        Arc::new(RedisStore::new(c).unwrap()),
    );
    let r = req("t", 10, 10);
    // Warm up the connection and the script cache.
    drop(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut other = server.conn().await;
    let busy = tokio::spawn(async move {
        let _: redis::RedisResult<i64> = redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                 while true do local n = redis.call('TIME') \
                 if n[1] * 1000000 + n[2] - s > 600000 then break end end return 1",
            )
            .arg(0)
            .query_async(&mut other)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The caller gives up after 100 ms; the admission is already on its way to Redis.
    let given_up = tokio::time::timeout(
        Duration::from_millis(100),
        l.admit(&r, TokenEstimate::of(&r)),
    )
    .await;
    assert!(given_up.is_err(), "Redis answered while busy: {given_up:?}");
    busy.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match l.admit(&r, TokenEstimate::of(&r)).await {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the slot of the abandoned admission is still held: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request larger than a limit's capacity is refused at once as too large with either
/// store, and whether Redis is up or not (the answer does not depend on the budget); the
/// stores themselves never admit more than a bucket holds (they used to admit it on a full
/// bucket, leaving a debt), and leave the bucket as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_refused_alike_by_both_stores() {
    use kinf_handler::tenants::store::{Admission, Check};
    let Some(mut server) = RedisServer::start("oversize") else {
        return;
    };
    let limits = [Arc::new(CompiledLimit {
        tokens_per_minute: Some(1000),
        ..limit("p/tpm")
    })];
    let stores: [Arc<dyn LimitStore>; 2] = [
        Arc::new(MemoryStore::new()),
        Arc::new(RedisStore::new(config(&server)).unwrap()),
    ];
    let big = req("t", 1200, 300);
    let small = req("t", 900, 100);
    for store in &stores {
        let l = Limiter::new(&limits, store.clone());
        match l.admit(&big, TokenEstimate::of(&big)).await {
            Err(e @ LimitError::Exceeded(_)) => {
                assert_eq!(
                    (e.status().as_u16(), e.code()),
                    (400, "request_over_token_limit")
                );
                assert_eq!(e.retry_after(), None);
                assert!(e.to_string().contains("p/tpm"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // The store asked directly: refused, nothing charged.
        let check = Check {
            limit: "p/tpm".into(),
            tenant: "direct".into(),
            tokens_per_minute: Some(1000),
            tokens: 1500,
            requests_per_minute: None,
            concurrent_requests: None,
        };
        match store.admit(std::slice::from_ref(&check)).await.unwrap() {
            Admission::Refused { kind, states, .. } => {
                assert_eq!(kind, BudgetKind::Tokens);
                assert_eq!(states[0].tokens.unwrap().remaining, 1000);
            }
            other => panic!("a store admitted more than its bucket holds: {other:?}"),
        }
        let fits = Check {
            tokens: 1000,
            ..check
        };
        assert!(matches!(
            store.admit(std::slice::from_ref(&fits)).await.unwrap(),
            Admission::Admitted { .. }
        ));
        // The tenant's budget is whole.
        let r = l.admit(&small, TokenEstimate::of(&small)).await.unwrap();
        assert_eq!(r.headers().tokens.unwrap().remaining, 0);
        std::mem::forget(r);
    }
    // Redis down, fail-closed: still the 400 (no 503), since no budget can ever admit it.
    server.kill();
    let l = Limiter::new(&limits, stores[1].clone());
    match l.admit(&big, TokenEstimate::of(&big)).await {
        Err(e) => assert_eq!(e.status(), 400, "{e}"),
        Ok(r) => panic!("{r:?}"),
    }
}

/// Both stores name, on a 429, the limit that keeps the request out longest, with the wait for
/// every limit to pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_on_the_longest_wait() {
    let Some(server) = RedisServer::start("longest") else {
        return;
    };
    let limits = [
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(600),
            requests_per_minute: Some(60),
            ..limit("p/tpm")
        }),
        Arc::new(CompiledLimit {
            requests_per_minute: Some(1),
            ..limit("p/rpm")
        }),
    ];
    let stores: [Arc<dyn LimitStore>; 2] = [
        Arc::new(MemoryStore::new()),
        Arc::new(RedisStore::new(config(&server)).unwrap()),
    ];
    let mut seen = Vec::new();
    for store in stores {
        let l = Limiter::new(&limits, store);
        let r = req("t", 600, 0);
        std::mem::forget(l.admit(&r, TokenEstimate::of(&r)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // 60 tokens: about 5 s more on p/tpm; a request: about 59 s more on p/rpm.
        let r = req("t", 60, 0);
        let e = match l.admit(&r, TokenEstimate::of(&r)).await {
            Err(LimitError::Exceeded(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!((&*e.limit, e.kind), ("p/rpm", BudgetKind::Requests));
        assert!(
            (50_000..=59_000).contains(&e.retry_after_ms),
            "{}",
            e.retry_after_ms
        );
        assert_eq!(e.headers.requests.unwrap().remaining, 0);
        seen.push((e.limit.clone(), e.kind, e.retry_after_secs()));
    }
    assert_eq!((&seen[0].0, seen[0].1), (&seen[1].0, seen[1].1));
    assert!(seen[0].2.abs_diff(seen[1].2) <= 1, "{seen:?}");
}
