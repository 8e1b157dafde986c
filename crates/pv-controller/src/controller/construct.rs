//! How a [`PvController`] is made: its queues, its watches and what each change of a claim, a
//! volume, a class or a Pod puts on which queue.

use k8s_openapi::api::core::v1::Pod;
use sidecar_kit::workqueue::QueueMetrics;

use super::*;

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

impl PvController {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process). `node_recyclers`: node agents recycle Released CSI
    /// volumes with policy `Recycle` (the embedded stack's); without them such a volume gets a
    /// `VolumeFailedRecycle` event.
    pub fn new(
        client: kube::Client,
        backoff: Backoff,
        node_recyclers: bool,
        watches: Watches,
    ) -> Arc<Self> {
        Self::with_queues(client, backoff, node_recyclers, None, None, watches)
    }

    /// Like [`PvController::new`], on a cluster: with kube-controller-manager's `workqueue_*`
    /// series for its queues (`claims`, `volumes`, `recycle`) in `metrics`, and its recyclers
    /// of hostPath and NFS volumes (`recycler`; none: such a volume is marked Failed, "No
    /// recycler plugin found for the volume!").
    pub fn with_metrics(
        client: kube::Client,
        backoff: Backoff,
        metrics: &sidecar_kit::metrics::Metrics,
        recycler: Option<RecyclerConfig>,
    ) -> Arc<Self> {
        Self::with_queues(
            client,
            backoff,
            false,
            Some(metrics),
            recycler,
            Watches::default(),
        )
    }

    fn with_queues(
        client: kube::Client,
        backoff: Backoff,
        node_recyclers: bool,
        metrics: Option<&sidecar_kit::metrics::Metrics>,
        recycler: Option<RecyclerConfig>,
        watches: Watches,
    ) -> Arc<Self> {
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
        let recycle_queue: WorkQueue<String> = queue(backoff, metrics, "recycle");
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
                    // At once, backing off or not: a claim naming a volume that does not exist
                    // yet waits (backs off) for it.
                    if let Some((ns, name)) = claim_named_by(v) {
                        cq.add_now(ObjectRef::new(&name).within(&ns));
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
            |_| {},
        );
        // A Pod that waits for the scheduler changes what its claims say they wait for.
        let (q, waiting_pods, feed) = (
            claim_queue.clone(),
            Arc::new(crate::pods::waiting_pods()),
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
        let recorder = Recorder::new(client.clone(), "persistentvolume-controller");
        Arc::new(PvController {
            recycler: recycler.map(Arc::new),
            recycle_queue,
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
}
