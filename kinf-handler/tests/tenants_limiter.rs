//! The limiter over the in-memory store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use futures_util::FutureExt;
use kinf_handler::tenants::store::BudgetKind;
use kinf_handler::tenants::{
    LimitError, LimitExceeded, Limiter, MemoryStore, Reservation, TokenEstimate, format_reset,
};
use kinf_lang::compiled::{CompiledLimit, RequestCond};
use kinf_policy::{Qos, TokenCount};
use kinf_router::Request;
use kinf_router::usage::TokenUsage;

fn limit(name: &str) -> CompiledLimit {
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

fn req(tenant: Option<&str>, prompt: u32, max_tokens: u32) -> Request {
    let mut r = Request::new("qwen", prompt);
    r.tenant = tenant.map(Arc::from);
    r.max_tokens = max_tokens;
    r
}

fn admit(l: &Limiter, r: &Request) -> Result<Reservation, LimitError> {
    // The in-memory store answers without awaiting anything.
    l.admit(r, TokenEstimate::of(r)).now_or_never().unwrap()
}

fn exceeded(e: LimitError) -> LimitExceeded {
    match e {
        LimitError::Exceeded(x) => *x,
        other => panic!("expected 429, got {other:?}"),
    }
}

fn header(pairs: &[(&'static str, String)], name: &str) -> String {
    pairs
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {name} in {pairs:?}"))
}

fn usage(prompt: u64, cached: u64, output: u64) -> TokenUsage {
    TokenUsage::from_openai(prompt, cached, output)
}

#[test]
fn tokens_per_minute_exceeded_with_headers_and_retry_after() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(6000),
            ..limit("p/tpm")
        })],
        Arc::new(MemoryStore::new()),
    );
    // 4000 + 1000 = 5000 reserved of 6000.
    let r = admit(&l, &req(Some("a"), 4000, 1000)).unwrap();
    let pairs = r.headers().pairs();
    assert_eq!(header(&pairs, "x-ratelimit-limit-tokens"), "6000");
    assert_eq!(header(&pairs, "x-ratelimit-remaining-tokens"), "1000");
    // 5000 tokens at 100 tokens/s: full again in 50 s.
    let reset = header(&pairs, "x-ratelimit-reset-tokens");
    assert!(reset == "50s" || reset.starts_with("49.9"), "{reset}");
    assert!(pairs.iter().all(|(n, _)| !n.ends_with("-requests")));
    std::mem::forget(r); // keep the whole estimate charged, as if in flight
    // 3000 more do not fit in the 1000 left: wait for 2000 tokens = 20 s.
    let e = exceeded(admit(&l, &req(Some("a"), 2000, 1000)).unwrap_err());
    assert_eq!(&*e.limit, "p/tpm");
    assert_eq!(e.kind, BudgetKind::Tokens);
    assert_eq!((e.requested, e.bound), (3000, 6000));
    assert!(
        (19_900..=20_000).contains(&e.retry_after_ms),
        "{}",
        e.retry_after_ms
    );
    assert_eq!(e.retry_after_secs(), 20);
    let hp = e.header_pairs();
    assert_eq!(header(&hp, "retry-after"), "20");
    assert_eq!(header(&hp, "x-ratelimit-limit-tokens"), "6000");
    assert_eq!(header(&hp, "x-ratelimit-remaining-tokens"), "1000");
    assert!(e.to_string().contains("p/tpm") && e.to_string().contains("tenant a"));
    let err = LimitError::Exceeded(Box::new(e));
    assert_eq!(err.status(), 429);
    assert_eq!(err.code(), "rate_limit_exceeded");
    // Still fits: 900 tokens.
    let small = admit(&l, &req(Some("a"), 800, 100)).unwrap();
    assert_eq!(
        header(&small.headers().pairs(), "x-ratelimit-remaining-tokens"),
        "100"
    );
}

#[test]
fn another_tenant_is_unaffected() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(1000),
            ..limit("p/tpm")
        })],
        Arc::new(MemoryStore::new()),
    );
    let a = admit(&l, &req(Some("a"), 900, 100)).unwrap();
    assert!(admit(&l, &req(Some("a"), 10, 10)).is_err());
    let b = admit(&l, &req(Some("b"), 900, 100)).unwrap();
    // Requests without a tenant share the "" budget.
    let n = admit(&l, &req(None, 900, 100)).unwrap();
    let e = exceeded(admit(&l, &req(None, 10, 10)).unwrap_err());
    assert_eq!(&*e.tenant, "");
    assert!(e.to_string().contains("without a tenant"));
    drop((a, b, n));
}

#[test]
fn matches_restrict_the_limit() {
    let cond = RequestCond {
        tenant: Some("batch-team".into()),
        qos: Some(Qos::Batch),
        ..RequestCond::default()
    };
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            condition: Some(cond),
            tokens_per_minute: Some(100),
            ..limit("p/batch")
        })],
        Arc::new(MemoryStore::new()),
    );
    let mut r = req(Some("batch-team"), 1000, 1000);
    // Interactive: no limit applies, no headers.
    let free = admit(&l, &r).unwrap();
    assert!(free.headers().is_empty());
    assert_eq!(free.limits().count(), 0);
    r.qos = Qos::Batch;
    // Larger than the whole budget: refused at once (it can never fit), charging nothing.
    let e = exceeded(admit(&l, &r).unwrap_err());
    assert_eq!(
        (&*e.limit, e.too_large),
        ("p/batch", Some(TokenCount::Total))
    );
    let fits = admit(&l, &req_batch()).unwrap();
    assert_eq!(fits.limits().collect::<Vec<_>>(), vec!["p/batch"]);
    drop(fits);
}

fn req_batch() -> Request {
    let mut r = req(Some("batch-team"), 1, 1);
    r.qos = Qos::Batch;
    r
}

#[test]
fn reconcile_refunds_unused_and_charges_overrun() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(10_000),
            ..limit("p/tpm")
        })],
        Arc::new(MemoryStore::new()),
    );
    // Reserve 2000 + 4000; use 2000 + 500 (of which 1500 cached: Total counts them all).
    let r = admit(&l, &req(Some("a"), 2000, 4000)).unwrap();
    r.complete(&usage(2000, 1500, 500));
    let r = admit(&l, &req(Some("a"), 1, 0)).unwrap();
    let rem: u64 = header(&r.headers().pairs(), "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    // 10000 - 2500 - 1 (+ a little refill).
    assert!((7499..=7510).contains(&rem), "{rem}");
    r.complete(&usage(1, 0, 0));
    // Overrun: reserved 10, used 3000 -> debt of 2990.
    let r = admit(&l, &req(Some("a"), 5, 5)).unwrap();
    r.complete(&usage(1000, 0, 2000));
    let r = admit(&l, &req(Some("a"), 1, 0)).unwrap();
    let rem: u64 = header(&r.headers().pairs(), "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    assert!((4497..=4520).contains(&rem), "{rem}");
    r.complete(&usage(1, 0, 0));
}

#[test]
fn count_restricts_what_is_reserved() {
    let mk = |count| {
        Limiter::new(
            &[Arc::new(CompiledLimit {
                tokens_per_minute: Some(10_000),
                count,
                ..limit("p/c")
            })],
            Arc::new(MemoryStore::new()),
        )
    };
    let remaining = |l: &Limiter| -> u64 {
        let r = admit(l, &req(Some("a"), 0, 0)).unwrap();
        header(&r.headers().pairs(), "x-ratelimit-remaining-tokens")
            .parse()
            .unwrap()
    };
    for (count, reserved, used) in [
        (TokenCount::Total, 3000, 1600),
        (TokenCount::Prompt, 1000, 1000),
        (TokenCount::UncachedPrompt, 1000, 200),
        (TokenCount::Output, 2000, 600),
    ] {
        let l = mk(count);
        let r = admit(&l, &req(Some("a"), 1000, 2000)).unwrap();
        let rem: u64 = header(&r.headers().pairs(), "x-ratelimit-remaining-tokens")
            .parse()
            .unwrap();
        assert_eq!(rem, 10_000 - reserved, "{count:?}");
        // 1000 prompt of which 800 cached, 600 output.
        r.complete(&usage(1000, 800, 600));
        let rem = remaining(&l);
        assert!(
            (10_000 - used..=10_000 - used + 5).contains(&rem),
            "{count:?}: {rem}"
        );
    }
}

#[test]
fn concurrency_released_on_drop_and_complete() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            concurrent_requests: Some(2),
            when_exceeded: Default::default(),
            ..limit("p/conc")
        })],
        Arc::new(MemoryStore::new()),
    );
    let a = admit(&l, &req(Some("t"), 10, 10)).unwrap();
    let b = admit(&l, &req(Some("t"), 10, 10)).unwrap();
    let e = exceeded(admit(&l, &req(Some("t"), 10, 10)).unwrap_err());
    assert_eq!(e.kind, BudgetKind::Concurrency);
    assert_eq!(e.bound, 2);
    assert_eq!(e.retry_after_secs(), 1);
    // Another tenant has its own slots.
    let other = admit(&l, &req(Some("u"), 10, 10)).unwrap();
    drop(a); // ended early without usage
    let c = admit(&l, &req(Some("t"), 10, 10)).unwrap();
    b.complete(&usage(10, 0, 3));
    let d = admit(&l, &req(Some("t"), 10, 10)).unwrap();
    assert!(admit(&l, &req(Some("t"), 10, 10)).is_err());
    drop((c, d, other));
    let _e = admit(&l, &req(Some("t"), 10, 10)).unwrap();
}

#[test]
fn requests_per_minute() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            requests_per_minute: Some(3),
            ..limit("p/rpm")
        })],
        Arc::new(MemoryStore::new()),
    );
    for left in ["2", "1", "0"] {
        let r = admit(&l, &req(Some("t"), 1, 1)).unwrap();
        let p = r.headers().pairs();
        assert_eq!(header(&p, "x-ratelimit-limit-requests"), "3");
        assert_eq!(header(&p, "x-ratelimit-remaining-requests"), left);
        r.complete(&usage(1, 0, 1));
    }
    let e = exceeded(admit(&l, &req(Some("t"), 1, 1)).unwrap_err());
    assert_eq!(e.kind, BudgetKind::Requests);
    // One request every 20 s.
    assert!(
        (19_900..=20_000).contains(&e.retry_after_ms),
        "{}",
        e.retry_after_ms
    );
    assert_eq!(
        header(&e.header_pairs(), "x-ratelimit-remaining-requests"),
        "0"
    );
    let reset = header(&e.header_pairs(), "x-ratelimit-reset-requests");
    assert!(reset.starts_with("59.9") || reset == "1m0s", "{reset}");
}

#[test]
fn all_or_nothing_across_limits() {
    let store = Arc::new(MemoryStore::new());
    let wide = || {
        Arc::new(CompiledLimit {
            tokens_per_minute: Some(1000),
            ..limit("p/wide")
        })
    };
    let l = Limiter::new(
        &[
            wide(),
            Arc::new(CompiledLimit {
                tokens_per_minute: Some(100),
                ..limit("p/narrow")
            }),
        ],
        store.clone(),
    );
    let r = admit(&l, &req(Some("t"), 50, 40)).unwrap();
    // Tightest budget in the headers: narrow, 10 left.
    assert_eq!(
        header(&r.headers().pairs(), "x-ratelimit-remaining-tokens"),
        "10"
    );
    std::mem::forget(r);
    let e = exceeded(admit(&l, &req(Some("t"), 50, 40)).unwrap_err());
    assert_eq!(&*e.limit, "p/narrow");
    // The refused request charged nothing on p/wide: 910 left there.
    let wide_only = Limiter::new(&[wide()], store);
    let r = admit(&wide_only, &req(Some("t"), 0, 0)).unwrap();
    let rem: u64 = header(&r.headers().pairs(), "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    assert!((910..=912).contains(&rem), "{rem}");
}

#[test]
fn reset_format_is_openais() {
    assert_eq!(format_reset(0), "0s");
    assert_eq!(format_reset(20), "20ms");
    assert_eq!(format_reset(6000), "6s");
    assert_eq!(format_reset(1500), "1.5s");
    assert_eq!(format_reset(60_000), "1m0s");
    assert_eq!(format_reset(150_500), "2m30.5s");
    assert_eq!(format_reset(3_720_000), "1h2m0s");
}

#[test]
fn no_limits_no_store_traffic() {
    let store = Arc::new(MemoryStore::new());
    let l = Limiter::new(&[], store.clone());
    assert!(l.is_empty());
    let r = admit(&l, &req(Some("t"), 1, 1)).unwrap();
    assert!(r.headers().is_empty());
    assert!(store.is_empty());
    assert_eq!(l.stats().admitted, 0);
}

#[test]
fn admission_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let l = Limiter::new(&[], Arc::new(MemoryStore::new()));
    let r = req(Some("t"), 1, 1);
    let f = l.admit(&r, TokenEstimate::of(&r));
    assert_send(&f);
    assert_send(&l);
}

/// A request whose estimate exceeds the bucket's whole capacity can never be admitted: it is
/// refused at once with a 400 naming the limit (no `retry-after`: waiting cannot help), without
/// touching the store, and leaves the tenant's budget as it was. (It used to be admitted on a
/// full bucket, draining it into debt for every other request of the tenant, and, while the
/// tenant's other requests kept the bucket from ever being full, refused forever with a
/// `retry-after` that lied.)
#[test]
fn oversize_request_refused_at_once_and_drains_nothing() {
    let store = Arc::new(MemoryStore::new());
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(1000),
            ..limit("p/tpm")
        })],
        store.clone(),
    );
    // 1200 + 300 > 1000, on a full bucket.
    let err = admit(&l, &req(Some("a"), 1200, 300)).unwrap_err();
    assert_eq!(err.status(), 400);
    assert_eq!(err.code(), "request_over_token_limit");
    assert_eq!(err.retry_after(), None);
    let msg = err.to_string();
    for part in [
        "p/tpm",
        "tenant a",
        "limit 1000",
        "requested 1500",
        "max_tokens",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    let e = exceeded(err);
    assert_eq!(e.kind, BudgetKind::Tokens);
    assert_eq!((e.requested, e.bound), (1500, 1000));
    assert!(!e.is_retryable());
    assert!(
        e.header_pairs()
            .iter()
            .all(|(n, _)| !n.starts_with("retry-after")),
        "{:?}",
        e.header_pairs()
    );
    // Nothing was charged, or even looked up; it is a client error, not among the 429s.
    assert!(store.is_empty());
    assert_eq!(l.stats().rejected, 0);
    // The tenant's other requests see the whole budget.
    let small = admit(&l, &req(Some("a"), 900, 100)).unwrap();
    assert_eq!(
        header(&small.headers().pairs(), "x-ratelimit-remaining-tokens"),
        "0"
    );
    // While the bucket is not full, the large request is still refused as too large (not as
    // a 429 to retry later), and the bucket's debt-free state is unchanged.
    let e = exceeded(admit(&l, &req(Some("a"), 1200, 300)).unwrap_err());
    assert!(e.too_large.is_some());
    small.complete(&usage(900, 0, 100));
    // Each count advises what to lower: the output limit counts only max_tokens.
    let out = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(100),
            count: TokenCount::Output,
            ..limit("p/out")
        })],
        Arc::new(MemoryStore::new()),
    );
    // A long prompt is fine there; 101 output tokens are not.
    drop(admit(&out, &req(None, 5000, 100)).unwrap());
    let e = exceeded(admit(&out, &req(None, 1, 101)).unwrap_err());
    assert_eq!(e.too_large, Some(TokenCount::Output));
    let msg = e.to_string();
    assert!(
        msg.contains("requests without a tenant") && !msg.contains("prompt"),
        "{msg}"
    );
}

/// Exactly the capacity still fits a full bucket (the boundary is "larger than").
#[test]
fn request_of_exactly_the_capacity_fits() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(1000),
            ..limit("p/tpm")
        })],
        Arc::new(MemoryStore::new()),
    );
    let r = admit(&l, &req(Some("a"), 700, 300)).unwrap();
    assert_eq!(
        header(&r.headers().pairs(), "x-ratelimit-remaining-tokens"),
        "0"
    );
    let e = exceeded(admit(&l, &req(Some("a"), 700, 300)).unwrap_err());
    assert!(e.is_retryable(), "{e}");
    assert_eq!(LimitError::Exceeded(Box::new(e)).status(), 429);
    drop(r);
}

/// An admission that a later limit refuses charges nothing, and no other request can see the
/// earlier limits charged meanwhile: the memory store decides all the limits of a request at
/// one instant (it used to charge them one by one, then give back, so that a request refused
/// by its second limit made another request fail the first one).
#[test]
fn refused_admission_never_shows_a_transient_charge() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let store = Arc::new(MemoryStore::new());
    let l = Limiter::new(
        &[
            Arc::new(CompiledLimit {
                tokens_per_minute: Some(100),
                ..limit("p/all")
            }),
            Arc::new(CompiledLimit {
                condition: Some(RequestCond {
                    qos: Some(Qos::Batch),
                    ..RequestCond::default()
                }),
                requests_per_minute: Some(1),
                ..limit("p/batch")
            }),
        ],
        store,
    );
    let mut batch = req(Some("t"), 100, 0);
    batch.qos = Qos::Batch;
    // Spend p/batch's one request; its 100 tokens come back.
    admit(&l, &batch).unwrap().complete(&usage(0, 0, 0));
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (l, stop) = (l.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Fits p/all (when nothing else holds it), always refused by p/batch.
                let e = exceeded(admit(&l, &batch).unwrap_err());
                assert!(e.is_retryable());
                n += 1;
            }
            n
        })
    };
    // Meanwhile an interactive request of the whole budget, given back each time, always fits.
    let spurious = AtomicU64::new(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    let mut tries = 0u64;
    while std::time::Instant::now() < deadline {
        match admit(&l, &req(Some("t"), 100, 0)) {
            Ok(r) => r.complete(&usage(0, 0, 0)),
            Err(e) => {
                spurious.fetch_add(1, Ordering::Relaxed);
                assert_eq!(&*exceeded(e).limit, "p/all");
            }
        }
        tries += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let refused_batches = hammer.join().unwrap();
    assert!(refused_batches > 0 && tries > 0);
    assert_eq!(
        spurious.load(Ordering::Relaxed),
        0,
        "an interactive request saw a batch request's charge that was being undone \
         ({tries} tries, {refused_batches} batch refusals)"
    );
}

/// On a 429, every budget reported is as it is now: the refused limit's other bucket is
/// refilled too (the memory store reported it as of its last use, unlike the Redis store).
#[test]
fn refusal_reports_every_bucket_refilled() {
    let l = Limiter::new(
        &[Arc::new(CompiledLimit {
            tokens_per_minute: Some(100),
            requests_per_minute: Some(60),
            ..limit("p/both")
        })],
        Arc::new(MemoryStore::new()),
    );
    let r = admit(&l, &req(Some("t"), 100, 0)).unwrap();
    assert_eq!(r.headers().requests.unwrap().remaining, 59);
    std::mem::forget(r);
    // A second later the request bucket is full again (one a second); tokens are not.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let e = exceeded(admit(&l, &req(Some("t"), 100, 0)).unwrap_err());
    assert_eq!(e.kind, BudgetKind::Tokens);
    let requests = e.headers.requests.unwrap();
    assert_eq!(
        (requests.remaining, requests.reset_ms),
        (60, 0),
        "{requests:?}"
    );
}

/// `retry-after` is when the request would pass every limit, not just the first that refused
/// it: the limit named is the one that keeps it out longest.
#[test]
fn retry_after_waits_for_every_limit() {
    let l = Limiter::new(
        &[
            Arc::new(CompiledLimit {
                tokens_per_minute: Some(600),
                ..limit("p/tpm")
            }),
            Arc::new(CompiledLimit {
                requests_per_minute: Some(1),
                ..limit("p/rpm")
            }),
        ],
        Arc::new(MemoryStore::new()),
    );
    std::mem::forget(admit(&l, &req(Some("t"), 600, 0)).unwrap());
    // 60 tokens more: 6 s on p/tpm; one request more: 60 s on p/rpm.
    let e = exceeded(admit(&l, &req(Some("t"), 60, 0)).unwrap_err());
    assert_eq!((&*e.limit, e.kind), ("p/rpm", BudgetKind::Requests));
    assert!(e.retry_after_secs() >= 59, "{}", e.retry_after_ms);
    assert_eq!(
        header(&e.header_pairs(), "x-ratelimit-remaining-requests"),
        "0"
    );
}
