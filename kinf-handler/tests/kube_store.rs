//! Kubernetes mode without an API server: watcher events go into the controller's store; the
//! bundle it produces is applied through the same path as a directory's; the compiled policy,
//! the endpoint set and the exact status of every object are asserted (insta snapshots).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kube_support;

use std::sync::Arc;

use kinf_handler::ApplyOutcome;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::kube::status::{self, LiveCounts, SecretKeys, StatusInput, WorkerSetLive};
use kinf_handler::kube::store::{ClusterStore, ObjectKey, StoredObject};
use kinf_policy::ResourceKind;
use kube::runtime::watcher::Event;
use kube_support::*;
use serde_json::{Value, json};

const NOW: &str = "2026-11-30T08:00:00Z";

/// Lists every CRD and the pods like a fresh watcher does (Init, InitApply…, InitDone).
fn initial_store(policy_obj: kube::api::DynamicObject) -> ClusterStore {
    let mut s = ClusterStore::new();
    let objs = [
        (ResourceKind::InferenceWorkerSet, vec![worker_set()]),
        (ResourceKind::InferenceProvider, vec![provider()]),
        (ResourceKind::InferencePool, vec![pool()]),
        (ResourceKind::InferencePolicy, vec![policy_obj]),
        (ResourceKind::GatewayBackend, vec![gateway()]),
    ];
    for (kind, list) in objs {
        s.apply_object_event(kind, Event::Init);
        for o in list {
            s.apply_object_event(kind, Event::InitApply(o));
        }
        assert!(s.apply_object_event(kind, Event::InitDone));
    }
    s.apply_pod_event(Event::Init);
    for p in [
        pod("vllm-0", "vllm", Some("10.0.0.1"), true, Some(8000)),
        pod("vllm-1", "vllm", Some("10.0.0.2"), false, Some(8000)),
        pod("vllm-2", "vllm", Some("10.0.0.4"), true, Some(9000)),
        pod("vllm-3", "vllm", None, false, None),
        pod("other", "web", Some("10.0.0.3"), true, Some(8000)),
    ] {
        s.apply_pod_event(Event::InitApply(p));
    }
    assert!(s.apply_pod_event(Event::InitDone));
    s
}

fn gateway_() -> Arc<Gateway> {
    Gateway::new(GatewayOptions::default())
}

fn endpoints(gw: &Gateway, ws: &str) -> Vec<String> {
    let applied = gw.store.current().unwrap();
    let d = applied
        .policy
        .destinations
        .iter()
        .find(|d| format!("{}/{}", d.namespace, d.name) == ws)
        .unwrap();
    let from_policy: Vec<String> = d
        .worker_set
        .as_ref()
        .unwrap()
        .endpoints
        .iter()
        .map(|e| e.to_string())
        .collect();
    let from_state: Vec<String> = gw.state.with(|st| {
        st.worker_sets[ws]
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    });
    assert_eq!(
        from_policy, from_state,
        "the cluster state follows the policy"
    );
    from_policy
}

fn secrets_known(s: &ClusterStore) -> SecretKeys {
    s.referenced_secrets()
        .into_iter()
        .filter_map(|(ns, n)| {
            let found = s.secret_state(&ns, &n, None)?;
            let keys = found.then(|| {
                s.bundle()
                    .resolved
                    .secrets
                    .get(&(ns.clone(), n.clone()))
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default()
            });
            Some(((ns, n), keys))
        })
        .collect()
}

fn patches(
    s: &ClusterStore,
    gw: &Gateway,
    bundle: &kinf_handler::bundle::ConfigBundle,
    outcome: &ApplyOutcome,
    diags: &[kinf_lang::Diagnostic],
    live: &LiveCounts,
) -> Vec<(String, Value)> {
    let objects: Vec<StoredObject> = s.objects().cloned().collect();
    let current = gw.store.current();
    let secrets = secrets_known(s);
    let refused: Option<std::collections::BTreeSet<String>> = outcome
        .refused_namespaces()
        .map(|ns| ns.iter().cloned().collect());
    status::compute(&StatusInput {
        objects: &objects,
        sources: &bundle.sources,
        diagnostics: diags,
        in_force: outcome.in_force(),
        refused_namespaces: refused.as_ref(),
        generation: current.as_ref().map(|c| c.generation),
        policy: current.as_ref().map(|c| &*c.policy),
        in_force_sources: current.as_ref().map(|c| &c.sources),
        live,
        secrets: &secrets,
        secret_errors: &s.secret_errors().clone(),
        now: NOW,
    })
    .into_iter()
    .map(|p| (p.key.label(), p.body))
    .collect()
}

/// Condition `type_` of object `label` in the status patches.
fn condition(p: &[(String, Value)], label: &str, type_: &str) -> Value {
    p.iter().find(|(k, _)| k == label).unwrap().1["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
        .clone()
}

fn live() -> LiveCounts {
    let mut l = LiveCounts::default();
    l.worker_sets.insert(
        "llm/vllm".into(),
        WorkerSetLive {
            selected_pods: Some(4),
            endpoints: 2,
            ready_endpoints: 2,
            kv_streams: 0,
            kv_connected: 0,
        },
    );
    l.providers.insert("llm/openai".into(), true);
    l
}

#[test]
fn selected_ready_pods_become_the_worker_sets_endpoints() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let bundle = s.bundle();
    assert_eq!(bundle.sources.len(), 5, "one source per object");
    assert_eq!(
        bundle.resolved.endpoints["llm/vllm"],
        vec!["10.0.0.1:8000", "10.0.0.4:9000"],
        "ready pods with an IP, on their `http` container port; not the unready, IP-less or unselected ones"
    );
    let gw = gateway_();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert_eq!(
        outcome,
        ApplyOutcome::Applied { generation: 1 },
        "{diags:?}"
    );
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.1:8000", "10.0.0.4:9000"]
    );
    // Live ingestion (scrapers, KV subscribers) follows the policy's endpoints: every replica
    // tracks the discovered pods like static endpoints.
    let tracked: Vec<String> =
        kinf_handler::live::EndpointSpec::from_policy(&gw.store.current().unwrap().policy)
            .into_iter()
            .map(|e| format!("{} {}", e.worker_set, e.address))
            .collect();
    assert_eq!(
        tracked,
        vec!["llm/vllm 10.0.0.1:8000", "llm/vllm 10.0.0.4:9000"]
    );
    let applied = gw.store.current().unwrap();
    let pool = applied.policy.pool("llm", "pool").unwrap();
    assert_eq!(pool.rules.len(), 1);
    assert_eq!(pool.model_names(), vec!["Qwen/Qwen3-8B", "qwen"]);

    // A pod becomes ready, another is deleted: the policy is re-applied with the new set.
    assert!(s.apply_pod_event(Event::Apply(pod(
        "vllm-1",
        "vllm",
        Some("10.0.0.2"),
        true,
        Some(8000)
    ))));
    assert!(s.apply_pod_event(Event::Delete(pod(
        "vllm-0",
        "vllm",
        Some("10.0.0.1"),
        true,
        Some(8000)
    ))));
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert_eq!(outcome, ApplyOutcome::Applied { generation: 2 });
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.2:8000", "10.0.0.4:9000"]
    );

    // The same event again changes nothing.
    assert!(!s.apply_pod_event(Event::Apply(pod(
        "vllm-1",
        "vllm",
        Some("10.0.0.2"),
        true,
        Some(8000)
    ))));
    assert_eq!(gw.apply_bundle(&s.bundle()).0, ApplyOutcome::Unchanged);

    // An explicit `spec.port` wins over container ports.
    let mut ws = worker_set();
    ws.data["spec"]["port"] = json!(8080);
    assert!(s.apply_object_event(ResourceKind::InferenceWorkerSet, Event::Apply(ws)));
    assert_eq!(
        s.bundle().resolved.endpoints["llm/vllm"],
        vec!["10.0.0.2:8080", "10.0.0.4:8080"]
    );
}

#[test]
fn provider_credentials_come_from_the_secret() {
    let mut s = initial_store(policy(1, "if"));
    let gw = gateway_();
    gw.apply_bundle(&s.bundle());
    let p = gw.providers.load_full();
    assert!(
        format!("{p:?}").contains("SecretMissing"),
        "without the Secret the provider has no credentials: {p:?}"
    );
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert!(
        matches!(outcome, ApplyOutcome::Applied { .. }),
        "a new Secret value re-applies the policy"
    );
    let p = gw.providers.load_full();
    assert!(!format!("{p:?}").contains("SecretMissing"), "{p:?}");
}

#[test]
fn status_of_a_clean_bundle() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    insta::assert_json_snapshot!("status_clean", p);
    for (_, body) in &p {
        let accepted = &body["status"]["conditions"][0];
        assert_eq!(accepted["status"], "True", "{body}");
    }
}

#[test]
fn status_names_the_error_by_code_field_path_and_help_and_a_fix_flips_accepted() {
    let mut s = initial_store(policy(2, "iff"));
    s.set_secret("llm", "openai-key", None);
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(matches!(outcome, ApplyOutcome::Refused { .. }));
    assert!(!gw.store.is_ready(), "nothing was applied");
    let broken = patches(&s, &gw, &bundle, &outcome, &diags, &LiveCounts::default());
    insta::assert_json_snapshot!("status_broken", broken);
    let pol = &broken
        .iter()
        .find(|(k, _)| k == "InferencePolicy/llm/routing")
        .unwrap()
        .1;
    let accepted = &pol["status"]["conditions"][0];
    assert_eq!(accepted["status"], "False");
    assert_eq!(accepted["reason"], "Invalid");
    let msg = accepted["message"].as_str().unwrap();
    assert!(
        msg.contains("error[KINF0101] spec.rules[0].route.exclude[0].iff"),
        "code and field path: {msg}"
    );
    assert!(msg.contains("did you mean `if`"), "help: {msg}");
    let pool_accepted = &broken
        .iter()
        .find(|(k, _)| k == "InferencePool/llm/pool")
        .unwrap()
        .1["status"]["conditions"][0];
    assert_eq!(pool_accepted["reason"], "BundleRefused");
    assert!(
        pool_accepted["message"]
            .as_str()
            .unwrap()
            .contains("InferencePolicy/llm/routing"),
        "other objects say which one is wrong"
    );
    let provider_refs = &broken
        .iter()
        .find(|(k, _)| k == "InferenceProvider/llm/openai")
        .unwrap()
        .1["status"]["conditions"][1];
    assert_eq!(provider_refs["reason"], "SecretNotFound");

    // The stored status is what was written; then the policy is fixed (generation 3).
    for (k, body) in &broken {
        let key = ObjectKey::parse_label(k).unwrap();
        let mut o = s.object(&key).unwrap().clone();
        o.status = body["status"].clone();
        s.upsert(o);
    }
    let mut fixed_obj = policy(3, "if");
    fixed_obj.data["status"] = s
        .object(&ObjectKey::parse_label("InferencePolicy/llm/routing").unwrap())
        .unwrap()
        .status
        .clone();
    s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(fixed_obj));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert_eq!(outcome, ApplyOutcome::Applied { generation: 1 });
    let later = "2026-11-30T08:05:00Z";
    let objects: Vec<StoredObject> = s.objects().cloned().collect();
    let current = gw.store.current().unwrap();
    let secrets = secrets_known(&s);
    let fixed = status::compute(&StatusInput {
        objects: &objects,
        sources: &bundle.sources,
        diagnostics: &diags,
        in_force: true,
        refused_namespaces: None,
        generation: Some(current.generation),
        policy: Some(&current.policy),
        in_force_sources: Some(&current.sources),
        live: &live(),
        secrets: &secrets,
        secret_errors: &s.secret_errors().clone(),
        now: later,
    });
    let pol = fixed
        .iter()
        .find(|p| p.key.kind == ResourceKind::InferencePolicy)
        .unwrap();
    assert_eq!(pol.status()["observedGeneration"], 3);
    let c = &pol.status()["conditions"];
    assert_eq!(c[0]["type"], "Accepted");
    assert_eq!(c[0]["status"], "True");
    assert_eq!(c[0]["reason"], "Accepted");
    assert_eq!(c[0]["lastTransitionTime"], later, "the condition changed");
    assert_eq!(c[1]["status"], "True");
    assert_eq!(
        c[1]["lastTransitionTime"], NOW,
        "ResolvedRefs stayed True: its transition time is kept"
    );
}

#[test]
fn status_of_an_up_to_date_object_needs_no_write() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "k")])),
    );
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let objects: Vec<StoredObject> = s.objects().cloned().collect();
    let current = gw.store.current();
    let secrets = secrets_known(&s);
    let input = StatusInput {
        objects: &objects,
        sources: &bundle.sources,
        diagnostics: &diags,
        in_force: outcome.in_force(),
        refused_namespaces: None,
        generation: current.as_ref().map(|c| c.generation),
        policy: current.as_ref().map(|c| &*c.policy),
        in_force_sources: current.as_ref().map(|c| &c.sources),
        live: &live(),
        secrets: &secrets,
        secret_errors: &s.secret_errors().clone(),
        now: NOW,
    };
    let first = status::compute(&input);
    for p in &first {
        assert!(!status::up_to_date(&Value::Null, p));
        // The API server adds nothing we compare; a stored copy is up to date.
        assert!(status::up_to_date(&p.status().clone(), p));
    }
}

#[test]
fn selectors_with_expressions() {
    use std::collections::BTreeMap;
    let labels: BTreeMap<String, String> = [
        ("app".to_owned(), "vllm".to_owned()),
        ("tier".to_owned(), "gpu".to_owned()),
    ]
    .into();
    let sel = |v: Value| status_sel(&v, &labels);
    assert!(sel(json!({})));
    assert!(sel(json!({"matchLabels": {"app": "vllm"}})));
    assert!(!sel(json!({"matchLabels": {"app": "web"}})));
    assert!(sel(
        json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]})
    ));
    assert!(!sel(
        json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]})
    ));
    assert!(sel(
        json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})
    ));
    assert!(!sel(
        json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    ));
    assert!(!sel(
        json!({"matchExpressions": [{"key": "tier", "operator": "Bogus"}]})
    ));
}

fn status_sel(v: &Value, labels: &std::collections::BTreeMap<String, String>) -> bool {
    kinf_handler::kube::store::selector_matches(v, labels)
}

/// The tenant a front door resolves for `Authorization: Bearer key` (`Err`: the key is refused).
fn tenant_of(gw: &Gateway, key: &str) -> Result<Option<String>, String> {
    let rt = gw.runtime().unwrap();
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        format!("Bearer {key}").parse().unwrap(),
    );
    let tenants = rt.door(None).tenants.as_ref().map_err(Clone::clone)?;
    tenants
        .resolve(&h)
        .map(|t| t.map(|t| t.to_string()))
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn a_refused_bundle_still_carries_pod_and_secret_changes_into_the_policy_in_force() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let mut door = gateway();
    door.data["spec"]["tenants"] = json!({"apiKeys": {"secretRef": {"name": "tenant-keys"}}});
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Apply(door));
    s.set_secret(
        "llm",
        "tenant-keys",
        Some(&secret(
            "tenant-keys",
            &[("team-a", "key-a"), ("team-b", "key-b")],
        )),
    );
    let gw = gateway_();
    let (outcome, diags) = gw.apply_bundle(&s.bundle());
    assert_eq!(
        outcome,
        ApplyOutcome::Applied { generation: 1 },
        "{diags:?}"
    );
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.1:8000", "10.0.0.4:9000"]
    );
    assert_eq!(tenant_of(&gw, "key-b"), Ok(Some("team-b".to_owned())));

    // An unrelated object breaks: the bundle is refused, the policy in force stays.
    s.apply_object_event(
        ResourceKind::InferencePolicy,
        Event::Apply(policy(2, "iff")),
    );
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert!(matches!(outcome, ApplyOutcome::Refused { .. }));

    // A rollout meanwhile: the new pod is used, the deleted one is not.
    s.apply_pod_event(Event::Apply(pod(
        "vllm-1",
        "vllm",
        Some("10.0.0.2"),
        true,
        Some(8000),
    )));
    s.apply_pod_event(Event::Delete(pod(
        "vllm-0",
        "vllm",
        Some("10.0.0.1"),
        true,
        Some(8000),
    )));
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert!(
        matches!(outcome, ApplyOutcome::Refused { .. }),
        "the new sources are still refused"
    );
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.2:8000", "10.0.0.4:9000"],
        "the endpoints of the policy in force follow the pods"
    );
    assert!(
        gw.store.last_rejected().is_some(),
        "the refusal stays recorded (readyz, admin status, metrics)"
    );
    let in_force = gw.store.current().unwrap();
    assert!(
        in_force
            .sources
            .iter()
            .any(|(_, f)| f.text.contains("if:") && !f.text.contains("iff:")),
        "the last good sources stay in force"
    );

    // A tenant key is revoked meanwhile: it stops working at once.
    s.set_secret(
        "llm",
        "tenant-keys",
        Some(&secret("tenant-keys", &[("team-a", "key-a")])),
    );
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert!(matches!(outcome, ApplyOutcome::Refused { .. }));
    assert!(
        tenant_of(&gw, "key-b").is_err(),
        "the revoked key is refused: {:?}",
        tenant_of(&gw, "key-b")
    );
    assert_eq!(tenant_of(&gw, "key-a"), Ok(Some("team-a".to_owned())));
}

#[test]
fn objects_of_the_policy_in_force_stay_ready_while_a_newer_bundle_is_refused() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let gw = gateway_();
    let (outcome, diags) = gw.apply_bundle(&s.bundle());
    assert_eq!(
        outcome,
        ApplyOutcome::Applied { generation: 1 },
        "{diags:?}"
    );
    // The policy breaks (generation 2) and a new policy appears in the same bundle.
    s.apply_object_event(
        ResourceKind::InferencePolicy,
        Event::Apply(policy(2, "iff")),
    );
    let mut extra = policy(1, "if");
    extra.metadata.name = Some("extra".into());
    s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(extra));
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(matches!(outcome, ApplyOutcome::Refused { .. }));
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let cond = |label: &str, type_: &str| condition(&p, label, type_);

    // Unchanged and serving: Accepted=False (bundle refused), Ready=True.
    let door = cond("GatewayBackend/llm/front", "Ready");
    assert_eq!(door["status"], "True", "{door}");
    assert_eq!(door["reason"], "InForce");
    assert!(
        door["message"]
            .as_str()
            .unwrap()
            .contains("this generation is in force"),
        "{door}"
    );
    assert_eq!(
        cond("GatewayBackend/llm/front", "Accepted")["reason"],
        "BundleRefused"
    );
    let provider = cond("InferenceProvider/llm/openai", "Ready");
    assert_eq!(provider["status"], "True", "{provider}");

    // The broken policy: generation 1 still routes; Ready names generation 2 as not applied.
    let pol = cond("InferencePolicy/llm/routing", "Ready");
    assert_eq!(pol["status"], "True", "{pol}");
    assert!(
        pol["message"]
            .as_str()
            .unwrap()
            .contains("generation 2 not applied (see Accepted)"),
        "{pol}"
    );
    assert_eq!(
        cond("InferencePolicy/llm/routing", "Accepted")["status"],
        "False"
    );

    // The new policy is in no policy in force: not ready.
    let extra = cond("InferencePolicy/llm/extra", "Ready");
    assert_eq!(extra["status"], "False", "{extra}");
    assert_eq!(extra["reason"], "NotAccepted");
}

#[test]
fn a_front_door_without_its_key_secret_says_requests_get_503() {
    let mut s = initial_store(policy(1, "if"));
    let mut door = gateway();
    door.data["spec"]["tenants"] = json!({"apiKeys": {"secretRef": {"name": "tenant-keys"}}});
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Apply(door));
    s.set_secret("llm", "tenant-keys", None);
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let ready = &p
        .iter()
        .find(|(k, _)| k == "GatewayBackend/llm/front")
        .unwrap()
        .1["status"]["conditions"][2];
    assert_eq!(ready["reason"], "TenantKeysUnavailable");
    let msg = ready["message"].as_str().unwrap();
    assert!(
        msg.contains("503 `tenant_identity_unavailable`") && !msg.contains("401"),
        "{msg}"
    );
}

#[test]
fn a_front_door_whose_key_secret_is_refused_is_not_ready_and_says_why() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let mut door = gateway();
    door.data["spec"]["tenants"] = json!({"apiKeys": {"secretRef": {"name": "tenant-keys"}}});
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Apply(door));
    // The Secret exists, but its content is refused: a tenant may not be named `anonymous`.
    s.set_secret(
        "llm",
        "tenant-keys",
        Some(&secret(
            "tenant-keys",
            &[("anonymous", "key-anon-123"), ("team-a", "key-a-456")],
        )),
    );
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(matches!(outcome, ApplyOutcome::Applied { .. }), "{diags:?}");
    // Every request to the door is refused (503 `tenant_identity_unavailable`).
    assert!(tenant_of(&gw, "key-a-456").is_err());
    let live = kinf_handler::kube::live_counts(&gw, &s.selected_pods());
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live);
    let ready = condition(&p, "GatewayBackend/llm/front", "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "TenantIdentityUnavailable", "{ready}");
    let msg = ready["message"].as_str().unwrap();
    assert!(
        msg.contains("`anonymous` is reserved")
            && msg.contains("503 `tenant_identity_unavailable`"),
        "{msg}"
    );
    assert!(
        !msg.contains("key-anon-123") && !msg.contains("key-a-456"),
        "no key in status: {msg}"
    );
    // Fixed: the door serves again and says so.
    s.set_secret(
        "llm",
        "tenant-keys",
        Some(&secret("tenant-keys", &[("team-a", "key-a-456")])),
    );
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert_eq!(tenant_of(&gw, "key-a-456"), Ok(Some("team-a".to_owned())));
    let live = kinf_handler::kube::live_counts(&gw, &s.selected_pods());
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live);
    let ready = condition(&p, "GatewayBackend/llm/front", "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("InForce")),
        "{ready}"
    );
}

#[test]
fn a_front_door_naming_a_key_file_reads_no_file_in_kubernetes_mode() {
    // A file the controller can read (as its ServiceAccount token, or keys mounted for another
    // team): a namespace user must not be able to make a front door accept its keys.
    let dir = std::env::temp_dir().join(format!("kinf-kube-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.txt");
    std::fs::write(&file, "team-a: key-from-file\n").unwrap();
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let mut door = gateway();
    door.data["spec"]["tenants"] = json!({"apiKeys": {"file": file.to_str().unwrap()}});
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Apply(door));
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(matches!(outcome, ApplyOutcome::Applied { .. }), "{diags:?}");
    let refused = tenant_of(&gw, "key-from-file").unwrap_err();
    assert!(refused.contains("not read in Kubernetes mode"), "{refused}");
    let live = kinf_handler::kube::live_counts(&gw, &s.selected_pods());
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live);
    let ready = condition(&p, "GatewayBackend/llm/front", "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "TenantIdentityUnavailable", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("apiKeys.secretRef"),
        "{ready}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_front_door_without_hosts_is_not_ready_and_names_the_one_that_serves() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let mut second = gateway();
    second.metadata.name = Some("other".into());
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Apply(second));
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(
        matches!(outcome, ApplyOutcome::Applied { .. }),
        "a warning: {diags:?}"
    );
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let conds =
        |label: &str| p.iter().find(|(k, _)| k == label).unwrap().1["status"]["conditions"].clone();
    // `front` sorts before `other`: requests without a named host go to `llm/front`.
    let front = conds("GatewayBackend/llm/front");
    assert_eq!(front[2]["status"], "True", "{front}");
    let other = conds("GatewayBackend/llm/other");
    assert_eq!(other[0]["reason"], "AcceptedWithWarnings", "{other}");
    assert_eq!(other[2]["status"], "False", "{other}");
    assert_eq!(other[2]["reason"], "Shadowed");
    let msg = other[2]["message"].as_str().unwrap();
    assert!(
        msg.contains("warning[KINF0508]") && msg.contains("`llm/front`"),
        "{msg}"
    );
}

#[test]
fn a_provider_without_health_information_is_not_ready_as_its_pool_counts_it() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let ready_of = |live: &LiveCounts| {
        let p = patches(&s, &gw, &bundle, &outcome, &diags, live);
        let ready = condition(&p, "InferenceProvider/llm/openai", "Ready");
        (ready["status"].clone(), ready["message"].clone())
    };
    let (status, _) = ready_of(&live());
    assert_eq!(status, "True");
    let mut unknown = live();
    unknown.providers.clear();
    let (status, message) = ready_of(&unknown);
    assert_eq!(status, "False", "{message}");
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("no health information yet"),
        "{message}"
    );
}

#[test]
fn a_secret_whose_read_failed_is_reported_unreadable_not_fine() {
    let mut s = initial_store(policy(1, "if"));
    // The provider's Secret could not be read (a timeout): it is not "not read yet".
    s.secret_read_failed("llm", "openai-key", "the read timed out after 10s");
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let cond = |t: &str| condition(&p, "InferenceProvider/llm/openai", t);
    let refs = cond("ResolvedRefs");
    assert_eq!(refs["status"], "False", "{refs}");
    assert_eq!(refs["reason"], "SecretUnreadable");
    assert!(
        refs["message"].as_str().unwrap().ends_with(
            "cannot be read: the read timed out after 10s (help: the controller retries every 30 s)"
        ),
        "{refs}"
    );
    assert_eq!(cond("Ready")["status"], "False");
    // Read once it succeeds: the error is forgotten.
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    assert!(s.secret_errors().is_empty());
}

#[tokio::test]
async fn provider_status_follows_the_provider_pool_not_the_routing_state() {
    let mut s = initial_store(policy(1, "if"));
    // A provider whose credentials are an environment variable: refused in Kubernetes mode.
    let mut p = provider();
    p.data["spec"]["credentials"] = json!({"env": "HOME"});
    s.apply_object_event(ResourceKind::InferenceProvider, Event::Apply(p));
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert!(
        !matches!(outcome, ApplyOutcome::Refused { .. }),
        "{diags:?}"
    );
    let live = kinf_handler::kube::live_counts(&gw, &s.selected_pods());
    // No request was routed; the routing state still says every provider is ready.
    assert_eq!(live.providers.get("llm/openai"), Some(&false), "{live:?}");
    let why = &live.provider_credential_errors["llm/openai"];
    assert!(why.contains("credentials.secretRef"), "{why}");
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live);
    let ready = condition(&p, "InferenceProvider/llm/openai", "Ready");
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "CredentialsUnavailable");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("not read in Kubernetes mode"),
        "{ready}"
    );
}

#[test]
fn front_doors_naming_the_same_host_are_ordered_by_creation_so_a_later_one_cannot_take_it() {
    let mut s = initial_store(policy(1, "if"));
    let door = |name: &str, created: &str| {
        let mut g = gateway();
        g.metadata.name = Some(name.into());
        g.metadata.uid = Some(format!("uid-{name}"));
        g.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            created.parse().unwrap(),
        ));
        g.data["spec"]["hosts"] = json!(["llm.team-a.example.com"]);
        g
    };
    s.apply_object_event(ResourceKind::GatewayBackend, Event::Delete(gateway()));
    // `front` was there first; `aaa`, created later, sorts first by name.
    s.apply_object_event(
        ResourceKind::GatewayBackend,
        Event::Apply(door("front", "2026-11-01T00:00:00Z")),
    );
    s.apply_object_event(
        ResourceKind::GatewayBackend,
        Event::Apply(door("aaa", "2026-11-30T00:00:00Z")),
    );
    let gw = gateway_();
    let (outcome, diags) = gw.apply_bundle(&s.bundle());
    assert!(
        !matches!(outcome, ApplyOutcome::Refused { .. }),
        "{diags:?}"
    );
    let order: Vec<String> = gw
        .store
        .current()
        .unwrap()
        .policy
        .gateways
        .iter()
        .map(|g| g.name.to_string())
        .collect();
    assert_eq!(order, ["front", "aaa"], "the older door answers the host");
    let warning = diags
        .iter()
        .find(|d| d.code.as_str() == "KINF0508")
        .expect("KINF0508");
    assert!(
        warning.message.contains("front door `llm/aaa`"),
        "the warning is on the later door: {}",
        warning.message
    );
}

/// Applies the store's bundle as the controller does: with namespace isolation against the
/// objects in force, which the outcome then updates.
fn apply_isolated(
    s: &ClusterStore,
    gw: &Gateway,
    in_force: &kinf_handler::kube::isolation::InForce,
) -> (
    kinf_handler::bundle::ConfigBundle,
    ApplyOutcome,
    Vec<kinf_lang::Diagnostic>,
) {
    let bundle = isolated_bundle(s, in_force);
    // The gateway records what the outcome put in force.
    let (outcome, diags) = gw.apply_bundle(&bundle);
    (bundle, outcome, diags)
}

/// The store's bundle as the controller makes it, with namespace isolation against the
/// objects in force.
fn isolated_bundle(
    s: &ClusterStore,
    in_force: &kinf_handler::kube::isolation::InForce,
) -> kinf_handler::bundle::ConfigBundle {
    let merge = Arc::new(kinf_handler::kube::isolation::NamespaceMerge::new(
        Arc::new(s.objects().cloned().collect()),
        in_force.clone(),
        Default::default(),
        s.pods_snapshot(),
    ));
    let mut bundle = s.bundle();
    bundle.resolved.isolation = Some(merge);
    bundle
}

/// Adds (or replaces) the second team's objects ([`team_b_objects`]).
fn team_b(s: &mut ClusterStore, generation: i64, exclude_key: &str) {
    for (kind, o) in team_b_objects(generation, exclude_key) {
        s.apply_object_event(kind, Event::Apply(o));
    }
}

#[test]
fn an_invalid_object_holds_back_only_its_own_namespace() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    team_b(&mut s, 8, "if");
    let gw = gateway_();
    let in_force = kinf_handler::kube::isolation::InForce::default();
    let (_, outcome, diags) = apply_isolated(&s, &gw, &in_force);
    assert_eq!(
        outcome,
        ApplyOutcome::Applied { generation: 1 },
        "{diags:?}"
    );

    // `llm` breaks its policy while `team-b` tightens its own: team-b's edit is applied, llm
    // keeps its policy in force.
    s.apply_object_event(
        ResourceKind::InferencePolicy,
        Event::Apply(policy(2, "iff")),
    );
    team_b(&mut s, 4, "if");
    let (bundle, outcome, diags) = apply_isolated(&s, &gw, &in_force);
    assert_eq!(
        outcome,
        ApplyOutcome::PartlyApplied {
            generation: 2,
            changed: true,
            errors: 1,
            namespaces: vec!["llm".into()],
        },
        "{diags:?}"
    );
    let b = in_force_text(&gw, "InferencePolicy/team-b/routing").unwrap();
    assert!(
        b.contains("greaterThan: 4"),
        "team-b's edit is in force: {b}"
    );
    let llm = in_force_text(&gw, "InferencePolicy/llm/routing").unwrap();
    assert!(
        llm.contains("if:") && !llm.contains("iff"),
        "llm keeps the policy in force: {llm}"
    );
    let refusal = gw.store.last_rejected().expect("the refusal is recorded");
    assert_eq!(refusal.namespaces, Some(vec!["llm".to_owned()]));
    assert_eq!(refusal.codes, vec!["KINF0101"]);
    // What the controller now holds in force: team-b's new objects, llm's old ones.
    let held = in_force.lock().clone().unwrap();
    let held_policy = |ns: &str| {
        held.iter()
            .find(|o| o.key.namespace == ns && o.key.kind == ResourceKind::InferencePolicy)
            .unwrap()
            .generation
    };
    assert_eq!(
        (held_policy("llm"), held_policy("team-b")),
        (Some(1), Some(4))
    );

    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    insta::assert_json_snapshot!("status_partly_applied", p);
    let cond = |label: &str, type_: &str| condition(&p, label, type_);
    let accepted = cond("InferencePolicy/llm/routing", "Accepted");
    assert_eq!(accepted["reason"], "Invalid", "{accepted}");
    assert!(
        accepted["message"]
            .as_str()
            .unwrap()
            .contains("namespace `llm` keeps the objects it has in force"),
        "{accepted}"
    );
    let pool = cond("InferencePool/llm/pool", "Accepted");
    assert_eq!(pool["reason"], "NamespaceRefused", "{pool}");
    assert!(
        pool["message"]
            .as_str()
            .unwrap()
            .contains("InferencePolicy/llm/routing"),
        "names the object at fault: {pool}"
    );
    for label in [
        "InferencePolicy/team-b/routing",
        "InferencePool/team-b/pool",
        "GatewayBackend/team-b/front",
    ] {
        let a = cond(label, "Accepted");
        assert_eq!(a["status"], "True", "{label}: {a}");
    }
    // The broken policy's generation 1 still routes.
    let ready = cond("InferencePolicy/llm/routing", "Ready");
    assert_eq!(ready["status"], "True", "{ready}");

    // Nothing changes in team-b and llm is still broken: the same policy stays, no new
    // generation.
    let (_, outcome, _) = apply_isolated(&s, &gw, &in_force);
    assert!(
        matches!(
            outcome,
            ApplyOutcome::PartlyApplied {
                generation: 2,
                changed: false,
                ..
            }
        ),
        "{outcome:?}"
    );

    // Both namespaces broken: nothing can be applied, the whole bundle is refused and the
    // policy in force stays.
    team_b(&mut s, 5, "iff");
    let (_, outcome, _) = apply_isolated(&s, &gw, &in_force);
    assert!(
        matches!(outcome, ApplyOutcome::Refused { errors: 2 }),
        "{outcome:?}"
    );
    assert_eq!(gw.store.last_rejected().unwrap().namespaces, None);
    assert!(
        in_force_text(&gw, "InferencePolicy/team-b/routing")
            .unwrap()
            .contains("greaterThan: 4")
    );

    // Both fixed: the whole bundle is applied and the refusal cleared.
    s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(policy(3, "if")));
    team_b(&mut s, 6, "if");
    let (_, outcome, _) = apply_isolated(&s, &gw, &in_force);
    assert_eq!(outcome, ApplyOutcome::Applied { generation: 3 });
    assert!(gw.store.last_rejected().is_none());
}

#[test]
fn a_namespace_with_errors_does_not_keep_a_first_start_from_serving_the_others() {
    // No policy in force yet (a new replica, no last good policy kept): the namespace with
    // errors has nothing to keep, every other one is served.
    let mut s = initial_store(policy(1, "iff"));
    team_b(&mut s, 8, "if");
    let gw = gateway_();
    let in_force = kinf_handler::kube::isolation::InForce::default();
    let (_, outcome, diags) = apply_isolated(&s, &gw, &in_force);
    assert_eq!(
        outcome,
        ApplyOutcome::PartlyApplied {
            generation: 1,
            changed: true,
            errors: 1,
            namespaces: vec!["llm".into()],
        },
        "{diags:?}"
    );
    assert!(gw.store.is_ready());
    let current = gw.store.current().unwrap();
    assert!(current.policy.pool("team-b", "pool").is_some());
    assert!(
        current.policy.pool("llm", "pool").is_none(),
        "nothing of llm is served"
    );
    assert!(
        in_force
            .lock()
            .clone()
            .unwrap()
            .iter()
            .all(|o| o.key.namespace == "team-b")
    );
}

#[test]
fn without_isolation_a_bundle_with_errors_in_one_namespace_is_refused_whole() {
    // Directory mode, or a bundle made without the objects: the whole bundle is refused.
    let mut s = initial_store(policy(1, "iff"));
    team_b(&mut s, 8, "if");
    let gw = gateway_();
    let (outcome, _) = gw.apply_bundle(&s.bundle());
    assert!(
        matches!(outcome, ApplyOutcome::Refused { errors: 1 }),
        "{outcome:?}"
    );
    assert!(!gw.store.is_ready());
}

#[test]
fn a_kept_namespace_serves_the_endpoints_its_worker_sets_in_force_select() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    team_b(&mut s, 8, "if");
    let gw = gateway_();
    let in_force = kinf_handler::kube::isolation::InForce::default();
    apply_isolated(&s, &gw, &in_force);
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.1:8000", "10.0.0.4:9000"]
    );
    // llm's edit points its worker set at other pods and breaks its policy; team-b edits.
    let mut ws = worker_set();
    ws.metadata.generation = Some(2);
    ws.data["spec"]["selector"] = json!({"matchLabels": {"app": "web"}});
    s.apply_object_event(ResourceKind::InferenceWorkerSet, Event::Apply(ws));
    s.apply_object_event(
        ResourceKind::InferencePolicy,
        Event::Apply(policy(2, "iff")),
    );
    team_b(&mut s, 4, "if");
    let (_, outcome, _) = apply_isolated(&s, &gw, &in_force);
    assert!(
        matches!(outcome, ApplyOutcome::PartlyApplied { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.1:8000", "10.0.0.4:9000"],
        "the refused selector must not take effect"
    );
    // Pods that the worker set in force selects still come and go.
    s.apply_pod_event(Event::Apply(pod(
        "vllm-1",
        "vllm",
        Some("10.0.0.2"),
        true,
        Some(8000),
    )));
    apply_isolated(&s, &gw, &in_force);
    assert_eq!(
        endpoints(&gw, "llm/vllm"),
        vec!["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.4:9000"]
    );
}

#[test]
fn a_bundle_made_while_the_one_before_is_applied_merges_with_what_that_one_put_in_force() {
    let mut s = initial_store(policy(1, "if"));
    team_b(&mut s, 8, "if");
    let gw = gateway_();
    let in_force = kinf_handler::kube::isolation::InForce::default();
    apply_isolated(&s, &gw, &in_force);
    // Bundle 2: llm edits its policy (valid). Bundle 3, made before bundle 2 is applied:
    // llm's next edit is invalid, team-b edits.
    let mut edited = policy(3, "if");
    edited.data["spec"]["rules"][0]["name"] = json!("local-first-v3");
    s.apply_object_event(ResourceKind::InferencePolicy, Event::Apply(edited));
    let second = isolated_bundle(&s, &in_force);
    s.apply_object_event(
        ResourceKind::InferencePolicy,
        Event::Apply(policy(4, "iff")),
    );
    team_b(&mut s, 5, "if");
    let third = isolated_bundle(&s, &in_force);
    assert!(matches!(
        gw.apply_bundle(&second).0,
        ApplyOutcome::Applied { .. }
    ));
    let (outcome, _) = gw.apply_bundle(&third);
    assert!(
        matches!(outcome, ApplyOutcome::PartlyApplied { .. }),
        "{outcome:?}"
    );
    let held = in_force.lock().clone().unwrap();
    let llm = held
        .iter()
        .find(|o| o.key.namespace == "llm" && o.key.kind == ResourceKind::InferencePolicy)
        .unwrap();
    assert_eq!(
        llm.generation,
        Some(3),
        "llm keeps bundle 2's policy, not bundle 1's"
    );
    let text = in_force_text(&gw, "InferencePolicy/llm/routing").unwrap();
    assert_eq!(
        text,
        second
            .sources
            .iter()
            .find(|(_, f)| f.name == "InferencePolicy/llm/routing")
            .unwrap()
            .1
            .text
            .to_string()
    );
}

/// `pod(…)` in phase `phase`.
fn in_phase(
    mut p: k8s_openapi::api::core::v1::Pod,
    phase: &str,
) -> k8s_openapi::api::core::v1::Pod {
    p.status.as_mut().unwrap().phase = Some(phase.into());
    p
}

#[test]
fn completed_pods_are_not_members_of_the_worker_set() {
    let mut s = initial_store(policy(1, "if"));
    let before = s.selected_pods()["llm/vllm"].clone();
    assert_eq!(before.selected, 4);
    // A Job-like pod that finished, and one that failed while its Ready condition was last
    // reported true (the kubelet may not have updated it yet): neither is a member.
    assert!(s.apply_pod_event(Event::Apply(in_phase(
        pod("vllm-done", "vllm", Some("10.0.0.8"), false, Some(8000)),
        "Succeeded"
    ))));
    assert!(s.apply_pod_event(Event::Apply(in_phase(
        pod("vllm-failed", "vllm", Some("10.0.0.9"), true, Some(8000)),
        "Failed"
    ))));
    // Running and pending pods are members as before.
    assert!(s.apply_pod_event(Event::Apply(in_phase(
        pod("vllm-running", "vllm", Some("10.0.0.5"), true, Some(8000)),
        "Running"
    ))));
    assert!(s.apply_pod_event(Event::Apply(in_phase(
        pod("vllm-pending", "vllm", None, false, None),
        "Pending"
    ))));
    let after = &s.selected_pods()["llm/vllm"];
    assert_eq!(
        after.selected, 6,
        "the running and the pending pod count, the completed ones do not: {after:?}"
    );
    assert_eq!(
        after.endpoints,
        vec!["10.0.0.1:8000", "10.0.0.4:9000", "10.0.0.5:8000"]
    );
    assert_eq!(
        s.bundle().resolved.endpoints["llm/vllm"],
        after.endpoints,
        "the bundle's endpoints skip them too"
    );
    // A running pod that completes leaves the set.
    assert!(s.apply_pod_event(Event::Apply(in_phase(
        pod("vllm-running", "vllm", Some("10.0.0.5"), false, Some(8000)),
        "Succeeded"
    ))));
    assert_eq!(s.selected_pods()["llm/vllm"].selected, 5);
    let info = kinf_handler::kube::store::PodInfo::from_pod(&in_phase(
        pod("x", "vllm", None, false, None),
        "Failed",
    ))
    .unwrap();
    assert!(info.completed);
    for phase in ["Pending", "Running", "Unknown"] {
        let info = kinf_handler::kube::store::PodInfo::from_pod(&in_phase(
            pod("x", "vllm", None, false, None),
            phase,
        ))
        .unwrap();
        assert!(!info.completed, "{phase}");
    }
}

#[test]
fn worker_sets_select_only_the_pods_of_their_own_namespace() {
    use kinf_handler::kube::store::{PodInfo, SelectedPods, select_pods, selector_matches};
    use std::collections::BTreeMap;
    // Namespaces that are prefixes of one another and sort around each other, so a range
    // that runs past its namespace, or stops short of it, is seen.
    let namespaces = ["a", "ll", "llm", "llm-2", "llm2", "llmz", "z"];
    let mut pods = BTreeMap::new();
    let mut n = 0;
    for (i, ns) in namespaces.iter().enumerate() {
        for j in 0..=i {
            n += 1;
            let app = if j % 3 == 2 { "web" } else { "vllm" };
            let mut p = pod(
                &format!("p{j}"),
                app,
                Some(&format!("10.{i}.0.{j}")),
                j % 2 == 0,
                Some(8000 + i32::try_from(i).unwrap()),
            );
            if j == 3 {
                p = in_phase(p, "Succeeded");
            }
            p.metadata.namespace = Some((*ns).into());
            let info = PodInfo::from_pod(&p).unwrap();
            pods.insert((info.namespace.clone(), info.name.clone()), info);
        }
    }
    assert_eq!(pods.len(), n);
    // A worker set in every namespace but `a` and `llm2`, plus one in a namespace without pods.
    let sets: Vec<StoredObject> = ["ll", "llm", "llm-2", "llmz", "z", "m"]
        .iter()
        .map(|ns| {
            StoredObject::from_dynamic(
                ResourceKind::InferenceWorkerSet,
                &in_namespace(worker_set(), ns),
            )
            .unwrap()
        })
        .collect();
    let got = select_pods(&pods, sets.iter());
    // What every set selects when every pod is looked at.
    let mut want = BTreeMap::new();
    for o in &sets {
        let sel = &o.spec["selector"];
        let mut sp = SelectedPods::default();
        for p in pods.values() {
            if p.namespace == o.key.namespace && !p.completed && selector_matches(sel, &p.labels) {
                sp.selected += 1;
                if p.ready {
                    let port = u16::try_from(p.ports[0].1).unwrap();
                    sp.endpoints.push(p.address(port).unwrap());
                }
            }
        }
        sp.endpoints.sort();
        want.insert(format!("{}/{}", o.key.namespace, o.key.name), sp);
    }
    assert_eq!(got, want);
    assert_eq!(
        got["llm/vllm"],
        SelectedPods {
            selected: 2,
            endpoints: vec!["10.2.0.0:8002".into()],
        },
        "`llm` has p0–p2; p2 is `web`; p1 is not ready"
    );
    assert_eq!(
        got["llm-2/vllm"].selected, 2,
        "p0, p1 (p2 web, p3 completed)"
    );
    assert_eq!(got["z/vllm"].selected, 4, "p0, p1, p4, p6");
    assert_eq!(got["m/vllm"], SelectedPods::default());
    assert_eq!(got.len(), 6);
}

#[test]
fn a_secret_read_before_that_cannot_be_read_again_keeps_its_value_and_says_so() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    );
    let gw = gateway_();
    gw.apply_bundle(&s.bundle());
    // The periodic re-read fails (a timeout): the value read before stays in use.
    assert!(s.secret_read_failed("llm", "openai-key", "the read timed out after 10s"));
    let bundle = s.bundle();
    assert!(
        bundle
            .resolved
            .secret("llm", "openai-key", "apiKey")
            .is_some_and(|v| v.expose() == "sk-test"),
        "the key read before is kept"
    );
    let (outcome, diags) = gw.apply_bundle(&bundle);
    assert_eq!(outcome, ApplyOutcome::Unchanged, "nothing to re-apply");
    let p = gw.providers.load_full();
    assert!(!format!("{p:?}").contains("SecretMissing"), "{p:?}");
    // …and the owner of the provider is told, in its status.
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let cond = |t: &str| condition(&p, "InferenceProvider/llm/openai", t);
    let refs = cond("ResolvedRefs");
    assert_eq!(refs["status"], "True", "the value in use resolves: {refs}");
    assert_eq!(refs["reason"], "SecretStale", "{refs}");
    assert_eq!(
        refs["message"],
        "spec.credentials.secretRef: Secret `llm/openai-key` cannot be read again: the read \
         timed out after 10s; the value read before stays in use (help: the controller retries \
         every 30 s)"
    );
    assert_eq!(cond("Ready")["status"], "True", "it still serves");
    // The next read succeeds: back to plain `ResolvedRefs`.
    assert!(s.set_secret(
        "llm",
        "openai-key",
        Some(&secret("openai-key", &[("apiKey", "sk-test")])),
    ));
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let refs = condition(&p, "InferenceProvider/llm/openai", "ResolvedRefs");
    assert_eq!(refs["reason"], "ResolvedRefs", "{refs}");
}

/// A Secret found missing, whose later reads fail: still `SecretNotFound`, but the message says
/// the reads since have failed (it may exist by now), rather than a bare, possibly stale
/// "not found".
#[test]
fn a_missing_secret_whose_reads_then_fail_says_so() {
    let mut s = initial_store(policy(1, "if"));
    s.set_secret("llm", "openai-key", None);
    let gw = gateway_();
    let bundle = s.bundle();
    let (outcome, diags) = gw.apply_bundle(&bundle);
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let refs = condition(&p, "InferenceProvider/llm/openai", "ResolvedRefs");
    assert_eq!(refs["reason"], "SecretNotFound", "{refs}");
    assert_eq!(
        refs["message"],
        "spec.credentials.secretRef: Secret `llm/openai-key` not found (help: create it in that namespace)"
    );
    assert!(s.secret_read_failed("llm", "openai-key", "the read timed out after 10s"));
    let bundle = s.bundle();
    let p = patches(&s, &gw, &bundle, &outcome, &diags, &live());
    let refs = condition(&p, "InferenceProvider/llm/openai", "ResolvedRefs");
    assert_eq!(refs["status"], "False", "{refs}");
    assert_eq!(refs["reason"], "SecretNotFound", "{refs}");
    assert_eq!(
        refs["message"],
        "spec.credentials.secretRef: Secret `llm/openai-key` not found when last read; it cannot \
         be read again: the read timed out after 10s (help: create it in that namespace; the \
         controller retries every 30 s)"
    );
}
