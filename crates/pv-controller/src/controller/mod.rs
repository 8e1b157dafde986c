//! The PV controller's I/O: watches feed caches, workers carry out the binder's decisions.
//! Binding writes the volume first (its claimRef, under optimistic concurrency), so two claims
//! racing for one volume end with exactly one binding: the loser's write conflicts and it
//! looks again.

mod claims;
mod construct;
mod recycle;
mod resync;
mod volumes;

pub use recycle::{PodEnd, RecycleError, RecyclerPodError};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use sidecar_kit::events::Recorder;
use sidecar_kit::runtime::Controller;
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};

use crate::decide::binder::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_BOUND_BY_CONTROLLER, ANN_STORAGE_PROVISIONER, ClaimAction,
    ClaimSource, VolumeAction, decide_claim, decide_volume,
};
use crate::decide::binder::{
    awaits_external_deleter, host_path_deletion_stands, leaves_claim_pending,
    left_to_node_recyclers, named_volumes, pending_status,
};
use crate::decide::binding::{
    bound_status, claim_bound_to, lost_status, volume_bound_to, volume_in_phase,
    volume_marked_bound, volume_unbound,
};

/// The names provisioners give the volume of a claim, `<prefix>-<claim uid>`: upstream's
/// default `--volume-name-prefix`.
const VOLUME_NAME_PREFIXES: &[&str] = &["pvc"];
use crate::decide::classes::default_class;
use crate::decide::consumers::{awaits_scheduling, first_consumer_event};
use crate::decide::recycle::RecyclerConfig;
use crate::index::{ClaimRefIndex, claim_named_by};
use crate::pods::PodsByClaim;

/// A failed write; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// An API write failed (a conflict means someone else changed the object first).
    #[error("failed to {action}: {source}")]
    Write {
        /// What was being written (as the message says it).
        action: &'static str,
        /// The API server's error.
        source: kube::Error,
    },
    /// The claim must wait (class missing...); retried with backoff.
    #[error("{0}")]
    Waiting(String),
    /// A volume to delete could not be read again from the API server (the hostPath deleter
    /// does not remove data on the cache's word alone).
    #[error("failed to read volume {volume} before deleting it: {source}")]
    ReadVolume {
        /// The volume.
        volume: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// The claim a volume is bound to could not be read from the API server (the volume is
    /// not released on the cache's word alone).
    #[error("failed to read claim {claim} of volume {volume}: {source}")]
    ReadClaim {
        /// `namespace/name` of the claim.
        claim: String,
        /// The volume.
        volume: String,
        /// The API server's error.
        source: kube::Error,
    },
}

/// The controller.
pub struct PvController {
    client: kube::Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>>,
    volume_queue: WorkQueue<String>,
    recorder: Recorder,
    /// The watches feeding the caches (stopped with the controller).
    watches: Watches,
    /// Whether node agents recycle CSI volumes (then `Recycle` is theirs, not an error here).
    node_recyclers: bool,
    /// Volumes by the claim their claimRef names, and those no claimRef names.
    index: Arc<ClaimRefIndex>,
    /// Claims and volumes as this controller last wrote them, while the caches are behind: a
    /// claim synced again before its binding reaches the cache is seen bound, and a volume it
    /// just bound is seen taken.
    assumed_claims: Arc<Assumed<PersistentVolumeClaim>>,
    assumed_volumes: Arc<Assumed<PersistentVolume>>,
    /// The default-class assignment counters, with metrics.
    retroactive: Option<crate::metrics::Retroactive>,
    /// The provision and delete operations' end-to-end times and errors, with metrics.
    operations: Option<Arc<crate::metrics::Operations>>,
    /// The Pods waiting for the scheduler, by the claims they name.
    waiting_pods: Arc<PodsByClaim>,
    /// The recyclers of hostPath and NFS volumes (none: such a volume gets kube-controller-
    /// manager's "No recycler plugin found").
    recycler: Option<Arc<RecyclerConfig>>,
    /// Volumes to recycle, each by one worker at a time (a recycle waits for its Pod).
    recycle_queue: WorkQueue<String>,
}

/// How often volumes whose claim is missing, and unbound claims a volume no claimRef names may
/// fit, are looked at again, whatever the events said.
pub const ORPHAN_RESYNC: Duration = Duration::from_secs(15);

impl std::fmt::Debug for PvController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PvController").finish_non_exhaustive()
    }
}

use sidecar_kit::assume::{Assumed, key_of};
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::Feed;

/// How soon an object whose write conflicted is looked at again.
const CONFLICT_RETRY: Duration = sidecar_kit::api_errors::CHANGED_LOOK_AGAIN;

/// A write that conflicted lost a race with another writer (the pvc-protection finalizer, the
/// provisioner, another claim binding the volume): the object is looked at again shortly from
/// its new version, without the failure backoff a real error earns (which grows to a minute
/// and held 50 claims unbound when every one of them raced the finalizer).
fn after_conflict(result: Result<(), SyncError>) -> Result<Next, SyncError> {
    match result {
        Ok(()) => Ok(Next::Done),
        Err(SyncError::Write { source, action })
            if sidecar_kit::api_errors::is_conflict(&source) =>
        {
            tracing::debug!(action, "write conflicted; looking again at the new version");
            Ok(Next::After(CONFLICT_RETRY))
        }
        Err(error) => Err(error),
    }
}

fn write_err(action: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Write { action, source }
}

impl PvController {
    /// A claim as last known: the cache's, or this controller's own write while the cache is
    /// behind it.
    fn claim(&self, key: &ObjectRef<PersistentVolumeClaim>) -> Option<Arc<PersistentVolumeClaim>> {
        let name = match &key.namespace {
            Some(ns) => format!("{ns}/{}", key.name),
            None => key.name.clone(),
        };
        self.assumed_claims.latest(&name, self.claims.get(key))
    }

    /// A volume as last known (see [`PvController::claim`]).
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.assumed_volumes
            .latest(name, self.volumes.get(&ObjectRef::new(name)))
    }

    /// Remembers a claim this controller wrote.
    fn wrote_claim(&self, claim: Arc<PersistentVolumeClaim>) {
        self.assumed_claims.assume(claim);
    }

    /// Remembers a volume this controller wrote.
    fn wrote_volume(&self, pv: Arc<PersistentVolume>) {
        self.assumed_volumes.assume(pv);
    }

    /// kube-controller-manager's `pv_collector_*` gauges, counted from this controller's caches.
    pub fn collector(&self) -> crate::metrics::PvCollector {
        crate::metrics::PvCollector::new(self.volumes.clone(), self.claims.clone())
    }

    /// Runs `workers` claim and volume workers until `stop` resolves.
    pub async fn run(self: Arc<Self>, workers: usize, stop: impl std::future::Future<Output = ()>) {
        self.run_with(workers, ORPHAN_RESYNC, stop).await;
    }

    /// Like [`PvController::run`], with the period of the resync passes (volumes whose claim
    /// is missing, unbound claims an unbound volume may fit): tests make it long to show that
    /// events alone release such volumes, or short to see the claims' pass.
    pub async fn run_with(
        self: Arc<Self>,
        workers: usize,
        orphan_resync: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        self.controller(workers, orphan_resync).run(stop).await;
    }

    /// The controller on the shared runtime: `workers` claim, volume and recycle workers, and
    /// the resync passes (`resync.rs`) every `orphan_resync`. A recycle waiting for its Pod
    /// stops with the controller (the Pod stays; the next try finds it, as
    /// kube-controller-manager's does after a restart).
    pub fn controller(self: &Arc<Self>, workers: usize, orphan_resync: Duration) -> Controller {
        let (claims, volumes, resync) = (self.clone(), self.clone(), self.clone());
        let recycles = self.clone();
        Controller::new("persistentvolume-controller")
            .watches(&self.watches)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.classes)
            .reconcile("claim", self.claim_queue.clone(), workers, move |key| {
                let this = claims.clone();
                async move { after_conflict(this.sync_claim(&key).await) }
            })
            .reconcile("volume", self.volume_queue.clone(), workers, move |key| {
                let this = volumes.clone();
                async move { after_conflict(this.sync_volume(&key).await) }
            })
            .reconcile("recycle", self.recycle_queue.clone(), workers, move |key| {
                let this = recycles.clone();
                async move {
                    tokio::select! {
                        done = this.recycle(&key) => done.map(|()| Next::Done),
                        () = this.recycle_queue.stopping() => Ok(Next::Done),
                    }
                }
            })
            .every(orphan_resync, move || {
                let queued = resync.resync_orphans();
                if queued > 0 {
                    tracing::debug!(volumes = queued, "re-queued volumes whose claim is missing");
                }
                let queued = resync.resync_unbound();
                if queued > 0 {
                    tracing::debug!(claims = queued, "re-queued unbound claims a volume may fit");
                }
            })
    }
}

/// Sets (`Some`) or removes (`None`) `pv.kubernetes.io/migrated-to`.
fn mark_migrated_to(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    driver: Option<String>,
) {
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    match driver {
        Some(driver) => {
            annotations.insert(sidecar_kit::migration::ANN_MIGRATED_TO.into(), driver);
        }
        None => {
            annotations.remove(sidecar_kit::migration::ANN_MIGRATED_TO);
        }
    }
}

/// Which part of an object a write replaces.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// The object (its status is the server's).
    Whole,
    /// Its status subresource.
    Status,
}

impl PvController {
    /// Replaces `updated`'s `part` on the API server and remembers what it returned (see
    /// [`PvController::claim`]); `action` names the write in its error.
    async fn put_claim(
        &self,
        updated: &PersistentVolumeClaim,
        part: Part,
        action: &'static str,
    ) -> Result<Arc<PersistentVolumeClaim>, SyncError> {
        let ns = updated.metadata.namespace.as_deref().unwrap_or_default();
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
        let written = Arc::new(put(&api, updated, part).await.map_err(write_err(action))?);
        self.wrote_claim(written.clone());
        Ok(written)
    }

    /// As [`PvController::put_claim`], for a volume.
    async fn put_volume(
        &self,
        updated: &PersistentVolume,
        part: Part,
        action: &'static str,
    ) -> Result<Arc<PersistentVolume>, SyncError> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let written = Arc::new(put(&api, updated, part).await.map_err(write_err(action))?);
        self.wrote_volume(written.clone());
        Ok(written)
    }
}

/// Replaces `updated`'s `part` under its resourceVersion.
async fn put<K>(api: &Api<K>, updated: &K, part: Part) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = updated.meta().name.as_deref().unwrap_or_default();
    let params = kube::api::PostParams::default();
    match part {
        Part::Whole => api.replace(name, &params, updated).await,
        Part::Status => api.replace_status(name, &params, updated).await,
    }
}

/// The UID of an object (`""` when it has none).
fn uid_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.uid.as_deref().unwrap_or_default()
}

/// A claim's reference from its `namespace/name` key.
fn claim_ref(key: &str) -> ObjectRef<PersistentVolumeClaim> {
    match key.split_once('/') {
        Some((namespace, name)) => ObjectRef::new(name).within(namespace),
        None => ObjectRef::new(key),
    }
}

/// Default backoff of the PV controller: at most [`ORPHAN_RESYNC`] between tries, as
/// kube-controller-manager retries whatever failed at its resync (every
/// `--pvclaimbinder-sync-period`).
pub fn default_backoff() -> Backoff {
    backoff_within(ORPHAN_RESYNC)
}

/// The backoff of a controller resyncing every `sync_period`: a claim or volume that failed is
/// looked at again at least that often (kube-controller-manager's queues do not back off; its
/// resync retries everything every period).
pub fn backoff_within(sync_period: Duration) -> Backoff {
    Backoff {
        start: Duration::from_millis(500).min(sync_period),
        max: sync_period,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> SyncError {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "m", "reason": "r", "code": code
        }))
        .unwrap();
        SyncError::Write {
            action: "bind",
            source: kube::Error::Api(Box::new(status)),
        }
    }

    #[test]
    fn a_conflict_is_looked_at_again_soon_and_other_errors_back_off() {
        assert_eq!(after_conflict(Ok(())).unwrap(), Next::Done);
        assert_eq!(
            after_conflict(Err(api_error(409))).unwrap(),
            Next::After(CONFLICT_RETRY)
        );
        assert!(after_conflict(Err(api_error(500))).is_err());
        assert!(after_conflict(Err(SyncError::Waiting("class".into()))).is_err());
    }

    #[test]
    fn a_failure_is_tried_again_within_the_sync_period() {
        let rows = [
            (ORPHAN_RESYNC, Duration::from_millis(500), ORPHAN_RESYNC),
            (
                Duration::from_secs(60),
                Duration::from_millis(500),
                Duration::from_secs(60),
            ),
            (
                Duration::from_millis(200),
                Duration::from_millis(200),
                Duration::from_millis(200),
            ),
        ];
        for (period, start, max) in rows {
            let backoff = backoff_within(period);
            assert_eq!((backoff.start, backoff.max), (start, max), "{period:?}");
        }
        assert_eq!(default_backoff().max, Duration::from_secs(15));
    }
}
