//! The set manager's state around the decisions: the watch of PersistentVolumeSets, its work
//! queue (one key per set), its index of labelled volumes (with the volumes it made that the
//! index does not show yet), and its metrics. What a pass does is in `sync.rs`.

use sidecar_kit::vocabulary::pv_phase as phase;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::runtime::reflector::Store;
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use sidecar_kit::key::ObjectKey;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::{WatchIndex, listed};
use sidecar_kit::workqueue::{Backoff, QueueMetrics, WorkQueue};

use super::decide::{available, is_member};
use super::index::{PassView, VolumeIndex};
use super::types::{LABEL_SET, PersistentVolumeSet, PersistentVolumeSetStatus};

/// The set manager's metrics.
#[derive(Debug, Clone)]
pub struct SetMetrics {
    /// `volstack_persistentvolumeset_volumes{set, state}`: total, available, bound, released.
    pub volumes: IntGaugeVec,
    /// `volstack_persistentvolumeset_claims_bound_total{set}`: volumes of the set that went from
    /// Available to Bound (claims served from the pool; claims provisioned dynamically are
    /// `controller_persistentvolumeclaim_provision_total`).
    pub bound_from_pool: IntCounterVec,
    /// `volstack_persistentvolumeset_volumes_created_total{set}`.
    pub created: IntCounterVec,
    /// `volstack_persistentvolumeset_volumes_deleted_total{set}`.
    pub deleted: IntCounterVec,
}

impl SetMetrics {
    fn register(metrics: &sidecar_kit::metrics::Metrics) -> Result<Self, prometheus::Error> {
        let volumes = IntGaugeVec::new(
            Opts::new(
                "volstack_persistentvolumeset_volumes",
                "Volumes of a PersistentVolumeSet by state (total, available, bound, released).",
            ),
            &["set", "state"],
        )?;
        let counter = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["set"]);
        let bound_from_pool = counter(
            "volstack_persistentvolumeset_claims_bound_total",
            "Volumes of a PersistentVolumeSet that went from Available to Bound.",
        )?;
        let created = counter(
            "volstack_persistentvolumeset_volumes_created_total",
            "Volumes created for a PersistentVolumeSet.",
        )?;
        let deleted = counter(
            "volstack_persistentvolumeset_volumes_deleted_total",
            "Volumes of a PersistentVolumeSet deleted by the set manager.",
        )?;
        metrics.registry.register(Box::new(volumes.clone()))?;
        metrics
            .registry
            .register(Box::new(bound_from_pool.clone()))?;
        metrics.registry.register(Box::new(created.clone()))?;
        metrics.registry.register(Box::new(deleted.clone()))?;
        Ok(SetMetrics {
            volumes,
            bound_from_pool,
            created,
            deleted,
        })
    }
}

/// The set manager (`--enable-volume-sets`).
pub struct SetManager {
    /// The sets.
    pub(crate) sets: Store<PersistentVolumeSet>,
    /// Set names to look at.
    pub(crate) queue: WorkQueue<String>,
    /// Volumes of sets to make (names of in-flight volumes; `--volume-set-creates` workers).
    pub(crate) creates: WorkQueue<String>,
    /// Backoff after a set's creations fail.
    backoff: Backoff,
    /// Per set: consecutive failed creations and when the last one failed.
    failures: Mutex<HashMap<String, (u32, Instant)>>,
    /// Metrics.
    pub(crate) metrics: SetMetrics,
    /// The last phase seen of each volume (to count bindings from a pool).
    phases: Mutex<HashMap<String, String>>,
    /// The labelled volumes and the volumes made but not seen yet ([`VolumeIndex`]).
    index: Mutex<VolumeIndex>,
}

impl std::fmt::Debug for SetManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetManager").finish_non_exhaustive()
    }
}

impl SetManager {
    /// Starts the watch of sets.
    pub fn new(
        client: kube::Client,
        watches: &Watches,
        metrics: &sidecar_kit::metrics::Metrics,
        backoff: Backoff,
    ) -> Result<Self, prometheus::Error> {
        let queue: WorkQueue<String> = WorkQueue::new(backoff)
            .with_metrics(QueueMetrics::new(metrics, "persistentvolumesets"));
        let creates: WorkQueue<String> = WorkQueue::new(backoff)
            .with_metrics(QueueMetrics::new(metrics, "persistentvolumeset-volumes"));
        let q = queue.clone();
        let sets = watches.reflect(Api::<PersistentVolumeSet>::all(client), move |event| {
            each(event, |set| {
                if let Some(name) = &set.metadata.name {
                    q.add(name.clone());
                }
            });
        });
        Ok(SetManager {
            sets,
            queue,
            creates,
            backoff,
            failures: Mutex::new(HashMap::new()),
            metrics: SetMetrics::register(metrics)?,
            phases: Mutex::new(HashMap::new()),
            index: Mutex::new(VolumeIndex::default()),
        })
    }

    /// The sets a volume belongs to: those whose selector matches it, and the set that made it
    /// (it may be gone: its Available volumes are then deleted).
    fn sets_of(&self, pv: &PersistentVolume) -> Vec<String> {
        let mut names: Vec<String> = self
            .sets
            .state()
            .iter()
            .filter(|set| is_member(set, pv))
            .filter_map(|set| set.metadata.name.clone())
            .collect();
        if let Some(made_by) = pv.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SET))
            && !names.contains(made_by)
        {
            names.push(made_by.clone());
        }
        names
    }

    /// A volume changed (or went): its sets are looked at again; a member that went from
    /// Available to Bound is counted as a claim served from the pool.
    pub fn volume_changed(&self, pv: &PersistentVolume, gone: bool) {
        let Some(name) = pv.metadata.name.clone() else {
            return;
        };
        let sets = self.sets_of(pv);
        self.index.lock().volume_changed(&name, pv, gone);
        let now = phase(pv).to_string();
        let before = if gone {
            self.phases.lock().remove(&name)
        } else {
            self.phases.lock().insert(name, now.clone())
        };
        if !gone
            && now == "Bound"
            && before.as_deref() == Some("Available")
            && let Some(set) = sets.first()
        {
            self.metrics.bound_from_pool.with_label_values(&[set]).inc();
        }
        for set in sets {
            self.queue.add(set);
        }
    }

    /// A StorageClass appeared, changed or went: the sets whose template names it are looked at
    /// again at once, out of the queue's backoff (where a set whose class was missing waits). A
    /// set held back after refused creations keeps its own wait (`SetManager::waiting`).
    pub fn class_changed(&self, class: &k8s_openapi::api::storage::v1::StorageClass) {
        let Some(class_name) = class.metadata.name.as_deref() else {
            return;
        };
        for set in self.sets.state() {
            if set.spec.template.spec.storage_class_name.as_deref() == Some(class_name)
                && let Some(name) = &set.metadata.name
            {
                self.queue.add_now(name.clone());
            }
        }
    }

    /// The end of a re-list of volumes: those it did not show are forgotten, and every set is
    /// looked at again when one of them was labelled.
    fn volumes_listed(&self, keep: &HashSet<ObjectKey>) {
        let kept = |name: &str| listed(keep, None, name);
        let forgotten = self.index.lock().reset(kept);
        self.phases.lock().retain(|name, _| kept(name));
        if forgotten > 0 {
            for set in self.sets.state() {
                if let Some(name) = &set.metadata.name {
                    self.queue.add(name.clone());
                }
            }
        }
    }

    /// What a pass over the set `name` reads ([`VolumeIndex::view`]).
    pub(crate) fn view(
        &self,
        name: &str,
        set: Option<&PersistentVolumeSet>,
        cached: impl Fn(&str) -> bool,
    ) -> PassView {
        self.index.lock().view(name, set, cached, Instant::now())
    }

    /// Notes a volume made for `set`, before its PV is written: it counts as the set's until a
    /// pass finds its PV in the index and the cache, or its delete event arrives.
    pub(crate) fn made(&self, set: &str, volume: &str) {
        self.index.lock().made(set, volume, Instant::now());
    }

    /// Takes back the note of a volume whose PV could not be written.
    pub(crate) fn unmade(&self, volume: &str) {
        self.index.lock().unmade(volume);
    }

    /// Sets the gauges of `set`.
    pub(crate) fn gauges(
        &self,
        set: &str,
        status: &PersistentVolumeSetStatus,
        members: &[&PersistentVolume],
    ) {
        let released = members.iter().filter(|pv| phase(pv) == "Released").count();
        let g = &self.metrics.volumes;
        g.with_label_values(&[set, "total"])
            .set(i64::from(status.replicas));
        g.with_label_values(&[set, "available"])
            .set(members.iter().filter(|pv| available(pv)).count() as i64);
        g.with_label_values(&[set, "bound"])
            .set(i64::from(status.bound_replicas));
        g.with_label_values(&[set, "released"]).set(released as i64);
    }

    /// A creation for `set` failed: the set waits out a backoff before it makes another (a
    /// driver that refuses every volume is not asked again at once).
    pub(crate) fn creation_failed(&self, set: &str) {
        let mut failures = self.failures.lock();
        let entry = failures
            .entry(set.to_string())
            .or_insert((0, Instant::now()));
        *entry = (entry.0.saturating_add(1), Instant::now());
        let wait = self.backoff.delay(entry.0);
        self.queue.add_after(set.to_string(), wait);
    }

    /// A creation for `set` succeeded: no more waiting.
    pub(crate) fn creation_succeeded(&self, set: &str) {
        self.failures.lock().remove(set);
    }

    /// How long `set` still waits after failed creations.
    pub(crate) fn waiting(&self, set: &str) -> Option<Duration> {
        let failures = self.failures.lock();
        let (n, at) = failures.get(set)?;
        self.backoff
            .delay(*n)
            .checked_sub(at.elapsed())
            .filter(|d| !d.is_zero())
    }

    /// Drops the series of a set that is gone.
    pub(crate) fn forget(&self, set: &str) {
        self.failures.lock().remove(set);
        for state in ["total", "available", "bound", "released"] {
            let _ = self.metrics.volumes.remove_label_values(&[set, state]);
        }
    }
}

impl WatchIndex<PersistentVolume> for SetManager {
    fn apply(&self, pv: &PersistentVolume) {
        self.volume_changed(pv, false);
    }

    fn delete(&self, pv: &PersistentVolume) {
        self.volume_changed(pv, true);
    }

    fn reset(&self, keep: &HashSet<ObjectKey>) {
        self.volumes_listed(keep);
    }
}
