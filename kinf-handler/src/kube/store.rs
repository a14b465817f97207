//! The controller's index: every Kinference object, the pods and the referenced Secrets, fed
//! by watcher events. Synchronous and pure — tests apply events and read the bundle.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ::kube::api::DynamicObject;
use ::kube::runtime::watcher::Event;
use k8s_openapi::api::core::v1::{Pod, Secret as K8sSecret};
use kinf_policy::{API_VERSION, ResourceKind};
use serde_json::Value;

use crate::bundle::{ConfigBundle, Resolved, SecretValues};
use crate::providers::credentials::Secret;

/// Identity of a Kinference object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Its kind.
    pub kind: ResourceKind,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// `Kind/namespace/name`: the source name of the object in a bundle, and the `resource` of
    /// its diagnostics.
    pub fn label(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }

    /// Parses [`ObjectKey::label`].
    pub fn parse_label(s: &str) -> Option<Self> {
        let mut it = s.splitn(3, '/');
        let kind = ResourceKind::parse(it.next()?)?;
        Some(ObjectKey {
            kind,
            namespace: it.next()?.to_owned(),
            name: it.next()?.to_owned(),
        })
    }
}

/// One Kinference object as the controller keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredObject {
    /// Identity.
    pub key: ObjectKey,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec` as stored by the API server.
    pub spec: Value,
    /// `status` as stored by the API server (`null` when none).
    pub status: Value,
    /// The YAML source compiled for it (`apiVersion`, `kind`, `metadata`, `spec`).
    pub source: Arc<str>,
    /// `metadata.uid`: tells a deleted and recreated object from the old one.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`: changes with every write the watch reports.
    pub resource_version: Option<String>,
    /// `metadata.creationTimestamp`: front doors that answer the same host are ordered by it.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

impl StoredObject {
    /// From a watched object of `kind`; `None` without a name.
    pub fn from_dynamic(kind: ResourceKind, obj: &DynamicObject) -> Option<Self> {
        let name = obj.metadata.name.clone()?;
        let namespace = obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let spec = obj.data.get("spec").cloned().unwrap_or(Value::Null);
        let status = obj.data.get("status").cloned().unwrap_or(Value::Null);
        let mut s = Self::new(
            ObjectKey {
                kind,
                namespace,
                name,
            },
            obj.metadata.generation,
            spec,
            status,
        );
        s.uid = obj.metadata.uid.clone();
        s.resource_version = obj.metadata.resource_version.clone();
        s.created = obj.metadata.creation_timestamp.as_ref().map(|t| t.0);
        Some(s)
    }

    /// From its parts (no `uid` or `resourceVersion`).
    pub fn new(key: ObjectKey, generation: Option<i64>, spec: Value, status: Value) -> Self {
        let doc = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": key.kind.as_str(),
            "metadata": {"name": key.name, "namespace": key.namespace},
            "spec": spec,
        });
        let source = super::yaml::to_yaml(&doc).into();
        StoredObject {
            key,
            generation,
            spec,
            status,
            source,
            uid: None,
            resource_version: None,
            created: None,
        }
    }
}

/// What the controller needs of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// The `Ready` condition is true.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// Container ports: `(name, port)`.
    pub ports: Vec<(Option<String>, i32)>,
    /// The pod has completed (`status.phase` `Succeeded` or `Failed`): its containers have
    /// stopped for good, so it is no member of any worker set. (Only this is kept of the phase:
    /// a pod going from `Pending` to `Running` changes nothing a worker set selects.)
    pub completed: bool,
}

impl PodInfo {
    /// From a watched pod; `None` without a name.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let status = pod.status.as_ref();
        Some(PodInfo {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            name,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            ports: pod
                .spec
                .as_ref()
                .map(|s| {
                    s.containers
                        .iter()
                        .flat_map(|c| c.ports.iter().flatten())
                        .map(|p| (p.name.clone(), p.container_port))
                        .collect()
                })
                .unwrap_or_default(),
            completed: matches!(
                status.and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
        })
    }

    /// `host:port` for `port` (IPv6 in brackets).
    pub fn address(&self, port: u16) -> Option<String> {
        let ip = self.ip.as_deref()?;
        Some(if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        })
    }
}

/// The pods selected by one worker set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelectedPods {
    /// Pods matching the selector.
    pub selected: u32,
    /// Of those, ready, with an IP and not terminating: the endpoints.
    pub endpoints: Vec<String>,
}

/// Which stream an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    /// One of the five CRDs.
    Crd(ResourceKind),
    /// Pods.
    Pods,
}

/// The pods, by `(namespace, name)`: shared with the bundles made from the store (copied on
/// the first change after a bundle took it).
pub type Pods = Arc<BTreeMap<(String, String), PodInfo>>;

/// Objects, pods and Secrets, as last seen.
#[derive(Debug, Default)]
pub struct ClusterStore {
    objects: BTreeMap<ObjectKey, StoredObject>,
    pods: Pods,
    /// `None`: looked up and not found.
    secrets: BTreeMap<(String, String), Option<BTreeMap<String, Secret>>>,
    /// Secrets whose read was attempted at least once (found, not found, or failed).
    secrets_tried: BTreeSet<(String, String)>,
    /// Why the last read of a Secret failed (timeout, server error), until a read succeeds.
    secret_errors: BTreeMap<(String, String), String>,
    init_objects: BTreeMap<ResourceKind, Vec<StoredObject>>,
    init_pods: Option<Vec<PodInfo>>,
    /// Streams that completed their first listing.
    synced: BTreeSet<Stream>,
}

impl ClusterStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a watcher event of one CRD. Returns whether anything changed.
    pub fn apply_object_event(&mut self, kind: ResourceKind, ev: Event<DynamicObject>) -> bool {
        match ev {
            Event::Apply(o) => match StoredObject::from_dynamic(kind, &o) {
                Some(s) => self.upsert(s),
                None => false,
            },
            Event::Delete(o) => match StoredObject::from_dynamic(kind, &o) {
                Some(s) => self.objects.remove(&s.key).is_some(),
                None => false,
            },
            Event::Init => {
                self.init_objects.insert(kind, Vec::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(s) = StoredObject::from_dynamic(kind, &o) {
                    self.init_objects.entry(kind).or_default().push(s);
                }
                false
            }
            Event::InitDone => {
                let fresh = self.init_objects.remove(&kind).unwrap_or_default();
                let before: Vec<StoredObject> = self
                    .objects
                    .values()
                    .filter(|o| o.key.kind == kind)
                    .cloned()
                    .collect();
                self.objects.retain(|k, _| k.kind != kind);
                for s in fresh {
                    self.objects.insert(s.key.clone(), s);
                }
                let after: Vec<&StoredObject> = self
                    .objects
                    .values()
                    .filter(|o| o.key.kind == kind)
                    .collect();
                let first = self.synced.insert(Stream::Crd(kind));
                first
                    || before.len() != after.len()
                    || before.iter().zip(after).any(|(a, b)| a != b)
            }
        }
    }

    /// Inserts or replaces an object. Returns whether it changed.
    pub fn upsert(&mut self, s: StoredObject) -> bool {
        if self.objects.get(&s.key) == Some(&s) {
            return false;
        }
        self.objects.insert(s.key.clone(), s);
        true
    }

    /// Applies a watcher event of pods. Returns whether anything changed.
    pub fn apply_pod_event(&mut self, ev: Event<Pod>) -> bool {
        match ev {
            Event::Apply(p) => match PodInfo::from_pod(&p) {
                Some(i) => {
                    let k = (i.namespace.clone(), i.name.clone());
                    if self.pods.get(&k) == Some(&i) {
                        return false;
                    }
                    Arc::make_mut(&mut self.pods).insert(k, i);
                    true
                }
                None => false,
            },
            Event::Delete(p) => match PodInfo::from_pod(&p) {
                Some(i) => {
                    let k = (i.namespace, i.name);
                    self.pods.contains_key(&k) && Arc::make_mut(&mut self.pods).remove(&k).is_some()
                }
                None => false,
            },
            Event::Init => {
                self.init_pods = Some(Vec::new());
                false
            }
            Event::InitApply(p) => {
                if let Some(i) = PodInfo::from_pod(&p) {
                    self.init_pods.get_or_insert_with(Vec::new).push(i);
                }
                false
            }
            Event::InitDone => {
                let fresh: BTreeMap<_, _> = self
                    .init_pods
                    .take()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| ((i.namespace.clone(), i.name.clone()), i))
                    .collect();
                let first = self.synced.insert(Stream::Pods);
                let changed = fresh != *self.pods;
                self.pods = Arc::new(fresh);
                first || changed
            }
        }
    }

    /// Records a Secret as read (`None`: not found). Returns whether it changed.
    pub fn set_secret(&mut self, namespace: &str, name: &str, secret: Option<&K8sSecret>) -> bool {
        let data = secret.map(|s| {
            let mut out = BTreeMap::new();
            for (k, v) in s.data.iter().flatten() {
                if let Ok(text) = std::str::from_utf8(&v.0) {
                    out.insert(k.clone(), Secret::new(text));
                }
            }
            for (k, v) in s.string_data.iter().flatten() {
                out.insert(k.clone(), Secret::new(v));
            }
            out
        });
        let k = (namespace.to_owned(), name.to_owned());
        let first = self.secrets_tried.insert(k.clone());
        let had_error = self.secret_errors.remove(&k).is_some();
        if self.secrets.get(&k) == Some(&data) {
            return first || had_error;
        }
        self.secrets.insert(k, data);
        true
    }

    /// Records that reading a Secret was attempted and failed, and why (a value read before is
    /// kept). Returns whether anything changed.
    pub fn secret_read_failed(&mut self, namespace: &str, name: &str, error: &str) -> bool {
        let k = (namespace.to_owned(), name.to_owned());
        let first = self.secrets_tried.insert(k.clone());
        let changed = self.secret_errors.get(&k).map(String::as_str) != Some(error);
        self.secret_errors.insert(k, error.to_owned());
        first || changed
    }

    /// Forgets the Secrets not in `in_use` (values, errors, that they were read): one
    /// referenced again is read afresh before it is used, not served from a value that may
    /// have been revoked meanwhile. Returns whether anything was forgotten.
    pub fn forget_secrets_except(&mut self, in_use: &BTreeSet<(String, String)>) -> bool {
        let before = self.secrets_tried.len() + self.secrets.len() + self.secret_errors.len();
        self.secrets.retain(|k, _| in_use.contains(k));
        self.secrets_tried.retain(|k| in_use.contains(k));
        self.secret_errors.retain(|k, _| in_use.contains(k));
        before != self.secrets_tried.len() + self.secrets.len() + self.secret_errors.len()
    }

    /// Why the last read of each Secret failed, for Secrets whose reads fail.
    pub fn secret_errors(&self) -> &BTreeMap<(String, String), String> {
        &self.secret_errors
    }

    /// What `/admin/status` shows of the store: per stream whether its first listing completed
    /// and how many objects it holds; the referenced Secrets and what became of their reads.
    pub fn summary_json(&self, streams: &[Stream]) -> serde_json::Value {
        let mut watches = serde_json::Map::new();
        for st in streams {
            let (name, count) = match st {
                Stream::Crd(kind) => (
                    kind.to_string(),
                    self.objects.keys().filter(|k| k.kind == *kind).count(),
                ),
                Stream::Pods => ("Pod".to_owned(), self.pods.len()),
            };
            watches.insert(
                name,
                serde_json::json!({"synced": self.synced.contains(st), "objects": count}),
            );
        }
        let label = |(ns, name): &(String, String)| format!("{ns}/{name}");
        let referenced = self.referenced_secrets();
        let by_state = |want: Option<bool>| -> Vec<String> {
            referenced
                .iter()
                .filter(|k| self.secret_state(&k.0, &k.1, None) == want)
                .map(label)
                .collect()
        };
        let errors: serde_json::Map<String, serde_json::Value> = self
            .secret_errors
            .iter()
            .map(|(k, e)| (label(k), serde_json::Value::from(e.as_str())))
            .collect();
        serde_json::json!({
            "watches": watches,
            "secrets": {
                "found": by_state(Some(true)),
                "notFound": by_state(Some(false)),
                "notRead": by_state(None),
                "readErrors": errors,
            },
        })
    }

    /// Whether a read of every Secret in `refs` was attempted at least once, so that a bundle
    /// does not treat a Secret as missing only because it was not read yet.
    pub fn secrets_tried(&self, refs: &BTreeSet<(String, String)>) -> bool {
        refs.iter().all(|k| self.secrets_tried.contains(k))
    }

    /// Whether every stream in `streams` has completed its first listing.
    pub fn synced(&self, streams: &[Stream]) -> bool {
        streams.iter().all(|s| self.synced.contains(s))
    }

    /// Every object, sorted by kind, namespace and name.
    pub fn objects(&self) -> impl Iterator<Item = &StoredObject> {
        self.objects.values()
    }

    /// One object.
    pub fn object(&self, key: &ObjectKey) -> Option<&StoredObject> {
        self.objects.get(key)
    }

    /// The Secrets referenced by providers (`spec.credentials.secretRef`) and front doors
    /// (`spec.tenants.apiKeys.secretRef`): `(namespace, name)`.
    pub fn referenced_secrets(&self) -> BTreeSet<(String, String)> {
        secret_refs_of(self.objects.values())
    }

    /// Whether a Secret was read and found, and whether it holds `key` (`None`: not read yet).
    pub fn secret_state(&self, namespace: &str, name: &str, key: Option<&str>) -> Option<bool> {
        self.secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|d| match (d, key) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(d), Some(k)) => d.contains_key(k),
            })
    }

    /// The pods selected by every selector-mode worker set, by `namespace/name`.
    pub fn selected_pods(&self) -> BTreeMap<String, SelectedPods> {
        self.selected_pods_of(self.objects.values())
    }

    /// What the worker sets among `objects` (for example those of the policy in force, whose
    /// specs may differ from the stored ones) select among the current pods.
    pub fn selected_pods_of<'o>(
        &self,
        objects: impl IntoIterator<Item = &'o StoredObject>,
    ) -> BTreeMap<String, SelectedPods> {
        select_pods(&self.pods, objects)
    }

    /// The current pods (shared, not copied).
    pub fn pods_snapshot(&self) -> Pods {
        self.pods.clone()
    }

    /// The bundle of everything known: one source per object (named `Kind/namespace/name`),
    /// the endpoints of selector-mode worker sets, and the Secrets found.
    pub fn bundle(&self) -> ConfigBundle {
        let sources = sources_of(self.objects.values());
        let endpoints = self
            .selected_pods()
            .into_iter()
            .map(|(k, v)| (k, v.endpoints))
            .collect();
        let secrets: SecretValues = self
            .secrets
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|d| (k.clone(), d.clone())))
            .collect();
        ConfigBundle {
            sources,
            resolved: Resolved {
                endpoints,
                secrets: Arc::new(secrets),
                kubernetes: true,
                in_force_endpoints: None,
                last_good: None,
                isolation: None,
                key_files: None,
                credential_files: None,
            },
            revision: 0,
        }
    }
}

/// What the worker sets among `objects` select among `pods`: by `namespace/name`, the pods
/// matched and the ready ones' addresses. Completed pods (phase `Succeeded` or `Failed`) are
/// not members. Each worker set looks only at the pods of its own namespace (a range of the
/// map, which is sorted by namespace first), not at every pod.
pub fn select_pods<'o>(
    pods: &BTreeMap<(String, String), PodInfo>,
    objects: impl IntoIterator<Item = &'o StoredObject>,
) -> BTreeMap<String, SelectedPods> {
    let mut out = BTreeMap::new();
    for o in objects {
        if o.key.kind != ResourceKind::InferenceWorkerSet {
            continue;
        }
        let Some(sel) = o.spec.get("selector").filter(|s| s.is_object()) else {
            continue;
        };
        let explicit = o
            .spec
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok());
        let mut sp = SelectedPods::default();
        for p in pods_in_namespace(pods, &o.key.namespace) {
            if p.completed || !selector_matches(sel, &p.labels) {
                continue;
            }
            sp.selected += 1;
            if !p.ready || p.terminating {
                continue;
            }
            let port = explicit.unwrap_or_else(|| pod_port(p));
            if let Some(a) = p.address(port) {
                sp.endpoints.push(a);
            }
        }
        sp.endpoints.sort();
        sp.endpoints.dedup();
        out.insert(format!("{}/{}", o.key.namespace, o.key.name), sp);
    }
    out
}

/// The pods of `namespace`: the keys `(namespace, …)` are contiguous in the map, from
/// `(namespace, "")` on.
fn pods_in_namespace<'p>(
    pods: &'p BTreeMap<(String, String), PodInfo>,
    namespace: &'p str,
) -> impl Iterator<Item = &'p PodInfo> {
    pods.range((namespace.to_owned(), String::new())..)
        .take_while(move |((ns, _), _)| ns == namespace)
        .map(|(_, p)| p)
}

/// The sources of `objects` (sorted by key), as a bundle holds them: front doors last, oldest
/// first. A request goes to the first door naming its host (else the first naming none), so a
/// door created later, in any namespace, cannot take another's host, and KINF0508 marks the
/// later one.
pub fn sources_of<'o>(objects: impl IntoIterator<Item = &'o StoredObject>) -> kinf_lang::Sources {
    let mut sources = kinf_lang::Sources::new();
    let (mut doors, others): (Vec<&StoredObject>, Vec<&StoredObject>) = objects
        .into_iter()
        .partition(|o| o.key.kind == ResourceKind::GatewayBackend);
    doors.sort_by(|a, b| {
        // Without a creation time (not from the API server): after those with one.
        (a.created.is_none(), a.created, &a.key).cmp(&(b.created.is_none(), b.created, &b.key))
    });
    for o in others.into_iter().chain(doors) {
        sources.add(o.key.label(), o.source.clone());
    }
    sources
}

/// The Secrets that the providers (`spec.credentials.secretRef`) and front doors
/// (`spec.tenants.apiKeys.secretRef`) among `objects` refer to: `(namespace, name)`.
pub fn secret_refs_of<'o>(
    objects: impl IntoIterator<Item = &'o StoredObject>,
) -> BTreeSet<(String, String)> {
    objects
        .into_iter()
        .filter_map(|o| {
            let name = match o.key.kind {
                ResourceKind::InferenceProvider => o.spec.pointer("/credentials/secretRef/name"),
                ResourceKind::GatewayBackend => o.spec.pointer("/tenants/apiKeys/secretRef/name"),
                _ => None,
            }?;
            Some((o.key.namespace.clone(), name.as_str()?.to_owned()))
        })
        .collect()
}

/// The vLLM port of a pod when the worker set names none: the first container port named
/// `http` (of `spec.containers`, in order; init containers are not looked at), else 8000
/// (vLLM's default), also when the pod has other, differently named ports.
fn pod_port(p: &PodInfo) -> u16 {
    p.ports
        .iter()
        .find(|(n, _)| n.as_deref() == Some("http"))
        .and_then(|(_, port)| u16::try_from(*port).ok())
        .unwrap_or(8000)
}

/// Whether a `LabelSelector` (as JSON: `matchLabels`, `matchExpressions`) matches `labels`.
/// An empty selector matches every pod; an unknown operator matches none.
pub fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    if let Some(ml) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return false;
            }
        }
    }
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let have = labels.get(key).map(String::as_str);
        let ok = match e.get("operator").and_then(Value::as_str) {
            Some("In") => have.is_some_and(|h| values.contains(&h)),
            Some("NotIn") => !have.is_some_and(|h| values.contains(&h)),
            Some("Exists") => have.is_some(),
            Some("DoesNotExist") => have.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}
