//! The PV controller's I/O: watches feed caches, workers carry out the binder's decisions.
//! Binding writes the volume first (its claimRef, under optimistic concurrency), so two claims
//! racing for one volume end with exactly one binding: the loser's write conflicts and it
//! looks again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::workqueue::{Backoff, Next, QueueMetrics, WorkQueue};

use crate::decide::binder::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER,
    ANN_STORAGE_PROVISIONER, ClaimAction, ClaimSource, VolumeAction, decide_claim, decide_volume,
};
use crate::decide::binder::{
    awaits_external_deleter, claim_is_gone, leaves_claim_pending, left_to_node_recyclers,
    named_volumes, pending_status,
};

/// The names provisioners give the volume of a claim, `<prefix>-<claim uid>`: upstream's
/// default `--volume-name-prefix`.
const VOLUME_NAME_PREFIXES: &[&str] = &["pvc"];
use crate::decide::classes::default_class;
use crate::decide::consumers::{awaits_scheduling, first_consumer_event};
use crate::index::{ClaimRefIndex, claim_named_by};
use crate::pods::WaitingPods;

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
    waiting_pods: Arc<WaitingPods>,
}

/// How often volumes whose claim is missing are looked at again, whatever the events said.
pub const ORPHAN_RESYNC: Duration = Duration::from_secs(15);

impl std::fmt::Debug for PvController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PvController").finish_non_exhaustive()
    }
}

use sidecar_kit::assume::{Assumed, key_of};
use sidecar_kit::vocabulary::{hostname, reference};
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::Feed;

/// A work queue, with its `workqueue_*` series when there are metrics.
fn queue<K: Clone + Eq + std::hash::Hash + Send + 'static>(
    backoff: Backoff,
    metrics: Option<&sidecar_kit::metrics::Metrics>,
    name: &str,
) -> WorkQueue<K> {
    let queue = WorkQueue::new(backoff);
    match metrics {
        Some(metrics) => queue.with_metrics(QueueMetrics::new(metrics, name)),
        None => queue,
    }
}

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
    /// Starts the watches. `node_recyclers`: node agents recycle Released CSI volumes with
    /// policy `Recycle` (the embedded stack's); without them such a volume gets a
    /// `VolumeFailedRecycle` event.
    pub fn new(client: kube::Client, backoff: Backoff, node_recyclers: bool) -> Arc<Self> {
        Self::with_queues(client, backoff, node_recyclers, None)
    }

    /// Like [`PvController::new`], with kube-controller-manager's `workqueue_*` series for its
    /// two queues (`claims`, `volumes`) in `metrics`.
    pub fn with_metrics(
        client: kube::Client,
        backoff: Backoff,
        metrics: &sidecar_kit::metrics::Metrics,
    ) -> Arc<Self> {
        Self::with_queues(client, backoff, false, Some(metrics))
    }

    fn with_queues(
        client: kube::Client,
        backoff: Backoff,
        node_recyclers: bool,
        metrics: Option<&sidecar_kit::metrics::Metrics>,
    ) -> Arc<Self> {
        let watches = Watches::default();
        let retroactive = metrics.and_then(|m| {
            crate::metrics::Retroactive::register(&m.registry)
                .map_err(|error| tracing::warn!(%error, "the retroactive StorageClass counters are not registered"))
                .ok()
        });
        let operations = metrics.and_then(|m| {
            crate::metrics::Operations::register(&m.registry)
                .map_err(|error| tracing::warn!(%error, "the volume operation metrics are not registered"))
                .ok()
                .map(Arc::new)
        });
        let claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>> =
            queue(backoff, metrics, "claims");
        let volume_queue: WorkQueue<String> = queue(backoff, metrics, "volumes");
        let index = Arc::new(ClaimRefIndex::default());
        let (q, vq, by_claim) = (claim_queue.clone(), volume_queue.clone(), index.clone());
        let assumed_claims: Arc<Assumed<PersistentVolumeClaim>> = Arc::default();
        let assumed_volumes: Arc<Assumed<PersistentVolume>> = Arc::default();
        let gone_claims = assumed_claims.clone();
        let claim_ops = operations.clone();
        // Claims and volumes are written back whole (updates): their caches keep every
        // annotation, so a write does not remove kubectl's last-applied configuration.
        let claims = watches.reflect_for_updates(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |e| {
                if let kube::runtime::watcher::Event::Delete(c) = e {
                    gone_claims.forget(&key_of(c));
                    if let Some(ops) = &claim_ops {
                        ops.forget(&key_of(c));
                    }
                }
                each(e, |c| {
                    q.add(ObjectRef::from_obj(c));
                    // A deleted or changed claim may release its volume: the one it names and
                    // every one whose claimRef names it.
                    if let Some(v) = c
                        .spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_ref())
                        .filter(|v| !v.is_empty())
                    {
                        vq.add(v.clone());
                    }
                    let ns = c.metadata.namespace.as_deref().unwrap_or_default();
                    let name = c.metadata.name.as_deref().unwrap_or_default();
                    for v in by_claim.volumes_of(ns, name) {
                        vq.add(v);
                    }
                });
            },
        );
        // A volume change may complete or free a claim's binding.
        let (vq, cq, by_claim) = (volume_queue.clone(), claim_queue.clone(), index.clone());
        let feed = Feed::default();
        let gone_volumes = assumed_volumes.clone();
        let volume_ops = operations.clone();
        let volumes =
            watches.reflect_for_updates(Api::<PersistentVolume>::all(client.clone()), move |e| {
                if let kube::runtime::watcher::Event::Delete(v) = e {
                    gone_volumes.forget(&key_of(v));
                    // Deleted by its external deleter: the delete operation ends.
                    if let Some(ops) = &volume_ops {
                        ops.finish(&key_of(v));
                    }
                }
                feed.event(e, &*by_claim);
                each(e, |v| {
                    if let Some(name) = &v.metadata.name {
                        vq.add(name.clone());
                    }
                    if let Some((ns, name)) = claim_named_by(v) {
                        cq.add(ObjectRef::new(&name).within(&ns));
                    }
                });
            });
        // Any class change may change the default class: every unbound claim looks again.
        let q = claim_queue.clone();
        let classes = watches.reflect_classes(
            Api::<StorageClass>::all(client.clone()),
            {
                let claims = claims.clone();
                move || claims.state()
            },
            |_, _| true,
            move |claim| q.add_now(ObjectRef::from_obj(claim)),
        );
        // A Pod that waits for the scheduler changes what its claims say they wait for.
        let (q, waiting_pods, feed) = (
            claim_queue.clone(),
            Arc::new(WaitingPods::default()),
            Feed::default(),
        );
        let by_claim = waiting_pods.clone();
        // No Pod cache: binding does not wait for one (a claim synced before the Pod list
        // arrives says WaitForFirstConsumer, and the listed Pod requeues it).
        watches.watch_only(
            Api::<Pod>::all(client.clone()),
            crate::pods::shrink,
            move |e| {
                feed.event(e, &*by_claim);
                each(e, |pod| {
                    if !awaits_scheduling(pod) {
                        return;
                    }
                    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
                    for claim in sidecar_kit::vocabulary::pod_claim_names(pod) {
                        q.add(ObjectRef::new(&claim).within(ns));
                    }
                });
            },
        );
        let recorder = Recorder::new(client.clone(), "persistentvolume-controller", hostname());
        Arc::new(PvController {
            waiting_pods,
            node_recyclers,
            index,
            client,
            claims,
            volumes,
            classes,
            claim_queue,
            volume_queue,
            recorder,
            watches,
            assumed_claims,
            assumed_volumes,
            retroactive,
            operations,
        })
    }

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
    fn wrote_claim(&self, claim: &PersistentVolumeClaim) {
        self.assumed_claims.assume(claim.clone());
    }

    /// Remembers a volume this controller wrote.
    fn wrote_volume(&self, pv: &PersistentVolume) {
        self.assumed_volumes.assume(pv.clone());
    }

    /// kube-controller-manager's `pv_collector_*` gauges, counted from this controller's caches.
    pub fn collector(&self) -> crate::metrics::PvCollector {
        crate::metrics::PvCollector::new(self.volumes.clone(), self.claims.clone())
    }

    /// Queues every volume whose claimRef names a claim that is missing or has another UID.
    /// A missed event must not leak a volume; kube-controller-manager re-syncs every 15 s.
    /// Uses [`WorkQueue::add`], so a volume waiting out a backoff keeps waiting.
    pub fn resync_orphans(&self) -> usize {
        if let Some(ops) = &self.operations {
            // Objects deleted while a watch was away got no delete event: their operations
            // end here (a volume's deletion is its delete operation's end).
            ops.sweep(
                |claim| self.claims.get(&claim_ref(claim)).is_some(),
                |volume| self.volumes.get(&ObjectRef::new(volume)).is_some(),
            );
        }
        let mut queued = 0;
        for pv in self.volumes.state() {
            let Some((ns, name)) = claim_named_by(&pv) else {
                continue;
            };
            let claim = self.claims.get(&ObjectRef::new(&name).within(&ns));
            if claim_is_gone(&pv, claim.as_deref())
                && let Some(pv_name) = &pv.metadata.name
            {
                self.volume_queue.add(pv_name.clone());
                queued += 1;
            }
        }
        queued
    }

    /// Runs `workers` claim and volume workers until `stop` resolves.
    pub async fn run(self: Arc<Self>, workers: usize, stop: impl std::future::Future<Output = ()>) {
        self.run_with(workers, ORPHAN_RESYNC, stop).await;
    }

    /// Like [`PvController::run`], with the period of the pass over volumes whose claim is
    /// missing (tests make it long to show that events alone release such volumes).
    pub async fn run_with(
        self: Arc<Self>,
        workers: usize,
        orphan_resync: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        self.controller(workers, orphan_resync).run(stop).await;
    }

    /// The controller on the shared runtime: `workers` claim and volume workers, and the pass
    /// over volumes whose claim is missing every `orphan_resync`.
    pub fn controller(self: &Arc<Self>, workers: usize, orphan_resync: Duration) -> Controller {
        let (claims, volumes, resync) = (self.clone(), self.clone(), self.clone());
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
            .every(orphan_resync, move || {
                let queued = resync.resync_orphans();
                if queued > 0 {
                    tracing::debug!(volumes = queued, "re-queued volumes whose claim is missing");
                }
            })
    }

    async fn sync_claim(&self, key: &ObjectRef<PersistentVolumeClaim>) -> Result<(), SyncError> {
        let Some(claim) = self.claim(key) else {
            return Ok(());
        };
        // A claim being deleted is synced as any other (kube-controller-manager's does not
        // look): a Pod that still holds it may wait for its binding.
        let classes = self.classes.state();
        // The volumes the decision can depend on, looked up by name rather than scanning
        // every volume for each claim (quadratic in a storm).
        let lookup = |name: &str| self.volume(name);
        let volumes = named_volumes(&claim, VOLUME_NAME_PREFIXES, lookup).unwrap_or_else(|| {
            let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            self.index
                .candidates_for(ns, name)
                .iter()
                .filter_map(|volume| lookup(volume))
                .collect()
        });
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        let action = decide_claim(&claim, &volumes, &classes, default);
        // Written after the decision's event, as kube-controller-manager orders them.
        let pending = leaves_claim_pending(&action)
            .then(|| pending_status(&claim))
            .flatten();
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match action {
            ClaimAction::Nothing => Ok(()),
            ClaimAction::AssignDefaultClass(class) => {
                let mut updated = (*claim).clone();
                updated
                    .spec
                    .get_or_insert_with(Default::default)
                    .storage_class_name = Some(class);
                let written = claims
                    .replace(&name, &PostParams::default(), &updated)
                    .await;
                if let Some(counters) = &self.retroactive {
                    counters.record(written.is_ok());
                }
                let written = written.map_err(write_err("assign the default class"))?;
                self.wrote_claim(&written);
                Ok(())
            }
            ClaimAction::Bind(pv_name) => {
                let pv = self
                    .volume(&pv_name)
                    .ok_or_else(|| SyncError::Waiting(format!("volume {pv_name} vanished")))?;
                let mut bound = (*pv).clone();
                bound.spec.get_or_insert_with(Default::default).claim_ref =
                    Some(reference(&*claim));
                bound
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(ANN_BOUND_BY_CONTROLLER.into(), "yes".into());
                let bound = pvs
                    .replace(&pv_name, &PostParams::default(), &bound)
                    .await
                    .map_err(write_err("bind the volume"))
                    .inspect_err(|_| self.operation_failed(&key_of(&*claim)))?;
                self.wrote_volume(&bound);
                let finished = self.finish_binding(&claim, &bound).await;
                self.operation_ended(&claim, finished)
            }
            ClaimAction::CompleteBinding(pv_name) => {
                let pv = self
                    .volume(&pv_name)
                    .ok_or_else(|| SyncError::Waiting(format!("volume {pv_name} vanished")))?;
                let finished = self.finish_binding(&claim, &pv).await;
                self.operation_ended(&claim, finished)
            }
            ClaimAction::Provision {
                provisioner,
                annotated,
            } => {
                let key = key_of(&*claim);
                if let Some(ops) = &self.operations {
                    ops.start(&key, uid_of(&claim.metadata), &provisioner, "provision");
                }
                if !annotated {
                    let mut updated = (*claim).clone();
                    let a = updated
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new);
                    a.insert(ANN_STORAGE_PROVISIONER.into(), provisioner.clone());
                    a.insert(ANN_BETA_STORAGE_PROVISIONER.into(), provisioner.clone());
                    let written = claims
                        .replace(&name, &PostParams::default(), &updated)
                        .await
                        .map_err(write_err("annotate the claim"))
                        .inspect_err(|_| self.operation_failed(&key))?;
                    self.wrote_claim(&written);
                }
                self.recorder
                    .record(&reference(&*claim), EventType::Normal, "ExternalProvisioning", &format!(
                        "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
                    ));
                Ok(())
            }
            ClaimAction::WaitForFirstConsumer => {
                let (reason, message) = first_consumer_event(&self.waiting_pods.of(&ns, &name));
                self.recorder
                    .record(&reference(&*claim), EventType::Normal, reason, &message);
                self.mark_pending(&claim, pending).await
            }
            ClaimAction::Pending {
                event,
                reason,
                message,
            } => {
                self.recorder
                    .record(&reference(&*claim), event, reason, &message);
                self.mark_pending(&claim, pending).await?;
                Err(SyncError::Waiting(message))
            }
            ClaimAction::Wait(why) => {
                self.mark_pending(&claim, pending).await?;
                Err(SyncError::Waiting(why))
            }
            ClaimAction::MigratedTo(driver) => {
                let mut updated = (*claim).clone();
                mark_migrated_to(&mut updated.metadata, driver);
                let written = claims
                    .replace(&name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("mark the claim migrated"))?;
                self.wrote_claim(&written);
                Ok(())
            }
            ClaimAction::Lost { reason, message } => {
                let mut updated = (*claim).clone();
                updated.status.get_or_insert_with(Default::default).phase = Some("Lost".into());
                let written = claims
                    .replace_status(&name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("mark the claim Lost"))?;
                self.wrote_claim(&written);
                self.recorder
                    .record(&reference(&*claim), EventType::Warning, reason, message);
                Ok(())
            }
        }
    }

    /// A step of the operation under way for `key` failed (see [`crate::metrics::Operations`]).
    fn operation_failed(&self, key: &str) {
        if let Some(ops) = &self.operations {
            ops.failed(key);
        }
    }

    /// A binding was written (the provision operation of its claim, if any, ends) or failed.
    fn operation_ended(
        &self,
        claim: &PersistentVolumeClaim,
        finished: Result<(), SyncError>,
    ) -> Result<(), SyncError> {
        if let Some(ops) = &self.operations {
            match &finished {
                Ok(()) => ops.finish(&key_of(claim)),
                Err(_) => ops.failed(&key_of(claim)),
            }
        }
        finished
    }

    /// The delete operation of a volume left to its external deleter starts (once).
    fn deletion_started(&self, pv: &PersistentVolume) {
        if let Some(ops) = &self.operations {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            ops.start(name, uid_of(&pv.metadata), &self.deleter_of(pv), "delete");
        }
    }

    /// The plugin a volume's delete operation is counted under, as kube-controller-manager
    /// names it for an external deleter: its class's provisioner (the CSI driver of a migrated
    /// plugin), `N/A` when the class is gone.
    fn deleter_of(&self, pv: &PersistentVolume) -> String {
        let class = crate::decide::matching::volume_class(pv);
        self.classes
            .get(&ObjectRef::new(&class))
            .map(|c| sidecar_kit::migration::driver_of(&c.provisioner).to_string())
            .unwrap_or_else(|| crate::metrics::NO_PLUGIN.to_string())
    }

    /// Writes a claim's `Pending` status, if it needs one (see [`pending_status`]).
    async fn mark_pending(
        &self,
        claim: &PersistentVolumeClaim,
        status: Option<k8s_openapi::api::core::v1::PersistentVolumeClaimStatus>,
    ) -> Result<(), SyncError> {
        let Some(status) = status else {
            return Ok(());
        };
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let mut pending = claim.clone();
        pending.status = Some(status);
        let written = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .replace_status(name, &PostParams::default(), &pending)
            .await
            .map_err(write_err("mark the claim Pending"))?;
        self.wrote_claim(&written);
        Ok(())
    }

    /// Writes the rest of a binding whose volume side is done: volume phase, claim spec and
    /// annotations, claim status.
    async fn finish_binding(
        &self,
        claim: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<(), SyncError> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        // A volume pre-bound by name only gets the claim's whole reference (its UID), as
        // kube-controller-manager writes it; it was bound by the user, not by us.
        let ref_uid = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.clone())
            .unwrap_or_default();
        let written;
        let pv = if ref_uid.is_empty() {
            let mut whole = pv.clone();
            whole.spec.get_or_insert_with(Default::default).claim_ref = Some(reference(claim));
            written = pvs
                .replace(&pv_name, &PostParams::default(), &whole)
                .await
                .map_err(write_err("bind the volume"))?;
            self.wrote_volume(&written);
            &written
        } else {
            pv
        };
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            let mut status = pv.clone();
            status.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
            let written = pvs
                .replace_status(&pv_name, &PostParams::default(), &status)
                .await
                .map_err(write_err("mark the volume Bound"))?;
            self.wrote_volume(&written);
        }
        let mut updated = claim.clone();
        let needs_spec = updated.spec.as_ref().and_then(|s| s.volume_name.as_deref())
            != Some(pv_name.as_str())
            || updated
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_BIND_COMPLETED))
                .is_none();
        if needs_spec {
            // As kube-controller-manager: the claim is marked bound by the controller when the
            // controller names its volume (not when the user did).
            let named_by_us = updated.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                != Some(pv_name.as_str());
            updated
                .spec
                .get_or_insert_with(Default::default)
                .volume_name = Some(pv_name.clone());
            let a = updated
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new);
            a.entry(ANN_BIND_COMPLETED.into())
                .or_insert_with(|| "yes".into());
            if named_by_us {
                a.entry(ANN_BOUND_BY_CONTROLLER.into())
                    .or_insert_with(|| "yes".into());
            }
            updated = claims
                .replace(&name, &PostParams::default(), &updated)
                .await
                .map_err(write_err("bind the claim"))?;
            self.wrote_claim(&updated);
        }
        let spec = pv.spec.clone().unwrap_or_default();
        let status = updated.status.get_or_insert_with(Default::default);
        if status.phase.as_deref() != Some("Bound") {
            // As kube-controller-manager: a claim going from Pending to Bound gets its
            // volume's attributes class as its current one.
            if status.phase.as_deref().is_none_or(|p| p == "Pending") {
                status.current_volume_attributes_class_name =
                    spec.volume_attributes_class_name.clone();
            }
            status.phase = Some("Bound".into());
            status.capacity = spec.capacity.clone();
            status.access_modes = spec.access_modes.clone();
            let written = claims
                .replace_status(&name, &PostParams::default(), &updated)
                .await
                .map_err(write_err("mark the claim Bound"))?;
            self.wrote_claim(&written);
            tracing::info!(volume = %pv_name, "claim bound");
        }
        Ok(())
    }

    /// The claim `pv`'s claimRef names, read from the API server (none when it is gone).
    async fn read_named_claim(
        &self,
        pv: &PersistentVolume,
    ) -> Result<Vec<PersistentVolumeClaim>, SyncError> {
        let Some((namespace, name)) = claim_named_by(pv) else {
            return Ok(Vec::new());
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        match claims.get_opt(&name).await {
            Ok(found) => Ok(found.into_iter().collect()),
            Err(source) => Err(SyncError::ReadClaim {
                claim: format!("{namespace}/{name}"),
                volume: pv.metadata.name.clone().unwrap_or_default(),
                source,
            }),
        }
    }

    async fn sync_volume(&self, name: &str) -> Result<(), SyncError> {
        let Some(pv) = self.volume(name) else {
            return Ok(());
        };
        // Only the claim the volume names matters: look it up instead of scanning all claims.
        let named: Vec<std::sync::Arc<PersistentVolumeClaim>> = claim_named_by(&pv)
            .and_then(|(ns, name)| self.claim(&ObjectRef::new(&name).within(&ns)))
            .into_iter()
            .collect();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut action = decide_volume(&pv, &named, ClaimSource::Cache);
        if action == VolumeAction::ReadClaimLive {
            // As kube-controller-manager: the cache may lag; the server decides.
            let live = self.read_named_claim(&pv).await?;
            action = decide_volume(&pv, &live, ClaimSource::Server);
        }
        if awaits_external_deleter(&pv) {
            self.deletion_started(&pv);
        }
        match action {
            // Never the answer for a claim read from the server (a row of `decide_volume`'s
            // table); were it, nothing is written and the next event looks again.
            VolumeAction::ReadClaimLive | VolumeAction::Nothing => Ok(()),
            VolumeAction::SetPhase(phase) => {
                let mut updated = (*pv).clone();
                updated.status.get_or_insert_with(Default::default).phase = Some(phase.into());
                let written = pvs
                    .replace_status(name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("set the volume phase"))?;
                self.wrote_volume(&written);
                // Released for its external deleter: the delete operation starts now, as the
                // deleter may be done before this controller syncs the volume again.
                if awaits_external_deleter(&written) {
                    self.deletion_started(&written);
                }
                tracing::info!(phase, "volume phase changed");
                Ok(())
            }
            VolumeAction::Unbind => {
                let mut updated = (*pv).clone();
                if let Some(spec) = updated.spec.as_mut() {
                    spec.claim_ref = None;
                }
                if let Some(a) = updated.metadata.annotations.as_mut() {
                    a.remove(ANN_BOUND_BY_CONTROLLER);
                }
                let written = pvs
                    .replace(name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("unbind the volume"))?;
                self.wrote_volume(&written);
                Ok(())
            }
            VolumeAction::ClearClaimUid => {
                let mut updated = (*pv).clone();
                if let Some(claim_ref) = updated.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                    claim_ref.uid = None;
                }
                let written = pvs
                    .replace(name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("clear the volume's claim UID"))?;
                self.wrote_volume(&written);
                Ok(())
            }
            VolumeAction::Fail { reason, message } => self.fail(&pv, reason, &message).await,
            VolumeAction::MigratedTo(driver) => {
                let mut updated = (*pv).clone();
                mark_migrated_to(&mut updated.metadata, driver);
                let written = pvs
                    .replace(name, &PostParams::default(), &updated)
                    .await
                    .map_err(write_err("mark the volume migrated"))?;
                self.wrote_volume(&written);
                Ok(())
            }
            VolumeAction::Recycle if left_to_node_recyclers(&pv, self.node_recyclers) => {
                tracing::debug!(pv = name, "left to the node agents' recycler");
                Ok(())
            }
            // As kube-controller-manager for a volume no recycler plugin serves.
            VolumeAction::Recycle => {
                self.fail(
                    &pv,
                    "VolumeFailedRecycle",
                    "No recycler plugin found for the volume!",
                )
                .await
            }
        }
    }

    /// Marks a volume Failed with the reason (status message and a Warning event), as
    /// kube-controller-manager's `updateVolumePhaseWithEvent`: the event only on the change.
    async fn fail(
        &self,
        pv: &PersistentVolume,
        reason: &str,
        message: &str,
    ) -> Result<(), SyncError> {
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
            return Ok(());
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        let mut updated = pv.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        status.phase = Some("Failed".into());
        status.message = Some(message.to_string());
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let written = pvs
            .replace_status(&name, &PostParams::default(), &updated)
            .await
            .map_err(write_err("mark the volume Failed"))?;
        self.wrote_volume(&written);
        self.recorder
            .record(&reference(pv), EventType::Warning, reason, message);
        Ok(())
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
