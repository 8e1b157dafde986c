//! The resizer: what external-resizer does for one driver, on the shared runtime. A claim whose
//! storage request grew has its volume grown by ControllerExpandVolume (or, for a driver with
//! only a node part, its new size recorded) and its PV's capacity updated; the node agent
//! then finishes with NodeExpandVolume. A claim that names another VolumeAttributesClass has
//! its volume changed by ControllerModifyVolume. Every step is recorded in the claim's status
//! first, so a restart resumes from the objects alone.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::{now_rfc3339, reference};
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};
use tonic::transport::Channel;

use decide::{Driver, Expansion, Modification};

/// The PV annotation holding the claim's capacity before a resize whose node part is due.
pub const ANN_PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// Why a pass failed; retried with the claim's backoff.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// An API write.
    #[error("failed to {step}: {source}")]
    Api {
        /// The step.
        step: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// The Secret a PV names for the call.
    #[error(transparent)]
    Secret(#[from] sidecar_kit::secrets::SecretError),
    /// ControllerExpandVolume failed (reported in an event and the claim's status).
    #[error("resize volume {pv:?} failed: {source}")]
    Expand {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// ControllerModifyVolume failed (reported in an event and the claim's status).
    #[error("modify volume {pv:?} failed: {source}")]
    Modify {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
}

/// How the resizer runs.
#[derive(Debug, Clone)]
pub struct ResizerSettings {
    /// The driver served (volumes of other drivers are left alone).
    pub driver: String,
    /// Whether it has ControllerExpandVolume (EXPAND_VOLUME).
    pub expands: bool,
    /// Whether the node service has NodeExpandVolume (EXPAND_VOLUME).
    pub node_expands: bool,
    /// Whether it has ControllerModifyVolume (MODIFY_VOLUME).
    pub modifies: bool,
    /// Deadline of each CSI call.
    pub timeout: Duration,
    /// Retry backoff per claim.
    pub backoff: Backoff,
    /// Workers.
    pub workers: usize,
}

/// The resizer of one driver.
pub struct Resizer {
    client: kube::Client,
    csi: Channel,
    caller: Caller,
    settings: ResizerSettings,
    recorder: Recorder,
    watches: Watches,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<VolumeAttributesClass>,
    queue: WorkQueue<ObjectRef<PersistentVolumeClaim>>,
}

impl std::fmt::Debug for Resizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resizer")
            .field("driver", &self.settings.driver)
            .finish_non_exhaustive()
    }
}

impl Resizer {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process); [`Resizer::controller`] runs the workers.
    pub fn new(
        client: kube::Client,
        csi: Channel,
        settings: ResizerSettings,
        watches: Watches,
    ) -> Arc<Self> {
        let queue = WorkQueue::new(settings.backoff);
        // A claim is looked at when what the resizer decides from changed, not for its own
        // status writes (a failed pass then waits for its backoff instead of looping).
        let q = queue.clone();
        let seen = parking_lot::Mutex::new(std::collections::HashMap::<_, u64>::new());
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |e: &kube::runtime::watcher::Event<PersistentVolumeClaim>| {
                if let kube::runtime::watcher::Event::Delete(c) = e {
                    seen.lock().remove(&ObjectRef::from_obj(c));
                    return;
                }
                each(e, |c| {
                    let key = ObjectRef::from_obj(c);
                    let print = decide::fingerprint(c);
                    if seen.lock().insert(key.clone(), print) != Some(print) {
                        q.add(key);
                    }
                });
            },
        );
        // A PV changing (its capacity, its claim) brings its claim back.
        let q = queue.clone();
        let volumes = watches.reflect(Api::<PersistentVolume>::all(client.clone()), move |e| {
            each(e, |pv: &PersistentVolume| {
                let r = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                if let Some((Some(ns), Some(name))) = r.map(|r| (&r.namespace, &r.name)) {
                    q.add(ObjectRef::new(name).within(ns));
                }
            });
        });
        // A class created after a claim named it brings the claims waiting for it back.
        let (q, waiting) = (queue.clone(), claims.clone());
        let classes = watches.reflect(
            Api::<VolumeAttributesClass>::all(client.clone()),
            move |e| {
                each(e, |class: &VolumeAttributesClass| {
                    for claim in waiting.state() {
                        let target = claim
                            .spec
                            .as_ref()
                            .and_then(|s| s.volume_attributes_class_name.as_deref());
                        if target.is_some() && target == class.metadata.name.as_deref() {
                            q.add(ObjectRef::from_obj(claim.as_ref()));
                        }
                    }
                });
            },
        );
        let caller = Caller::new(&settings.driver, settings.timeout, None);
        let recorder = Recorder::new(
            client.clone(),
            format!("external-resizer {}", settings.driver),
        );
        Arc::new(Resizer {
            client,
            csi,
            caller,
            settings,
            recorder,
            watches,
            claims,
            volumes,
            classes,
            queue,
        })
    }

    /// The controller: waits for its caches, then runs the workers.
    pub fn controller(self: Arc<Self>) -> Controller {
        let this = self.clone();
        Controller::new("external-resizer")
            .watches(&self.watches)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.classes)
            .reconcile(
                "resizer",
                self.queue.clone(),
                self.settings.workers,
                move |key| {
                    let this = this.clone();
                    async move { this.sync(&key).await }
                },
            )
    }

    fn driver(&self) -> Driver<'_> {
        Driver {
            name: &self.settings.driver,
            expands: self.settings.expands,
            node_expands: self.settings.node_expands,
            modifies: self.settings.modifies,
        }
    }

    async fn sync(&self, key: &ObjectRef<PersistentVolumeClaim>) -> Result<Next, ResizeError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(Next::Done);
        };
        let volume = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty())
            .and_then(|n| self.volumes.get(&ObjectRef::new(n)));
        if let Some(pv) = volume.as_deref()
            && decide::pre_resize_annotation_done(&claim, pv, &self.settings.driver)
        {
            let patch = json!({"metadata": {"annotations": {ANN_PRE_RESIZE_CAPACITY: null}}});
            let name = pv.metadata.name.clone().unwrap_or_default();
            Api::<PersistentVolume>::all(self.client.clone())
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| ResizeError::Api {
                    step: "remove the volume's pre-resize capacity",
                    source,
                })?;
        }
        if let Some(expansion) = decide::expansion(&claim, volume.as_deref(), self.driver()) {
            self.expand(&claim, volume.as_deref(), expansion).await?;
            // The claim's status changed: the next pass (its watch event) looks at the rest.
            return Ok(Next::Done);
        }
        let classes = &self.classes;
        let modification = decide::modification(
            &claim,
            volume.as_deref(),
            |name| {
                classes
                    .get(&ObjectRef::new(name))
                    .map(|c| c.as_ref().clone())
            },
            self.driver(),
        );
        match modification {
            None => {}
            Some(Modification::Pending { target }) => {
                let pending = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.modify_volume_status.as_ref())
                    .is_some_and(|m| m.status == decide::modify_status::PENDING);
                if !pending {
                    self.event(
                        &claim,
                        EventType::Warning,
                        "VolumeModifyFailed",
                        &format!("VAC {target:?} does not exist."),
                    );
                    self.patch_claim_status(
                        &claim,
                        &decide::modify_pending(),
                        "mark the claim's change of class pending",
                    )
                    .await?;
                }
            }
            Some(Modification::Modify {
                pv,
                target,
                request,
                secret,
            }) => {
                self.modify(&claim, &pv, &target, request, secret).await?;
            }
        }
        Ok(Next::Done)
    }

    async fn expand(
        &self,
        claim: &PersistentVolumeClaim,
        volume: Option<&PersistentVolume>,
        expansion: Expansion,
    ) -> Result<(), ResizeError> {
        let claim = &self
            .patch_claim_status(
                claim,
                &decide::resize_started(claim, expansion.to, &now_rfc3339()),
                "mark the claim resizing",
            )
            .await?;
        self.event(
            claim,
            EventType::Normal,
            "Resizing",
            &format!("External resizer is resizing volume {}", expansion.pv),
        );
        let (capacity, node_part) = match expansion.request {
            None => (expansion.to, true),
            Some(mut request) => {
                request.secrets =
                    sidecar_kit::secrets::fetch_ref(&self.client, expansion.secret.as_ref())
                        .await?;
                let mut client = csi::controller_client::ControllerClient::new(self.csi.clone());
                let answer = self
                    .caller
                    .call(
                        "/csi.v1.Controller/ControllerExpandVolume",
                        client.controller_expand_volume(self.caller.request(request)),
                    )
                    .await;
                match answer {
                    Ok(answer) => (
                        answer.capacity_bytes.max(expansion.to),
                        answer.node_expansion_required,
                    ),
                    Err(source) => {
                        let error = source.status_text();
                        self.event(
                            claim,
                            EventType::Warning,
                            "VolumeResizeFailed",
                            &format!(
                                "resize volume {:?} by resizer {:?} failed: {error}",
                                expansion.pv, self.settings.driver
                            ),
                        );
                        if let Some(patch) =
                            decide::resize_failed(claim, source.code, &error, &now_rfc3339())
                        {
                            self.patch_claim_status(claim, &patch, "record the failed resize")
                                .await?;
                        }
                        return Err(ResizeError::Expand {
                            pv: expansion.pv,
                            source,
                        });
                    }
                }
            }
        };
        let mut pv_patch = json!({"spec": {"capacity": {"storage": sidecar_kit::quantity::format_binary_si(capacity)}}});
        let annotated = volume
            .and_then(|v| v.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(ANN_PRE_RESIZE_CAPACITY));
        if node_part
            && !annotated
            && let Some(old) = claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
        {
            pv_patch["metadata"] = json!({"annotations": {ANN_PRE_RESIZE_CAPACITY: old.0}});
        }
        Api::<PersistentVolume>::all(self.client.clone())
            .patch(
                &expansion.pv,
                &PatchParams::default(),
                &Patch::Merge(&pv_patch),
            )
            .await
            .map_err(|source| ResizeError::Api {
                step: "update the volume's capacity",
                source,
            })?;
        let done = decide::resize_done(claim, capacity, node_part, &now_rfc3339());
        self.patch_claim_status(claim, &done, "record the resize")
            .await?;
        if node_part {
            self.event(
                claim,
                EventType::Normal,
                "FileSystemResizeRequired",
                "Require file system resize of volume on node",
            );
        } else {
            self.event(
                claim,
                EventType::Normal,
                "VolumeResizeSuccessful",
                "Resize volume succeeded",
            );
        }
        Ok(())
    }

    async fn modify(
        &self,
        claim: &PersistentVolumeClaim,
        pv: &str,
        target: &str,
        mut request: csi::ControllerModifyVolumeRequest,
        secret: Option<sidecar_kit::secrets::SecretRef>,
    ) -> Result<(), ResizeError> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let claim = &self
            .patch_claim_status(
                claim,
                &decide::modify_started(claim, target, &now_rfc3339()),
                "mark the claim's volume modifying",
            )
            .await?;
        self.event(
            claim,
            EventType::Normal,
            "VolumeModify",
            &format!("external resizer is modifying volume {name} with vac {target}"),
        );
        request.secrets = sidecar_kit::secrets::fetch_ref(&self.client, secret.as_ref()).await?;
        let mut client = csi::controller_client::ControllerClient::new(self.csi.clone());
        let answer = self
            .caller
            .call(
                "/csi.v1.Controller/ControllerModifyVolume",
                client.controller_modify_volume(self.caller.request(request)),
            )
            .await;
        if let Err(source) = answer {
            let mut message = source.status_text();
            if decide::uncertain(source.code) {
                message.push_str(&format!(". Still modifying to VAC {target}"));
            }
            self.event(claim, EventType::Warning, "VolumeModifyFailed", &message);
            let failed =
                decide::modify_failed(claim, target, source.code, &source.message, &now_rfc3339());
            self.patch_claim_status(claim, &failed, "record the failed change of class")
                .await?;
            return Err(ResizeError::Modify {
                pv: pv.to_string(),
                source,
            });
        }
        let pv_patch = json!({"spec": {"volumeAttributesClassName": target}});
        Api::<PersistentVolume>::all(self.client.clone())
            .patch(pv, &PatchParams::default(), &Patch::Merge(&pv_patch))
            .await
            .map_err(|source| ResizeError::Api {
                step: "record the volume's class",
                source,
            })?;
        self.patch_claim_status(
            claim,
            &decide::modify_done(claim, target),
            "record the claim's class",
        )
        .await?;
        self.event(
            claim,
            EventType::Normal,
            "VolumeModifySuccessful",
            &format!("external resizer modified volume {name} with vac {target} successfully"),
        );
        Ok(())
    }

    /// Patches the claim's status; returns the claim as written.
    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        patch: &Value,
        step: &'static str,
    ) -> Result<PersistentVolumeClaim, ResizeError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        // Written over the claim it was decided from, or not at all (a conflict: looked at
        // again from what is current).
        let patch = sidecar_kit::patch_ops::merge_at_version(&claim.metadata, patch);
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ResizeError::Api { step, source })
    }

    fn event(&self, claim: &PersistentVolumeClaim, kind: EventType, reason: &str, message: &str) {
        self.recorder
            .record(&reference(claim), kind, reason, message);
    }
}
