//! Carrying out a plan: the API writes and CSI calls of one attach, detach or PV release, in
//! the order the decisions give (protect first, call, then record), with the outcome written
//! to the VolumeAttachment's status.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use sidecar_kit::api_errors;
use sidecar_kit::csi::CallError;
use sidecar_kit::events::EventType;
use sidecar_kit::patch_ops::{self, Op};
use sidecar_kit::vocabulary::{now_rfc3339 as now, reference};
use sidecar_kit::workqueue::Next;

use super::Attacher;
use crate::decide::attach::{self, Plan};
use crate::decide::{self, status, volume};

/// Upstream's words for a detach whose attachment could not be marked detached.
const MARK_DETACHED: &str = "could not mark as detached";

/// How soon a VolumeAttachment held by the other queue's worker is looked at again.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a sync failed (retried with backoff; the attach or detach error is in the status).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The attach cannot be tried (no PV, no CSINode, a bad spec).
    #[error("failed to attach {name}: {message}")]
    AttachRefused {
        /// The VolumeAttachment.
        name: String,
        /// Why the attach cannot be tried (also written to `status.attachError`).
        message: String,
    },
    /// The detach cannot be tried.
    #[error("failed to detach {name}: {message}")]
    DetachRefused {
        /// The VolumeAttachment.
        name: String,
        /// Why the detach cannot be tried (also written to `status.detachError`).
        message: String,
    },
    /// Adding the finalizer to the PV failed.
    #[error("could not add PersistentVolume finalizer to {pv}: {source}")]
    ProtectVolume {
        /// The PV.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
    /// Adding the finalizer and node id to the VolumeAttachment failed.
    #[error("could not save VolumeAttachment {name}: {source}")]
    ProtectAttachment {
        /// The VolumeAttachment.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The controller-publish Secret could not be read.
    #[error(transparent)]
    Secret(#[from] sidecar_kit::secrets::SecretError),
    /// ControllerPublishVolume failed.
    #[error("failed to attach {name}: {source}")]
    Publish {
        /// The VolumeAttachment.
        name: String,
        /// The call's error.
        source: CallError,
    },
    /// ControllerUnpublishVolume failed.
    #[error("failed to detach {name}: {source}")]
    Unpublish {
        /// The VolumeAttachment.
        name: String,
        /// The call's error.
        source: CallError,
    },
    /// A status write failed.
    #[error("failed to write the status of {name}: {source}")]
    Status {
        /// The VolumeAttachment.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Removing the finalizer from the VolumeAttachment failed.
    #[error("could not remove the finalizer of VolumeAttachment {name}: {source}")]
    ReleaseAttachment {
        /// The VolumeAttachment.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Removing the finalizer from the PV failed.
    #[error("could not remove the finalizer of PersistentVolume {pv}: {source}")]
    ReleaseVolume {
        /// The PV.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Whether an API error says the object is gone.
fn not_found(error: &kube::Error) -> bool {
    api_errors::is_not_found(error)
}

/// What became of a write: done, a step for the queue (the object gone or changed meanwhile,
/// by the shared table), or an error for the caller to report.
enum Wrote {
    Done,
    Next(Next),
    Failed(kube::Error),
}

impl Wrote {
    /// `result` of a write guarded as `write`; `gone`: the step when the object is gone (None:
    /// as if written).
    fn of(result: Result<(), kube::Error>, write: api_errors::Write, gone: Option<Next>) -> Wrote {
        let Err(error) = result else {
            return Wrote::Done;
        };
        if gone.is_none() && not_found(&error) {
            return Wrote::Done;
        }
        match api_errors::next_after(error, write, gone.unwrap_or(Next::Done)) {
            Ok(next) => Wrote::Next(next),
            Err(error) => Wrote::Failed(error),
        }
    }
}

/// Which half of the lifecycle failed: its error goes to `attachError` or `detachError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Attach,
    Detach,
}

impl Attacher {
    /// Writes a status patch; returns the new resourceVersion.
    async fn write_status(&self, name: &str, patch: &Value) -> Result<Option<String>, kube::Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|va| va.metadata.resource_version)
    }

    /// Writes a finalizer patch (guarded by its `test` operations); `gone` as in [`Wrote::of`].
    async fn json_patch<K>(
        &self,
        api: Api<K>,
        name: &str,
        ops: Vec<Op>,
        gone: Option<Next>,
    ) -> Wrote
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let result = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch_ops::patch(ops)),
            )
            .await
            .map(|_| ());
        Wrote::of(result, api_errors::Write::Tested, gone)
    }

    /// Records a failure of `side` in the status (and an event, once per message) and
    /// returns the error.
    async fn failed(
        &self,
        va: &VolumeAttachment,
        side: Side,
        message: String,
        code: Option<tonic::Code>,
        error: SyncError,
    ) -> SyncError {
        let name = va.metadata.name.clone().unwrap_or_default();
        let (patch, reason) = match side {
            Side::Attach => {
                let code = code
                    .filter(|_| self.cfg.options.error_codes)
                    .map(|c| c as i32);
                (status::attach_error(&now(), &message, code), "AttachFailed")
            }
            Side::Detach => (status::detach_error(&now(), &message), "DetachFailed"),
        };
        if let Err(source) = self.write_status(&name, &patch).await
            && !not_found(&source)
        {
            tracing::warn!(attachment = %name, error = %source, "failed to save the error in the status");
        }
        self.recorder
            .record(&reference(va), EventType::Warning, reason, &message);
        error
    }

    /// Records a refused write of `side` as upstream words it (`<what>: <the API server's
    /// message>`) and returns the error `error` makes of it.
    async fn write_failed(
        &self,
        va: &VolumeAttachment,
        side: Side,
        what: &str,
        source: kube::Error,
        error: impl FnOnce(kube::Error) -> SyncError,
    ) -> SyncError {
        let message = format!("{what}: {}", api_errors::message(&source));
        self.failed(va, side, message, None, error(source)).await
    }

    /// The secret a call of `side` needs (none without a reference); a failure is recorded
    /// as the side's error.
    async fn secrets(
        &self,
        va: &VolumeAttachment,
        side: Side,
        secret: Option<&sidecar_kit::secrets::SecretRef>,
    ) -> Result<std::collections::HashMap<String, String>, SyncError> {
        match sidecar_kit::secrets::fetch_ref(&self.client, secret).await {
            Ok(secrets) => Ok(secrets),
            Err(e) => {
                let message = e.to_string();
                Err(self.failed(va, side, message, None, e.into()).await)
            }
        }
    }

    /// The attach queue's reconcile.
    pub(super) async fn sync_attach(self: &Arc<Self>, name: &str) -> Result<Next, SyncError> {
        let Some(_held) = self.hold(name) else {
            return Ok(Next::After(BUSY_RETRY));
        };
        let Some(va) = self.ours(name) else {
            return Ok(Next::Done);
        };
        if decide::deleting(&va) && self.cfg.driver.publish_unpublish {
            self.detach_queue.add_now(name.to_string());
            return Ok(Next::Done);
        }
        let force = self.forced(&va);
        if !force && !decide::attached(&va) && self.marked.lock().contains_key(name) {
            // Attached by us; the cache is behind (its event will bring the key back).
            return Ok(Next::Done);
        }
        match self.plan_for(&va, force).await {
            Plan::Nothing => Ok(Next::Done),
            Plan::MarkAttached => {
                let written = self
                    .write_status(name, &status::attached(None, &Default::default()))
                    .await
                    .map(drop);
                match Wrote::of(written, api_errors::Write::Plain, Some(Next::Done)) {
                    Wrote::Done => Ok(Next::Done),
                    Wrote::Next(next) => Ok(next),
                    Wrote::Failed(source) => Err(SyncError::Status {
                        name: name.to_string(),
                        source,
                    }),
                }
            }
            Plan::AttachFailed {
                message,
                protect_volume,
                secret_first,
            } => {
                if let Some((pv, ops)) = protect_volume
                    && let Some(next) = self.protect_volume(&va, pv, ops).await?
                {
                    return Ok(next);
                }
                // Upstream reads the secret first: a missing one is what this reports.
                self.secrets(&va, Side::Attach, secret_first.as_ref())
                    .await?;
                let error = SyncError::AttachRefused {
                    name: name.to_string(),
                    message: message.clone(),
                };
                Err(self.failed(&va, Side::Attach, message, None, error).await)
            }
            Plan::Detach(_) | Plan::DetachFailed { .. } => {
                // Being deleted meanwhile (the trivial driver never gets here).
                self.detach_queue.add_now(name.to_string());
                Ok(Next::Done)
            }
            Plan::Attach(plan) => self.attach(&va, plan).await,
        }
    }

    /// Adds our finalizer to the attachment's PV, for an attach or a refused one (upstream adds
    /// it right after reading the PV). `Some(next)`: the PV changed meanwhile, look again.
    async fn protect_volume(
        &self,
        va: &VolumeAttachment,
        pv: String,
        ops: Vec<Op>,
    ) -> Result<Option<Next>, SyncError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match self.json_patch(api, &pv, ops, Some(Next::Retry)).await {
            Wrote::Done => Ok(None),
            Wrote::Next(next) => Ok(Some(next)),
            Wrote::Failed(source) => Err(self
                .write_failed(
                    va,
                    Side::Attach,
                    "could not add PersistentVolume finalizer",
                    source,
                    |source| SyncError::ProtectVolume { pv, source },
                )
                .await),
        }
    }

    async fn attach(&self, va: &VolumeAttachment, plan: attach::Attach) -> Result<Next, SyncError> {
        let name = va.metadata.name.clone().unwrap_or_default();
        if let Some((pv, ops)) = plan.protect_volume
            && let Some(next) = self.protect_volume(va, pv, ops).await?
        {
            return Ok(next);
        }
        // Before the attachment's finalizer, as upstream: an attachment whose secret is missing
        // has nothing to detach and can be deleted at once.
        let secrets = self
            .secrets(va, Side::Attach, plan.publish.secret.as_ref())
            .await?;
        if let Some(ops) = plan.protect_attachment {
            let api: Api<VolumeAttachment> = Api::all(self.client.clone());
            match self.json_patch(api, &name, ops, Some(Next::Done)).await {
                Wrote::Done => {}
                Wrote::Next(next) => return Ok(next),
                Wrote::Failed(source) => {
                    return Err(self
                        .write_failed(
                            va,
                            Side::Attach,
                            "could not save VolumeAttachment",
                            source,
                            |source| SyncError::ProtectAttachment { name, source },
                        )
                        .await);
                }
            }
        }
        match self.driver.publish(&plan.publish, secrets).await {
            Ok(context) => {
                let previous = va
                    .status
                    .as_ref()
                    .and_then(|s| s.attachment_metadata.as_ref());
                match self
                    .write_status(&name, &status::attached(previous, &context))
                    .await
                {
                    Ok(Some(version)) => {
                        let mut marked = self.marked.lock();
                        // Unless the event came first (the cache has it already).
                        let cached = self
                            .attachment(&name)
                            .and_then(|v| v.metadata.resource_version.clone());
                        if cached.as_ref() != Some(&version) {
                            marked.insert(name.clone(), version);
                        }
                    }
                    Ok(None) => {}
                    // Deleted meanwhile: the detach has the finalizer to work with.
                    Err(e) => match Wrote::of(Err(e), api_errors::Write::Plain, None) {
                        Wrote::Done => {}
                        // Changed meanwhile: publish again (idempotent) and write anew.
                        Wrote::Next(next) => return Ok(next),
                        Wrote::Failed(source) => return Err(SyncError::Status { name, source }),
                    },
                }
                self.forced.lock().remove(&name);
                tracing::info!(attachment = %name, volume = %plan.publish.volume_id, node = %va.spec.node_name, "attached");
                Ok(Next::Done)
            }
            Err(source) => {
                let message = source.status_text();
                let code = Some(source.code);
                let error = SyncError::Publish { name, source };
                Err(self.failed(va, Side::Attach, message, code, error).await)
            }
        }
    }

    /// The detach queue's reconcile.
    pub(super) async fn sync_detach(self: &Arc<Self>, name: &str) -> Result<Next, SyncError> {
        let Some(_held) = self.hold(name) else {
            return Ok(Next::After(BUSY_RETRY));
        };
        let Some(va) = self.ours(name) else {
            return Ok(Next::Done);
        };
        if !decide::deleting(&va) {
            self.attach_queue.add_now(name.to_string());
            return Ok(Next::Done);
        }
        let force = self.forced(&va);
        let plan = match self.plan_for(&va, force).await {
            Plan::Detach(plan) => plan,
            Plan::DetachFailed {
                message,
                secret_first,
            } => {
                self.secrets(&va, Side::Detach, secret_first.as_ref())
                    .await?;
                let error = SyncError::DetachRefused {
                    name: name.to_string(),
                    message: message.clone(),
                };
                return Err(self.failed(&va, Side::Detach, message, None, error).await);
            }
            Plan::MarkAttached | Plan::Attach(_) | Plan::AttachFailed { .. } | Plan::Nothing => {
                self.forced.lock().remove(name);
                return Ok(Next::Done);
            }
        };
        let secrets = self
            .secrets(&va, Side::Detach, plan.secret.as_ref())
            .await?;
        if let Err(source) = self.driver.unpublish(&plan, secrets).await {
            let message = source.status_text();
            let error = SyncError::Unpublish {
                name: name.to_string(),
                source,
            };
            return Err(self.failed(&va, Side::Detach, message, None, error).await);
        }
        if let Some(ops) = plan.release {
            let api: Api<VolumeAttachment> = Api::all(self.client.clone());
            // Changed meanwhile: detach again (idempotent) from the new object.
            match self.json_patch(api, name, ops, None).await {
                Wrote::Done => {}
                Wrote::Next(next) => return Ok(next),
                Wrote::Failed(source) => {
                    return Err(self
                        .write_failed(&va, Side::Detach, MARK_DETACHED, source, |source| {
                            SyncError::ReleaseAttachment {
                                name: name.to_string(),
                                source,
                            }
                        })
                        .await);
                }
            }
        }
        if plan.write_status {
            let written = self.write_status(name, &status::detached()).await.map(drop);
            match Wrote::of(written, api_errors::Write::Plain, None) {
                Wrote::Done => {}
                Wrote::Next(next) => return Ok(next),
                Wrote::Failed(source) => {
                    return Err(self
                        .write_failed(&va, Side::Detach, MARK_DETACHED, source, |source| {
                            SyncError::Status {
                                name: name.to_string(),
                                source,
                            }
                        })
                        .await);
                }
            }
        }
        self.forced.lock().remove(name);
        tracing::info!(attachment = %name, volume = %plan.volume_id, node = %va.spec.node_name, "detached");
        Ok(Next::Done)
    }

    /// The volume queue's reconcile: a deleted PV (or an in-tree one handed back,
    /// [`volume::releasable`]) loses our finalizer once no VolumeAttachment names it.
    pub(super) async fn sync_volume(self: &Arc<Self>, name: &str) -> Result<Next, SyncError> {
        let Some(pv) = self.volumes.get(&ObjectRef::new(name)) else {
            return Ok(Next::Done);
        };
        let named = self.by_volume.lock().of(&name.to_string()).next().is_some();
        let Some(ops) = volume::release(&pv, &self.finalizer, &self.cfg.driver.name, named) else {
            return Ok(Next::Done);
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match self.json_patch(api, name, ops, Some(Next::Done)).await {
            Wrote::Done => Ok(Next::Done),
            Wrote::Next(next) => Ok(next),
            Wrote::Failed(source) => Err(SyncError::ReleaseVolume {
                pv: name.to_string(),
                source,
            }),
        }
    }
}
