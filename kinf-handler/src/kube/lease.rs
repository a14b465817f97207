//! Leader election on a `coordination.k8s.io/v1` Lease: one replica writes status, all serve.
//!
//! Every `renew_every`, each replica reads the Lease. The holder renews it. Another replica
//! never compares the holder's `renewTime` with its own wall clock (the two nodes' clocks may
//! disagree by minutes); as client-go's leaderelection does, it remembers the Lease record it
//! read (`spec` and `resourceVersion`, [`Observed`]) with the local monotonic instant at which it
//! first read it, and takes the Lease over only once that record has stayed unchanged for
//! `leaseDurationSeconds` of its own monotonic time. So a replica that starts, or has just seen
//! a renewal, waits a full lease duration without change before a takeover, whatever
//! `renewTime` says; a holder that dies without releasing the Lease is replaced `duration` to
//! about `duration + renew_every` after another replica first read its last renewal, and a
//! Lease with no holder (released) is taken over at once. Writes carry the `resourceVersion`
//! read, so two replicas racing for an expired Lease cannot both win (the loser gets 409
//! Conflict). Each round has a timeout (`renew_every`), and a holder counts as the leader only
//! for `renew_deadline` after its last successful renewal began — less than the lease duration,
//! which another replica starts counting no earlier than when that renewal was written, so a
//! holder that cannot renew (an error, or a request that never returns) has stopped writing
//! status before another replica may take the Lease over.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use ::kube::Api;
use ::kube::api::{ObjectMeta, PostParams};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// How long after its last successful renewal began a holder still acts as the leader (the
/// default of [`LeaseConfig::renew_deadline`]; client-go's default too).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Settings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a lease is valid without renewal (written as `leaseDurationSeconds`; also
    /// used for a Lease read without one).
    pub duration: Duration,
    /// How often it is renewed (and others check it); also the timeout of one round.
    pub renew_every: Duration,
    /// How long after the start of its last successful renewal the holder still acts as the
    /// leader; shorter than `duration`, so that it stops before anyone may take over.
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// A 15 s lease renewed every 5 s; the holder steps down 10 s after its last renewal.
    pub fn new(name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaseConfig {
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            renew_deadline: RENEW_DEADLINE,
        }
    }
}

/// Whether this replica holds the Lease: it does while its last successful renewal began less
/// than `deadline` ago. Shared by the lease loop (which records renewals) and the status writer
/// (which checks it before every write), so leadership ends on time even while a lease request
/// hangs.
#[derive(Debug)]
pub struct Leadership {
    renewed: Mutex<Option<Instant>>,
    deadline: Duration,
    /// Shutting down: the lease loop stops and no renewal counts any more.
    resigned: std::sync::atomic::AtomicBool,
}

impl Leadership {
    /// Not the leader yet; leadership lasts `deadline` after each renewal.
    pub fn new(deadline: Duration) -> Self {
        Leadership {
            renewed: Mutex::new(None),
            deadline,
            resigned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Gives leadership up for good (shutdown): [`run`] stops at its next round, and a round in
    /// flight no longer makes this replica the leader.
    pub fn resign(&self) {
        self.resigned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.renewed.lock() = None;
    }

    /// Whether [`Leadership::resign`] was called.
    pub fn resigned(&self) -> bool {
        self.resigned.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records a successful renewal whose request was sent at `at`. Returns whether this
    /// replica was not the leader before.
    pub fn renewed(&self, at: Instant) -> bool {
        if self.resigned() {
            return false;
        }
        let was = self.is_leader();
        *self.renewed.lock() = Some(at);
        !was
    }

    /// Gives leadership up (another replica holds the Lease). Returns whether this replica
    /// was the leader.
    pub fn lost(&self) -> bool {
        let was = self.is_leader();
        *self.renewed.lock() = None;
        was
    }

    /// When the request of the last successful renewal was sent (`None` after a loss or
    /// resignation, or before the first renewal).
    pub fn last_renewal(&self) -> Option<Instant> {
        *self.renewed.lock()
    }

    /// Whether this replica may act as the leader now.
    pub fn is_leader(&self) -> bool {
        self.renewed
            .lock()
            .is_some_and(|t| t.elapsed() < self.deadline)
    }
}

/// What to do with the Lease as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// It does not exist: create it, held by us.
    Create,
    /// We hold it: renew.
    Renew,
    /// It has no holder, or another holder's record stayed unchanged for the lease duration:
    /// take it over.
    TakeOver,
    /// Another replica holds it.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// The Lease record a replica last read and when it first read it, on the local monotonic
/// clock: how a non-holder measures expiry without trusting the holder's wall clock.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// `resourceVersion` and `spec` of the record, and when it was first read.
    seen: Option<(Option<String>, LeaseSpec, Instant)>,
}

impl Observed {
    /// Nothing observed yet (a replica that just started).
    pub fn new() -> Self {
        Observed::default()
    }

    /// Records `lease` as read at `now`; returns how long the same record (`resourceVersion`
    /// and `spec`) has been read, from when it was first read.
    fn unchanged_for(&mut self, lease: &Lease, now: Instant) -> Duration {
        let version = &lease.metadata.resource_version;
        let spec = lease.spec.clone().unwrap_or_default();
        match &self.seen {
            Some((v, s, since)) if v == version && *s == spec => {
                now.saturating_duration_since(*since)
            }
            _ => {
                self.seen = Some((version.clone(), spec, now));
                Duration::ZERO
            }
        }
    }

    /// Forgets the record (the Lease does not exist).
    fn forget(&mut self) {
        self.seen = None;
    }
}

/// Decides what to do with the Lease read at `now` (local monotonic clock), recording it in
/// `observed`. Another holder's Lease expires once the record has been unchanged in `observed`
/// for its `leaseDurationSeconds` (else `cfg.duration`); its `renewTime` is not consulted.
pub fn decide(
    lease: Option<&Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
    now: Instant,
) -> Action {
    let Some(lease) = lease else {
        observed.forget();
        return Action::Create;
    };
    let unchanged = observed.unchanged_for(lease, now);
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder == cfg.identity {
        return Action::Renew;
    }
    if holder.is_empty() {
        return Action::TakeOver;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|&s| s > 0)
        .map_or(cfg.duration, Duration::from_secs);
    if unchanged >= duration {
        Action::TakeOver
    } else {
        Action::Follow { holder }
    }
}

/// The Lease after `action` (for `Create`, `Renew`, `TakeOver`).
pub fn next_lease(
    current: Option<&Lease>,
    cfg: &LeaseConfig,
    namespace: &str,
    action: &Action,
    now: Timestamp,
) -> Lease {
    let mut lease = current.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let mut spec: LeaseSpec = lease.spec.take().unwrap_or_default();
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(i32::MAX);
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(MicroTime(now));
    if *action != Action::Renew {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        if *action == Action::TakeOver {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        } else {
            spec.lease_transitions = Some(0);
        }
    }
    lease.spec = Some(spec);
    lease
}

/// One round: read, decide, write. `observed` carries what this replica saw of the Lease from
/// round to round (see [`decide`]). Returns whether we hold the lease afterwards.
pub async fn round(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    namespace: &str,
    observed: &mut Observed,
) -> Result<bool, ::kube::Error> {
    let current = api.get_opt(&cfg.name).await?;
    // Read after the response: the record was written no later than this instant.
    let action = decide(current.as_ref(), cfg, observed, Instant::now());
    if let Action::Follow { .. } = action {
        return Ok(false);
    }
    let lease = next_lease(current.as_ref(), cfg, namespace, &action, Timestamp::now());
    let pp = PostParams {
        field_manager: Some(super::FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let written = match action {
        Action::Create => api.create(&pp, &lease).await,
        _ => api.replace(&cfg.name, &pp, &lease).await,
    };
    match written {
        Ok(_) => Ok(true),
        // Another replica wrote first (create race or stale resourceVersion).
        Err(::kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up on shutdown, when we hold it: clears `holderIdentity` (written with the
/// `resourceVersion` read), so that another replica takes it over at its next round instead of
/// after the lease duration. Returns whether it was released.
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, ::kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(false);
    };
    let mut spec = lease.spec.take().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    lease.spec = Some(spec);
    let pp = PostParams {
        field_manager: Some(super::FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match api.replace(&cfg.name, &pp, &lease).await {
        Ok(_) => Ok(true),
        // Written by someone else since: not ours to clear any more.
        Err(::kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs the election forever, recording renewals in `leader`. Each round is abandoned after
/// `renew_every`; leadership then lapses `renew_deadline` after the last successful renewal.
pub async fn run(api: Api<Lease>, cfg: LeaseConfig, namespace: String, leader: Arc<Leadership>) {
    let mut was_leader = false;
    let mut observed = Observed::new();
    loop {
        if leader.resigned() {
            return;
        }
        let started = Instant::now();
        match tokio::time::timeout(
            cfg.renew_every,
            round(&api, &cfg, &namespace, &mut observed),
        )
        .await
        {
            Ok(Ok(true)) => {
                if leader.renewed(started) {
                    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became the status-writing leader");
                }
            }
            Ok(Ok(false)) => {
                if leader.lost() {
                    tracing::info!(identity = %cfg.identity, "lost the lease; no longer writing status");
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "lease round failed"),
            Err(_) => tracing::warn!(timeout = ?cfg.renew_every, "lease round timed out"),
        }
        let is_leader = leader.is_leader();
        if was_leader && !is_leader {
            tracing::warn!(
                identity = %cfg.identity,
                "lease not renewed within the renew deadline; no longer writing status"
            );
        }
        was_leader = is_leader;
        // The next round starts `renew_every` after this one began (at once after a timeout).
        tokio::time::sleep_until(started + cfg.renew_every).await;
    }
}
