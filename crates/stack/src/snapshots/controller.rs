//! The snapshot controller's I/O on the shared runtime: watches of snapshots, contents,
//! classes, claims and volumes feed two queues; a reconcile builds the world of one object,
//! asks `decide` for the steps and carries them out (API patches, CSI calls, events).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::workqueue::{Backoff, Next, QueueMetrics, WorkQueue};
use tonic::transport::Channel;

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
}

fn api(step: &'static str) -> impl FnOnce(kube::Error) -> SyncError {
    move |source| SyncError::Api { step, source }
}

/// An API answer where `code` (404: already gone, 409: already there) means the step is done.
fn done_if<T>(result: Result<T, kube::Error>, code: u16) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == code => Ok(()),
        Err(error) => Err(error),
    }
}

/// Settings.
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
    /// Starts the watches; [`SnapshotController::controller`] runs the workers.
    pub fn new(
        client: kube::Client,
        csi: Channel,
        settings: SnapshotSettings,
        metrics: Option<sidecar_kit::metrics::Metrics>,
    ) -> Arc<Self> {
        let mut snapshot_queue = WorkQueue::new(settings.backoff);
        let mut content_queue = WorkQueue::new(settings.backoff);
        if let Some(m) = &metrics {
            snapshot_queue = snapshot_queue.with_metrics(QueueMetrics::new(m, "snapshots"));
            content_queue = content_queue.with_metrics(QueueMetrics::new(m, "contents"));
        }
        let watches = Watches::default();
        let q = snapshot_queue.clone();
        let snapshots = watches.reflect(Api::<VolumeSnapshot>::all(client.clone()), move |event| {
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
                    let r = &c.spec.volume_snapshot_ref;
                    if let (Some(ns), Some(name)) = (&r.namespace, &r.name) {
                        sq.add(snapshot_key(ns, name));
                    }
                });
            },
        );
        let classes = watches.reflect(Api::<VolumeSnapshotClass>::all(client.clone()), |_| {});
        // A claim restoring from a snapshot, or being snapshotted, brings the snapshot back.
        let q = snapshot_queue.clone();
        let snapshot_cache = snapshots.clone();
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |event| {
                each(event, |claim| {
                    let ns = claim.metadata.namespace.clone().unwrap_or_default();
                    if let Some(name) = decide::restores_from(claim) {
                        q.add(snapshot_key(&ns, &name));
                    }
                    let claim_name = claim.metadata.name.as_deref();
                    for s in snapshot_cache.state() {
                        if s.metadata.namespace.as_deref() == Some(ns.as_str())
                            && s.spec.source.persistent_volume_claim_name.as_deref() == claim_name
                        {
                            q.add(ObjectRef::from_obj(s.as_ref()));
                        }
                    }
                });
            },
        );
        let volumes = watches.reflect(Api::<PersistentVolume>::all(client.clone()), |_| {});
        let caller = Caller::new(&settings.driver, settings.timeout, metrics);
        let recorder = Recorder::new(
            client.clone(),
            "snapshot-controller",
            sidecar_kit::vocabulary::hostname(),
        );
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
                    async move { this.sync_snapshot(&key).await }
                },
            )
            .reconcile(
                "content",
                self.content_queue.clone(),
                self.settings.workers,
                move |key| {
                    let this = contents.clone();
                    async move { this.sync_content(&key).await }
                },
            )
    }

    async fn sync_snapshot(&self, key: &ObjectRef<VolumeSnapshot>) -> Result<Next, SyncError> {
        let Some(snapshot) = self.snapshots.get(key) else {
            return Ok(Next::Done);
        };
        let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
        let content = self
            .contents
            .get(&ObjectRef::new(&decide::wanted_content(&snapshot)));
        let classes = self.classes.state();
        let class_refs: Vec<&VolumeSnapshotClass> = classes.iter().map(|c| c.as_ref()).collect();
        let claim_name = snapshot.spec.source.persistent_volume_claim_name.clone();
        let claim = claim_name
            .as_ref()
            .and_then(|n| self.claims.get(&ObjectRef::new(n).within(&namespace)));
        let volume = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref())
            .and_then(|s| s.volume_name.clone())
            .and_then(|n| self.volumes.get(&ObjectRef::new(&n)));
        let claims = self.claims.state();
        let restoring = decide::restoring(&snapshot, claims.iter().map(|c| c.as_ref()));
        let snapshots = self.snapshots.state();
        let claim_busy = decide::claim_busy(&snapshot, snapshots.iter().map(|s| s.as_ref()));
        let now = sidecar_kit::vocabulary::now_rfc3339();
        let plan = decide::decide_snapshot(&SnapshotWorld {
            snapshot: &snapshot,
            content: content.as_deref(),
            classes: &class_refs,
            claim: claim.as_deref(),
            volume: volume.as_deref(),
            restoring,
            claim_busy,
            driver: &self.settings.driver,
            now: &now,
        });
        // Finalizer patches of one plan build on each other (indexes, the empty list).
        let mut finalizers = snapshot.metadata.finalizers.clone().unwrap_or_default();
        for step in plan.steps {
            self.snapshot_step(&snapshot, &mut finalizers, step).await?;
        }
        Ok(match plan.outcome {
            Outcome::Done => Next::Done,
            Outcome::Retry => Next::Retry,
        })
    }

    async fn snapshot_step(
        &self,
        snapshot: &VolumeSnapshot,
        finalizers: &mut Vec<String>,
        step: SnapshotStep,
    ) -> Result<(), SyncError> {
        let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
        let name = snapshot.metadata.name.clone().unwrap_or_default();
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &namespace);
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let params = PatchParams::default();
        match step {
            SnapshotStep::AddFinalizer(f) => {
                let rv = snapshot.metadata.resource_version.as_deref();
                let patch = add_finalizer(finalizers, f, rv);
                snapshots
                    .patch(&name, &params, &json_patch(patch)?)
                    .await
                    .map_err(api("add a snapshot finalizer"))?;
                finalizers.push(f.to_string());
            }
            SnapshotStep::RemoveFinalizer(f) => {
                if let Some(patch) = remove_finalizer(finalizers, f) {
                    snapshots
                        .patch(&name, &params, &json_patch(patch)?)
                        .await
                        .map_err(api("remove a snapshot finalizer"))?;
                    finalizers.retain(|x| x != f);
                }
            }
            SnapshotStep::SetClass(class) => {
                snapshots
                    .patch(
                        &name,
                        &params,
                        &Patch::Merge(json!({"spec": {"volumeSnapshotClassName": class}})),
                    )
                    .await
                    .map_err(api("set the default snapshot class"))?;
            }
            SnapshotStep::ProtectClaim(claim) => {
                self.claim_finalizer(&namespace, &claim, true).await?
            }
            SnapshotStep::ReleaseClaim(claim) => {
                self.claim_finalizer(&namespace, &claim, false).await?
            }
            SnapshotStep::CreateContent(content) => {
                let created = contents.create(&PostParams::default(), &content).await;
                if let Err(e) = done_if(created, 409) {
                    let message = format!("Failed to create snapshot content with error {e}");
                    self.event(
                        &reference(snapshot),
                        EventType::Warning,
                        "CreateSnapshotContentFailed",
                        &message,
                    );
                    return Err(api("create the snapshot content")(e));
                }
            }
            SnapshotStep::BindContent { content, uid } => {
                contents
                    .patch(
                        &content,
                        &params,
                        &Patch::Merge(json!({"spec": {"volumeSnapshotRef": {"uid": uid}}})),
                    )
                    .await
                    .map_err(api("bind the snapshot content"))?;
            }
            SnapshotStep::SetStatus(status) => {
                let value =
                    serde_json::to_value(&status).map_err(|e| SyncError::Invalid(e.to_string()))?;
                snapshots
                    .patch_status(
                        &name,
                        &params,
                        &json_patch(json!([{"op": "add", "path": "/status", "value": value}]))?,
                    )
                    .await
                    .map_err(api("update the snapshot status"))?;
            }
            SnapshotStep::MarkBeingDeleted(content) => {
                contents
                    .patch(
                        &content,
                        &params,
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {ANN_BEING_DELETED: "yes"}}}),
                        ),
                    )
                    .await
                    .map_err(api("mark the content as being deleted"))?;
            }
            SnapshotStep::DeleteContent(content) => {
                let deleted = contents.delete(&content, &DeleteParams::default()).await;
                if let Err(e) = done_if(deleted, 404) {
                    let message = format!("Failed to delete snapshot content: {e}");
                    self.event(
                        &reference(snapshot),
                        EventType::Warning,
                        "SnapshotContentObjectDeleteError",
                        &message,
                    );
                    return Err(api("delete the snapshot content")(e));
                }
            }
            SnapshotStep::Event(kind, reason, message) => {
                self.event(&reference(snapshot), kind, reason, &message);
            }
        }
        Ok(())
    }

    /// Adds (`protect`) or removes the source-protection finalizer of a claim being
    /// snapshotted; nothing when it is already so, or the claim is gone.
    async fn claim_finalizer(
        &self,
        namespace: &str,
        claim: &str,
        protect: bool,
    ) -> Result<(), SyncError> {
        let Some(cached) = self.claims.get(&ObjectRef::new(claim).within(namespace)) else {
            return Ok(());
        };
        let list = cached.metadata.finalizers.clone().unwrap_or_default();
        let has = list.iter().any(|f| f == FINALIZER_CLAIM);
        let patch = match (protect, has) {
            (true, false) => Some(add_finalizer(
                &list,
                FINALIZER_CLAIM,
                cached.metadata.resource_version.as_deref(),
            )),
            (false, true) => remove_finalizer(&list, FINALIZER_CLAIM),
            (true, true) | (false, false) => None,
        };
        if let Some(patch) = patch {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), namespace);
            done_if(
                claims
                    .patch(claim, &PatchParams::default(), &json_patch(patch)?)
                    .await,
                404,
            )
            .map_err(api("update the claim's snapshot finalizer"))?;
        }
        Ok(())
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

    async fn sync_content(&self, name: &str) -> Result<Next, SyncError> {
        let Some(content) = self.contents.get(&ObjectRef::new(name)) else {
            return Ok(Next::Done);
        };
        let class = content
            .spec
            .volume_snapshot_class_name
            .as_ref()
            .and_then(|c| self.classes.get(&ObjectRef::new(c)));
        let r = &content.spec.volume_snapshot_ref;
        let snapshot_exists = match (&r.namespace, &r.name) {
            (Some(ns), Some(n)) => self
                .snapshots
                .get(&snapshot_key(ns, n))
                .is_some_and(|s| r.uid.is_none() || s.metadata.uid == r.uid),
            _ => false,
        };
        let plan = decide::decide_content(&ContentWorld {
            content: &content,
            class: class.as_deref(),
            snapshot_exists,
            driver: &self.settings.driver,
        });
        for step in plan.steps {
            if !self.content_step(&content, step).await? {
                return Ok(Next::Retry);
            }
        }
        Ok(match plan.outcome {
            Outcome::Done => Next::Done,
            Outcome::Retry => Next::Retry,
        })
    }

    /// Carries out one step; false when a CSI call failed (reported; retried with backoff).
    async fn content_step(
        &self,
        content: &VolumeSnapshotContent,
        step: ContentStep,
    ) -> Result<bool, SyncError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let params = PatchParams::default();
        let controller = || csi::controller_client::ControllerClient::new(self.csi.clone());
        match step {
            ContentStep::AddFinalizer => {
                let patch = add_finalizer(
                    content.metadata.finalizers.as_deref().unwrap_or_default(),
                    FINALIZER_CONTENT,
                    content.metadata.resource_version.as_deref(),
                );
                contents
                    .patch(&name, &params, &json_patch(patch)?)
                    .await
                    .map_err(api("add the content finalizer"))?;
            }
            ContentStep::RemoveFinalizer => {
                if let Some(patch) = remove_finalizer(
                    content.metadata.finalizers.as_deref().unwrap_or_default(),
                    FINALIZER_CONTENT,
                ) {
                    done_if(
                        contents.patch(&name, &params, &json_patch(patch)?).await,
                        404,
                    )
                    .map_err(api("remove the content finalizer"))?;
                }
            }
            ContentStep::CreateSnapshot {
                name: csi_name,
                source_volume_id,
                parameters,
            } => {
                self.annotate(&name, ANN_BEING_CREATED, Some("yes")).await?;
                let secrets = self.secrets(content).await?;
                let request = csi::CreateSnapshotRequest {
                    source_volume_id,
                    name: csi_name,
                    secrets,
                    parameters: parameters.into_iter().collect(),
                };
                let mut client = controller();
                let answer = self
                    .caller
                    .call(
                        "/csi.v1.Controller/CreateSnapshot",
                        client.create_snapshot(self.caller.request(request)),
                    )
                    .await;
                match answer {
                    Ok(response) => {
                        let Some(s) = response.snapshot else {
                            return Err(SyncError::Invalid(
                                "CreateSnapshot answered without a snapshot".into(),
                            ));
                        };
                        let created = nanos(s.creation_time.as_ref());
                        let status = decide::content_status(
                            content.status.as_ref(),
                            &s.snapshot_id,
                            s.ready_to_use,
                            created,
                            s.size_bytes,
                        );
                        self.content_status(&name, &status).await?;
                        self.annotate(&name, ANN_BEING_CREATED, None).await?;
                        if !s.ready_to_use {
                            // Asked again after the backoff until the driver says ready.
                            return Ok(false);
                        }
                    }
                    Err(error) => {
                        self.content_failed(content, "SnapshotCreationFailed", &error)
                            .await?;
                        if final_code(error.code) {
                            self.annotate(&name, ANN_BEING_CREATED, None).await?;
                        }
                        return Ok(false);
                    }
                }
            }
            ContentStep::CheckSnapshot(handle) => {
                let mut client = controller();
                let request = csi::ListSnapshotsRequest {
                    snapshot_id: handle.clone(),
                    ..Default::default()
                };
                let answer = self
                    .caller
                    .call(
                        "/csi.v1.Controller/ListSnapshots",
                        client.list_snapshots(self.caller.request(request)),
                    )
                    .await;
                let found = match answer {
                    Ok(r) => r.entries.into_iter().find_map(|e| e.snapshot),
                    Err(error) => {
                        self.content_failed(content, "SnapshotContentCheckandUpdateFailed", &error)
                            .await?;
                        return Ok(false);
                    }
                };
                let Some(s) = found else {
                    let error = CallError {
                        method: "ListSnapshots",
                        code: tonic::Code::NotFound,
                        message: format!("snapshot {handle} not found"),
                    };
                    self.content_failed(content, "SnapshotContentCheckandUpdateFailed", &error)
                        .await?;
                    return Ok(false);
                };
                let created = nanos(s.creation_time.as_ref());
                let status = decide::content_status(
                    content.status.as_ref(),
                    &s.snapshot_id,
                    s.ready_to_use,
                    created,
                    s.size_bytes,
                );
                self.content_status(&name, &status).await?;
                if !s.ready_to_use {
                    return Ok(false);
                }
            }
            ContentStep::DeleteSnapshot(handle) => {
                let secrets = self.secrets(content).await?;
                let mut client = controller();
                let request = csi::DeleteSnapshotRequest {
                    snapshot_id: handle,
                    secrets,
                };
                let answer = self
                    .caller
                    .call(
                        "/csi.v1.Controller/DeleteSnapshot",
                        client.delete_snapshot(self.caller.request(request)),
                    )
                    .await;
                if let Err(error) = answer {
                    self.event(
                        &reference(content),
                        EventType::Warning,
                        "SnapshotDeleteError",
                        &format!("Failed to delete snapshot: {error}"),
                    );
                    return Ok(false);
                }
                let cleared = json!([{"op": "add", "path": "/status", "value": {}}]);
                match contents
                    .patch_status(&name, &params, &json_patch(cleared)?)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api("clear the content status")(e)),
                }
            }
            ContentStep::ClearBeingCreated => {
                self.annotate(&name, ANN_BEING_CREATED, None).await?;
            }
            ContentStep::Event(kind, reason, message) => {
                self.event(&reference(content), kind, reason, &message);
            }
        }
        Ok(true)
    }

    async fn annotate(
        &self,
        content: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), SyncError> {
        Api::<VolumeSnapshotContent>::all(self.client.clone())
            .patch(
                content,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .map_err(api("annotate the content"))?;
        Ok(())
    }

    async fn content_status(
        &self,
        content: &str,
        status: &super::types::VolumeSnapshotContentStatus,
    ) -> Result<(), SyncError> {
        let value = serde_json::to_value(status).map_err(|e| SyncError::Invalid(e.to_string()))?;
        Api::<VolumeSnapshotContent>::all(self.client.clone())
            .patch_status(
                content,
                &PatchParams::default(),
                &json_patch(json!([{"op": "add", "path": "/status", "value": value}]))?,
            )
            .await
            .map_err(api("update the content status"))?;
        Ok(())
    }

    /// Reports a failed CSI call: an event on the content and the error in its status.
    async fn content_failed(
        &self,
        content: &VolumeSnapshotContent,
        reason: &'static str,
        error: &CallError,
    ) -> Result<(), SyncError> {
        let message = format!("Failed to check and update snapshot content: {error}");
        let mut status = content.status.clone().unwrap_or_default();
        if status.error.as_ref().and_then(|e| e.message.as_deref()) == Some(message.as_str()) {
            // The same failure again: no new event, no status write.
            return Ok(());
        }
        self.event(&reference(content), EventType::Warning, reason, &message);
        status.ready_to_use = Some(false);
        status.error = Some(SnapshotError {
            time: Some(sidecar_kit::vocabulary::now_rfc3339()),
            message: Some(message),
        });
        let name = content.metadata.name.clone().unwrap_or_default();
        self.content_status(&name, &status).await
    }

    /// The CreateSnapshot/DeleteSnapshot secret named by the content's annotations.
    async fn secrets(
        &self,
        content: &VolumeSnapshotContent,
    ) -> Result<HashMap<String, String>, SyncError> {
        let annotations = content.metadata.annotations.clone().unwrap_or_default();
        let (Some(name), Some(namespace)) = (
            annotations.get(ANN_SECRET_NAME),
            annotations.get(ANN_SECRET_NAMESPACE),
        ) else {
            return Ok(HashMap::new());
        };
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(api("get the snapshotter secret"))?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }
}

/// Codes after which the driver is not working on the snapshot any more (the being-created
/// annotation may go); for the others it may still be.
fn final_code(code: tonic::Code) -> bool {
    !matches!(
        code,
        tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unavailable
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
    )
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

fn json_patch(value: Value) -> Result<Patch<()>, SyncError> {
    serde_json::from_value(value)
        .map(Patch::Json)
        .map_err(|e| SyncError::Invalid(e.to_string()))
}

/// A JSON patch adding a finalizer. Creating the list replaces whatever list the object has
/// now, so that is tested against the resourceVersion the empty list was seen at.
fn add_finalizer(finalizers: &[String], finalizer: &str, resource_version: Option<&str>) -> Value {
    if finalizers.is_empty() {
        let mut ops = Vec::new();
        if let Some(rv) = resource_version {
            ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}));
        }
        ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}));
        Value::Array(ops)
    } else {
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}])
    }
}

/// A JSON patch removing a finalizer, tested so a concurrent change is not overwritten.
fn remove_finalizer(finalizers: &[String], finalizer: &str) -> Option<Value> {
    let index = finalizers.iter().position(|f| f == finalizer)?;
    Some(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": finalizer},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_patches_create_append_and_remove_by_tested_index() {
        assert_eq!(
            add_finalizer(&[], "f", Some("7")),
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
            ])
        );
        let list = vec!["a".to_string(), "f".to_string()];
        assert_eq!(
            add_finalizer(&list, "g", Some("7")),
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "g"}])
        );
        assert_eq!(
            remove_finalizer(&list, "f"),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "f"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        );
        assert_eq!(remove_finalizer(&list, "x"), None);
        assert!(final_code(tonic::Code::InvalidArgument));
        assert!(!final_code(tonic::Code::Unavailable));
    }
}
