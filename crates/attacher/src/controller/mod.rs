//! The attacher around its decisions: watches of VolumeAttachments, PersistentVolumes and
//! CSINodes; an attach queue and a detach queue with their own workers (a detach storm cannot
//! starve attaches, upstream issue 761); a queue releasing PersistentVolumes; the periodic
//! reconcile against the driver's published nodes; all on the shared runtime.

mod calls;
mod plan;
mod reconcile;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use parking_lot::Mutex;
use sidecar_kit::csi::Caller;
use sidecar_kit::events::Recorder;
use sidecar_kit::key::ObjectKey;
use sidecar_kit::metrics::Metrics;
use sidecar_kit::runtime::Controller;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::{Feed, Referrers, WatchIndex, listed};
use sidecar_kit::workqueue::{Backoff, QueueMetrics, WorkQueue};
use tonic::transport::Channel;

use crate::decide::{self, DriverView, Options};

pub use sync::SyncError;

/// Settings from flags and the driver.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The driver.
    pub driver: DriverView,
    /// Decision options.
    pub options: Options,
    /// Timeout of each call and of a reconcile pass.
    pub timeout: Duration,
    /// Attach workers, and detach workers (each).
    pub workers: usize,
    /// Per-item backoff.
    pub backoff: Backoff,
    /// Every VolumeAttachment is looked at again this often.
    pub resync: Duration,
    /// The reconcile against ListVolumes runs this often.
    pub reconcile_sync: Duration,
    /// ListVolumes page size (0: the driver's).
    pub max_entries: i32,
    /// Longest logged gRPC message (-1: no limit).
    pub max_log_length: i32,
}

/// The running attacher.
pub struct Attacher {
    client: kube::Client,
    driver: calls::DriverCalls,
    cfg: Settings,
    finalizer: String,
    recorder: Recorder,
    watches: Watches,
    attachments: Store<VolumeAttachment>,
    volumes: Store<PersistentVolume>,
    csinodes: Store<CSINode>,
    attach_queue: WorkQueue<String>,
    detach_queue: WorkQueue<String>,
    volume_queue: WorkQueue<String>,
    /// VolumeAttachments the reconcile found the driver disagreeing with, with the
    /// resourceVersion it judged (see [`crate::decide::reconcile::force_stands`]).
    forced: Mutex<HashMap<String, Option<String>>>,
    /// VolumeAttachments a worker of either queue is handling (one at a time per name).
    busy: Mutex<HashSet<String>>,
    /// What each VolumeAttachment looked like when last queued (see
    /// [`decide::fingerprint`]).
    seen: Mutex<HashMap<String, u64>>,
    /// Every VolumeAttachment (any attacher's) by the PV it names: a PV's sync asks whether
    /// one still names it without looking at them all.
    by_volume: Mutex<Referrers<String>>,
    /// Feeds `seen`, `forced`, `marked` and `by_volume` from the watch of VolumeAttachments (a
    /// re-list drops the names it no longer shows).
    attachment_feed: Feed,
    /// VolumeAttachments marked attached whose new version the cache has not shown yet, with
    /// the resourceVersion written: until it arrives a cached "not attached" is stale, not a
    /// reason to publish and write again.
    marked: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Attacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacher")
            .field("driver", &self.cfg.driver.name)
            .finish_non_exhaustive()
    }
}

/// Why the attacher could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A metric could not be registered.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

fn queue(backoff: Backoff, metrics: &Metrics, name: &str) -> WorkQueue<String> {
    WorkQueue::new(backoff).with_metrics(QueueMetrics::new(metrics, name))
}

impl Attacher {
    /// Starts the watches; [`Attacher::controller`] runs it.
    pub fn new(
        client: kube::Client,
        channel: Channel,
        cfg: Settings,
        recorder: Recorder,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let watches = Watches::default();
        let attach_queue = queue(cfg.backoff, metrics, "csi-attacher-va");
        let detach_queue = queue(cfg.backoff, metrics, "csi-attacher-va-detach");
        let volume_queue = queue(cfg.backoff, metrics, "csi-attacher-pv");
        let calls = Caller::new(&cfg.driver.name, cfg.timeout, Some(metrics.clone()));
        let finalizer = decide::finalizer(&cfg.driver.name);
        Arc::new_cyclic(|weak: &std::sync::Weak<Attacher>| {
            let on_attachment = {
                let weak = weak.clone();
                move |event: &watcher::Event<VolumeAttachment>| {
                    if let Some(this) = weak.upgrade() {
                        this.on_attachment(event);
                    }
                }
            };
            let attachments = watches.reflect_trimmed(
                Api::<VolumeAttachment>::all(client.clone()),
                |_: &mut VolumeAttachment| {},
                on_attachment,
            );
            let on_volume = {
                let (queue, finalizer) = (volume_queue.clone(), finalizer.clone());
                let driver = cfg.driver.name.clone();
                move |event: &watcher::Event<PersistentVolume>| {
                    each(event, |pv| {
                        if decide::volume::releasable(pv, &driver)
                            && sidecar_kit::finalizers::has(&pv.metadata, &finalizer)
                        {
                            queue.add(pv.metadata.name.clone().unwrap_or_default());
                        }
                    });
                }
            };
            let volumes = watches.reflect_trimmed(
                Api::<PersistentVolume>::all(client.clone()),
                shrink_volume,
                on_volume,
            );
            let on_csinode = {
                let weak = weak.clone();
                move |event: &watcher::Event<CSINode>| {
                    let Some(this) = weak.upgrade() else { return };
                    each(event, |node| this.node_changed(node));
                }
            };
            let csinodes = watches.reflect(Api::<CSINode>::all(client.clone()), on_csinode);
            Attacher {
                recorder,
                client,
                driver: calls::DriverCalls::new(
                    channel,
                    calls,
                    cfg.max_log_length,
                    cfg.max_entries,
                ),
                cfg,
                finalizer,
                watches,
                attachments,
                volumes,
                csinodes,
                attach_queue,
                detach_queue,
                volume_queue,
                forced: Mutex::new(HashMap::new()),
                busy: Mutex::new(HashSet::new()),
                seen: Mutex::new(HashMap::new()),
                by_volume: Mutex::default(),
                attachment_feed: Feed::default(),
                marked: Mutex::new(HashMap::new()),
            }
        })
    }

    /// The attacher as a controller of the shared runtime.
    pub fn controller(self: &Arc<Self>) -> Controller {
        let (attach, detach, release) = (self.clone(), self.clone(), self.clone());
        let (resync, reconcile) = (self.clone(), self.clone());
        let workers = self.cfg.workers;
        let mut controller = Controller::new("csi-attacher")
            .watches(&self.watches)
            .wait_for(&self.attachments)
            .wait_for(&self.volumes)
            .wait_for(&self.csinodes)
            .start_with({
                let this = self.clone();
                async move {
                    this.queue_all(true);
                    true
                }
            })
            .reconcile("attach", self.attach_queue.clone(), workers, move |key| {
                let this = attach.clone();
                async move { this.sync_attach(&key).await }
            })
            .reconcile("detach", self.detach_queue.clone(), workers, move |key| {
                let this = detach.clone();
                async move { this.sync_detach(&key).await }
            })
            .reconcile("volume", self.volume_queue.clone(), workers, move |key| {
                let this = release.clone();
                async move { this.sync_volume(&key).await }
            })
            .every(self.cfg.resync, move || resync.queue_all(false));
        if self.cfg.driver.publish_unpublish && self.cfg.driver.list_published {
            let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
            controller = controller.every(self.cfg.reconcile_sync, move || {
                // One pass at a time: a slow driver makes passes late, never concurrent.
                if running.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let (this, running) = (reconcile.clone(), running.clone());
                tokio::spawn(async move {
                    this.reconcile_pass().await;
                    running.store(false, std::sync::atomic::Ordering::SeqCst);
                });
            });
        }
        controller
    }

    /// Queues a VolumeAttachment on the queue of its state (attach, or detach when being
    /// deleted); `now` ignores its backoff.
    fn route(&self, va: &VolumeAttachment, now: bool) {
        let name = va.metadata.name.clone().unwrap_or_default();
        let queue = if decide::deleting(va) {
            &self.detach_queue
        } else {
            &self.attach_queue
        };
        if now {
            queue.add_now(name);
        } else {
            queue.add(name);
        }
    }

    fn on_attachment(&self, event: &watcher::Event<VolumeAttachment>) {
        self.attachment_feed.event(event, self);
    }

    /// A CSINode changed: attachments to its node that wait for it are tried again.
    fn node_changed(&self, node: &CSINode) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        for va in self.attachments.state() {
            if va.spec.node_name == name
                && decide::ours(&va, &self.cfg.driver.name)
                && !decide::attached(&va)
            {
                self.route(&va, true);
            }
        }
    }

    /// Queues every VolumeAttachment of ours (the resync), and at start every PV whose
    /// finalizer may go ([`decide::volume::releasable`]).
    fn queue_all(&self, at_start: bool) {
        for va in self.attachments.state() {
            if decide::ours(&va, &self.cfg.driver.name) {
                self.route(&va, false);
            }
        }
        if at_start {
            for pv in self.volumes.state() {
                if decide::volume::releasable(&pv, &self.cfg.driver.name)
                    && sidecar_kit::finalizers::has(&pv.metadata, &self.finalizer)
                {
                    self.volume_queue
                        .add(pv.metadata.name.clone().unwrap_or_default());
                }
            }
        }
    }

    fn attachment(&self, name: &str) -> Option<Arc<VolumeAttachment>> {
        self.attachments.get(&ObjectRef::new(name))
    }
}

/// Keeps of a PV what the attacher reads: metadata (name, deletion, finalizers) and the spec
/// (the CSI source, access modes, volume mode, mount options); drops the status and the claim
/// reference's details it never reads.
fn shrink_volume(pv: &mut PersistentVolume) {
    pv.status = None;
    // An in-tree PV (CSI migration) keeps what its translation reads: the zone labels, the
    // Azure file share's resource group annotation, its claim's namespace.
    if sidecar_kit::migration::is_migratable(pv) {
        return;
    }
    if let Some(spec) = pv.spec.as_mut() {
        spec.claim_ref = None;
        spec.node_affinity = None;
    }
    pv.metadata.labels = None;
    pv.metadata.annotations = None;
}

/// What the attacher remembers per VolumeAttachment, fed by its watch.
impl WatchIndex<VolumeAttachment> for Attacher {
    fn apply(&self, va: &VolumeAttachment) {
        let name = va.metadata.name.clone().unwrap_or_default();
        {
            let mut by_volume = self.by_volume.lock();
            match &va.spec.source.persistent_volume_name {
                Some(pv) => by_volume.link(&name, pv.clone()),
                None => drop(by_volume.unlink(&name)),
            }
        }
        if !decide::ours(va, &self.cfg.driver.name) {
            return;
        }
        {
            let mut marked = self.marked.lock();
            if marked
                .get(&name)
                .is_some_and(|rv| va.metadata.resource_version.as_ref() == Some(rv))
            {
                marked.remove(&name);
            }
        }
        let print = decide::fingerprint(va);
        if self.seen.lock().insert(name, print) != Some(print) {
            self.route(va, false);
        }
    }

    fn delete(&self, va: &VolumeAttachment) {
        let name = va.metadata.name.clone().unwrap_or_default();
        let _ = self.by_volume.lock().unlink(&name);
        self.seen.lock().remove(&name);
        self.forced.lock().remove(&name);
        self.marked.lock().remove(&name);
        if let Some(pv) = &va.spec.source.persistent_volume_name {
            self.volume_queue.add(pv.clone());
        }
    }

    /// Attachments deleted while the watch was away are forgotten, and the PVs they were the
    /// last to name are looked at again.
    fn reset(&self, keep: &HashSet<ObjectKey>) {
        let kept = |name: &String| listed(keep, None, name);
        self.seen.lock().retain(|name, _| kept(name));
        self.forced.lock().retain(|name, _| kept(name));
        self.marked.lock().retain(|name, _| kept(name));
        // The PVs no attachment names any more (whichever attacher's it was): each sync
        // releases its PV if it is releasable and has our finalizer.
        let released = self.by_volume.lock().retain_listed(keep);
        for pv in released {
            self.volume_queue.add(pv);
        }
    }
}
