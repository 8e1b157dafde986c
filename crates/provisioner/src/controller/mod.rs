//! The controller around the decisions: watches feed caches, keys go through work queues to
//! workers, workers read caches, call `decide`, and carry out the result (CSI calls, API
//! writes). State lives in the cluster; see `claims` for how a crash or a deleted claim never
//! leaks a volume.

mod attachments;
mod cache;
mod calls;
mod claim_error;
mod claim_topology;
mod claims;
mod data_sources;
pub mod driver;
mod in_flight;
mod infeasible;
mod intent_record;
pub mod intents;
mod ledger;
mod listing;
pub mod node_deployment;
pub(crate) mod recovery;
mod topology_cache;
mod volumes;

use std::sync::Arc;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::Api;
use kube::runtime::watcher;
use sidecar_kit::events::Recorder;
use sidecar_kit::recent::Recent;
use sidecar_kit::runtime::Controller;
use sidecar_kit::workqueue::{Backoff, QueueMetrics, WorkQueue};
use tonic::transport::Channel;

use crate::decide::provision::{DriverCapabilities, ProvisionOptions};
use cache::Caches;
pub use claims::ClaimError;
pub use in_flight::InFlight;
use sidecar_kit::watch::{Watches, each as for_each, empty};
use sidecar_kit::watch_index::{ByReference, Feed};

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Provisioning options.
    pub options: ProvisionOptions,
    /// Driver capabilities.
    pub caps: DriverCapabilities,
    /// `--timeout`.
    pub timeout: Duration,
    /// `--worker-threads`.
    pub workers: usize,
    /// Backoff bounds.
    pub backoff: Backoff,
    /// `--strict-topology`.
    pub strict_topology: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// CrossNamespaceVolumeDataSource gate.
    pub cross_namespace: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// `--cloning-protection-threads`.
    pub cloning_workers: usize,
    /// Identity attribute written into PVs.
    pub identity: String,
    /// Namespace and name of the intent log Lease.
    pub intent_log: (String, String),
    /// Namespace and name of the listed volumes' Lease (identity, epoch, settled mark).
    pub listed_lease: (String, String),
    /// How volumes in flight at a crash are found again (`--in-flight-recovery` and the
    /// driver).
    pub recovery: crate::decide::recovery::Recovery,
    /// `--node-deployment`: this node.
    pub node: Option<node_deployment::NodeDeployment>,
    /// `--enable-volume-sets`: run the PersistentVolumeSet manager.
    pub volume_sets: bool,
    /// `--volume-set-creates`: CreateVolume calls in flight per set at most.
    pub volume_set_creates: usize,
}

/// The capacity controller's inputs (`--enable-capacity`): its settings and the client its
/// writes go through (`--kube-api-capacity-qps`/`-burst`).
pub struct CapacityInput {
    /// The capacity controller's flags.
    pub settings: crate::capacity::controller::CapacitySettings,
    /// The rate-limited client.
    pub writer: kube::Client,
}

/// How long the names of deleted handles and finished PVs are remembered (a retry or a stale
/// cache event within it does not delete again).
const REMEMBER_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Volume queue key: a PV's name.
pub type VolumeKey = sidecar_kit::key::ObjectKey;

/// Claim queue key.
pub type ClaimKey = sidecar_kit::key::ObjectKey;

/// The running provisioner.
pub struct Provisioner {
    pub(crate) client: kube::Client,
    pub(crate) csi: Channel,
    /// The CSI calls: `--timeout` each, counted in the metrics.
    pub(crate) csi_calls: sidecar_kit::csi::Caller,
    pub(crate) cfg: ControllerConfig,
    pub(crate) caches: Caches,
    pub(crate) claims: WorkQueue<ClaimKey>,
    /// PVs to look at, keyed by name (one shared 16-byte key per queued PV: a deletion burst
    /// queues 100,000 of them).
    pub(crate) volumes: WorkQueue<VolumeKey>,
    /// Source claims whose cloning-protection finalizer may go (only with CLONE_VOLUME).
    pub(crate) cloning: WorkQueue<ClaimKey>,
    pub(crate) recorder: Recorder,
    /// The events upstream's CSI layer records with a recorder of its own, from component
    /// `external-provisioner` (only "Assuming an external populator will provision the
    /// volume"); the others come from the controller's identity, as upstream's.
    pub(crate) csi_layer_recorder: Recorder,
    pub(crate) metrics: sidecar_kit::metrics::Metrics,
    /// The watches feeding the caches (stopped with the controller).
    pub(crate) watches: Watches,
    /// Volumes that may exist without a PV yet, and their intent log.
    pub(crate) ledger: ledger::Ledger,
    /// The VolumeAttachments naming each PV (a PV's volume is deleted once none does).
    pub(crate) attached: Arc<attachments::AttachmentsByVolume>,
    /// Volume handles DeleteVolume already removed, so a retry of the API steps (or a stale
    /// cache) never calls DeleteVolume twice (upstream issue 1235).
    pub(crate) deleted_handles: Arc<Recent<String>>,
    /// PVs whose deletion this process finished; later cache events for them are stale.
    pub(crate) finished: Arc<Recent<String>>,
    /// With listed volumes: the Lease holding this cluster's identity, this start's epoch and
    /// the settled mark (started before the workers run).
    pub(crate) listing: std::sync::OnceLock<listing::Listing>,
    /// The settled mark's queue (one key).
    pub(crate) settled: WorkQueue<String>,
    /// Topology requirement per claim, computed once per (claim UID, selected node), so
    /// retries send identical requests; dropped when the claim is provisioned or gone, or its
    /// CreateVolume fails for good or is rescheduled.
    pub(crate) topology: claim_topology::ClaimTopology,
    /// `--enable-capacity`: the capacity controller, told about provisioned and deleted volumes.
    pub(crate) capacity: Option<Arc<crate::capacity::controller::CapacityTracker>>,
    /// `--node-deployment`: this node's gate in front of provisioning and deletion.
    pub(crate) gate: Option<node_deployment::NodeGate>,
    /// `--enable-volume-sets`: the PersistentVolumeSet manager.
    pub(crate) sets: Option<Arc<crate::volume_sets::manager::SetManager>>,
    /// Claims whose CreateVolume the driver refused as infeasible (INVALID_ARGUMENT), waiting
    /// `--retry-interval-max` before their next attempt; dropped when the claim is forgotten.
    pub(crate) infeasible: parking_lot::Mutex<
        std::collections::HashMap<ClaimKey, crate::decide::classify::Infeasible>,
    >,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner")
            .field("driver", &self.cfg.caps.name)
            .finish_non_exhaustive()
    }
}

/// The queue key of a claim: `namespace/name` in 16 bytes (kube's `ObjectRef` takes 96 and its
/// clones copy their strings; a storm queues 10,000 keys).
pub(crate) fn claim_key(pvc: &PersistentVolumeClaim) -> ClaimKey {
    ClaimKey::of(&pvc.metadata)
}

impl Provisioner {
    /// Starts the watches and returns the provisioner; [`Provisioner::controller`] is what runs it.
    pub fn new(
        client: kube::Client,
        csi: Channel,
        cfg: ControllerConfig,
        recorder: Recorder,
        metrics: sidecar_kit::metrics::Metrics,
        capacity: Option<CapacityInput>,
    ) -> Result<Arc<Self>, prometheus::Error> {
        // Upstream names its queues "claims" and "volumes" (the `workqueue_*` name label).
        let claims_q: WorkQueue<ClaimKey> =
            WorkQueue::new(cfg.backoff).with_metrics(QueueMetrics::new(&metrics, "claims"));
        let volumes_q: WorkQueue<VolumeKey> =
            WorkQueue::new(cfg.backoff).with_metrics(QueueMetrics::new(&metrics, "volumes"));
        let cloning_q: WorkQueue<ClaimKey> = WorkQueue::new(cfg.backoff)
            .with_metrics(QueueMetrics::new(&metrics, "cloning-protection"));
        let with_topology = cfg.options.topology && cfg.caps.accessibility;
        let watches = Watches::default();

        let q = claims_q.clone();
        let cloning = cfg.caps.clone_volume.then(|| cloning_q.clone());
        let clones = Arc::new(ByReference::new(|claim: &PersistentVolumeClaim| {
            crate::decide::cloning::cloned_claim(claim)
                .map(|(_, source)| source)
                .into_iter()
                .collect()
        }));
        let (clone_index, clone_feed) = (clones.clone(), Feed::default());
        // The driver's name is in every claim's annotations and every PV (twice each).
        let words = [cfg.caps.name.as_str()];
        let claims = watches.reflect_compact(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            &words,
            cache::shrink_claim,
            move |event| {
                clone_feed.event(event, &*clone_index);
                for_each(event, |pvc| {
                    q.add(claim_key(pvc));
                    if let Some(cloning) = &cloning {
                        // A source being deleted, and the source of a clone whose state
                        // changed, are looked at again; the latter at once, backing off or
                        // not: a source being deleted waits (backs off) for its clones.
                        if pvc.metadata.deletion_timestamp.is_some() {
                            cloning.add(claim_key(pvc));
                        }
                        if let Some((namespace, source)) = crate::decide::cloning::cloned_claim(pvc)
                        {
                            cloning.add_now(ClaimKey::new(Some(&namespace), &source));
                        }
                    }
                });
            },
        );
        let sets = if cfg.volume_sets {
            Some(Arc::new(crate::volume_sets::manager::SetManager::new(
                client.clone(),
                &watches,
                &metrics,
                cfg.backoff,
            )?))
        } else {
            None
        };
        let q = volumes_q.clone();
        let keep = cache::Keep {
            // Capacity refreshes and node deployment read a volume's node affinity.
            affinity: capacity.is_some() || cfg.node.is_some(),
            // The set manager reads labels and sizes; an in-tree PV's zone label is part of
            // the handle it translates to (CSI migration).
            labels_and_size: sets.is_some() || cfg.caps.migrated_from.is_some(),
        };
        let on_volume = sets.clone();
        let feed = Feed::default();
        let deleted_handles: Arc<Recent<String>> = Arc::new(Recent::new(REMEMBER_FOR));
        let finished: Arc<Recent<String>> = Arc::new(Recent::new(REMEMBER_FOR));
        let (handles_seen, finished_seen) = (deleted_handles.clone(), finished.clone());
        let volumes = watches.reflect_compact(
            Api::<PersistentVolume>::all(client.clone()),
            &words,
            move |pv: &mut PersistentVolume| cache::shrink_volume(pv, keep),
            move |event| {
                if let watcher::Event::Delete(pv) = event {
                    // Gone from the cache: no stale event of it can come any more, so what
                    // guarded its deletion against one is forgotten (memory stays at the
                    // deletions in progress, not at every deletion of the last ten minutes).
                    if let Some(name) = &pv.metadata.name {
                        finished_seen.forget(name.as_str());
                    }
                    if let Some(handle) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                        handles_seen.forget(handle.volume_handle.as_str());
                    }
                }
                for_each(event, |pv| {
                    if let Some(name) = &pv.metadata.name {
                        q.add(VolumeKey::cluster(name));
                    }
                });
                if let Some(sets) = &on_volume {
                    feed.event(event, &**sets);
                }
            },
        );
        // A class that appears, changes or goes may unblock the claims of that class, and the
        // volume sets whose template names it.
        let (q, sets_of_class) = (claims_q.clone(), sets.clone());
        let classes = watches.reflect_classes(
            Api::<StorageClass>::all(client.clone()),
            {
                let claims = claims.clone();
                move || claims.state()
            },
            |claim, class| {
                crate::decide::claim::claim_class(claim) == class.metadata.name.as_deref()
            },
            move |claim| q.add_now(claim_key(claim)),
            move |class| {
                if let Some(sets) = &sets_of_class {
                    sets.class_changed(class);
                }
            },
        );
        let (csinodes, nodes) = if let Some(node) = cfg.node.as_ref().filter(|_| with_topology) {
            // A per-node provisioner sees only its own node, as NodeGetInfo describes it.
            node_deployment::local_topology(node, &cfg.caps.name)
        } else if with_topology {
            (
                watches.reflect(Api::<CSINode>::all(client.clone()), |_| {}),
                watches.reflect(Api::<Node>::all(client.clone()), |_| {}),
            )
        } else {
            (empty(), empty())
        };
        let attached = Arc::new(attachments::AttachmentsByVolume::default());
        let attachments = if cfg.caps.publish_unpublish {
            let q = volumes_q.clone();
            let (feed, index) = (Feed::default(), attached.clone());
            watches.reflect(Api::<VolumeAttachment>::all(client.clone()), move |event| {
                feed.event(event, &*index);
                // A PV waiting for its attachments is looked at again when the last goes.
                match event {
                    watcher::Event::Delete(va) => {
                        if let Some(pv) = &va.spec.source.persistent_volume_name {
                            q.add_now(VolumeKey::cluster(pv));
                        }
                    }
                    watcher::Event::InitDone => {
                        for pv in index.take_freed() {
                            q.add_now(VolumeKey::cluster(&pv));
                        }
                    }
                    watcher::Event::Init
                    | watcher::Event::InitApply(_)
                    | watcher::Event::Apply(_) => {}
                }
            })
        } else {
            empty()
        };
        let csi_calls =
            sidecar_kit::csi::Caller::new(&cfg.caps.name, cfg.timeout, Some(metrics.clone()));
        let capacity = match capacity {
            Some(input) => Some(crate::capacity::controller::CapacityTracker::new(
                client.clone(),
                input.writer,
                csi.clone(),
                input.settings,
                &watches,
                &metrics,
            )?),
            None => None,
        };
        let topology = claim_topology::ClaimTopology::new(&cfg, csinodes, nodes);
        let gate = cfg.node.clone().map(node_deployment::NodeGate::new);
        let csi_layer_recorder = Recorder::new(client.clone(), "external-provisioner");
        Ok(Arc::new(Provisioner {
            client,
            csi,
            csi_calls,
            cfg,
            caches: Caches {
                claims,
                volumes,
                classes,
                attachments,
                clones,
            },
            claims: claims_q,
            volumes: volumes_q,
            cloning: cloning_q,
            csi_layer_recorder,
            recorder,
            metrics,
            watches,
            ledger: ledger::Ledger::default(),
            attached,
            deleted_handles,
            listing: std::sync::OnceLock::new(),
            settled: WorkQueue::new(Backoff {
                start: Duration::from_millis(100),
                max: Duration::from_secs(30),
            }),
            finished,
            topology,
            capacity,
            gate,
            sets,
            infeasible: parking_lot::Mutex::default(),
        }))
    }

    /// The intent log, when each CreateVolume is recorded in it first.
    pub(crate) fn intent_log(&self) -> Option<&intents::IntentLog> {
        self.ledger
            .intents()
            .filter(|_| self.cfg.recovery == crate::decide::recovery::Recovery::IntentLog)
    }

    /// Asks for what is settled to be written when `pv` may be deleted without its volume
    /// and volumes are marked.
    pub(crate) fn retained(&self, pv: &PersistentVolume) {
        if self.listing.get().is_some()
            && crate::decide::recovery::outlives_its_pv(
                pv,
                &self.cfg.caps.name,
                self.cfg.caps.migrated_from,
            )
        {
            self.settled.add(String::new());
        }
    }

    /// The provisioner as a controller: it waits for its caches, finds what a predecessor left
    /// in flight (`recovery`), then runs `--worker-threads` claim workers and as many volume
    /// workers.
    pub fn controller(self: Arc<Self>) -> Controller {
        let c = &self.caches;
        let (recover, claims, volumes) = (self.clone(), self.clone(), self.clone());
        let settled = self.clone();
        let cloning = self.clone();
        let controller = Controller::new("csi-provisioner").watches(&self.watches);
        let controller = match &self.capacity {
            Some(capacity) => capacity.attach(controller),
            None => controller,
        };
        let controller = match &self.sets {
            Some(sets) => {
                let (this, maker) = (self.clone(), self.clone());
                controller
                    .wait_for(&sets.sets)
                    .reconcile(
                        "persistentvolumeset",
                        sets.queue.clone(),
                        self.cfg.workers,
                        move |name| {
                            let this = this.clone();
                            async move { crate::volume_sets::sync::sync_set(&this, &name).await }
                        },
                    )
                    .reconcile(
                        "persistentvolumeset-volume",
                        sets.creates.clone(),
                        self.cfg.volume_set_creates,
                        move |volume| {
                            let maker = maker.clone();
                            async move { crate::volume_sets::sync::sync_member(&maker, &volume).await }
                        },
                    )
            }
            None => controller,
        };
        let controller = controller
            .wait_for(&c.claims)
            .wait_for(&c.volumes)
            .wait_for(&c.classes)
            .wait_for(&self.topology.csinodes)
            .wait_for(&self.topology.nodes)
            .wait_for(&c.attachments)
            .start_with(async move {
                recovery::recover(&recover).await;
                true
            })
            .reconcile("claim", self.claims.clone(), self.cfg.workers, move |key| {
                let this = claims.clone();
                async move { this.sync_claim(&key).await }
            })
            .reconcile(
                "volume",
                self.volumes.clone(),
                self.cfg.workers,
                move |key| {
                    let this = volumes.clone();
                    async move { this.sync_volume(key.name()).await }
                },
            )
            .reconcile("settled-mark", self.settled.clone(), 1, move |_| {
                let this = settled.clone();
                async move { recovery::write_settled(&this).await }
            });
        // Cloning protection only runs for a driver that clones (its queue is fed only then).
        if !self.cfg.caps.clone_volume {
            return controller;
        }
        controller.reconcile(
            "cloning-protection",
            self.cloning.clone(),
            self.cfg.cloning_workers,
            move |key| {
                let this = cloning.clone();
                async move { data_sources::sync_clone_source(&this, &key).await }
            },
        )
    }
}
