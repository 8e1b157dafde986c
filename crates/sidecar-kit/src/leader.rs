//! Leader election on a coordination.k8s.io/v1 Lease, compatible with client-go's `LeaseLock`
//! (same name rule, same spec fields and the same takeover rule), so a Go replica and ours can
//! hand over during a rolling upgrade. Unlike upstream's default, the lease is released on exit
//! so a standby takes over at its next retry instead of after the lease duration. As client-go's
//! lock, it records a Normal `LeaderElection` event on the Lease when it becomes leader and when
//! it stops leading (`<identity> became leader`, from component `<lock>/<identity>`), unless
//! [`ElectionConfig::events`] is None.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

/// The lock name csi-lib-utils gives a driver's election before it sanitizes it into the
/// Lease's name: the driver's name with `/` as `-`. Its `LeaderElection` events come from
/// `<lock name>/<identity>`.
pub fn lock_name(driver: &str) -> String {
    driver.replace('/', "-")
}

/// The Lease name for a driver, as csi-lib-utils makes it: every character other than
/// `[a-zA-Z0-9-]` becomes `-`, and a trailing `-` gets an `X`.
pub fn lease_name(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.ends_with('-') {
        name.push('X');
    }
    name
}

/// The namespace of the lease: the flag, else `POD_NAMESPACE`, else the service account's
/// namespace, else `default`.
pub fn lease_namespace(flag: &str) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.is_empty()
    {
        return ns;
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// Settings, from the `--leader-election-*` flags.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (`<host>_<uuid>`).
    pub identity: String,
    /// `--leader-election-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-election-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-election-retry-period`.
    pub retry_period: Duration,
    /// `--leader-election-labels`.
    pub labels: BTreeMap<String, String>,
    /// Release the lease when stopping.
    pub release_on_exit: bool,
    /// Record client-go's `LeaderElection` events on the lease, from component
    /// `<this>/<identity>` (csi-lib-utils' lock name: the driver's name with `/` as `-`, not
    /// sanitized as the lease's name is). None for a sidecar whose upstream RBAC grants no
    /// events (the Go external-attacher's): its events are refused there, and ours would show
    /// as 403s in a cluster that keeps that RBAC.
    pub events: Option<String>,
    /// The `name` label of `leader_election_master_status`: client-go's election name, which
    /// csi-lib-utils leaves empty (the Go sidecars export `name=""`) and kube-controller-manager
    /// sets to its lease's name.
    pub metric_name: String,
}

/// What to write to the lease, decided from what it holds now.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseAction {
    /// Someone else holds a valid lease.
    Wait {
        /// The holder.
        holder: String,
    },
    /// Write this spec (create when there was no lease).
    Write(LeaseSpec),
}

fn micro(t: Timestamp) -> MicroTime {
    MicroTime(t)
}

/// client-go's `tryAcquireOrRenew` as a pure function. Another holder's lease is valid while
/// `observed_for` (how long this replica has seen the record unchanged, on its own clock) is
/// shorter than the record's duration: the holder's `renewTime` is never compared with the
/// local clock, so clock skew between replicas does not matter.
pub fn decide(
    current: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    lease_duration: Duration,
    observed_for: Duration,
) -> LeaseAction {
    let seconds = i32::try_from(lease_duration.as_secs())
        .unwrap_or(i32::MAX)
        .max(1);
    let Some(spec) = current else {
        return LeaseAction::Write(LeaseSpec {
            holder_identity: Some(me.to_string()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(micro(now)),
            renew_time: Some(micro(now)),
            lease_transitions: Some(0),
            ..Default::default()
        });
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if !holder.is_empty() && holder != me {
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0),
        );
        if observed_for < duration {
            return LeaseAction::Wait { holder };
        }
    }
    let mut next = spec.clone();
    if holder == me {
        next.renew_time = Some(micro(now));
        next.lease_duration_seconds = Some(seconds);
    } else {
        next.holder_identity = Some(me.to_string());
        next.acquire_time = Some(micro(now));
        next.renew_time = Some(micro(now));
        next.lease_duration_seconds = Some(seconds);
        next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    LeaseAction::Write(next)
}

/// The spec written on release: no holder, a one-second duration (as client-go's release).
pub fn released(spec: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(micro(now)),
        renew_time: Some(micro(now)),
        lease_transitions: spec.lease_transitions,
        ..Default::default()
    }
}

/// Leadership as seen by health checks and metrics.
#[derive(Debug, Clone, Default)]
pub struct LeaderStatus {
    leading: Arc<AtomicBool>,
    last_renew: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
}

impl LeaderStatus {
    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    fn renewed(&self) {
        {
            let mut last = self.last_renew.lock();
            *last = Some(tokio::time::Instant::now());
        }
    }

    /// client-go's health rule: unhealthy only while leading with a lease not renewed for
    /// longer than `max_age` (the lease duration plus a tolerance).
    pub fn healthy(&self, max_age: Duration) -> bool {
        if !self.is_leader() {
            return true;
        }
        let last = *self.last_renew.lock();
        last.is_some_and(|t| t.elapsed() <= max_age)
    }
}

/// Why the election, or one acquire-or-renew of it, failed. Only [`ElectionError::Lost`]
/// ends an election; a failed attempt is tried again at the next turn.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// Renewal failed for longer than the renew deadline.
    #[error("leader election lost: the lease could not be renewed within {0:?}")]
    Lost(Duration),
    /// Reading or writing the lease: the API answered with an error.
    #[error("the lease call failed: {0}")]
    Lease(#[source] kube::Error),
    /// Reading or writing the lease did not finish within the renew deadline.
    #[error("the lease call did not finish within the renew deadline")]
    LeaseTimedOut,
}

/// The election loop.
pub struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    status: LeaderStatus,
    /// The lease record as last seen and when it was first seen in that state (local clock).
    observed: parking_lot::Mutex<Option<(LeaseSpec, tokio::time::Instant)>>,
    /// The lease as this replica last wrote (or, on the slow path, read) it: the object its
    /// events name, and what a leader renews without reading it first (client-go's fast
    /// path).
    written: parking_lot::Mutex<Option<Lease>>,
    /// `leader_election_slowpath_total{name}` (`name`: [`ElectionConfig::metric_name`]):
    /// renewals of a leader that read the lease (its write from the lease as last known
    /// failed, or that lease was no longer known valid). Created at the first one, as
    /// client-go's series appears then.
    slow_paths: Option<prometheus::IntCounterVec>,
    /// Its `LeaderElection` events (None: no `events`).
    recorder: Option<crate::events::Recorder>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// An elector for the lease in `config`.
    /// Needs a Tokio runtime (its event recorder starts its writer).
    pub fn new(client: kube::Client, config: ElectionConfig) -> Self {
        let recorder = config.events.as_ref().map(|lock| {
            crate::events::Recorder::new(client.clone(), format!("{lock}/{}", config.identity))
        });
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            status: LeaderStatus::default(),
            observed: parking_lot::Mutex::new(None),
            written: parking_lot::Mutex::new(None),
            slow_paths: None,
            recorder,
        }
    }

    /// Counts the renewals that took client-go's slow path in `counter`
    /// (`leader_election_slowpath_total`), under the election's metric name.
    pub fn count_slow_paths(mut self, counter: prometheus::IntCounterVec) -> Self {
        self.slow_paths = Some(counter);
        self
    }

    /// Notes the lease as this replica wrote it: seen now, renewed from next time.
    fn wrote(&self, lease: Lease) {
        self.observe(lease.spec.as_ref());
        *self.written.lock() = Some(lease);
    }

    /// Records `<identity> <what>` on the lease, as client-go's lease lock does.
    fn record(&self, what: &str) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        // Leading follows a write, so the lease as written is known; its name otherwise.
        let written = self.written.lock().as_ref().map(|l| l.metadata.clone());
        let metadata = written.unwrap_or_else(|| ObjectMeta {
            name: Some(self.config.name.clone()),
            namespace: Some(self.config.namespace.clone()),
            ..Default::default()
        });
        recorder.record(
            &crate::vocabulary::reference(&Lease {
                metadata,
                spec: None,
            }),
            crate::events::EventType::Normal,
            "LeaderElection",
            &format!("{} {what}", self.config.identity),
        );
    }

    /// Notes the record seen now; returns for how long it has been seen unchanged.
    fn observe(&self, spec: Option<&LeaseSpec>) -> Duration {
        let now = tokio::time::Instant::now();
        let mut observed = self.observed.lock();
        match (observed.as_ref(), spec) {
            (Some((seen, since)), Some(spec)) if seen == spec => now.duration_since(*since),
            (_, Some(spec)) => {
                *observed = Some((spec.clone(), now));
                Duration::ZERO
            }
            (_, None) => {
                *observed = None;
                Duration::ZERO
            }
        }
    }

    /// One acquire-or-renew, bounded by `deadline` (a hanging API call counts as a failure).
    async fn attempt(&self, deadline: tokio::time::Instant) -> Result<bool, ElectionError> {
        match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
            Ok(Ok(acquired)) => Ok(acquired),
            Ok(Err(error)) => Err(ElectionError::Lease(error)),
            Err(_) => Err(ElectionError::LeaseTimedOut),
        }
    }

    /// Leadership status handle.
    pub fn status(&self) -> LeaderStatus {
        self.status.clone()
    }

    /// client-go's fast path: a leader whose lease is still valid (seen unchanged, on its
    /// own clock, for less than the lease duration since it wrote it) renews it from what it
    /// wrote last, one write and no read. False when that does not apply or the write fails
    /// (the lease changed, or the write was refused: the slow path reads it).
    async fn renew_optimistically(&self) -> bool {
        let Some((last, observed_for)) = self.renewable() else {
            return false;
        };
        let LeaseAction::Write(spec) = decide(
            last.spec.as_ref(),
            &self.config.identity,
            Timestamp::now(),
            self.config.lease_duration,
            observed_for,
        ) else {
            return false;
        };
        match self.replace(last, spec).await {
            Ok(written) => {
                self.wrote(written);
                true
            }
            Err(error) => {
                tracing::debug!(%error, "failed to renew the lease optimistically; reading it");
                false
            }
        }
    }

    /// The lease a leader may renew without reading it, and for how long it has been seen
    /// unchanged: None unless leading with that lease still valid on this replica's clock.
    fn renewable(&self) -> Option<(Lease, Duration)> {
        if !self.status.is_leader() {
            return None;
        }
        let last = self.written.lock().clone()?;
        let observed_for = {
            let observed = self.observed.lock();
            let (seen, since) = observed.as_ref()?;
            (last.spec.as_ref() == Some(seen)).then(|| since.elapsed())?
        };
        (observed_for < self.config.lease_duration).then_some((last, observed_for))
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        if self.renew_optimistically().await {
            return Ok(true);
        }
        let existing = match self.api.get(&self.config.name).await {
            Ok(lease) => Some(lease),
            Err(error) if crate::api_errors::is_not_found(&error) => None,
            Err(e) => return Err(e),
        };
        let current = existing.as_ref().and_then(|l| l.spec.as_ref());
        let observed_for = self.observe(current);
        let action = decide(
            current,
            &self.config.identity,
            Timestamp::now(),
            self.config.lease_duration,
            observed_for,
        );
        let spec = match action {
            LeaseAction::Wait { .. } => return Ok(false),
            LeaseAction::Write(spec) => spec,
        };
        match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        labels: (!self.config.labels.is_empty())
                            .then(|| self.config.labels.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(written) => {
                        self.wrote(written);
                        Ok(true)
                    }
                    Err(error) if crate::api_errors::is_already_exists(&error) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(lease) => {
                // client-go's slow path of a leader: the lease read still names us.
                let ours = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(self.config.identity.as_str());
                if ours
                    && self.status.is_leader()
                    && let Some(counter) = &self.slow_paths
                {
                    counter
                        .with_label_values(&[self.config.metric_name.as_str()])
                        .inc();
                }
                // As client-go's lock keeps the lease it read: should this write fail, the
                // next renewal starts from it.
                *self.written.lock() = Some(lease.clone());
                match self.replace(lease, spec).await {
                    Ok(written) => {
                        self.wrote(written);
                        Ok(true)
                    }
                    Err(error) if crate::api_errors::is_conflict(&error) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Writes `spec` over the lease as it was read (a conflict if it changed meanwhile).
    async fn replace(&self, mut lease: Lease, spec: LeaseSpec) -> Result<Lease, kube::Error> {
        lease.spec = Some(spec);
        lease.metadata.managed_fields = None;
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
    }

    /// Releases the lease, read first as client-go's release does.
    async fn release(&self) {
        let Ok(lease) = self.api.get(&self.config.name).await else {
            return;
        };
        let holds = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.config.identity.as_str());
        if !holds {
            return;
        }
        let spec = released(
            lease
                .spec
                .as_ref()
                .cloned()
                .as_ref()
                .unwrap_or(&LeaseSpec::default()),
            Timestamp::now(),
        );
        match self.replace(lease, spec).await {
            Ok(written) => {
                *self.written.lock() = Some(written);
                tracing::info!(lease = %self.config.name, "released the leader lease");
            }
            Err(error) => tracing::warn!(%error, "failed to release the leader lease"),
        }
    }

    /// Waits for leadership, runs `lead` with a stop signal while leading, and returns when
    /// `shutdown` resolves (after releasing the lease) or leadership is lost
    /// ([`ElectionError::Lost`], the only error it returns).
    pub async fn run<F, Fut>(
        self,
        lead: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ElectionError>
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        tokio::pin!(shutdown);
        let retry = self.config.retry_period;
        tracing::info!(lease = %self.config.name, namespace = %self.config.namespace, identity = %self.config.identity, "waiting for leadership");
        loop {
            let deadline = tokio::time::Instant::now() + self.config.renew_deadline;
            match self.attempt(deadline).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "failed to read or write the leader lease"),
            }
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = &mut shutdown => return Ok(()),
            }
        }
        tracing::info!(lease = %self.config.name, "became leader");
        self.record("became leader");
        self.status.renewed();
        self.status.leading.store(true, Ordering::SeqCst);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut leading = tokio::spawn(lead(stop_rx));
        // As client-go: renew every retry period; every call, and the whole renewal, must finish
        // within the renew deadline counted from the last successful renewal, or leadership
        // is lost. The wait between tries ends at that deadline too: a leader whose renewals
        // fail fast stops at the deadline, not a retry period after it (client-go stops a
        // retry period plus the renew deadline after its last renewal, which with its
        // defaults is the lease duration itself).
        let mut last_renew = tokio::time::Instant::now();
        let outcome = loop {
            let deadline = last_renew + self.config.renew_deadline;
            let wake = (tokio::time::Instant::now() + retry).min(deadline);
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = &mut shutdown => break Ok(()),
            }
            if tokio::time::Instant::now() >= deadline {
                break Err(ElectionError::Lost(self.config.renew_deadline));
            }
            match self.attempt(deadline).await {
                Ok(true) => {
                    last_renew = tokio::time::Instant::now();
                    self.status.renewed();
                }
                Ok(false) => break Err(ElectionError::Lost(self.config.renew_deadline)),
                // Tried again at the next turn, or lost there if the deadline has come.
                Err(error) => tracing::warn!(%error, "failed to renew the leader lease"),
            }
        };
        self.status.leading.store(false, Ordering::SeqCst);
        let _ = stop_tx.send(true);
        match &outcome {
            Ok(()) => {
                // Shutting down: in-flight work finishes, then the lease is released.
                let _ = (&mut leading).await;
                // Bounded as client-go's release (by the renew deadline): a hanging API
                // server does not hold the shutdown.
                if self.config.release_on_exit
                    && tokio::time::timeout(self.config.renew_deadline, self.release())
                        .await
                        .is_err()
                {
                    tracing::warn!(lease = %self.config.name, "the lease was not released within the renew deadline");
                }
            }
            Err(_) => {
                // Lost: another replica may lead already. Stop writing now rather than wait
                // for in-flight work (upstream exits the process here).
                leading.abort();
                let _ = leading.await;
                tracing::error!(lease = %self.config.name, "leadership lost; stopped all work");
            }
        }
        // As client-go, once the lease is let go (naming it as released, when it was). On a
        // shutdown it is written before this returns (the process stops next); a leader that
        // lost its lease stops at once, its event left to chance as client-go's.
        self.record("stopped leading");
        if outcome.is_ok()
            && let Some(recorder) = self.recorder
        {
            recorder.flush(self.config.renew_deadline).await;
        }
        outcome
    }
}

#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
