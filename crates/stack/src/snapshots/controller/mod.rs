//! The snapshot controller's I/O on the shared runtime: watches of snapshots, contents,
//! classes, claims and volumes feed two queues; a reconcile builds the world of one object,
//! asks `decide` for the steps and carries them out (API patches, CSI calls, events).
//!
//! - `snapshot`: a VolumeSnapshot's reconcile and its steps;
//! - `content`: a VolumeSnapshotContent's reconcile, its steps and the CSI calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::patch_ops::{self, Op};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::{ByReference, Feed};
use sidecar_kit::workqueue::{Backoff, Next, QueueMetrics, WorkQueue};
use tonic::transport::Channel;

mod content;
mod snapshot;

use super::decide::{
    self, ANN_BEING_CREATED, ANN_BEING_DELETED, ANN_SECRET_NAME, ANN_SECRET_NAMESPACE, ContentStep,
    ContentWorld, FINALIZER_CLAIM, FINALIZER_CONTENT, Outcome, SnapshotStep, SnapshotWorld,
};
use super::types::{SnapshotError, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};

/// Why a step failed; retried with the key's backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// An API write or read failed.
    #[error("failed to {step}: {source}")]
    Api {
        /// The step.
        step: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// A CSI call failed (reported in an event and the content's status).
    #[error(transparent)]
    Csi(#[from] CallError),
    /// A step was decided but cannot be carried out (a bad object).
    #[error("{0}")]
    Invalid(String),
    /// A finalizer patch found the object changed since it was read (its `test` failed, or a
    /// conflict): the pass ends and looks again soon, from what is current (not a failure).
    #[error("the object changed before {step}")]
    Changed {
        /// The step.
        step: &'static str,
    },
}

/// A pass's answer: a changed object is looked at again soon, not backed off as a failure.
fn settled(result: Result<Next, SyncError>) -> Result<Next, SyncError> {
    match result {
        Err(SyncError::Changed { step }) => {
            tracing::debug!(step, "changed meanwhile; looking again");
            Ok(Next::After(sidecar_kit::api_errors::CHANGED_LOOK_AGAIN))
        }
        Ok(next) => Ok(next),
        Err(error @ (SyncError::Api { .. } | SyncError::Csi(_) | SyncError::Invalid(_))) => {
            Err(error)
        }
    }
}

/// Sends finalizer operations guarded by their `test`s: done when the object is gone,
/// [`SyncError::Changed`] when it changed since it was read.
async fn patch_finalizers<K>(
    api: &Api<K>,
    name: &str,
    ops: Vec<Op>,
    step: &'static str,
) -> Result<(), SyncError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use sidecar_kit::api_errors::{AfterWrite, Write, after_write};
    match api
        .patch(name, &PatchParams::default(), &json_patch(ops))
        .await
    {
        Ok(_) => Ok(()),
        Err(source) => match after_write(&source, Write::Tested) {
            AfterWrite::Gone => Ok(()),
            AfterWrite::Changed => Err(SyncError::Changed { step }),
            AfterWrite::Later(_) | AfterWrite::Refused => Err(SyncError::Api { step, source }),
        },
    }
}

fn api(step: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Api { step, source }
}

/// An API answer where an error `done` names (`api_errors::is_not_found`: already gone,
/// `is_already_exists`: already there) means the step is done.
fn done_if<T>(
    result: Result<T, kube::Error>,
    done: fn(&kube::Error) -> bool,
) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(error) if done(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

/// How the snapshot controller runs (workers, backoff, resync).
#[derive(Debug, Clone)]
pub struct SnapshotSettings {
    /// The driver served (contents of other drivers are left alone).
    pub driver: String,
    /// Deadline of each CSI call.
    pub timeout: Duration,
    /// Retry backoff.
    pub backoff: Backoff,
    /// Workers per queue.
    pub workers: usize,
}

/// The snapshot controller for one driver.
pub struct SnapshotController {
    client: kube::Client,
    csi: Channel,
    caller: Caller,
    settings: SnapshotSettings,
    recorder: Recorder,
    watches: Watches,
    snapshots: Store<VolumeSnapshot>,
    contents: Store<VolumeSnapshotContent>,
    classes: Store<VolumeSnapshotClass>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    /// Snapshots by their source claim: a claim's event and a snapshot's sync read those, not
    /// every snapshot.
    snapshots_of_claim: Arc<ByReference<VolumeSnapshot>>,
    /// Claims by the snapshot they restore from: a snapshot's sync reads those, not every
    /// claim.
    restoring_claims: Arc<ByReference<PersistentVolumeClaim>>,
    snapshot_queue: WorkQueue<ObjectRef<VolumeSnapshot>>,
    content_queue: WorkQueue<String>,
}

impl std::fmt::Debug for SnapshotController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotController")
            .field("driver", &self.settings.driver)
            .finish_non_exhaustive()
    }
}

fn snapshot_key(namespace: &str, name: &str) -> ObjectRef<VolumeSnapshot> {
    ObjectRef::new(name).within(namespace)
}

impl SnapshotController {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process); [`SnapshotController::controller`] runs the workers.
    pub fn new(
        client: kube::Client,
        csi: Channel,
        settings: SnapshotSettings,
        metrics: Option<sidecar_kit::metrics::Metrics>,
        watches: Watches,
    ) -> Arc<Self> {
        let mut snapshot_queue = WorkQueue::new(settings.backoff);
        let mut content_queue = WorkQueue::new(settings.backoff);
        if let Some(m) = &metrics {
            snapshot_queue = snapshot_queue.with_metrics(QueueMetrics::new(m, "snapshots"));
            content_queue = content_queue.with_metrics(QueueMetrics::new(m, "contents"));
        }
        let (q, snapshots_of_claim, feed) = (
            snapshot_queue.clone(),
            Arc::new(ByReference::new(|s: &VolumeSnapshot| {
                s.spec
                    .source
                    .persistent_volume_claim_name
                    .clone()
                    .into_iter()
                    .collect()
            })),
            Feed::default(),
        );
        let index = snapshots_of_claim.clone();
        let snapshots = watches.reflect(Api::<VolumeSnapshot>::all(client.clone()), move |event| {
            feed.event(event, &*index);
            each(event, |s| q.add(ObjectRef::from_obj(s)));
        });
        let (cq, sq) = (content_queue.clone(), snapshot_queue.clone());
        let contents = watches.reflect(
            Api::<VolumeSnapshotContent>::all(client.clone()),
            move |event| {
                each(event, |c| {
                    if let Some(name) = &c.metadata.name {
                        cq.add(name.clone());
                    }
                    // At once, backing off or not: the snapshot may wait for this content (made
                    // after it, or bound to it at last).
                    let r = &c.spec.volume_snapshot_ref;
                    if let (Some(ns), Some(name)) = (&r.namespace, &r.name) {
                        sq.add_now(snapshot_key(ns, name));
                    }
                });
            },
        );
        // A class that appears, changes or goes brings back at once, backing off or not, the
        // snapshots not ready yet that name it or name none (it may be the default class they
        // lacked).
        let (sq, pending) = (snapshot_queue.clone(), snapshots.clone());
        let classes = watches.reflect(
            Api::<VolumeSnapshotClass>::all(client.clone()),
            move |event| {
                each(event, |class| {
                    let class = class.metadata.name.as_deref().unwrap_or_default();
                    for snapshot in pending.state() {
                        if decide::may_wait_for_class(&snapshot, class) {
                            sq.add_now(ObjectRef::from_obj(snapshot.as_ref()));
                        }
                    }
                });
            },
        );
        // A claim restoring from a snapshot, or being snapshotted, brings the snapshot back at
        // once, backing off or not: its change may be what the snapshot waited for (a claim
        // bound at last, a restoring claim gone).
        let (q, restoring_claims, feed) = (
            snapshot_queue.clone(),
            Arc::new(ByReference::new(|c: &PersistentVolumeClaim| {
                decide::restores_from(c).into_iter().collect()
            })),
            Feed::default(),
        );
        let (index, of_claim) = (restoring_claims.clone(), snapshots_of_claim.clone());
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |event| {
                feed.event(event, &*index);
                each(event, |claim| {
                    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
                    if let Some(name) = decide::restores_from(claim) {
                        q.add_now(snapshot_key(ns, &name));
                    }
                    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
                    for snapshot in of_claim.of(ns, claim_name) {
                        q.add_now(snapshot_key(ns, &snapshot));
                    }
                });
            },
        );
        let volumes = watches.reflect(Api::<PersistentVolume>::all(client.clone()), |_| {});
        let caller = Caller::new(&settings.driver, settings.timeout, metrics);
        let recorder = Recorder::new(client.clone(), "snapshot-controller");
        Arc::new(SnapshotController {
            client,
            csi,
            caller,
            settings,
            recorder,
            watches,
            snapshots,
            contents,
            classes,
            claims,
            volumes,
            snapshots_of_claim,
            restoring_claims,
            snapshot_queue,
            content_queue,
        })
    }

    /// The controller: waits for its caches, then runs the snapshot and content workers.
    pub fn controller(self: Arc<Self>) -> Controller {
        let (snapshots, contents) = (self.clone(), self.clone());
        Controller::new("snapshot-controller")
            .watches(&self.watches)
            .wait_for(&self.snapshots)
            .wait_for(&self.contents)
            .wait_for(&self.classes)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .reconcile(
                "snapshot",
                self.snapshot_queue.clone(),
                self.settings.workers,
                move |key| {
                    let this = snapshots.clone();
                    async move { settled(this.sync_snapshot(&key).await) }
                },
            )
            .reconcile(
                "content",
                self.content_queue.clone(),
                self.settings.workers,
                move |key| {
                    let this = contents.clone();
                    async move { settled(this.sync_content(&key).await) }
                },
            )
    }

    fn event(
        &self,
        object: &k8s_openapi::api::core::v1::ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        self.recorder.record(object, kind, reason, message);
    }
}

/// A snapshot's creation time in Unix nanoseconds; now when the driver gave none.
fn nanos(time: Option<&prost_types::Timestamp>) -> i64 {
    time.map(|t| t.seconds.saturating_mul(1_000_000_000) + i64::from(t.nanos))
        .filter(|n| *n > 0)
        .unwrap_or_else(now_nanos)
}

fn now_nanos() -> i64 {
    k8s_openapi::jiff::Timestamp::now()
        .as_nanosecond()
        .try_into()
        .unwrap_or(i64::MAX)
}

/// A JSON patch request of `ops`.
fn json_patch(ops: Vec<Op>) -> Patch<()> {
    Patch::Json(patch_ops::patch(ops))
}

/// The status of an object replaced by `status` (a status patch).
fn status_patch(status: impl serde::Serialize) -> Result<Patch<()>, SyncError> {
    let value = serde_json::to_value(status).map_err(|e| SyncError::Invalid(e.to_string()))?;
    Ok(json_patch(vec![patch_ops::add(&["status"], value)]))
}

/// The operations adding `finalizer` to an object listing `finalizers` at `resource_version`
/// (as [`sidecar_kit::finalizers::add_ops`]), or None when it is listed already.
fn add_finalizer(
    finalizers: &[String],
    finalizer: &str,
    resource_version: Option<&str>,
) -> Option<Vec<Op>> {
    let meta = ObjectMeta {
        finalizers: Some(finalizers.to_vec()),
        resource_version: resource_version.map(str::to_string),
        ..ObjectMeta::default()
    };
    sidecar_kit::finalizers::add_ops(&meta, finalizer)
}

/// The operations removing `finalizer`, tested at its index, or None when it is not listed.
fn remove_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<Op>> {
    let meta = ObjectMeta {
        finalizers: Some(finalizers.to_vec()),
        ..ObjectMeta::default()
    };
    sidecar_kit::finalizers::remove_ops(&meta, finalizer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_patches_create_append_and_remove_by_tested_index() {
        let json = |ops: Option<Vec<Op>>| ops.map(|ops| serde_json::to_value(ops).unwrap());
        assert_eq!(
            json(add_finalizer(&[], "f", Some("7"))),
            Some(json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
            ]))
        );
        let list = vec!["a".to_string(), "f".to_string()];
        assert_eq!(
            json(add_finalizer(&list, "g", Some("7"))),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["a", "f"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "g"},
            ]))
        );
        assert_eq!(json(add_finalizer(&list, "f", Some("7"))), None);
        assert_eq!(
            json(remove_finalizer(&list, "f")),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "f"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        );
        assert_eq!(remove_finalizer(&list, "x"), None);
        assert!(sidecar_kit::csi::is_final(tonic::Code::InvalidArgument));
        assert!(!sidecar_kit::csi::is_final(tonic::Code::Unavailable));
    }
}
