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
    // Larger than the whole budget: admitted on a full bucket (leaving a debt), then refused.
    let big = admit(&l, &r).unwrap();
    assert_eq!(big.limits().collect::<Vec<_>>(), vec!["p/batch"]);
    let e = exceeded(admit(&l, &req_batch()).unwrap_err());
    assert_eq!(&*e.limit, "p/batch");
    drop(big);
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
