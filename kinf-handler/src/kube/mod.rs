//! Kubernetes mode (`kinference serve --kubernetes`): a [`ConfigSource`] fed by watchers on the
//! five Kinference CRDs and on Pods, plus the Secrets that providers and front doors refer
//! to; and the status writer.
//!
//! - [`store`]: the synchronous index the watcher events go into; it produces the bundle
//!   (one YAML source per object, the ready pods of each selector-mode worker set as
//!   endpoints, the Secret values) that [`crate::gateway::Gateway::apply_bundle`] compiles like
//!   a directory's.
//! - [`status`]: the pure function from objects, diagnostics and live counts to each object's
//!   server-side-apply `/status` body.
//! - [`lease`]: leader election on a Lease; only the leader writes status, every replica
//!   serves.
//! - [`isolation`]: a bundle refused for errors in some namespaces still applies every other
//!   namespace's objects.
//! - [`Controller`]: wiring (watch tasks, Secret reads, the apply loop, the status loop).

pub mod isolation;
pub mod last_good;
pub mod lease;
pub mod status;
pub mod store;
pub mod yaml;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use ::kube::runtime::{WatchStreamExt, watcher};
use ::kube::{Api, Client};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret as K8sSecret};
use kinf_lang::{Diagnostic, Sources};
use kinf_policy::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
    ResourceKind,
};
use parking_lot::Mutex;
use serde_json::Value;

use crate::ApplyOutcome;
use crate::bundle::{BundleSender, ConfigBundle, ConfigSource};
use crate::gateway::Gateway;
use status::{LiveCounts, SecretKeys, StatusInput, StatusPatch, WorkerSetLive};
use store::{ClusterStore, ObjectKey, StoredObject, Stream};

/// The field manager of every write (status patches, the Lease, the last-good ConfigMap).
pub const FIELD_MANAGER: &str = "kinference";

/// Longest wait for one status PATCH, Secret GET or last-good ConfigMap request (the client
/// has no read timeout, and a stuck request must not hold the status writer or the Secret
/// reader forever).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Secrets read at once.
const SECRET_READS_AT_ONCE: usize = 8;

/// Longest a bundle waits for the first read of a Secret it newly refers to: one read's
/// timeout and a margin.
const NEW_SECRET_WAIT: Duration = Duration::from_secs(12);

/// Bundles made and not yet applied whose objects are kept for status (the apply loop takes
/// the newest; older ones are dropped when it applies a newer one).
const MAX_UNAPPLIED_SNAPSHOTS: usize = 64;

/// Settings of Kubernetes mode.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// Namespace to watch; `None`: every namespace (needs a ClusterRole).
    pub namespace: Option<String>,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease (the pod name).
    pub identity: String,
    /// How often status is recomputed (live counts change without any event).
    pub status_interval: Duration,
    /// How often referenced Secrets are read again.
    pub secret_refresh: Duration,
    /// Quiet time after a change before a bundle is published (batches bursts of events).
    pub debounce: Duration,
    /// Namespaces whose Bedrock providers may sign with this process's own `AWS_*`
    /// credentials (`--ambient-aws-credentials`); default none.
    pub ambient_aws: crate::providers::credentials::AmbientAws,
}

impl KubeOptions {
    /// Defaults for `namespace`, with the Lease `kinference-leader` in the same namespace (or
    /// `default`).
    pub fn new(namespace: Option<String>, identity: impl Into<String>) -> Self {
        KubeOptions {
            lease_namespace: namespace.clone().unwrap_or_else(|| "default".to_owned()),
            namespace,
            lease_name: "kinference-leader".to_owned(),
            identity: identity.into(),
            status_interval: Duration::from_secs(10),
            secret_refresh: Duration::from_secs(30),
            debounce: Duration::from_millis(200),
            ambient_aws: crate::providers::credentials::AmbientAws::default(),
        }
    }
}

/// The API resource of a kind (for [`DynamicObject`] APIs).
pub fn api_resource(kind: ResourceKind) -> ApiResource {
    match kind {
        ResourceKind::InferenceWorkerSet => ApiResource::erase::<InferenceWorkerSet>(&()),
        ResourceKind::InferenceProvider => ApiResource::erase::<InferenceProvider>(&()),
        ResourceKind::InferencePool => ApiResource::erase::<InferencePool>(&()),
        ResourceKind::InferencePolicy => ApiResource::erase::<InferencePolicy>(&()),
        ResourceKind::GatewayBackend => ApiResource::erase::<GatewayBackend>(&()),
    }
}

/// Every stream that must have listed once before a bundle is published.
pub const STREAMS: [Stream; 6] = [
    Stream::Crd(ResourceKind::InferenceWorkerSet),
    Stream::Crd(ResourceKind::InferenceProvider),
    Stream::Crd(ResourceKind::InferencePool),
    Stream::Crd(ResourceKind::InferencePolicy),
    Stream::Crd(ResourceKind::GatewayBackend),
    Stream::Pods,
];

/// The last bundle applied, as status needs it.
#[derive(Clone, Debug)]
struct LastApply {
    revision: u64,
    objects: Arc<Vec<StoredObject>>,
    sources: Sources,
    diagnostics: Vec<Diagnostic>,
    in_force: bool,
    /// The namespaces refused while every other one was applied.
    refused_namespaces: Option<std::collections::BTreeSet<String>>,
}

/// A status body written, and the object it was written to.
#[derive(Clone, Debug)]
struct Sent {
    /// `metadata.uid` of the object (a recreated object is another one).
    uid: Option<String>,
    /// `metadata.resourceVersion` of the object as stored when the patch was computed: once the
    /// watch reports a newer version (this write, or anyone else's), the stored status is the
    /// truth again.
    resource_version: Option<String>,
    /// The body sent.
    body: Value,
}

impl Sent {
    /// Whether `o` is still the very version this body was written against (the watch has not
    /// reported anything newer), so that the body stands for its status.
    fn describes(&self, o: &StoredObject) -> bool {
        self.uid == o.uid && self.resource_version == o.resource_version
    }
}

/// The Kubernetes controller of one replica.
pub struct Controller {
    client: Client,
    opts: KubeOptions,
    store: Mutex<ClusterStore>,
    changed: tokio::sync::watch::Sender<u64>,
    leader: Arc<lease::Leadership>,
    revision: AtomicU64,
    /// The objects of each bundle not yet applied, by revision (for status).
    snapshots: Mutex<BTreeMap<u64, Arc<Vec<StoredObject>>>>,
    /// The objects of the last bundle applied (or found unchanged): the policy in force.
    in_force_objects: isolation::InForce,
    /// The endpoints its worker sets were compiled with (hashed).
    in_force_compiled_with: isolation::CompiledWith,
    last: Mutex<Option<LastApply>>,
    status_wake: tokio::sync::Notify,
    /// Status bodies written, by object, until the watch reports the object again.
    last_sent: Mutex<HashMap<ObjectKey, Sent>>,
    /// One status writer at a time.
    writing: tokio::sync::Mutex<()>,
    /// The objects in force are the last good policy kept in the cluster, read at start
    /// ([`last_good`]): no bundle of this process has been in force yet.
    seeded: std::sync::atomic::AtomicBool,
    /// The content last written to (or read from) the last-good ConfigMap: a hash of it.
    last_good_written: Mutex<Option<u64>>,
    /// The last failure to read or write the last-good ConfigMap.
    last_good_error: Mutex<Option<String>>,
    /// The last bundle was refused and the kept policy is what this replica serves.
    serving_kept: std::sync::atomic::AtomicBool,
    /// The namespaces whose objects in force are those kept in the cluster (read at start):
    /// all of the kept policy's until a bundle of this process is in force; after a partial
    /// apply, the refused namespaces that still hold them.
    kept_namespaces: Mutex<std::collections::BTreeSet<String>>,
    /// Those of them served after the last bundle (none while no policy is in force).
    serving_kept_namespaces: Mutex<Vec<String>>,
}

impl crate::gateway::ControllerStatus for Controller {
    fn status_json(&self) -> serde_json::Value {
        Controller::status_json(self)
    }
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("opts", &self.opts)
            .field("leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// A controller talking to `client`.
    pub fn new(client: Client, opts: KubeOptions) -> Arc<Self> {
        Arc::new(Controller {
            client,
            opts,
            store: Mutex::new(ClusterStore::new()),
            changed: tokio::sync::watch::channel(0).0,
            leader: Arc::new(lease::Leadership::new(lease::RENEW_DEADLINE)),
            revision: AtomicU64::new(0),
            snapshots: Mutex::new(BTreeMap::new()),
            in_force_objects: Arc::new(Mutex::new(None)),
            in_force_compiled_with: Arc::new(Mutex::new(None)),
            last: Mutex::new(None),
            status_wake: tokio::sync::Notify::new(),
            last_sent: Mutex::new(HashMap::new()),
            writing: tokio::sync::Mutex::new(()),
            seeded: std::sync::atomic::AtomicBool::new(false),
            last_good_written: Mutex::new(None),
            last_good_error: Mutex::new(None),
            serving_kept: std::sync::atomic::AtomicBool::new(false),
            kept_namespaces: Mutex::new(std::collections::BTreeSet::new()),
            serving_kept_namespaces: Mutex::new(Vec::new()),
        })
    }

    fn last_good_api(&self) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
        Api::namespaced(self.client.clone(), &self.opts.lease_namespace)
    }

    /// The last-good ConfigMap's name.
    pub fn last_good_name(&self) -> String {
        last_good::config_map_name(&self.opts.lease_name)
    }

    /// Takes `objects` (kept by an earlier leader) as the policy in force until a bundle of
    /// this process is: a refused first bundle then serves them. No effect once a bundle was
    /// in force.
    pub fn seed_last_good(&self, mut objects: Vec<StoredObject>) {
        let mut in_force = self.in_force_objects.lock();
        if in_force.is_some() {
            return;
        }
        // Only what this replica watches now (`--namespace` may differ from the writer's).
        if let Some(ns) = &self.opts.namespace {
            objects.retain(|o| &o.key.namespace == ns);
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        *self.last_good_written.lock() = last_good::encode(&objects).ok().map(|j| content_hash(&j));
        self.seeded.store(true, Ordering::SeqCst);
        *self.kept_namespaces.lock() = objects.iter().map(|o| o.key.namespace.clone()).collect();
        *in_force = Some(Arc::new(objects));
    }

    /// Reads the last-good ConfigMap once (at start) and seeds it ([`Self::seed_last_good`]).
    /// Returns whether it found one.
    pub async fn load_last_good(&self) -> bool {
        let name = self.last_good_name();
        match last_good::read(&self.last_good_api(), &name).await {
            Ok(Some(objects)) => {
                tracing::info!(configmap = %name, objects = objects.len(), "last good policy found");
                self.seed_last_good(objects);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(error = %e, "the last good policy could not be read");
                *self.last_good_error.lock() = Some(e);
                false
            }
        }
    }

    /// The leader writes the objects of the policy in force to the last-good ConfigMap when
    /// they differ from what it holds. Returns whether it wrote.
    pub async fn persist_last_good(&self) -> bool {
        if !self.is_leader() {
            // Another leader may write it meanwhile: once this replica leads again, it writes
            // what it has in force rather than trust what it wrote (or read) before.
            *self.last_good_written.lock() = None;
            return false;
        }
        let Some(objects) = self.in_force_objects.lock().clone() else {
            return false;
        };
        let json = match last_good::encode(&objects) {
            Ok(json) => json,
            Err(e) => {
                *self.last_good_error.lock() = Some(e);
                return false;
            }
        };
        let hash = content_hash(&json);
        if *self.last_good_written.lock() == Some(hash) {
            return false;
        }
        match last_good::write(&self.last_good_api(), &self.last_good_name(), &json).await {
            Ok(()) => {
                *self.last_good_written.lock() = Some(hash);
                *self.last_good_error.lock() = None;
                true
            }
            Err(e) => {
                // Retried every status round: logged when the error changes, not every time.
                let mut last = self.last_good_error.lock();
                if last.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, "the last good policy could not be kept");
                }
                *last = Some(e);
                false
            }
        }
    }

    /// Runs `f` on the store; when it returns true (something changed) the change is signalled.
    pub fn update_store(&self, f: impl FnOnce(&mut ClusterStore) -> bool) -> bool {
        let changed = f(&mut self.store.lock());
        if changed {
            self.changed.send_modify(|v| *v += 1);
        }
        changed
    }

    /// A receiver told of every change of the store, and whenever the apply loop must look
    /// again (what the loop itself waits on).
    pub fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Reads the store.
    pub fn with_store<R>(&self, f: impl FnOnce(&ClusterStore) -> R) -> R {
        f(&self.store.lock())
    }

    /// What `/admin/status` shows under `kubernetes`: this replica's identity, what it
    /// watches, whether it holds the Lease and since when it last renewed it, every watch's
    /// first-listing state and object count, the referenced Secrets, and the last bundle.
    pub fn status_json(&self) -> serde_json::Value {
        let last = self.last.lock().clone();
        serde_json::json!({
            "identity": self.opts.identity,
            "namespace": self.opts.namespace,
            "lease": format!("{}/{}", self.opts.lease_namespace, self.opts.lease_name),
            "leader": self.is_leader(),
            "lastRenewalAgeMs": self
                .leader
                .last_renewal()
                .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)),
            "firstBundleReady": self.first_bundle_ready(),
            "lastGood": {
                "configMap": format!("{}/{}", self.opts.lease_namespace, self.last_good_name()),
                "serving": self.serving_kept.load(std::sync::atomic::Ordering::Relaxed),
                "servingNamespaces": self.serving_kept_namespaces.lock().clone(),
                "error": self.last_good_error.lock().clone(),
            },
            "store": self.with_store(|s| s.summary_json(&STREAMS)),
            "lastBundle": last.map(|l| serde_json::json!({
                "revision": l.revision,
                "inForce": l.in_force,
                "refusedNamespaces": l.refused_namespaces,
                "objects": l.objects.len(),
                "errors": l.diagnostics.iter().filter(|d| d.severity == kinf_lang::Severity::Error).count(),
                "warnings": l.diagnostics.iter().filter(|d| d.severity == kinf_lang::Severity::Warning).count(),
            })),
        })
    }

    /// Whether this replica holds the Lease (renewed within the renew deadline).
    pub fn is_leader(&self) -> bool {
        self.leader.is_leader()
    }

    /// Sets leadership (the lease loop does; tests may): `true` counts as a renewal now.
    pub fn set_leader(&self, leader: bool) {
        if leader {
            self.leader.renewed(tokio::time::Instant::now());
        } else {
            self.leader.lost();
        }
    }

    /// Whether the first bundle may be published: every watched resource completed its first
    /// listing and every Secret it refers to was read (or its read attempted) once — otherwise
    /// a starting replica would serve, and report ready, with tenant keys and provider
    /// credentials "not found".
    pub fn first_bundle_ready(&self) -> bool {
        self.with_store(|s| s.synced(&STREAMS)) && self.secrets_read()
    }

    /// Whether every Secret in use was read (or its read failed) at least once. The Secrets
    /// in use include those of the objects in force (the last good policy kept in the
    /// cluster, before any bundle of this process): a refused bundle serves that policy.
    pub fn secrets_read(&self) -> bool {
        let in_force = self.in_force_objects.lock().clone();
        self.with_store(|s| {
            s.secrets_tried(&secret_refs_in_use(
                s,
                in_force.as_deref().map(Vec::as_slice),
            ))
        })
    }

    /// What the apply loop compares to decide whether to publish a bundle
    /// ([`ContentKey::needs_publish`]).
    pub fn content_key(&self) -> ContentKey {
        let in_force = self.in_force_objects.lock().clone();
        let compiled_with = *self.in_force_compiled_with.lock();
        self.with_store(|s| {
            let b = s.bundle();
            ContentKey {
                bundle: crate::bundle::sources_hash(&b.sources) ^ b.resolved.fingerprint(),
                in_force: in_force
                    .map(|objects| isolation::endpoints_hash(&in_force_endpoints(s, &objects))),
                compiled_with,
            }
        })
    }

    /// The bundle of the store's current content, numbered, with a snapshot of its objects
    /// kept for status.
    pub fn snapshot_bundle(&self) -> ConfigBundle {
        let in_force = self.in_force_objects.lock().clone();
        let (mut bundle, objects, pods) = self.with_store(|s| {
            let mut bundle = s.bundle();
            // If this bundle is refused, the policy in force is re-applied with the current
            // pods as *its* worker sets select them.
            bundle.resolved.in_force_endpoints = in_force
                .as_ref()
                .map(|objects| in_force_endpoints(s, objects));
            (bundle, s.objects().cloned().collect(), s.pods_snapshot())
        });
        let objects: Arc<Vec<StoredObject>> = Arc::new(objects);
        // Namespace isolation: the gateway merges this bundle with the objects in force, and
        // records what it put in force, when it applies it.
        bundle.resolved.isolation = Some(Arc::new(isolation::NamespaceMerge::new(
            objects.clone(),
            self.in_force_objects.clone(),
            self.in_force_compiled_with.clone(),
            pods,
        )));
        if self.seeded.load(Ordering::SeqCst) {
            bundle.resolved.last_good = in_force.map(|objects| store::sources_of(objects.iter()));
        }
        let rev = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        bundle.revision = rev;
        let mut snaps = self.snapshots.lock();
        snaps.insert(rev, objects);
        // Applied bundles are removed by `after_apply`; this only bounds a stalled apply loop.
        while snaps.len() > MAX_UNAPPLIED_SNAPSHOTS {
            snaps.pop_first();
        }
        bundle
    }

    /// Records the outcome of applying a bundle made by [`Controller::snapshot_bundle`] and
    /// wakes the status loop.
    pub fn after_apply(
        &self,
        gw: &Gateway,
        bundle: &ConfigBundle,
        outcome: &ApplyOutcome,
        diags: &[Diagnostic],
    ) {
        // The pods may have changed while this bundle was on its way, back to what the policy
        // in force had before: the apply loop then saw nothing to publish. Wake it to compare
        // the selection with what was just compiled.
        let key = self.content_key();
        if let (Some(selected), Some(compiled)) = (key.in_force, key.compiled_with)
            && selected != compiled
        {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        // This one and every older one (skipped for a newer bundle) are done.
        let objects = {
            let mut snaps = self.snapshots.lock();
            let objects = snaps.remove(&bundle.revision);
            snaps.retain(|rev, _| *rev > bundle.revision);
            objects
        };
        let Some(objects) = objects else {
            return;
        };
        // (What the bundle put in force was recorded when it was applied:
        // `NamespaceIsolation::settle`.)
        let in_force = outcome.in_force();
        let refused_namespaces: Option<std::collections::BTreeSet<String>> = outcome
            .refused_namespaces()
            .map(|ns| ns.iter().cloned().collect());
        if in_force {
            self.seeded.store(false, Ordering::SeqCst);
            // Partly applied: the refused namespaces that held the kept objects still do.
            let mut kept = self.kept_namespaces.lock();
            match &refused_namespaces {
                Some(refused) => kept.retain(|ns| refused.contains(ns)),
                None => kept.clear(),
            }
        }
        // Refused, and a policy is served all the same while only the kept one exists: the
        // kept one (it compiled).
        let serving_kept = !in_force && self.seeded.load(Ordering::SeqCst) && gw.store.is_ready();
        self.serving_kept
            .store(serving_kept, std::sync::atomic::Ordering::Relaxed);
        *self.serving_kept_namespaces.lock() = if gw.store.is_ready() {
            self.kept_namespaces.lock().iter().cloned().collect()
        } else {
            Vec::new()
        };
        *self.last.lock() = Some(LastApply {
            revision: bundle.revision,
            objects,
            sources: bundle.sources.clone(),
            diagnostics: diags.to_vec(),
            in_force,
            refused_namespaces,
        });
        self.status_wake.notify_one();
    }

    /// The status of every object of the last applied bundle, with the objects' current status
    /// from the store (for `lastTransitionTime`) and the gateway's live counts.
    pub fn status_patches(&self, gw: &Gateway, now: &str) -> Vec<StatusPatch> {
        let Some(last) = self.last.lock().clone() else {
            return Vec::new();
        };
        let sent = self.last_sent.lock().clone();
        let (objects, secrets, secret_errors, selected) = self.with_store(|s| {
            let objects: Vec<StoredObject> = last
                .objects
                .iter()
                .map(|o| {
                    let mut o = o.clone();
                    if let Some(cur) = s.object(&o.key) {
                        o.status = cur.status.clone();
                        // A newer generation with the same content (an edit reverted within
                        // the debounce, a re-applied manifest) is not compiled again: it is
                        // the generation in force.
                        if cur.source == o.source {
                            o.generation = cur.generation;
                        }
                    }
                    // Written but not yet reported back by the watch: that is the previous
                    // status (keeps transition times stable). Not for a recreated object.
                    if let Some(cur) = s.object(&o.key)
                        && let Some(sent) = sent.get(&o.key)
                        && sent.describes(cur)
                        && !status::covers(&o.status, &sent.body["status"])
                    {
                        o.status = sent.body["status"].clone();
                    }
                    o
                })
                .collect();
            (
                objects,
                secret_keys(s),
                s.secret_errors().clone(),
                s.selected_pods(),
            )
        });
        let live = live_counts(gw, &selected);
        let current = gw.store.current();
        let policy = current.as_ref().map(|a| a.policy.clone());
        status::compute(&StatusInput {
            objects: &objects,
            sources: &last.sources,
            diagnostics: &last.diagnostics,
            in_force: last.in_force,
            refused_namespaces: last.refused_namespaces.as_ref(),
            generation: current.as_ref().map(|a| a.generation),
            policy: policy.as_deref(),
            in_force_sources: current.as_ref().map(|a| &a.sources),
            live: &live,
            secrets: &secrets,
            secret_errors: &secret_errors,
            now,
        })
    }

    /// Writes every status that differs from the stored one (and from the last one written),
    /// when this replica is the leader. Returns how many were written.
    pub async fn write_status(&self, gw: &Gateway) -> usize {
        if !self.is_leader() {
            return 0;
        }
        let _one_writer = self.writing.lock().await;
        let now = now_rfc3339();
        let patches = self.status_patches(gw, &now);
        // Forget writes to objects that are gone, recreated or reported back since.
        self.with_store(|s| {
            self.last_sent
                .lock()
                .retain(|k, sent| s.object(k).is_some_and(|o| sent.describes(o)));
        });
        let mut written = 0;
        for p in patches {
            let stored = self.with_store(|s| s.object(&p.key).cloned());
            let Some(stored) = stored else { continue };
            let already_sent = self
                .last_sent
                .lock()
                .get(&p.key)
                .is_some_and(|sent| sent.describes(&stored) && sent.body == p.body);
            if status::up_to_date(&stored.status, &p) || already_sent {
                continue;
            }
            if !self.is_leader() {
                break;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                &p.key.namespace,
                &api_resource(p.key.kind),
            );
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let sent = tokio::time::timeout(
                REQUEST_TIMEOUT,
                api.patch_status(&p.key.name, &pp, &Patch::Apply(&p.body)),
            )
            .await;
            let Ok(sent) = sent else {
                tracing::warn!(object = %p.key.label(), "status patch timed out");
                continue;
            };
            match sent {
                Ok(_) => {
                    written += 1;
                    self.last_sent.lock().insert(
                        p.key.clone(),
                        Sent {
                            uid: stored.uid,
                            resource_version: stored.resource_version,
                            body: p.body,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(object = %p.key.label(), error = %e, "status patch failed");
                }
            }
        }
        written
    }

    fn crd_api(&self, kind: ResourceKind) -> Api<DynamicObject> {
        let ar = api_resource(kind);
        match &self.opts.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// Reads the referenced Secrets (all when `all`, else only those not read yet).
    pub async fn read_secrets(&self, all: bool) {
        // Also those of the objects in force: while a newer bundle is refused, the policy in
        // force is re-applied with their current values (a refused edit may name another
        // Secret; a revocation in the one in force must still be seen).
        let in_force = self.in_force_objects.lock().clone();
        let in_use =
            self.with_store(|s| secret_refs_in_use(s, in_force.as_deref().map(Vec::as_slice)));
        // Secrets no longer referenced are forgotten (not signalled as a change: nothing uses
        // them).
        self.store.lock().forget_secrets_except(&in_use);
        let refs = self.with_store(|s| {
            in_use
                .into_iter()
                .filter(|(ns, n)| all || s.secret_state(ns, n, None).is_none())
                .collect::<Vec<_>>()
        });
        // A few at a time: one slow Secret (up to the 10 s timeout) must not hold up the rest.
        futures_util::stream::iter(refs)
            .for_each_concurrent(SECRET_READS_AT_ONCE, |(ns, name)| async move {
                let api: Api<K8sSecret> = Api::namespaced(self.client.clone(), &ns);
                let Ok(got) = tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(&name)).await
                else {
                    let why = format!("the read timed out after {}s", REQUEST_TIMEOUT.as_secs());
                    self.secret_read_failed(&ns, &name, &why);
                    return;
                };
                let got = match got {
                    Ok(s) => s,
                    Err(::kube::Error::Api(e)) if e.code == 403 => {
                        let why = "forbidden (the API server's 403): grant the controller `get` \
                                   on it (the chart's `secrets.names`, or `secrets.allowAll`)";
                        self.secret_read_failed(&ns, &name, why);
                        return;
                    }
                    Err(e) => {
                        self.secret_read_failed(&ns, &name, &e.to_string());
                        return;
                    }
                };
                let key = (ns.clone(), name.clone());
                let failed_before = self.with_store(|s| s.secret_errors().contains_key(&key));
                self.update_store(|s| s.set_secret(&ns, &name, got.as_ref()));
                if failed_before {
                    tracing::info!(secret = %format!("{ns}/{name}"), "the Secret can be read again");
                }
            })
            .await;
    }

    /// Records that reading Secret `ns/name` failed with `why`, and logs it: a warning naming
    /// the Secret and the error, which says whether the value read before stays in use (it
    /// does: a failed read drops no key; the status of the objects naming it says so too).
    /// The same error as the last read's is logged at `debug` only: the Secrets are read again
    /// every 30 s, and one warning per failure is enough.
    fn secret_read_failed(&self, ns: &str, name: &str, why: &str) {
        let secret = format!("{ns}/{name}");
        let key = (ns.to_owned(), name.to_owned());
        let (repeated, state) = self.with_store(|s| {
            (
                s.secret_errors().get(&key).map(String::as_str) == Some(why),
                s.secret_state(ns, name, None),
            )
        });
        match state {
            _ if repeated => {
                tracing::debug!(%secret, error = %why, "cannot read the Secret (as before)");
            }
            Some(true) => tracing::warn!(
                %secret, error = %why,
                "cannot read the Secret again; the value read before stays in use"
            ),
            Some(false) => tracing::warn!(
                %secret, error = %why,
                "cannot read the Secret again (it was not found before)"
            ),
            None => tracing::warn!(%secret, error = %why, "cannot read the Secret"),
        }
        self.update_store(|s| s.secret_read_failed(ns, name, why));
    }

    /// On shutdown: stops the lease loop and status writes, and gives the Lease up when this
    /// replica holds it ([`lease::release`]), within 2 s, so that another replica writes status
    /// at once rather than after the lease runs out.
    pub async fn release_lease(&self) {
        self.leader.resign();
        let api: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.opts.lease_namespace);
        let cfg = lease::LeaseConfig::new(&self.opts.lease_name, &self.opts.identity);
        match tokio::time::timeout(Duration::from_secs(2), lease::release(&api, &cfg)).await {
            Ok(Ok(true)) => tracing::info!(lease = %cfg.name, "lease released"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
            Err(_) => tracing::warn!("releasing the lease timed out"),
        }
    }

    /// Starts the watch tasks, the Secret reader, the lease loop, the apply loop and the status
    /// loop. Returns at once; the tasks run until the runtime stops.
    pub fn start(self: &Arc<Self>, gw: Arc<Gateway>, on_applied: crate::serve::OnApplied) {
        let status: Arc<dyn crate::gateway::ControllerStatus> = self.clone();
        // Only one controller per gateway; a second start keeps the first's status view.
        let _ = gw.controller.set(status);
        let (tx, rx) = tokio::sync::watch::channel(None);
        let me = self.clone();
        let after: crate::bundle::AfterApply =
            Arc::new(move |gw, bundle, outcome, diags| me.after_apply(gw, bundle, outcome, diags));
        tokio::spawn(crate::bundle::apply_loop(
            gw.clone(),
            rx,
            on_applied,
            Some(after),
        ));
        let source: Box<dyn ConfigSource> = Box::new(KubeSource(self.clone()));
        tokio::spawn(source.run(tx));
        // Lease.
        let lease_api = Api::namespaced(self.client.clone(), &self.opts.lease_namespace);
        let cfg = lease::LeaseConfig::new(&self.opts.lease_name, &self.opts.identity);
        tokio::spawn(lease::run(
            lease_api,
            cfg,
            self.opts.lease_namespace.clone(),
            self.leader.clone(),
        ));
        // Status.
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = me.status_wake.notified() => {}
                    () = tokio::time::sleep(me.opts.status_interval) => {}
                }
                me.write_status(&gw).await;
                me.persist_last_good().await;
            }
        });
    }
}

/// The [`ConfigSource`] of a [`Controller`].
struct KubeSource(Arc<Controller>);

impl ConfigSource for KubeSource {
    fn run(
        self: Box<Self>,
        tx: BundleSender,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let c = self.0;
        Box::pin(async move {
            // First the last good policy (served if the first bundle is refused): before the
            // Secret reader starts, so that its first round reads that policy's Secrets too.
            c.load_last_good().await;
            for kind in ResourceKind::ALL {
                let c = c.clone();
                tokio::spawn(async move {
                    let mut events = watcher(c.crd_api(kind), watcher::Config::default())
                        .default_backoff()
                        .boxed();
                    while let Some(ev) = events.next().await {
                        match ev {
                            Ok(ev) => {
                                c.update_store(|s| s.apply_object_event(kind, ev));
                            }
                            Err(e) => {
                                tracing::warn!(kind = %kind, error = %e, "watch failed; retrying")
                            }
                        }
                    }
                });
            }
            {
                let c = c.clone();
                tokio::spawn(async move {
                    let api: Api<Pod> = match &c.opts.namespace {
                        Some(ns) => Api::namespaced(c.client.clone(), ns),
                        None => Api::all(c.client.clone()),
                    };
                    let mut events = watcher(api, watcher::Config::default())
                        .default_backoff()
                        .boxed();
                    while let Some(ev) = events.next().await {
                        match ev {
                            Ok(ev) => {
                                c.update_store(|s| s.apply_pod_event(ev));
                            }
                            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                        }
                    }
                });
            }
            {
                let c = c.clone();
                let mut changed = c.changed.subscribe();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(c.opts.secret_refresh);
                    loop {
                        let all = tokio::select! {
                            _ = tick.tick() => true,
                            r = changed.changed() => { if r.is_err() { return; } false }
                        };
                        c.read_secrets(all).await;
                    }
                });
            }
            let mut changed = c.changed.subscribe();
            // Changes made before subscribing (the watches have started) count too.
            changed.mark_changed();
            let mut waiting_logged = false;
            let mut last_published: Option<ContentKey> = None;
            // Since when a bundle waits for a Secret it newly refers to.
            let mut secret_wait: Option<tokio::time::Instant> = None;
            while changed.changed().await.is_ok() {
                tokio::time::sleep(c.opts.debounce).await;
                changed.borrow_and_update();
                if last_published.is_none() && !c.first_bundle_ready() {
                    if !waiting_logged {
                        tracing::info!(
                            "waiting for the first listing of every watched resource and the \
                             first read of every referenced Secret"
                        );
                        waiting_logged = true;
                    }
                    continue;
                }
                // An edit that names a Secret not read yet (a new API-key Secret) waits for its
                // first read (the reader signals when it ends), so that it is not compiled
                // without it; at most `NEW_SECRET_WAIT`, should the API server not answer.
                if !c.secrets_read() {
                    let since = *secret_wait.get_or_insert_with(|| {
                        let c = c.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(NEW_SECRET_WAIT).await;
                            c.changed.send_modify(|n| *n = n.wrapping_add(1));
                        });
                        tokio::time::Instant::now()
                    });
                    if since.elapsed() < NEW_SECRET_WAIT {
                        continue;
                    }
                }
                secret_wait = None;
                // Status written by the leader comes back as events: a bundle whose sources,
                // endpoints and Secrets are unchanged is not compiled again.
                let key = c.content_key();
                if !ContentKey::needs_publish(last_published.as_ref(), &key) {
                    c.status_wake.notify_one();
                    continue;
                }
                last_published = Some(key);
                let bundle = c.snapshot_bundle();
                if tx.send(Some(Arc::new(bundle))).is_err() {
                    return;
                }
            }
        })
    }
}

/// The endpoints that the worker sets among `objects` (those of the policy in force) select
/// among the store's pods, by `namespace/name`.
fn in_force_endpoints(s: &ClusterStore, objects: &[StoredObject]) -> BTreeMap<String, Vec<String>> {
    s.selected_pods_of(objects.iter())
        .into_iter()
        .map(|(k, v)| (k, v.endpoints))
        .collect()
}

/// What the apply loop compares to decide whether to publish a new bundle.
#[derive(Clone, Debug)]
pub struct ContentKey {
    /// A hash of the bundle's sources, endpoints and Secret values.
    pub bundle: u64,
    /// A hash of the endpoints that the worker sets of the objects in force select now.
    pub in_force: Option<u64>,
    /// A hash of the endpoints the policy in force was compiled with (set when a bundle is
    /// applied).
    pub compiled_with: Option<u64>,
}

impl ContentKey {
    /// Whether a bundle must be published, `last` being the key when the last one was:
    /// - the store's content changed (sources, the bundle's endpoints, Secret values); or
    /// - the worker sets in force select other pods than the policy in force was compiled
    ///   with, and no bundle was published for these pods yet. While a bundle is refused, as a
    ///   whole or in some namespaces, those worker sets may select other pods than the
    ///   bundle's (an edited selector), and only a new bundle carries the change into the
    ///   policy in force.
    pub fn needs_publish(last: Option<&ContentKey>, now: &ContentKey) -> bool {
        let Some(last) = last else {
            return true;
        };
        if last.bundle != now.bundle {
            return true;
        }
        match (now.in_force, now.compiled_with) {
            (Some(selected), Some(compiled)) => {
                selected != compiled && last.in_force != Some(selected)
            }
            _ => false,
        }
    }
}

/// The Secrets in use: those the store's objects refer to, and those of the objects in force
/// (while a newer bundle is refused, or before the first, the policy in force is compiled with
/// their current values).
fn secret_refs_in_use(
    s: &ClusterStore,
    in_force: Option<&[StoredObject]>,
) -> std::collections::BTreeSet<(String, String)> {
    let mut refs = s.referenced_secrets();
    if let Some(objects) = in_force {
        refs.extend(store::secret_refs_of(objects));
    }
    refs
}

/// A hash of the last-good content, to write it only when it changed.
fn content_hash(json: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = ahash::AHasher::default();
    json.hash(&mut h);
    h.finish()
}

/// What the store knows of every referenced Secret.
fn secret_keys(s: &ClusterStore) -> SecretKeys {
    let bundle_secrets = s.bundle().resolved.secrets;
    s.referenced_secrets()
        .into_iter()
        .filter_map(|(ns, name)| {
            let state = s.secret_state(&ns, &name, None)?;
            let keys = state.then(|| {
                bundle_secrets
                    .get(&(ns.clone(), name.clone()))
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default()
            });
            Some(((ns, name), keys))
        })
        .collect()
}

/// Live counts of a gateway: endpoints and their health from the cluster state, KV-event
/// streams from the ingestion status, selected pods from the store.
pub fn live_counts(gw: &Gateway, selected: &BTreeMap<String, store::SelectedPods>) -> LiveCounts {
    let mut out = LiveCounts::default();
    gw.state.with(|st| {
        for (k, ws) in &st.worker_sets {
            out.worker_sets.insert(
                k.to_string(),
                WorkerSetLive {
                    selected_pods: selected.get(&**k).map(|s| s.selected),
                    endpoints: ws.endpoints.len() as u32,
                    ready_endpoints: ws.endpoints.iter().filter(|e| e.ready).count() as u32,
                    kv_streams: 0,
                    kv_connected: 0,
                },
            );
        }
    });
    // Provider health from the provider pool itself (probes, breaker, credentials), not from
    // the routing state, which only requests refresh.
    let pool = gw.providers.load();
    for (k, p) in pool.state_snapshot() {
        out.providers.insert(k.to_string(), p.ready);
    }
    for (k, e) in pool.credential_errors() {
        out.provider_credential_errors.insert(k.to_string(), e);
    }
    // Front doors whose tenant identity could not be built refuse every request (503): the
    // runtime in force says which and why (never a key).
    if let Some(rt) = gw.runtime() {
        for door in &rt.doors {
            if let (Some(g), Err(e)) = (&door.gateway, &door.tenants) {
                let prefix = format!("GatewayBackend {g}: tenant identity: ");
                let why = e.strip_prefix(&prefix).unwrap_or(e);
                out.front_door_errors.insert(g.to_string(), why.to_owned());
            }
        }
    }
    for (k, s) in selected {
        out.worker_sets
            .entry(k.clone())
            .or_insert_with(|| WorkerSetLive {
                selected_pods: Some(s.selected),
                ..WorkerSetLive::default()
            });
    }
    if let Some(live) = gw.live.load_full() {
        let status = live.status_json();
        for e in status.as_array().into_iter().flatten() {
            let Some(ws) = e.get("workerSet").and_then(Value::as_str) else {
                continue;
            };
            let Some(kv) = e.get("kv").filter(|k| k.is_object()) else {
                continue;
            };
            if let Some(w) = out.worker_sets.get_mut(ws) {
                w.kv_streams += 1;
                if kv.get("connected").and_then(Value::as_bool) == Some(true) {
                    w.kv_connected += 1;
                }
            }
        }
    }
    out
}

/// Now, RFC 3339 in whole seconds (`metav1.Time`).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Where Linux exposes the kernel's host name (a pod's name inside a pod).
pub const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// This replica's default identity in the Lease: `$POD_NAME`, else `$HOSTNAME`, else the host
/// name read from `hostname_file` ([`HOSTNAME_FILE`]; `HOSTNAME` is a shell variable that is
/// often not exported), else `kinference-<pid>`. `var` reads an environment variable.
pub fn default_identity(
    var: impl Fn(&str) -> Option<String>,
    hostname_file: &std::path::Path,
) -> String {
    let non_empty = |v: String| {
        let v = v.trim().to_owned();
        (!v.is_empty()).then_some(v)
    };
    var("POD_NAME")
        .and_then(non_empty)
        .or_else(|| var("HOSTNAME").and_then(non_empty))
        .or_else(|| {
            std::fs::read_to_string(hostname_file)
                .ok()
                .and_then(non_empty)
        })
        .unwrap_or_else(|| format!("kinference-{}", std::process::id()))
}

/// A Kubernetes client from the in-cluster service account or `KUBECONFIG`.
pub async fn client() -> Result<Client, ::kube::Error> {
    Client::try_default().await
}
