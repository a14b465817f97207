//! Behaviour of one simulated engine: LRU eviction with reference counts, chunked prefill,
//! scheduler limits, preemption, the step-time model, aborts and rejections.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_router::kv_events::KvEvent;
use kinf_sim::hash::block_hashes;
use kinf_sim::{
    Engine, EngineOptions, FinishReason, Output, Profile, RejectReason, Request, RequestStats,
};

fn tiny(f: impl FnOnce(&mut Profile)) -> Engine {
    let mut p = Profile::tiny();
    f(&mut p);
    Engine::new(p, EngineOptions::default()).unwrap()
}

fn toks(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 1000 + i) % 997).collect()
}

/// Runs until idle, checking invariants after every event.
fn drain(e: &mut Engine) -> Vec<Output> {
    let mut out = Vec::new();
    while e.advance_next(&mut out).is_some() {
        e.check_invariants().unwrap();
    }
    out
}

fn removed(out: &[Output]) -> Vec<u64> {
    let mut v = Vec::new();
    for o in out {
        if let Output::KvEvents(b) = o {
            for e in &b.events {
                if let KvEvent::BlockRemoved(r) = e {
                    v.extend(r.block_hashes.iter().copied());
                }
            }
        }
    }
    v
}

fn stored(out: &[Output]) -> Vec<u64> {
    let mut v = Vec::new();
    for o in out {
        if let Output::KvEvents(b) = o {
            for e in &b.events {
                if let KvEvent::BlockStored(s) = e {
                    v.extend(s.block_hashes.iter().copied());
                }
            }
        }
    }
    v
}

fn finished(out: &[Output]) -> Vec<(u64, FinishReason, RequestStats)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Finished(f) => Some((f.id, f.reason, f.stats)),
            _ => None,
        })
        .collect()
}

#[test]
fn lru_evicts_least_recently_freed_blocks_tail_first_and_never_referenced_ones() {
    // 12 blocks of 4 tokens.
    let mut e = tiny(|p| p.num_gpu_blocks = 12);
    let (p1, p2, p3) = (toks(1, 16), toks(2, 16), toks(3, 32));
    let (h1, h2, h3) = (
        block_hashes(&p1, 4),
        block_hashes(&p2, 4),
        block_hashes(&p3, 4),
    );

    e.submit(Request::new(1, p1.clone(), 1), 0.0).unwrap();
    let out = drain(&mut e);
    assert_eq!(stored(&out), h1);
    e.submit(Request::new(2, p2.clone(), 1), e.now()).unwrap();
    drain(&mut e);
    assert_eq!(e.cached_block_hashes().len(), 8);
    assert_eq!(e.gauges().kv_cache_usage, 0.0, "cached blocks are free");

    // Eight new blocks: the four never used, then request 1's (freed before request 2's),
    // last block first.
    e.submit(Request::new(3, p3.clone(), 1), e.now()).unwrap();
    let out = drain(&mut e);
    let mut want: Vec<u64> = h1.clone();
    want.reverse();
    assert_eq!(removed(&out), want);
    assert_eq!(e.cached_prefix_blocks(&h2), 4);
    assert_eq!(e.cached_prefix_blocks(&h3), 8);

    // Request 4 reuses p2 (a hit takes references on its four blocks) and keeps decoding
    // while request 5 needs seven blocks: eviction must take request 3's blocks, never p2's.
    let mut p4 = p2.clone();
    p4.extend(toks(4, 4));
    e.submit(Request::new(4, p4, 12), e.now()).unwrap();
    let mut out = Vec::new();
    e.advance_into(e.now() + 0.0015, &mut out);
    let hit = out.iter().find_map(|o| match o {
        Output::FirstToken { cached_tokens, .. } => Some(*cached_tokens),
        _ => None,
    });
    assert_eq!(hit, Some(16));
    e.submit(Request::new(5, toks(5, 28), 2), e.now()).unwrap();
    out.extend(drain(&mut e));
    let gone = removed(&out);
    assert!(!gone.is_empty());
    assert!(gone.iter().all(|h| !h2.contains(h)), "p2 was referenced");
    assert!(gone.iter().all(|h| h3.contains(h) || !h1.contains(h)));
    assert_eq!(e.cached_prefix_blocks(&h2), 4);
    assert_eq!(finished(&out).len(), 2);
    let c = e.counters();
    assert_eq!(c.requests_finished, 5);
    assert_eq!(c.preemptions, 0);
}

#[test]
fn chunked_prefill_splits_prompts_by_the_token_budget() {
    // Budget 32 tokens: a 100-token prompt takes 4 steps (32, 32, 32, 4).
    let mut e = tiny(|_| {});
    let prompt = toks(7, 100);
    e.submit(Request::new(1, prompt.clone(), 3), 0.0).unwrap();
    let mut out = Vec::new();
    let mut chunks = Vec::new();
    while e.next_event_time().is_some() {
        e.advance_next(&mut out);
        if let Some(s) = e.current_step() {
            chunks.push((s.prefill_tokens, s.decode_seqs));
        }
    }
    assert_eq!(
        chunks,
        vec![(32, 0), (32, 0), (32, 0), (4, 0), (0, 1), (0, 1)]
    );
    // Each chunk's newly full blocks are stored with the step that computed them, chained on
    // the previous chunk's last block.
    let hashes = block_hashes(&prompt, 4);
    let events: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::KvEvents(b) => Some(b),
            _ => None,
        })
        .collect();
    let firsts: Vec<(usize, Option<u64>)> = events
        .iter()
        .filter_map(|b| match b.events.first() {
            Some(KvEvent::BlockStored(s)) => Some((s.block_hashes.len(), s.parent)),
            _ => None,
        })
        .collect();
    assert_eq!(
        &firsts[..4],
        &[
            (8, None),
            (8, Some(hashes[7])),
            (8, Some(hashes[15])),
            (1, Some(hashes[23]))
        ]
    );
    // TTFT = the four prefill steps (no API-server delay in `tiny`), by the step model.
    let m = Profile::tiny().step;
    let want: f64 = [32.0, 32.0, 32.0, 4.0]
        .iter()
        .map(|n| m.base_s + m.per_prefill_token_s * n)
        .sum();
    let (_, _, stats) = finished(&out)[0];
    assert!((stats.ttft().unwrap() - want).abs() < 1e-12);
    let itl = m.base_s + m.per_decode_seq_s;
    assert!((stats.mean_itl().unwrap() - itl).abs() < 1e-12);
    assert_eq!(stats.output_tokens, 3);
}

#[test]
fn decodes_share_steps_with_a_prefill_chunk() {
    let mut e = tiny(|_| {});
    e.submit(Request::new(1, toks(1, 8), 50), 0.0).unwrap();
    let mut out = Vec::new();
    e.advance_into(0.01, &mut out); // request 1 is decoding
    e.submit(Request::new(2, toks(2, 200), 2), 0.01).unwrap();
    let mut seen = Vec::new();
    while e.next_event_time().is_some() {
        e.advance_next(&mut out);
        if let Some(s) = e.current_step() {
            assert!(s.tokens <= 32);
            seen.push((s.prefill_tokens, s.decode_seqs));
        }
    }
    // While request 2 prefills, request 1 still decodes each step and the chunk takes the rest
    // of the budget.
    assert!(seen.contains(&(31, 1)), "{seen:?}");
}

#[test]
fn without_chunked_prefill_a_prompt_runs_in_one_step() {
    let mut e = tiny(|p| {
        p.enable_chunked_prefill = false;
        p.max_num_batched_tokens = 512;
    });
    e.submit(Request::new(1, toks(1, 100), 2), 0.0).unwrap();
    let mut steps = Vec::new();
    let mut out = Vec::new();
    while e.next_event_time().is_some() {
        e.advance_next(&mut out);
        if let Some(s) = e.current_step() {
            steps.push(s.prefill_tokens);
        }
    }
    assert_eq!(steps, vec![100, 0]);
}

#[test]
fn max_num_seqs_and_token_budget_bound_every_step() {
    let mut e = tiny(|p| {
        p.max_num_seqs = 3;
        p.max_num_batched_tokens = 20;
    });
    for i in 0..10 {
        e.submit(Request::new(i, toks(i as u32, 30 + i as usize), 5), 0.0)
            .unwrap();
    }
    let mut out = Vec::new();
    let mut max_running = 0;
    while e.next_event_time().is_some() {
        e.advance_next(&mut out);
        e.check_invariants().unwrap();
        let g = e.gauges();
        assert!(g.running <= 3);
        assert_eq!(g.running + g.waiting, e.num_live());
        max_running = max_running.max(g.running);
        if let Some(s) = e.current_step() {
            assert!(s.tokens <= 20, "{s:?}");
            assert!(s.scheduled <= 3);
        }
    }
    assert_eq!(max_running, 3);
    let f = finished(&out);
    assert_eq!(f.len(), 10);
    // FCFS: requests are first scheduled in submission order.
    let mut by_sched: Vec<_> = f
        .iter()
        .map(|(id, _, s)| (s.scheduled.unwrap(), *id))
        .collect();
    by_sched.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let ids: Vec<u64> = by_sched.iter().map(|x| x.1).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
}

#[test]
fn a_full_cache_preempts_the_newest_request_which_recomputes() {
    // 20 blocks of 4 tokens; three requests that each grow to 60 tokens (15 blocks).
    let mut e = tiny(|p| p.num_gpu_blocks = 20);
    for i in 0..3 {
        e.submit(Request::new(i, toks(10 + i as u32, 20), 40), 0.0)
            .unwrap();
    }
    let out = drain(&mut e);
    let f = finished(&out);
    assert_eq!(f.len(), 3);
    assert!(
        f.iter()
            .all(|(_, r, s)| *r == FinishReason::Length && s.output_tokens == 40)
    );
    assert!(e.counters().preemptions > 0);
    assert!(f.iter().any(|(_, _, s)| s.preemptions > 0));
    assert_eq!(e.gauges().kv_cache_usage, 0.0);
}

#[test]
fn token_outputs_and_itl_accounting() {
    let mut e = tiny(|_| {});
    e.submit(Request::new(9, toks(1, 10), 6), 0.0).unwrap();
    e.submit(Request::new(10, toks(2, 10), 4), 0.0).unwrap();
    let out = drain(&mut e);
    let mut idx: Vec<(u64, u32)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Token {
                id, index, token, ..
            } => {
                assert!(*token < 1000);
                Some((*id, *index))
            }
            _ => None,
        })
        .collect();
    idx.sort_unstable();
    let want: Vec<(u64, u32)> = (0..6)
        .map(|i| (9, i))
        .chain((0..4).map(|i| (10, i)))
        .collect();
    assert_eq!(idx, want);
    let m = e.metrics();
    assert_eq!(m.counters.generation_tokens, 10);
    assert_eq!(m.histograms.itl.count, 5 + 3);
    assert_eq!(m.histograms.ttft.count, 2);
    assert_eq!(m.counters.prompt_tokens, 20);
    assert_eq!(m.counters.prefix_cache_queries, 20);
    let times: Vec<f64> = out.iter().map(Output::time).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    // Generated tokens are the documented function of the seed.
    let t0 = out.iter().find_map(|o| match o {
        Output::Token {
            id: 9,
            index: 2,
            token,
            ..
        } => Some(*token),
        _ => None,
    });
    assert_eq!(t0, Some(kinf_sim::output_token(9, 2, 1000)));
}

#[test]
fn api_server_delay_counts_in_ttft() {
    let mut p = Profile::tiny();
    p.frontend.fixed_s = 0.5;
    p.frontend.per_prompt_token_s = 0.01;
    let mut e = Engine::new(p.clone(), EngineOptions::default()).unwrap();
    e.submit(Request::new(1, toks(1, 10), 1), 2.0).unwrap();
    assert!((e.next_event_time().unwrap() - 2.6).abs() < 1e-12);
    assert_eq!(e.gauges().waiting, 1);
    let out = drain(&mut e);
    let (_, _, s) = finished(&out)[0];
    let step = p.step.base_s + p.step.per_prefill_token_s * 10.0;
    assert!((s.ttft().unwrap() - (0.6 + step)).abs() < 1e-12);
    assert!((s.ready - 2.6).abs() < 1e-12);
}

#[test]
fn aborts_release_blocks_and_report_once() {
    let mut e = tiny(|_| {});
    e.submit(Request::new(1, toks(1, 40), 100), 0.0).unwrap();
    e.submit(Request::new(2, toks(2, 40), 100), 0.0).unwrap();
    e.submit(Request::new(3, toks(3, 40), 100), 1.0).unwrap();
    let mut out = Vec::new();
    e.advance_into(0.05, &mut out);
    assert!(e.gauges().kv_cache_usage > 0.0);
    assert!(e.abort(1));
    assert!(e.abort(3)); // still in the API-server queue (submitted for t = 1)
    assert!(!e.abort(42));
    out.extend(drain(&mut e));
    let f = finished(&out);
    assert_eq!(f.len(), 3);
    let reasons: Vec<_> = f.iter().map(|(id, r, _)| (*id, *r)).collect();
    assert!(reasons.contains(&(1, FinishReason::Abort)));
    assert!(reasons.contains(&(3, FinishReason::Abort)));
    assert!(reasons.contains(&(2, FinishReason::Length)));
    assert_eq!(e.counters().requests_aborted, 2);
    assert_eq!(e.gauges().kv_cache_usage, 0.0);
    assert!(e.is_idle());
}

#[test]
fn rejections() {
    let mut e = tiny(|p| p.max_model_len = 64);
    let r = |id, n, max| Request::new(id, toks(1, n), max);
    assert_eq!(
        e.submit(r(1, 64, 1), 0.0).unwrap_err().reason,
        RejectReason::PromptTooLong
    );
    assert_eq!(
        e.submit(r(2, 0, 1), 0.0).unwrap_err().reason,
        RejectReason::EmptyPrompt
    );
    assert_eq!(
        e.submit(r(3, 4, 0), 0.0).unwrap_err().reason,
        RejectReason::NoOutput
    );
    assert_eq!(
        e.submit(r(4, 4, 1), f64::NAN).unwrap_err().reason,
        RejectReason::BadTime
    );
    e.submit(r(5, 60, 100), 0.0).unwrap();
    assert_eq!(
        e.submit(r(5, 4, 1), 0.0).unwrap_err().reason,
        RejectReason::DuplicateId
    );
    // max_tokens is clamped to the model length.
    let out = drain(&mut e);
    assert_eq!(finished(&out)[0].2.output_tokens, 4);
    assert_eq!(e.counters().requests_rejected, 5);
    // A cache smaller than max_model_len bounds the sequence length instead.
    let e = tiny(|p| p.num_gpu_blocks = 8);
    assert_eq!(e.max_len(), 32);
}

#[test]
fn reset_prefix_cache_clears_when_idle_only() {
    let mut e = tiny(|_| {});
    e.submit(Request::new(1, toks(1, 16), 30), 0.0).unwrap();
    let mut out = Vec::new();
    e.advance_into(0.005, &mut out);
    assert!(!e.reset_prefix_cache(), "blocks in use");
    drain(&mut e);
    assert!(!e.cached_block_hashes().is_empty());
    assert!(e.reset_prefix_cache());
    assert!(e.cached_block_hashes().is_empty());
    let out = drain(&mut e);
    assert!(matches!(
        out.as_slice(),
        [Output::KvEvents(b)] if b.events == vec![KvEvent::AllBlocksCleared]
    ));
}

#[test]
fn kv_batches_encode_to_vllm_payloads_that_decode_back() {
    let mut e = tiny(|p| p.num_gpu_blocks = 12);
    for i in 0..4 {
        e.submit(Request::new(i, toks(i as u32, 30), 3), 0.0)
            .unwrap();
    }
    let out = drain(&mut e);
    let mut n = 0;
    for o in &out {
        if let Output::KvEvents(b) = o {
            let bytes = b.payload(1_700_000_000.5, Some(0));
            let (ts, events, rank) = kinf_router::kv_events::decode_payload(&bytes).unwrap();
            assert_eq!(ts, 1_700_000_000.5);
            assert_eq!(rank, Some(0));
            assert_eq!(events, b.events);
            n += 1;
        }
    }
    assert!(n > 0);
    assert!(!removed(&out).is_empty(), "the small cache evicted");
}
