//! Kubernetes mode against kube's mocked API server (`tower_test::mock::pair`): the exact
//! server-side-apply status PATCH requests, a fixed policy flipping `Accepted` back to true,
//! no status from a replica without the Lease, and the Lease rounds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kube_support;

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::kube::lease::{self, Action, LeaseConfig};
use kinf_handler::kube::store::StoredObject;
use kinf_handler::kube::{Controller, KubeOptions};
use kinf_policy::ResourceKind;
use kube::client::Body;
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use kube_support::*;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock() -> (Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "llm"), handle)
}

/// A Kubernetes API error response (`Status`, as the API server sends it).
fn api_error(code: u16, reason: &str, message: &str) -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "code": code, "message": message});
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(&status).unwrap()))
        .unwrap()
}

fn load(c: &Controller, policy_obj: kube::api::DynamicObject) {
    list_all(c, policy_obj);
    c.update_store(|s| {
        s.set_secret(
            "llm",
            "openai-key",
            Some(&secret("openai-key", &[("apiKey", "sk")])),
        )
    });
}

/// Every watch's first listing (no Secret read yet).
fn list_all(c: &Controller, policy_obj: kube::api::DynamicObject) {
    let objs = [
        (ResourceKind::InferenceWorkerSet, worker_set()),
        (ResourceKind::InferenceProvider, provider()),
        (ResourceKind::InferencePool, pool()),
        (ResourceKind::InferencePolicy, policy_obj),
        (ResourceKind::GatewayBackend, gateway()),
    ];
    c.update_store(|s| {
        for (kind, o) in objs {
            s.apply_object_event(kind, Event::Init);
            s.apply_object_event(kind, Event::InitApply(o));
            s.apply_object_event(kind, Event::InitDone);
        }
        s.apply_pod_event(Event::Init);
        s.apply_pod_event(Event::InitApply(pod(
            "vllm-0",
            "vllm",
            Some("10.0.0.1"),
            true,
            Some(8000),
        )));
        s.apply_pod_event(Event::InitDone);
        true
    });
}

fn apply(c: &Controller, gw: &Gateway) {
    let bundle = c.snapshot_bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    c.after_apply(gw, &bundle, &outcome, &diags);
}

/// One request as seen by the mock API server.
#[derive(Debug)]
struct Seen {
    method: String,
    uri: String,
    content_type: String,
    body: Value,
}

/// Answers `n` requests with 200 and the object echoed back; returns what was asked.
async fn serve_patches(handle: &mut Handle, n: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a request")
            .expect("the client is alive");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        let mut echoed = body.clone();
        echoed["metadata"]["resourceVersion"] = json!("2");
        send.send_response(
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&echoed).unwrap()))
                .unwrap(),
        );
        out.push(Seen {
            method: parts.method.to_string(),
            uri: parts.uri.to_string(),
            content_type: parts
                .headers
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
            body,
        });
    }
    out
}

/// Makes the store hold what was written, as the watcher would report it.
fn store_written(c: &Controller, seen: &[Seen]) {
    for s in seen {
        let kind = ResourceKind::parse(s.body["kind"].as_str().unwrap()).unwrap();
        let key = kinf_handler::kube::store::ObjectKey {
            kind,
            namespace: s.body["metadata"]["namespace"].as_str().unwrap().into(),
            name: s.body["metadata"]["name"].as_str().unwrap().into(),
        };
        c.update_store(|st| {
            let mut o = st.object(&key).unwrap().clone();
            o.status = s.body["status"].clone();
            st.upsert(o)
        });
    }
}

#[tokio::test]
async fn leader_sends_the_exact_server_side_apply_status_patch_and_a_fix_flips_accepted() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(2, "iff"));
    apply(&c, &gw);
    c.set_leader(true);
    let expected = c.status_patches(&gw, "2026-11-30T08:00:00Z");
    assert_eq!(expected.len(), 5);

    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 5).await;
    assert_eq!(writer.await.unwrap(), 5);

    let pol = seen
        .iter()
        .find(|s| s.body["kind"] == "InferencePolicy")
        .unwrap();
    assert_eq!(pol.method, "PATCH");
    assert_eq!(
        pol.uri,
        "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/inferencepolicies/routing/status?&force=true&fieldManager=kinference"
    );
    assert_eq!(pol.content_type, "application/apply-patch+yaml");
    let want = expected
        .iter()
        .find(|p| p.key.kind == ResourceKind::InferencePolicy)
        .unwrap();
    // Everything but the transition time (the writer uses the clock) is exactly as computed.
    let strip = |v: &Value| {
        let mut v = v.clone();
        for c in v["status"]["conditions"].as_array_mut().unwrap() {
            c.as_object_mut().unwrap().remove("lastTransitionTime");
        }
        v
    };
    assert_eq!(strip(&pol.body), strip(&want.body));
    assert_eq!(pol.body["apiVersion"], "kinference.buoyant.io/v1alpha1");
    assert_eq!(pol.body["status"]["observedGeneration"], 2);
    let accepted = &pol.body["status"]["conditions"][0];
    assert_eq!(
        (
            accepted["type"].as_str(),
            accepted["status"].as_str(),
            accepted["reason"].as_str()
        ),
        (Some("Accepted"), Some("False"), Some("Invalid"))
    );
    assert!(
        accepted["message"]
            .as_str()
            .unwrap()
            .contains("error[KINF0101] spec.rules[0].route.exclude[0].iff")
    );
    let uris: Vec<&str> = seen
        .iter()
        .map(|s| s.uri.split('?').next().unwrap())
        .collect();
    assert_eq!(
        uris,
        vec![
            "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/inferenceworkersets/vllm/status",
            "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/inferenceproviders/openai/status",
            "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/inferencepools/pool/status",
            "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/inferencepolicies/routing/status",
            "/apis/kinference.buoyant.io/v1alpha1/namespaces/llm/gatewaybackends/front/status",
        ]
    );

    // Nothing changed: nothing is sent again.
    store_written(&c, &seen);
    let again = tokio::time::timeout(Duration::from_secs(2), c.write_status(&gw))
        .await
        .expect("no request is waiting for an answer");
    assert_eq!(again, 0);

    // The policy is fixed (generation 3): Accepted flips back to true everywhere.
    c.update_store(|s| {
        let mut fixed = policy(3, "if");
        fixed.data["status"] = pol.body["status"].clone();
        s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(fixed))
    });
    apply(&c, &gw);
    assert!(gw.store.is_ready());
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 5).await;
    assert_eq!(writer.await.unwrap(), 5);
    for s in &seen {
        let a = &s.body["status"]["conditions"][0];
        assert_eq!(a["type"], "Accepted");
        assert_eq!(a["status"], "True", "{}", s.body);
    }
    let pol = seen
        .iter()
        .find(|s| s.body["kind"] == "InferencePolicy")
        .unwrap();
    assert_eq!(pol.body["status"]["observedGeneration"], 3);
    assert_eq!(pol.body["status"]["conditions"][0]["observedGeneration"], 3);
}

#[tokio::test]
async fn a_replica_without_the_lease_sends_no_status_until_it_wins_it() {
    let (client, mut handle) = mock();
    let c = Controller::new(
        client.clone(),
        KubeOptions::new(Some("llm".into()), "pod-a"),
    );
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    assert!(!c.is_leader());
    let written = tokio::time::timeout(Duration::from_secs(2), c.write_status(&gw))
        .await
        .unwrap();
    assert_eq!(written, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), handle.next_request())
            .await
            .is_err(),
        "a follower sends nothing"
    );

    // The Lease does not exist: GET 404, then POST creates it held by this replica.
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    let round = tokio::spawn({
        let cfg = cfg.clone();
        async move { lease::round(&api, &cfg, "llm", &mut lease::Observed::new()).await }
    });
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "GET");
    assert_eq!(
        req.uri().to_string(),
        "/apis/coordination.k8s.io/v1/namespaces/llm/leases/kinference-leader"
    );
    send.send_response(api_error(
        404,
        "NotFound",
        "leases \"kinference-leader\" not found",
    ));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "POST");
    assert_eq!(
        req.uri().to_string(),
        "/apis/coordination.k8s.io/v1/namespaces/llm/leases?&fieldManager=kinference"
    );
    let body: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body["spec"]["holderIdentity"], "pod-a");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
    send.send_response(
        Response::builder()
            .status(201)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    assert!(round.await.unwrap().unwrap(), "it holds the lease");
    c.set_leader(true);
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 5).await;
    assert!(seen.iter().all(|s| s.method == "PATCH"));
    assert_eq!(writer.await.unwrap(), 5);
}

/// A `renewTime` as the API server writes it.
fn micro(t: k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The Lease `kinference-leader` held by `holder`, as the API server returns it.
fn held_lease(holder: &str, renew_time: &str, resource_version: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kinference-leader", "namespace": "llm",
                     "resourceVersion": resource_version},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": renew_time, "leaseTransitions": 2},
    })
}

/// Answers the next request, which must be a Lease GET, with `lease`.
async fn answer_get(handle: &mut Handle, lease: &Value) {
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "GET", "{} {}", req.method(), req.uri());
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(lease).unwrap(),
    )));
}

/// Another replica's Lease is taken over only once its record has not changed for the lease
/// duration on this replica's monotonic clock — even a `renewTime` years old is not trusted
/// at first sight (a fresh replica waits a full duration).
#[tokio::test(start_paused = true)]
async fn a_lease_held_by_another_replica_is_respected_until_it_expires() {
    let (client, mut handle) = mock();
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    let observed = Arc::new(tokio::sync::Mutex::new(lease::Observed::new()));
    // A round that wrote would wait for an answer: bounded, so that it fails, not hangs.
    let finished = |r: tokio::task::JoinHandle<Result<bool, kube::Error>>| async move {
        tokio::time::timeout(Duration::from_secs(1), r)
            .await
            .expect("the round finished without writing")
            .unwrap()
            .unwrap()
    };
    let round = || {
        let (api, cfg, observed) = (api.clone(), cfg.clone(), observed.clone());
        tokio::spawn(async move {
            let mut observed = observed.lock().await;
            lease::round(&api, &cfg, "llm", &mut observed).await
        })
    };
    let held = held_lease("pod-b", "2020-01-01T00:00:00.000000Z", "7");
    let first_seen = tokio::time::Instant::now();
    let r = round();
    answer_get(&mut handle, &held).await;
    assert!(!finished(r).await, "pod-b holds it");
    tokio::time::sleep_until(first_seen + cfg.duration - Duration::from_millis(1)).await;
    let r = round();
    answer_get(&mut handle, &held).await;
    assert!(
        !finished(r).await,
        "unchanged for less than the lease duration: still pod-b's"
    );

    // Unchanged for the lease duration: taken over with the resourceVersion read (a PUT),
    // transitions counted.
    tokio::time::sleep_until(first_seen + cfg.duration).await;
    let r = round();
    answer_get(&mut handle, &held).await;
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "PUT");
    let body: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    assert_eq!(body["spec"]["holderIdentity"], "pod-a");
    assert_eq!(body["spec"]["leaseTransitions"], 3);
    // Another replica won the race: 409, not leader.
    send.send_response(api_error(409, "Conflict", "conflict"));
    assert!(!finished(r).await);
}

/// A holder whose clock is 10 minutes behind (every `renewTime` long past by this replica's
/// clock) keeps the Lease as long as it renews; once it stops, the Lease is taken over one
/// lease duration (of local time) after the last renewal was seen.
#[tokio::test(start_paused = true)]
async fn a_renewing_holder_whose_clock_is_behind_keeps_the_lease() {
    let (client, mut handle) = mock();
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    let leadership = Arc::new(lease::Leadership::new(cfg.renew_deadline));
    tokio::spawn(lease::run(
        api,
        cfg.clone(),
        "llm".into(),
        leadership.clone(),
    ));
    let behind =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(10);
    let mut held = Value::Null;
    let mut last_change = tokio::time::Instant::now();
    // A minute of rounds, each seeing a renewal (a new renewTime and resourceVersion).
    for i in 0..12 {
        held = held_lease(
            "pod-b",
            &micro(behind + k8s_openapi::jiff::SignedDuration::from_secs(5 * i)),
            &(100 + i).to_string(),
        );
        answer_get(&mut handle, &held).await;
        last_change = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !leadership.is_leader(),
            "round {i}: taken over from a renewing holder"
        );
    }
    // pod-b dies: the record stops changing, and is taken over after the lease duration.
    let taken_over = loop {
        let (req, send) = handle.next_request().await.unwrap();
        if req.method() == "PUT" {
            let body = req.into_body().collect_bytes().await.unwrap();
            send.send_response(Response::new(Body::from(body)));
            break last_change.elapsed();
        }
        assert_eq!(req.method(), "GET");
        assert!(
            last_change.elapsed() < cfg.duration + cfg.renew_every,
            "never taken over"
        );
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&held).unwrap(),
        )));
    };
    assert!(
        taken_over >= cfg.duration && taken_over < cfg.duration + cfg.renew_every,
        "taken over {taken_over:?} after the last renewal was seen"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(leadership.is_leader());
}

/// A dead holder whose clock was 10 minutes ahead (its last `renewTime` still in the future
/// by this replica's clock) loses the Lease one lease duration after its record stopped
/// changing, not when this replica's clock reaches that `renewTime`.
#[tokio::test(start_paused = true)]
async fn a_dead_holder_whose_clock_was_ahead_loses_the_lease_after_the_lease_duration() {
    let (client, mut handle) = mock();
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    let leadership = Arc::new(lease::Leadership::new(cfg.renew_deadline));
    tokio::spawn(lease::run(
        api,
        cfg.clone(),
        "llm".into(),
        leadership.clone(),
    ));
    let ahead =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_mins(10);
    let held = held_lease("pod-b", &micro(ahead), "7");
    let first_seen = tokio::time::Instant::now();
    let taken_over = loop {
        let (req, send) = handle.next_request().await.unwrap();
        if req.method() == "PUT" {
            let body: Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            assert_eq!(body["metadata"]["resourceVersion"], "7");
            assert_eq!(body["spec"]["holderIdentity"], "pod-a");
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&body).unwrap(),
            )));
            break first_seen.elapsed();
        }
        assert_eq!(req.method(), "GET");
        assert!(
            first_seen.elapsed() < cfg.duration + cfg.renew_every,
            "never taken over"
        );
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&held).unwrap(),
        )));
    };
    assert!(
        taken_over >= cfg.duration && taken_over < cfg.duration + cfg.renew_every,
        "taken over {taken_over:?} after the record was first seen"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(leadership.is_leader());
}

#[test]
fn lease_decisions() {
    let cfg = LeaseConfig::new("l", "a");
    let t0 = tokio::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let lease = |holder: &str, renew: &str, version: &str, duration: Option<i32>| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "l", "resourceVersion": version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "renewTime": renew},
        }))
        .unwrap()
    };
    let decide = |o: &mut lease::Observed, l: &Lease, t| lease::decide(Some(l), &cfg, o, t);
    let follow = Action::Follow { holder: "b".into() };
    let mut o = lease::Observed::new();
    assert_eq!(lease::decide(None, &cfg, &mut o, t0), Action::Create);
    let old = "2000-01-01T00:00:00.000000Z";
    assert_eq!(
        decide(&mut o, &lease("a", old, "1", Some(15)), t0),
        Action::Renew
    );
    // No holder (released): at once.
    let mut o = lease::Observed::new();
    assert_eq!(
        decide(&mut o, &lease("", old, "1", Some(15)), t0),
        Action::TakeOver
    );

    // Another holder: expired after 15 s of no change, whatever its renewTime says.
    let mut o = lease::Observed::new();
    let b1 = lease("b", old, "1", Some(15));
    assert_eq!(decide(&mut o, &b1, at(0)), follow);
    assert_eq!(decide(&mut o, &b1, at(14)), follow);
    assert_eq!(decide(&mut o, &b1, at(15)), Action::TakeOver);
    // A renewal (renewTime changed) starts the count again, as does any new resourceVersion.
    let mut o = lease::Observed::new();
    assert_eq!(decide(&mut o, &b1, at(0)), follow);
    let b2 = lease("b", "2000-01-01T00:00:05.000000Z", "2", Some(15));
    assert_eq!(decide(&mut o, &b2, at(14)), follow);
    assert_eq!(decide(&mut o, &b2, at(28)), follow);
    let b3 = lease("b", "2000-01-01T00:00:05.000000Z", "3", Some(15));
    assert_eq!(decide(&mut o, &b3, at(29)), follow);
    assert_eq!(decide(&mut o, &b3, at(43)), follow);
    assert_eq!(decide(&mut o, &b3, at(44)), Action::TakeOver);
    // The record's leaseDurationSeconds counts; without one (or a nonsensical one), ours.
    let mut o = lease::Observed::new();
    let long = lease("b", old, "1", Some(30));
    assert_eq!(decide(&mut o, &long, at(0)), follow);
    assert_eq!(decide(&mut o, &long, at(29)), follow);
    assert_eq!(decide(&mut o, &long, at(30)), Action::TakeOver);
    for d in [None, Some(0), Some(-5)] {
        let mut o = lease::Observed::new();
        let l = lease("b", old, "1", d);
        assert_eq!(decide(&mut o, &l, at(0)), follow);
        assert_eq!(decide(&mut o, &l, at(14)), follow, "{d:?}");
        assert_eq!(decide(&mut o, &l, at(15)), Action::TakeOver, "{d:?}");
    }
    // Deleted and created again: counted afresh.
    let mut o = lease::Observed::new();
    assert_eq!(decide(&mut o, &b1, at(0)), follow);
    assert_eq!(lease::decide(None, &cfg, &mut o, at(10)), Action::Create);
    assert_eq!(decide(&mut o, &b1, at(20)), follow);
    assert_eq!(decide(&mut o, &b1, at(35)), Action::TakeOver);
}

#[tokio::test]
async fn a_new_generation_with_the_content_in_force_is_observed() {
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    let observed = |c: &Controller| {
        c.status_patches(&gw, "2026-11-30T08:00:00Z")
            .into_iter()
            .find(|p| p.key.kind == ResourceKind::InferencePolicy)
            .unwrap()
            .status()
            .clone()
    };
    assert_eq!(observed(&c)["observedGeneration"], 1);
    // Edited (generation 2) and reverted (generation 3) within the debounce: the content is
    // the one in force, so no bundle is compiled; status still observes generation 3.
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        );
        s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(policy(3, "if")))
    });
    let st = observed(&c);
    assert_eq!(st["observedGeneration"], 3, "{st}");
    for cond in st["conditions"].as_array().unwrap() {
        assert_eq!(cond["observedGeneration"], 3, "{cond}");
    }
    assert_eq!(st["conditions"][0]["status"], "True");

    // A generation with other content that was not compiled yet is not claimed as observed.
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(4, "iff")),
        )
    });
    assert_ne!(observed(&c)["observedGeneration"], 4);
}

#[tokio::test]
async fn a_deleted_and_recreated_object_gets_its_status_written_again() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    c.set_leader(true);
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 5).await;
    assert_eq!(writer.await.unwrap(), 5);
    store_written(&c, &seen);

    // `kubectl replace --force`: the same content under a new uid, without status. The
    // content is unchanged, so no bundle is compiled.
    c.update_store(|s| {
        let old = policy(1, "if");
        s.apply_object_event(ResourceKind::InferencePolicy, Event::Delete(old));
        let mut new = policy(1, "if");
        new.metadata.uid = Some("uid-routing-2".into());
        s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(new))
    });
    // Transition times are the new object's, not the deleted one's.
    let later = "2030-01-01T00:00:00Z";
    let pol = c
        .status_patches(&gw, later)
        .into_iter()
        .find(|p| p.key.kind == ResourceKind::InferencePolicy)
        .unwrap();
    for cond in pol.status()["conditions"].as_array().unwrap() {
        assert_eq!(cond["lastTransitionTime"], later, "{cond}");
    }
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 1).await;
    assert_eq!(writer.await.unwrap(), 1);
    assert_eq!(seen[0].body["kind"], "InferencePolicy");
    assert_eq!(seen[0].body["status"]["observedGeneration"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lease_requests_hang_steps_down_before_the_lease_can_be_taken_over() {
    let (client, mut handle) = mock();
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    assert!(cfg.renew_deadline < cfg.duration);
    let leadership = Arc::new(lease::Leadership::new(cfg.renew_deadline));
    tokio::spawn(lease::run(
        api,
        cfg.clone(),
        "llm".into(),
        leadership.clone(),
    ));
    // First round: no Lease (404), created (201): leader.
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "GET");
    send.send_response(api_error(404, "NotFound", "nf"));
    let renewed = tokio::time::Instant::now();
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "POST");
    let body = req.into_body().collect_bytes().await.unwrap();
    send.send_response(
        Response::builder()
            .status(201)
            .body(Body::from(body))
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(leadership.is_leader());

    // From now on every Lease request hangs (a half-open connection): taken, never answered.
    let mut hanging = Vec::new();
    let stepped_down = loop {
        tokio::select! {
            r = handle.next_request() => hanging.push(r.unwrap()),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if !leadership.is_leader() {
            break renewed.elapsed();
        }
        assert!(
            renewed.elapsed() < cfg.duration,
            "still the leader when another replica may take the Lease over"
        );
    };
    assert!(
        stepped_down < cfg.duration && stepped_down >= cfg.renew_deadline - Duration::from_secs(1),
        "stepped down after {stepped_down:?}"
    );
    // Rounds go on: the hanging one is abandoned after `renew_every` and the next one starts.
    let until = tokio::time::Instant::now() + cfg.renew_every + Duration::from_secs(1);
    while tokio::time::Instant::now() < until {
        tokio::select! {
            r = handle.next_request() => hanging.push(r.unwrap()),
            () = tokio::time::sleep_until(until) => {}
        }
    }
    assert!(!leadership.is_leader());
    assert!(
        hanging.len() >= 2,
        "a hanging round is abandoned and the next one starts: {} requests",
        hanging.len()
    );
}

#[tokio::test]
async fn the_first_bundle_waits_until_every_referenced_secret_was_read_once() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    list_all(&c, policy(1, "if"));
    assert!(
        !c.first_bundle_ready(),
        "every watch listed, but the provider's Secret was not read yet"
    );
    // The read fails (500): attempted once is enough (the Secret stays "not read").
    let reader = {
        let c = c.clone();
        tokio::spawn(async move { c.read_secrets(false).await })
    };
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(
        req.uri().path(),
        "/api/v1/namespaces/llm/secrets/openai-key"
    );
    send.send_response(api_error(500, "InternalError", "boom"));
    reader.await.unwrap();
    assert!(c.first_bundle_ready());
    assert_eq!(
        c.with_store(|s| s.secret_state("llm", "openai-key", None)),
        None,
        "a failed read is not \"not found\""
    );

    // Found, or not found, counts as read too.
    let c2 = Controller::new(mock().0, KubeOptions::new(Some("llm".into()), "pod-a"));
    list_all(&c2, policy(1, "if"));
    assert!(!c2.first_bundle_ready());
    c2.update_store(|s| s.set_secret("llm", "openai-key", None));
    assert!(c2.first_bundle_ready());
}

/// Later bundles wait for a Secret they newly name too (the apply loop holds them until
/// [`Controller::secrets_read`], at most 12 s), and a Secret no longer named is forgotten:
/// named again, it is read afresh instead of served from a value that may have been revoked.
#[tokio::test]
async fn a_newly_named_secret_is_read_before_use_and_an_unnamed_one_is_forgotten() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    load(&c, policy(1, "if"));
    assert!(c.secrets_read());
    // The provider now names another Secret.
    let mut p = provider();
    p.metadata.generation = Some(2);
    p.data["spec"]["credentials"]["secretRef"]["name"] = json!("openai-key-2");
    c.update_store(|s| s.apply_object_event(ResourceKind::InferenceProvider, Event::Apply(p)));
    assert!(!c.secrets_read(), "the new Secret is not read yet");
    // The reader reads only the new one, and forgets the old one.
    let reader = {
        let c = c.clone();
        tokio::spawn(async move { c.read_secrets(false).await })
    };
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(
        req.uri().path(),
        "/api/v1/namespaces/llm/secrets/openai-key-2"
    );
    send.send_response(api_error(404, "NotFound", "not found"));
    reader.await.unwrap();
    assert!(c.secrets_read());
    assert_eq!(
        c.with_store(|s| s.secret_state("llm", "openai-key", None)),
        None,
        "the Secret no one names is forgotten"
    );
    // Named again: not read yet, so it waits for a fresh read.
    c.update_store(|s| {
        s.apply_object_event(ResourceKind::InferenceProvider, Event::Apply(provider()))
    });
    assert!(!c.secrets_read());
}

#[tokio::test]
async fn a_holder_shutting_down_releases_the_lease_and_resigns() {
    let (client, mut handle) = mock();
    let api: Api<Lease> = Api::namespaced(client, "llm");
    let cfg = LeaseConfig::new("kinference-leader", "pod-a");
    let now = k8s_openapi::jiff::Timestamp::now();
    let held_by = |holder: &str| {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kinference-leader", "namespace": "llm", "resourceVersion": "9"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
        })
    };
    // Held by us: cleared, with the resourceVersion read.
    let release = tokio::spawn({
        let (api, cfg) = (api.clone(), cfg.clone());
        async move { lease::release(&api, &cfg).await }
    });
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "GET");
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&held_by("pod-a")).unwrap(),
    )));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "PUT");
    let body: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body["metadata"]["resourceVersion"], "9");
    assert!(body["spec"]["holderIdentity"].is_null(), "{body}");
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&body).unwrap(),
    )));
    assert!(release.await.unwrap().unwrap(), "released");
    // Another replica can take it over at once.
    let released: Lease = serde_json::from_value(body).unwrap();
    assert_eq!(
        lease::decide(
            Some(&released),
            &LeaseConfig::new("kinference-leader", "pod-b"),
            &mut lease::Observed::new(),
            tokio::time::Instant::now(),
        ),
        Action::TakeOver
    );

    // Held by another replica: left alone (no write).
    let release = tokio::spawn(async move { lease::release(&api, &cfg).await });
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&held_by("pod-b")).unwrap(),
    )));
    assert!(!release.await.unwrap().unwrap());

    // A resigned replica is not the leader, and a renewal in flight does not make it one.
    let leadership = lease::Leadership::new(std::time::Duration::from_secs(10));
    leadership.renewed(tokio::time::Instant::now());
    assert!(leadership.is_leader());
    leadership.resign();
    assert!(!leadership.is_leader());
    leadership.renewed(tokio::time::Instant::now());
    assert!(!leadership.is_leader());
}

#[tokio::test]
async fn while_a_bundle_is_refused_the_worker_sets_in_force_decide_the_endpoints() {
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    let endpoints = |gw: &Gateway| -> Vec<String> {
        let mut v: Vec<String> = gw.state.with(|st| {
            st.worker_sets["llm/vllm"]
                .endpoints
                .iter()
                .map(|e| e.address.to_string())
                .collect()
        });
        v.sort();
        v
    };
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    assert_eq!(endpoints(&gw), ["10.0.0.1:8000"]);
    // An unrelated error refuses the bundle, and in it the worker set's selector was changed
    // to pods labelled `other`: a refused edit, which must not take effect.
    let mut ws = worker_set();
    ws.metadata.generation = Some(2);
    ws.data["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
    c.update_store(|s| {
        s.apply_pod_event(Event::Apply(pod(
            "other-0",
            "other",
            Some("10.0.0.3"),
            true,
            Some(8000),
        )));
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        );
        s.apply_object_event(ResourceKind::InferenceWorkerSet, Event::Apply(ws));
        true
    });
    apply(&c, &gw);
    assert!(gw.store.last_rejected().is_some(), "the bundle was refused");
    assert_eq!(
        endpoints(&gw),
        ["10.0.0.1:8000"],
        "the refused selector leaked in"
    );
    // Pods the worker set in force selects still come and go.
    c.update_store(|s| {
        s.apply_pod_event(Event::Apply(pod(
            "vllm-1",
            "vllm",
            Some("10.0.0.2"),
            true,
            Some(8000),
        )))
    });
    apply(&c, &gw);
    assert_eq!(endpoints(&gw), ["10.0.0.1:8000", "10.0.0.2:8000"]);
    // Deleting the worker set is refused too (the pool still names it): its endpoints stay.
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferenceWorkerSet,
            Event::Delete(worker_set()),
        )
    });
    apply(&c, &gw);
    assert_eq!(endpoints(&gw), ["10.0.0.1:8000", "10.0.0.2:8000"]);
}

#[tokio::test]
async fn while_a_bundle_is_refused_the_secrets_in_force_are_still_read() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    // A refused bundle in which the provider names another Secret: the one in force must
    // still be read, or a key revoked in it would stay valid while the refusal lasts.
    let mut p = provider();
    p.metadata.generation = Some(2);
    p.data["spec"]["credentials"] = json!({"secretRef": {"name": "openai-key-2"}});
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        );
        s.apply_object_event(ResourceKind::InferenceProvider, Event::Apply(p))
    });
    apply(&c, &gw);
    assert!(gw.store.last_rejected().is_some());
    let reading = tokio::spawn({
        let c = c.clone();
        async move { c.read_secrets(true).await }
    });
    // Both reads are asked for before either is answered: one slow Secret does not hold up
    // the others.
    let mut asked = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..2 {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a Secret read")
            .unwrap();
        asked.push(req.uri().path().to_owned());
        pending.push(send);
    }
    for send in pending {
        send.send_response(api_error(404, "NotFound", "not found"));
    }
    reading.await.unwrap();
    asked.sort();
    assert_eq!(
        asked,
        [
            "/api/v1/namespaces/llm/secrets/openai-key",
            "/api/v1/namespaces/llm/secrets/openai-key-2"
        ]
    );
}

#[tokio::test]
async fn a_forbidden_secret_is_reported_as_forbidden_not_missing() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    list_all(&c, policy(1, "if"));
    let answer = api_error(403, "Forbidden", "secrets \"openai-key\" is forbidden");
    read_secrets_answering(&c, &mut handle, answer).await;
    let why = c.with_store(|s| {
        (
            s.secret_state("llm", "openai-key", None),
            s.secret_errors()
                .get(&("llm".to_owned(), "openai-key".to_owned()))
                .cloned(),
        )
    });
    assert_eq!(why.0, None, "not recorded as read and missing");
    assert!(why.1.unwrap().contains("forbidden"));
}

/// `GET /admin/status` of `gw`, as JSON.
async fn admin_status(gw: &Arc<Gateway>) -> Value {
    use tower::ServiceExt;
    let resp = gw
        .router_with_admin()
        .oneshot(
            Request::get("/admin/status")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn admin_status_shows_the_controllers_lease_watches_secrets_and_last_bundle() {
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    // Standalone: no `kubernetes` section.
    assert_eq!(admin_status(&gw).await["kubernetes"], Value::Null);
    let status: Arc<dyn kinf_handler::gateway::ControllerStatus> = c.clone();
    assert!(gw.controller.set(status).is_ok());

    // Starting: nothing listed, not the leader, no bundle.
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["identity"], "pod-a");
    assert_eq!(k["namespace"], "llm");
    assert_eq!(k["lease"], "llm/kinference-leader");
    assert_eq!(k["leader"], false);
    assert_eq!(k["lastRenewalAgeMs"], Value::Null);
    assert_eq!(k["firstBundleReady"], false);
    assert_eq!(k["store"]["watches"]["InferencePolicy"]["synced"], false);
    assert_eq!(k["lastBundle"], Value::Null);

    // Every watch listed; the provider's Secret not read yet.
    list_all(&c, policy(1, "if"));
    let k = admin_status(&gw).await["kubernetes"].clone();
    for kind in [
        "InferenceWorkerSet",
        "InferenceProvider",
        "InferencePool",
        "InferencePolicy",
        "GatewayBackend",
        "Pod",
    ] {
        assert_eq!(
            k["store"]["watches"][kind],
            json!({"synced": true, "objects": 1}),
            "{kind}"
        );
    }
    assert_eq!(k["store"]["secrets"]["notRead"], json!(["llm/openai-key"]));
    assert_eq!(k["firstBundleReady"], false);

    // The Secret read fails, then is found; a bundle is applied; the Lease is won.
    c.update_store(|s| s.secret_read_failed("llm", "openai-key", "timed out"));
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(
        k["store"]["secrets"]["readErrors"]["llm/openai-key"],
        "timed out"
    );
    assert_eq!(k["firstBundleReady"], true);
    c.update_store(|s| {
        s.set_secret(
            "llm",
            "openai-key",
            Some(&secret("openai-key", &[("apiKey", "sk")])),
        )
    });
    apply(&c, &gw);
    c.set_leader(true);
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["store"]["secrets"]["found"], json!(["llm/openai-key"]));
    assert_eq!(k["store"]["secrets"]["readErrors"], json!({}));
    assert_eq!(k["leader"], true);
    assert!(
        k["lastRenewalAgeMs"].as_u64().is_some_and(|ms| ms < 5_000),
        "{k}"
    );
    assert_eq!(k["lastBundle"]["inForce"], true);
    assert_eq!(k["lastBundle"]["objects"], 5);
    assert_eq!(k["lastBundle"]["errors"], 0);
    let first = k["lastBundle"]["revision"].as_u64().unwrap();

    // A refused bundle is the last one, not in force; losing the Lease shows at once.
    load(&c, policy(2, "iff"));
    apply(&c, &gw);
    c.set_leader(false);
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["lastBundle"]["revision"].as_u64(), Some(first + 1));
    assert_eq!(k["lastBundle"]["inForce"], false);
    assert!(k["lastBundle"]["errors"].as_u64().unwrap() > 0, "{k}");
    assert_eq!(k["leader"], false);
    assert_eq!(k["lastRenewalAgeMs"], Value::Null);
}

#[tokio::test]
async fn a_replica_starting_while_the_bundle_is_refused_serves_the_last_good_policy() {
    // The leader keeps the objects of the policy in force in a ConfigMap beside the Lease.
    let (client, mut handle) = mock();
    let c1 = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw1 = Gateway::new(GatewayOptions::default());
    load(&c1, policy(1, "if"));
    const KEY: &str = "sk-kept-nowhere-4242";
    c1.update_store(|s| {
        s.set_secret(
            "llm",
            "openai-key",
            Some(&secret("openai-key", &[("apiKey", KEY)])),
        )
    });
    apply(&c1, &gw1);
    assert!(!c1.persist_last_good().await, "a follower keeps nothing");
    c1.set_leader(true);
    let writer = {
        let c1 = c1.clone();
        tokio::spawn(async move { c1.persist_last_good().await })
    };
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "PATCH");
    assert_eq!(
        req.uri().to_string(),
        "/api/v1/namespaces/llm/configmaps/kinference-leader-last-good?&force=true&fieldManager=kinference"
    );
    let kept: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(kept["kind"], "ConfigMap");
    let inner = kept["data"]["objects.json"].as_str().unwrap();
    let objects: Value = serde_json::from_str(inner).unwrap();
    assert_eq!(objects.as_array().unwrap().len(), 5);
    assert!(
        c1.snapshot_bundle()
            .resolved
            .secret("llm", "openai-key", "apiKey")
            .is_some_and(|v| v.expose() == KEY),
        "the bundle holds the key"
    );
    assert!(!inner.contains(KEY), "Secret values are never kept");
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&kept).unwrap()))
            .unwrap(),
    );
    assert!(writer.await.unwrap());
    assert!(
        !c1.persist_last_good().await,
        "unchanged: not written again"
    );
    // Leadership lost and won back: another leader may have written meanwhile, so the
    // ConfigMap is written again even though this replica's policy did not change.
    c1.set_leader(false);
    assert!(!c1.persist_last_good().await);
    c1.set_leader(true);
    let writer = {
        let c1 = c1.clone();
        tokio::spawn(async move { c1.persist_last_good().await })
    };
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("written again")
        .unwrap();
    assert_eq!(req.method(), "PATCH");
    let again: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(again["data"], kept["data"]);
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&again).unwrap()))
            .unwrap(),
    );
    assert!(writer.await.unwrap());

    // A new replica starts while someone's edit is invalid: it reads the kept policy and
    // serves it, with the refusal visible.
    let (client, mut handle) = mock();
    let c2 = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-b"));
    let gw2 = Gateway::new(GatewayOptions::default());
    let status: Arc<dyn kinf_handler::gateway::ControllerStatus> = c2.clone();
    assert!(gw2.controller.set(status).is_ok());
    let reader = {
        let c2 = c2.clone();
        tokio::spawn(async move { c2.load_last_good().await })
    };
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), "GET");
    assert_eq!(
        req.uri().path(),
        "/api/v1/namespaces/llm/configmaps/kinference-leader-last-good"
    );
    // (The kept provider names another Secret than the current one: the replica must read
    // it before its first bundle, since a refusal serves the kept policy.)
    let mut objects = objects;
    for o in objects.as_array_mut().unwrap() {
        if o["kind"] == "InferenceProvider" {
            o["spec"]["credentials"]["secretRef"]["name"] = json!("kept-key");
        }
    }
    let mut kept2 = kept.clone();
    kept2["data"]["objects.json"] = json!(objects.to_string());
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&kept2).unwrap()))
            .unwrap(),
    );
    assert!(reader.await.unwrap());
    load(&c2, policy(2, "iff"));
    assert!(
        !c2.first_bundle_ready(),
        "the kept policy's Secret was not read yet"
    );
    c2.update_store(|s| {
        s.set_secret(
            "llm",
            "kept-key",
            Some(&secret("kept-key", &[("apiKey", "sk-2")])),
        )
    });
    assert!(c2.first_bundle_ready());
    apply(&c2, &gw2);
    assert!(gw2.store.last_rejected().is_some(), "the refusal is kept");
    let served = gw2.store.current().expect("the kept policy is in force");
    let policy_src = served
        .sources
        .iter()
        .find(|(_, f)| f.name.starts_with("InferencePolicy/"))
        .map(|(_, f)| f.text.to_string())
        .unwrap();
    assert!(
        policy_src.contains("if:") && !policy_src.contains("iff"),
        "{policy_src}"
    );
    let names = |a: &kinf_handler::policy_store::Applied| {
        a.sources
            .iter()
            .map(|(_, f)| format!("{}\n{}", f.name, f.text))
            .collect::<Vec<_>>()
    };
    // The same policy as the replica that kept it: the same sources, compiled with the
    // same pods as endpoints.
    let mut want = names(&gw1.store.current().unwrap());
    for w in &mut want {
        *w = w.replace("name: \"openai-key\"", "name: \"kept-key\"");
    }
    assert_eq!(names(&served), want);
    let endpoints = |a: &kinf_handler::policy_store::Applied| {
        a.policy
            .destinations
            .iter()
            .filter_map(|d| {
                d.worker_set
                    .as_ref()
                    .map(|w| (d.name.clone(), w.endpoints.clone()))
            })
            .collect::<Vec<_>>()
    };
    let kept_endpoints = endpoints(&served);
    assert_eq!(kept_endpoints, endpoints(&gw1.store.current().unwrap()));
    assert_eq!(kept_endpoints[0].1.len(), 1, "{kept_endpoints:?}");
    let k = admin_status(&gw2).await["kubernetes"].clone();
    assert_eq!(k["lastGood"]["serving"], true, "{k}");
    assert_eq!(k["lastGood"]["servingNamespaces"], json!(["llm"]), "{k}");
    assert_eq!(
        k["lastGood"]["configMap"],
        "llm/kinference-leader-last-good"
    );

    // Once a bundle of its own is in force, the kept one is no longer used.
    load(&c2, policy(3, "if"));
    apply(&c2, &gw2);
    assert!(gw2.store.last_rejected().is_none());
    let k = admin_status(&gw2).await["kubernetes"].clone();
    assert_eq!(k["lastGood"]["serving"], false);
    assert_eq!(k["lastGood"]["servingNamespaces"], json!([]));

    // Nothing kept (404): a refused first bundle leaves the replica not ready, as before.
    let (client, mut handle) = mock();
    let c3 = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-c"));
    let gw3 = Gateway::new(GatewayOptions::default());
    let reader = {
        let c3 = c3.clone();
        tokio::spawn(async move { c3.load_last_good().await })
    };
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(api_error(404, "NotFound", "configmaps not found"));
    assert!(!reader.await.unwrap());
    load(&c3, policy(2, "iff"));
    apply(&c3, &gw3);
    assert!(!gw3.store.is_ready());
}

/// GET `path` on the gateway with its admin routes: status and body.
async fn get_text(gw: &Arc<Gateway>, path: &str) -> (StatusCode, String) {
    use tower::ServiceExt;
    let resp = gw
        .router_with_admin()
        .oneshot(Request::get(path).body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn one_teams_invalid_object_does_not_hold_back_another_teams_edit() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(None, "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    let status: Arc<dyn kinf_handler::gateway::ControllerStatus> = c.clone();
    assert!(gw.controller.set(status).is_ok());
    let team_b = |c: &Controller, generation: i64, key: &str| {
        c.update_store(|s| {
            for (kind, o) in team_b_objects(generation, key) {
                s.apply_object_event(kind, Event::Apply(o));
            }
            true
        });
    };
    load(&c, policy(1, "if"));
    team_b(&c, 8, "if");
    apply(&c, &gw);
    assert_eq!(gw.store.current().unwrap().generation, 1);

    // Team `llm` breaks its policy; team `team-b` tightens its own.
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        )
    });
    team_b(&c, 4, "if");
    apply(&c, &gw);
    assert_eq!(
        gw.store.current().unwrap().generation,
        2,
        "team-b's edit is a new generation"
    );
    let text = |label: &str| in_force_text(&gw, label).unwrap();
    assert!(text("InferencePolicy/team-b/routing").contains("greaterThan: 4"));
    assert!(!text("InferencePolicy/llm/routing").contains("iff"));

    // `/readyz`, `/admin/status` and the metrics name the refused namespace.
    let (code, body) = get_text(&gw, "/readyz").await;
    assert_eq!(code, StatusCode::OK);
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        ready["lastRefused"]["namespaces"],
        json!(["llm"]),
        "{ready}"
    );
    assert_eq!(ready["lastRefused"]["codes"], json!(["KINF0101"]));
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["lastBundle"]["inForce"], true, "{k}");
    assert_eq!(k["lastBundle"]["refusedNamespaces"], json!(["llm"]));
    let (_, metrics) = get_text(&gw, "/metrics").await;
    for line in [
        "kinference_policy_refused 1.0",
        "kinference_policy_refused_namespaces 1.0",
        "kinference_policy_reloads_total{result=\"partly_applied\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }

    // The leader writes every object's status: team-b's are accepted, llm's say why not.
    c.set_leader(true);
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 9).await;
    assert_eq!(writer.await.unwrap(), 9);
    let accepted = |label: &str| {
        let (kind, rest) = label.split_once('/').unwrap();
        let (ns, name) = rest.split_once('/').unwrap();
        seen.iter()
            .find(|s| {
                s.body["kind"] == kind
                    && s.body["metadata"]["namespace"] == ns
                    && s.body["metadata"]["name"] == name
            })
            .map(|s| s.body["status"]["conditions"][0].clone())
            .unwrap()
    };
    for label in [
        "InferencePolicy/team-b/routing",
        "InferencePool/team-b/pool",
        "GatewayBackend/team-b/front",
        "InferenceWorkerSet/team-b/vllm",
    ] {
        assert_eq!(accepted(label)["status"], "True", "{label}");
    }
    assert_eq!(accepted("InferencePolicy/llm/routing")["reason"], "Invalid");
    assert_eq!(
        accepted("InferencePool/llm/pool")["reason"],
        "NamespaceRefused"
    );

    // The last good policy kept for new replicas is what is in force: llm's generation 1,
    // team-b's generation 4.
    let persist = {
        let c = c.clone();
        tokio::spawn(async move { c.persist_last_good().await })
    };
    let (req, send) = handle.next_request().await.unwrap();
    let kept: Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&kept).unwrap()))
            .unwrap(),
    );
    assert!(persist.await.unwrap());
    let objects: Value =
        serde_json::from_str(kept["data"]["objects.json"].as_str().unwrap()).unwrap();
    let kept_policy = |ns: &str| {
        objects
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["kind"] == "InferencePolicy" && o["namespace"] == ns)
            .map(|o| o["spec"].to_string())
            .unwrap()
    };
    assert!(kept_policy("llm").contains("\"if\""), "{objects}");
    assert!(
        kept_policy("team-b").contains("\"greaterThan\":4"),
        "{objects}"
    );

    // llm fixed: everything applied, nothing refused.
    c.update_store(|s| {
        s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(policy(3, "if")))
    });
    apply(&c, &gw);
    assert!(gw.store.last_rejected().is_none());
    let (_, metrics) = get_text(&gw, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "kinference_policy_refused_namespaces 0.0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn after_a_partial_apply_the_refused_namespace_is_served_from_the_kept_policy() {
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(None, "pod-b"));
    let gw = Gateway::new(GatewayOptions::default());
    let status: Arc<dyn kinf_handler::gateway::ControllerStatus> = c.clone();
    assert!(gw.controller.set(status).is_ok());
    // What the leader kept: llm's generation 1 and team-b's limit 8.
    let kept: Vec<StoredObject> = [
        (ResourceKind::InferenceWorkerSet, worker_set()),
        (ResourceKind::InferenceProvider, provider()),
        (ResourceKind::InferencePool, pool()),
        (ResourceKind::InferencePolicy, policy(1, "if")),
        (ResourceKind::GatewayBackend, gateway()),
    ]
    .into_iter()
    .chain(team_b_objects(8, "if"))
    .map(|(kind, o)| StoredObject::from_dynamic(kind, &o).unwrap())
    .collect();
    c.seed_last_good(kept);
    // The replica starts while llm's policy is invalid and team-b has moved on.
    load(&c, policy(2, "iff"));
    c.update_store(|s| {
        for (kind, o) in team_b_objects(4, "if") {
            s.apply_object_event(kind, Event::Apply(o));
        }
        true
    });
    apply(&c, &gw);
    assert!(gw.store.is_ready(), "served");
    let text = |label: &str| in_force_text(&gw, label).unwrap();
    assert!(
        !text("InferencePolicy/llm/routing").contains("iff"),
        "llm: the kept policy"
    );
    assert!(text("InferencePolicy/team-b/routing").contains("greaterThan: 4"));
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["lastGood"]["serving"], false, "{k}");
    assert_eq!(k["lastGood"]["servingNamespaces"], json!(["llm"]), "{k}");
    // llm fixed: nothing is served from the kept policy any more.
    load(&c, policy(3, "if"));
    apply(&c, &gw);
    let k = admin_status(&gw).await["kubernetes"].clone();
    assert_eq!(k["lastGood"]["servingNamespaces"], json!([]), "{k}");
}

#[tokio::test]
async fn while_a_bundle_is_refused_pods_only_the_worker_sets_in_force_select_publish_a_bundle() {
    use kinf_handler::kube::ContentKey;
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    let first = c.content_key();
    assert!(ContentKey::needs_publish(None, &first), "the first bundle");
    apply(&c, &gw);
    // A bundle was applied and nothing else changed: no new bundle.
    let applied = c.content_key();
    assert!(!ContentKey::needs_publish(Some(&first), &applied));

    // A refused edit points the worker set at pods labelled `other`.
    let mut ws = worker_set();
    ws.metadata.generation = Some(2);
    ws.data["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        );
        s.apply_object_event(ResourceKind::InferenceWorkerSet, Event::Apply(ws))
    });
    let refused = c.content_key();
    assert!(ContentKey::needs_publish(Some(&applied), &refused));
    apply(&c, &gw);
    assert!(gw.store.last_rejected().is_some());

    // A pod that only the worker set in force selects: the bundle's own content is the same,
    // but the policy in force must get the endpoint.
    c.update_store(|s| {
        s.apply_pod_event(Event::Apply(pod(
            "vllm-1",
            "vllm",
            Some("10.0.0.2"),
            true,
            Some(8000),
        )))
    });
    let pod_added = c.content_key();
    assert_eq!(
        pod_added.bundle, refused.bundle,
        "the bundle did not change"
    );
    assert!(ContentKey::needs_publish(Some(&refused), &pod_added));
    apply(&c, &gw);
    let mut endpoints: Vec<String> = gw.state.with(|st| {
        st.worker_sets["llm/vllm"]
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    });
    endpoints.sort();
    assert_eq!(endpoints, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    // Nothing changed since: no new bundle.
    assert!(!ContentKey::needs_publish(
        Some(&pod_added),
        &c.content_key()
    ));
}

/// The same after a partial apply: namespace `llm` is refused (its edit also points its worker
/// set elsewhere) while `team-b`'s objects are applied, which puts a new list of objects in
/// force. A pod that only `llm`'s worker set in force selects must still reach the policy in
/// force. Before, the apply loop compared the objects in force by identity, and a partial apply
/// always makes a new list, so such pod changes were never published.
#[tokio::test]
async fn after_a_partial_apply_pods_only_the_kept_worker_sets_select_publish_a_bundle() {
    use kinf_handler::kube::ContentKey;
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(None, "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    let team_b = |c: &Controller, generation: i64| {
        c.update_store(|s| {
            for (kind, o) in team_b_objects(generation, "if") {
                s.apply_object_event(kind, Event::Apply(o));
            }
            true
        });
    };
    load(&c, policy(1, "if"));
    team_b(&c, 8);
    apply(&c, &gw);
    let applied = c.content_key();

    // `llm` breaks its policy and points its worker set at pods labelled `other`; `team-b`
    // edits its own policy.
    let mut ws = worker_set();
    ws.metadata.generation = Some(2);
    ws.data["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
    c.update_store(|s| {
        s.apply_object_event(
            ResourceKind::InferencePolicy,
            Event::Apply(policy(2, "iff")),
        );
        s.apply_object_event(ResourceKind::InferenceWorkerSet, Event::Apply(ws))
    });
    team_b(&c, 4);
    let edited = c.content_key();
    assert!(ContentKey::needs_publish(Some(&applied), &edited));
    apply(&c, &gw);
    assert_eq!(
        gw.store.last_rejected().and_then(|r| r.namespaces.clone()),
        Some(vec!["llm".to_owned()]),
        "a partial apply"
    );

    // A pod that only `llm`'s worker set in force selects.
    c.update_store(|s| {
        s.apply_pod_event(Event::Apply(pod(
            "vllm-1",
            "vllm",
            Some("10.0.0.2"),
            true,
            Some(8000),
        )))
    });
    let pod_added = c.content_key();
    assert_eq!(pod_added.bundle, edited.bundle, "the bundle did not change");
    assert!(ContentKey::needs_publish(Some(&edited), &pod_added));
    apply(&c, &gw);
    let mut endpoints: Vec<String> = gw.state.with(|st| {
        st.worker_sets["llm/vllm"]
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    });
    endpoints.sort();
    assert_eq!(endpoints, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    // Published once for those pods: not again, neither before nor after it was applied.
    assert!(!ContentKey::needs_publish(
        Some(&pod_added),
        &c.content_key()
    ));
}

/// A pod joining a worker set makes a new gateway policy generation. Only the worker set's own
/// status changes (its pod count); every other object's stays as written. Before, every
/// message named the gateway's generation, so each pod change rewrote every object's status.
#[tokio::test]
async fn a_pod_change_rewrites_only_the_status_that_changed() {
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    c.set_leader(true);
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 5).await;
    assert_eq!(writer.await.unwrap(), 5);
    store_written(&c, &seen);
    let first = gw.store.current().unwrap().generation;

    c.update_store(|s| {
        s.apply_pod_event(Event::Apply(pod(
            "vllm-1",
            "vllm",
            Some("10.0.0.2"),
            true,
            Some(8000),
        )))
    });
    apply(&c, &gw);
    assert!(gw.store.current().unwrap().generation > first);
    let writer = {
        let (c, gw) = (c.clone(), gw.clone());
        tokio::spawn(async move { c.write_status(&gw).await })
    };
    let seen = serve_patches(&mut handle, 1).await;
    assert_eq!(
        seen[0].body["kind"], "InferenceWorkerSet",
        "{:?}",
        seen[0].body
    );
    // No other object's status is sent.
    let more = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    assert!(
        more.is_err(),
        "another status was rewritten: {:?}",
        more.ok().flatten().map(|(r, _)| r.uri().to_string())
    );
    assert_eq!(writer.await.unwrap(), 1, "one object's status changed");
}

/// A bundle made for pods that change back before it is applied: the loop saw the pods equal
/// to what was in force and published nothing, and the apply then put the bundle's pods in
/// force. The apply wakes the loop, which then publishes the pods of now.
#[tokio::test]
async fn pods_that_change_back_while_a_bundle_is_applied_publish_again() {
    use kinf_handler::kube::ContentKey;
    let (client, _handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    let gw = Gateway::new(GatewayOptions::default());
    load(&c, policy(1, "if"));
    apply(&c, &gw);
    let vllm1 = || pod("vllm-1", "vllm", Some("10.0.0.2"), true, Some(8000));
    // A pod joins; its bundle is made...
    c.update_store(|s| s.apply_pod_event(Event::Apply(vllm1())));
    let published = c.content_key();
    let bundle = c.snapshot_bundle();
    // ...the pod leaves before it is applied: nothing to publish yet.
    c.update_store(|s| s.apply_pod_event(Event::Delete(vllm1())));
    let mut changes = c.subscribe_changes();
    changes.borrow_and_update();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    c.after_apply(&gw, &bundle, &outcome, &diags);
    assert!(changes.has_changed().unwrap(), "the apply loop is woken");
    assert!(ContentKey::needs_publish(
        Some(&published),
        &c.content_key()
    ));
    // An apply whose pods are the pods of now wakes nothing.
    apply(&c, &gw);
    let mut changes = c.subscribe_changes();
    changes.borrow_and_update();
    apply(&c, &gw);
    assert!(!changes.has_changed().unwrap());
}

/// Log lines written while the subscriber is the thread's default.
#[derive(Clone, Default)]
struct LogCapture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Captures the log lines at `level` and above while the guard lives, as the thread's
    /// default subscriber (a current-thread runtime: the reading task runs on this thread).
    fn install(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = LogCapture::default();
        let sink = logs.clone();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || sink.clone())
                .with_ansi(false)
                .with_max_level(level)
                .finish(),
        );
        (logs, guard)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Reads the referenced Secrets once (`c` references one), the API server answering the read
/// with `answer`; returns the path read.
async fn read_secrets_answering(
    c: &Arc<Controller>,
    handle: &mut Handle,
    answer: Response<Body>,
) -> String {
    let reading = tokio::spawn({
        let c = c.clone();
        async move { c.read_secrets(true).await }
    });
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a Secret read")
        .unwrap();
    send.send_response(answer);
    reading.await.unwrap();
    req.uri().path().to_owned()
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_again_is_logged_and_its_value_kept() {
    let (logs, _log) = LogCapture::install(tracing::Level::WARN);
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    load(&c, policy(1, "if"));
    let answer = api_error(500, "InternalError", "etcdserver: request timed out");
    assert_eq!(
        read_secrets_answering(&c, &mut handle, answer).await,
        "/api/v1/namespaces/llm/secrets/openai-key"
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("cannot read the Secret again"))
        .unwrap_or_else(|| panic!("a warning: {text:?}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("secret=llm/openai-key"), "{line}");
    assert!(line.contains("etcdserver: request timed out"), "{line}");
    assert!(
        line.contains("the value read before stays in use"),
        "{line}"
    );
    assert!(!line.contains("sk"), "never the value: {line}");
    // The value read before is still the one used; the error is recorded for the status.
    assert_eq!(
        c.with_store(|s| s.secret_state("llm", "openai-key", Some("apiKey"))),
        Some(true)
    );
    assert!(
        c.snapshot_bundle()
            .resolved
            .secret("llm", "openai-key", "apiKey")
            .is_some_and(|v| v.expose() == "sk")
    );
    assert!(c.with_store(|s| {
        s.secret_errors()
            .contains_key(&("llm".to_owned(), "openai-key".to_owned()))
    }));
}

/// A Secret whose reads keep failing the same way is warned about once, not at every re-read
/// (every 30 s): again when the error changes, and at `info` when a read succeeds again.
#[tokio::test]
async fn a_secret_failing_the_same_way_is_warned_about_once() {
    let (logs, _log) = LogCapture::install(tracing::Level::INFO);
    let (client, mut handle) = mock();
    let c = Controller::new(client, KubeOptions::new(Some("llm".into()), "pod-a"));
    load(&c, policy(1, "if"));
    let warnings = |logs: &LogCapture| {
        logs.text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("cannot read the Secret"))
            .count()
    };
    let failures = [
        "etcdserver: request timed out",
        "etcdserver: request timed out",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
    ];
    for (i, why) in failures.into_iter().enumerate() {
        read_secrets_answering(&c, &mut handle, api_error(500, "InternalError", why)).await;
        let want = if i < 3 { 1 } else { 2 };
        assert_eq!(
            warnings(&logs),
            want,
            "after read {}: {}",
            i + 1,
            logs.text()
        );
    }
    // The last failure shows in the status.
    assert!(c.with_store(|s| {
        s.secret_errors()
            .get(&("llm".to_owned(), "openai-key".to_owned()))
            .is_some_and(|e| e.contains("etcdserver: leader changed"))
    }));
    // A read that succeeds again says so, once.
    for _ in 0..2 {
        let body = serde_json::to_vec(&secret("openai-key", &[("apiKey", "sk-2")])).unwrap();
        let answer = Response::builder().body(Body::from(body)).unwrap();
        read_secrets_answering(&c, &mut handle, answer).await;
    }
    let text = logs.text();
    let recovered: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("the Secret can be read again"))
        .collect();
    assert_eq!(recovered.len(), 1, "{text}");
    assert!(recovered[0].contains("INFO") && recovered[0].contains("secret=llm/openai-key"));
    assert!(!text.contains("sk-2"), "never the value: {text}");
    assert_eq!(warnings(&logs), 2, "{text}");
}
