//! The limiter over a real `redis-server`: shared budgets across replicas, fail modes.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kinf_handler::tenants::store::BudgetKind;
use kinf_handler::tenants::{
    FailMode, LimitError, LimitStore, Limiter, RedisConfig, RedisStore, TokenEstimate,
};
use kinf_lang::compiled::CompiledLimit;
use kinf_router::usage::TokenUsage;
use support::redis::{RedisServer, limit, req, tokens_and_concurrency};

fn store(server: &RedisServer, mode: FailMode) -> Arc<RedisStore> {
    let mut c = RedisConfig::new(server.url());
    c.fail_mode = mode;
    c.key_prefix = "test:rl:".into();
    Arc::new(RedisStore::new(c).unwrap())
}

fn remaining_tokens(r: &kinf_handler::tenants::Reservation) -> u64 {
    r.headers().tokens.unwrap().remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tokens_requests_concurrency() {
    let Some(server) = RedisServer::start("limiter") else {
        return;
    };
    let st = store(&server, FailMode::Closed);
    let l = Limiter::new(&tokens_and_concurrency(), st.clone());
    let r1 = l
        .admit(
            &req("a", 4000, 1000),
            TokenEstimate {
                prompt: 4000,
                output: 1000,
            },
        )
        .await
        .unwrap();
    assert_eq!(remaining_tokens(&r1), 1000);
    let pairs = r1.headers().pairs();
    assert!(
        pairs.contains(&("x-ratelimit-limit-tokens", "6000".into())),
        "{pairs:?}"
    );
    assert!(
        pairs.contains(&("x-ratelimit-remaining-requests", "99".into())),
        "{pairs:?}"
    );
    // Over the token budget: 3000 needed, 1000 left, 100/s.
    let e = match l
        .admit(
            &req("a", 2000, 1000),
            TokenEstimate {
                prompt: 2000,
                output: 1000,
            },
        )
        .await
    {
        Err(LimitError::Exceeded(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!((&*e.limit, e.kind), ("p/tpm", BudgetKind::Tokens));
    assert!(
        (19_800..=20_000).contains(&e.retry_after_ms),
        "{}",
        e.retry_after_ms
    );
    assert_eq!(e.retry_after_secs(), 20);
    // 1,000 left, plus what refilled (100 tokens/s) since the first admission: under a loaded
    // test run more than 10 ms can pass between the two calls (the same 200 ms slack as the
    // retry time above).
    let remaining = e.headers.tokens.unwrap().remaining;
    assert!((1000..=1020).contains(&remaining), "{remaining}");
    // Another tenant is unaffected.
    let b = l
        .admit(
            &req("b", 10, 10),
            TokenEstimate {
                prompt: 10,
                output: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(remaining_tokens(&b), 5980);
    // Reconcile: reserved 5000, used 1000 → 4000 back.
    r1.complete(&TokenUsage::from_openai(900, 0, 100));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = l
            .admit(&req("a", 0, 0), TokenEstimate::default())
            .await
            .unwrap();
        let rem = remaining_tokens(&r);
        drop(r);
        if rem >= 5000 {
            assert!(rem <= 5100, "{rem}");
            break;
        }
        assert!(Instant::now() < deadline, "refund not applied: {rem}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Concurrency: 2 slots for tenant c, released on drop.
    let c1 = l
        .admit(&req("c", 1, 1), TokenEstimate::default())
        .await
        .unwrap();
    let c2 = l
        .admit(&req("c", 1, 1), TokenEstimate::default())
        .await
        .unwrap();
    match l.admit(&req("c", 1, 1), TokenEstimate::default()).await {
        Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency),
        other => panic!("{other:?}"),
    }
    drop(c1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let c3 = loop {
        if let Ok(r) = l.admit(&req("c", 1, 1), TokenEstimate::default()).await {
            break r;
        }
        assert!(Instant::now() < deadline, "slot not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop((c2, c3, b));
    assert_eq!(st.stats().snapshot().redis_errors, 0);
    // Keys carry the prefix and expire.
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("test:rl:")),
        "{keys:?}"
    );
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        // -2: the key expired or was settled away since KEYS; -1 would be a key without expiry.
        assert!(ttl > 0 || ttl == -2, "{k} has no expiry ({ttl})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_budgets() {
    let Some(server) = RedisServer::start("limiter") else {
        return;
    };
    let limits = [
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(10_000),
            ..limit("p/tpm")
        }),
        Arc::new(CompiledLimit {
            concurrent_requests: Some(5),
            when_exceeded: Default::default(),
            ..limit("p/conc")
        }),
    ];
    let replicas = [
        Limiter::new(&limits, store(&server, FailMode::Closed)),
        Limiter::new(&limits, store(&server, FailMode::Closed)),
    ];
    // Tokens: 2 × 150 concurrent admissions of 100 tokens each, held (not completed).
    let started = Instant::now();
    let mut tasks = Vec::new();
    for l in &replicas {
        for _ in 0..150 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let r = req("t", 60, 40);
                match l.admit(&r, TokenEstimate::of(&r)).await {
                    Ok(res) => {
                        // Hold the tokens, release the concurrency slot only after counting.
                        Some(res)
                    }
                    Err(LimitError::Exceeded(_)) => None,
                    Err(e) => panic!("{e}"),
                }
            }));
        }
    }
    let mut held = Vec::new();
    for t in tasks {
        if let Some(r) = t.await.unwrap() {
            held.push(r);
        }
    }
    // Concurrency bound holds across both replicas.
    assert!(
        held.len() <= 5,
        "{} in flight with a limit of 5",
        held.len()
    );
    assert!(!held.is_empty());
    for r in held.drain(..) {
        std::mem::forget(r); // hold their tokens, never release (leases expire)
    }
    // Tokens: a tenant without the concurrency cap (a tokens-only limiter) over the same keys.
    let tok_only = [Arc::new(CompiledLimit {
        tokens_per_minute: Some(10_000),
        ..limit("p/tpm2")
    })];
    let replicas2 = [
        Limiter::new(&tok_only, store(&server, FailMode::Closed)),
        Limiter::new(&tok_only, store(&server, FailMode::Closed)),
    ];
    let mut tasks = Vec::new();
    for l in &replicas2 {
        for _ in 0..150 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let r = req("t", 60, 40);
                l.admit(&r, TokenEstimate::of(&r))
                    .await
                    .map(std::mem::forget)
                    .is_ok()
            }));
        }
    }
    let mut admitted = 0u64;
    for t in tasks {
        if t.await.unwrap() {
            admitted += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let refill = (elapsed * 10_000.0 / 60.0).ceil() as u64;
    let tokens = admitted * 100;
    eprintln!("two replicas: admitted {admitted} × 100 tokens in {elapsed:.3}s (refill {refill})");
    // Within the limit plus at most one estimate per replica (plus what refilled meanwhile).
    assert!(
        tokens <= 10_000 + 2 * 100 + refill,
        "{tokens} tokens admitted"
    );
    assert!(tokens >= 10_000 - 100, "{tokens} tokens admitted: too few");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_open_and_closed() {
    let Some(mut server) = RedisServer::start("limiter") else {
        return;
    };
    let limits = [Arc::new(CompiledLimit {
        tokens_per_minute: Some(1000),
        ..limit("p/tpm")
    })];
    let open_store = store(&server, FailMode::Open);
    let closed_store = store(&server, FailMode::Closed);
    let open = Limiter::new(&limits, open_store.clone());
    let closed = Limiter::new(&limits, closed_store.clone());
    let r = req("t", 10, 10);
    // Both work while Redis is up.
    open.admit(&r, TokenEstimate::of(&r))
        .await
        .unwrap()
        .complete(&TokenUsage::default());
    closed
        .admit(&r, TokenEstimate::of(&r))
        .await
        .unwrap()
        .complete(&TokenUsage::default());
    server.kill();
    let t0 = Instant::now();
    let res = open.admit(&r, TokenEstimate::of(&r)).await.unwrap();
    assert!(res.is_unlimited());
    assert!(res.headers().is_empty());
    drop(res);
    let res = open.admit(&r, TokenEstimate::of(&r)).await.unwrap();
    assert!(res.is_unlimited());
    let s = open.stats();
    assert_eq!(s.fail_open_admits, 2, "{s:?}");
    assert!(s.redis_errors >= 2, "{s:?}");
    match closed.admit(&r, TokenEstimate::of(&r)).await {
        Err(e @ LimitError::Unavailable(_)) => {
            assert_eq!(e.status(), 503);
            assert_eq!(e.code(), "rate_limiter_unavailable");
            assert_eq!(e.retry_after_secs(), 1);
        }
        other => panic!("{other:?}"),
    }
    let s = closed.stats();
    assert_eq!(s.fail_closed_rejects, 1, "{s:?}");
    assert!(s.redis_errors >= 1, "{s:?}");
    // Failures are quick (bounded by the timeout).
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[tokio::test]
async fn store_from_flags_parses() {
    use kinf_handler::tenants::store_from_flags;
    assert!(store_from_flags("memory", FailMode::Open, None).is_ok());
    let s = store_from_flags("redis://127.0.0.1:1/0", FailMode::Closed, Some("x:")).unwrap();
    assert_eq!(s.fail_mode(), FailMode::Closed);
    let e = store_from_flags("mem", FailMode::Open, None).err().unwrap();
    assert!(
        e.contains("--limiter-store") && e.contains("redis+unix://"),
        "{e}"
    );
    assert!(store_from_flags("redis+unix:///tmp/redis.sock?db=2", FailMode::Open, None).is_ok());
    // TLS (`rediss://`) is a store too (tenants_redis_tls.rs runs it).
    assert!(store_from_flags("rediss://127.0.0.1:6380/0", FailMode::Open, None).is_ok());
}

/// A request in flight longer than the lease keeps its concurrency slot: its replica renews
/// the lease. A replica that dies (its store dropped, nothing released) leaks the slot for one
/// lease at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_keeps_its_slot_and_a_dead_replica_frees_it_within_a_lease() {
    let Some(server) = RedisServer::start("lease") else {
        return;
    };
    let replica = |lease_ms: u64| {
        let mut c = RedisConfig::new(server.url());
        c.key_prefix = "test:lease:".into();
        c.lease = Duration::from_millis(lease_ms);
        let st = Arc::new(RedisStore::new(c).unwrap());
        let l = Limiter::new(
            &[Arc::new(CompiledLimit {
                concurrent_requests: Some(1),
                when_exceeded: Default::default(),
                ..limit("p/conc")
            })],
            st.clone(),
        );
        (st, l)
    };
    // Leases of 2 s, renewed every 667 ms: a renewal held up by a loaded machine for over a
    // second would still be in time.
    let (_st1, l1) = replica(2000);
    let (_st2, l2) = replica(2000);
    let held = l1
        .admit(&req("t", 1, 1), TokenEstimate::default())
        .await
        .unwrap();
    // Two and a half leases later the slot is still held, for this replica and for the other.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    for l in [&l1, &l2] {
        match l.admit(&req("t", 1, 1), TokenEstimate::default()).await {
            Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency),
            other => panic!("the lease of a request in flight expired: {other:?}"),
        }
    }
    // Released: free at once.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        if let Ok(r) = l2.admit(&req("t", 1, 1), TokenEstimate::default()).await {
            break r;
        }
        assert!(Instant::now() < deadline, "slot not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(again);
    // A third replica takes the slot and dies holding it (its store dropped, nothing
    // released): no more renewals, and replica 1 gets the slot within about a lease.
    let (st3, _) = replica(2000);
    let check = kinf_handler::tenants::store::Check {
        limit: "p/conc".into(),
        tenant: "t".into(),
        tokens_per_minute: None,
        tokens: 0,
        requests_per_minute: None,
        concurrent_requests: Some(1),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match st3.admit(std::slice::from_ref(&check)).await.unwrap() {
            kinf_handler::tenants::store::Admission::Admitted { .. } => break,
            _ => assert!(Instant::now() < deadline, "slot not released"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewed while it lives.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(
        l1.admit(&req("t", 1, 1), TokenEstimate::default())
            .await
            .is_err()
    );
    drop(st3);
    let died = Instant::now();
    let deadline = died + Duration::from_secs(8);
    loop {
        if l1
            .admit(&req("t", 1, 1), TokenEstimate::default())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a dead replica's slot never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        // At most a lease after the last renewal, which came at most a renewal period before.
        died.elapsed() < Duration::from_secs(4),
        "{:?}",
        died.elapsed()
    );
}
