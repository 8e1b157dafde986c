//! Deleting the volumes of released PVs: DeleteVolume with the secret recorded on the PV,
//! then delete the PV, then drop our finalizer (two API writes per volume).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::api_errors;
use sidecar_kit::events::EventType;
use sidecar_kit::patch_ops::Op;
use sidecar_kit::workqueue::Next;

use super::Provisioner;
use crate::decide::classify::{DeleteOutcome, classify_delete};
use crate::decide::delete::{VolumeDecision, decide_volume};
use crate::decide::parameters::{SecretKind, parse_class_parameters};
use crate::decide::provision::{NoDynamicProvisioning, PV_FINALIZER};
use crate::decide::secrets::{SecretRef, TemplateContext, resolve};

/// Why a volume was not deleted this time; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A VolumeAttachment still names the PV: wait for the detach (no event: this is normal).
    #[error("waiting for VolumeAttachment {0:?} to be deleted")]
    Attached(String),
    /// The driver did not delete the volume.
    #[error(transparent)]
    Driver(#[from] sidecar_kit::csi::CallError),
    /// The driver cannot delete volumes at all.
    #[error(transparent)]
    NoDynamicProvisioning(#[from] NoDynamicProvisioning),
    /// An in-tree PV of the migrated plugin does not translate to a CSI volume.
    #[error("{0}")]
    Translate(String),
    /// The PV could not be deleted or its finalizer removed.
    #[error("failed to {action} PersistentVolume: {source}")]
    Api {
        /// What was being done to the PV (read, delete, remove the finalizer of).
        action: &'static str,
        /// The API server's error.
        source: kube::Error,
    },
}

impl Provisioner {
    /// One pass over a PV: done, or looked at again after the key's backoff (a failure, or a
    /// VolumeAttachment that must go first).
    pub(crate) async fn sync_volume(&self, name: &str) -> Result<Next, VolumeError> {
        match self.reclaim(name).await {
            Ok(()) => Ok(Next::Done),
            Err(error @ VolumeError::Attached(_)) => {
                tracing::debug!(%error, "deletion waits");
                Ok(Next::Retry)
            }
            Err(
                error @ (VolumeError::Driver(_)
                | VolumeError::NoDynamicProvisioning(_)
                | VolumeError::Translate(_)
                | VolumeError::Api { .. }),
            ) => Err(error),
        }
    }

    /// A deletion that failed: counted under the volume's class and said on it
    /// (`VolumeFailedDelete`, as upstream).
    fn delete_failed(&self, pv: &PersistentVolume, class: &str, message: &str) {
        self.metrics.delete_failed.with_label_values(&[class]).inc();
        self.recorder.record(
            &sidecar_kit::vocabulary::reference(pv),
            EventType::Warning,
            "VolumeFailedDelete",
            message,
        );
    }

    async fn reclaim(&self, name: &str) -> Result<(), VolumeError> {
        // Read before the cache: the PV's deletion event takes it out of the cache before it
        // forgets that its deletion was finished here, so a PV read after a `false` here is
        // never a stale copy of one finished (read after, the cache could hand out the copy
        // from just before the deletion event and the check see it already forgotten).
        let finished = self.finished.contains(name);
        let Some(pv) = self.caches.volumes.get(&ObjectRef::new(name)) else {
            return Ok(());
        };
        // A volume in flight whose PV exists is the deletion path's from now on (a claim
        // bound to it, a worker that crashed after saving it, a set's volume).
        if self.ledger.contains(name) {
            self.ledger.settle(name);
        }
        if finished {
            return Ok(());
        }
        // A PV kept at its deletion (its policy set at creation, or changed since): its volume
        // must never be taken for one left in flight.
        self.retained(&pv);
        match decide_volume(&pv, &self.cfg.caps.name, self.cfg.caps.migrated_from) {
            VolumeDecision::Ignore => Ok(()),
            VolumeDecision::Untranslatable(reason) => {
                let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone());
                self.delete_failed(&pv, &class.unwrap_or_default(), &reason);
                Err(VolumeError::Translate(reason))
            }
            VolumeDecision::RemoveFinalizer => self.remove_finalizer(&pv).await,
            VolumeDecision::AddFinalizer => {
                let (driver, migrated) = (&self.cfg.caps.name, self.cfg.caps.migrated_from);
                self.change_finalizer(
                    &pv,
                    sidecar_kit::finalizers::add_ops,
                    |now| decide_volume(now, driver, migrated) == VolumeDecision::AddFinalizer,
                    "add the finalizer to",
                )
                .await
            }
            VolumeDecision::Delete { .. }
                if !self.gate.as_ref().is_none_or(|gate| gate.deletes(&pv)) =>
            {
                tracing::debug!(volume = name, "PV was not provisioned on this node");
                Ok(())
            }
            VolumeDecision::Delete {
                volume_handle,
                secret,
            } => {
                // After the node check, before the attachments, as upstream checks it.
                if let Some(why) = self.cfg.caps.no_dynamic_provisioning {
                    let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone());
                    self.delete_failed(&pv, &class.unwrap_or_default(), &why.to_string());
                    return Err(why.into());
                }
                if self.cfg.caps.publish_unpublish
                    && let Some(va) = self.attached.naming(name)
                {
                    return Err(VolumeError::Attached(va));
                }
                let class = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone())
                    .unwrap_or_default();
                // Upstream's updateDeleteStats: the whole operation, counted when it is done.
                let started = std::time::Instant::now();
                let done = || {
                    self.metrics
                        .delete_total
                        .with_label_values(&[class.as_str()])
                        .inc();
                    self.metrics
                        .delete_duration
                        .with_label_values(&[class.as_str()])
                        .observe(started.elapsed().as_secs_f64());
                    self.finished_with(name);
                };
                if !self.deleted_handles.contains(&volume_handle) {
                    let secret = match secret {
                        Some(recorded) => recorded,
                        None => self.class_secret(&pv),
                    };
                    let secrets = self.secrets_or_none(name, secret.as_ref()).await;
                    let migrated = sidecar_kit::migration::is_migratable(&pv);
                    let result = self
                        .delete_volume_call(&volume_handle, secrets, migrated)
                        .await;
                    if let Err(error) = result
                        && classify_delete(Err(error.code)) == DeleteOutcome::Retry
                    {
                        // As upstream: the driver's status, message included.
                        self.delete_failed(&pv, &class, &error.status_text());
                        return Err(VolumeError::Driver(error));
                    }
                    self.deleted_handles.remember(volume_handle.clone());
                    if let Some(capacity) = &self.capacity {
                        capacity.volume_changed(
                            &class,
                            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
                        );
                    }
                    tracing::info!(volume_handle, "volume deleted");
                }
                if pv.metadata.deletion_timestamp.is_none() {
                    let api: Api<PersistentVolume> = Api::all(self.client.clone());
                    match api.delete(name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {
                            done();
                            return Ok(());
                        }
                        Err(source) => {
                            return Err(VolumeError::Api {
                                action: "delete",
                                source,
                            });
                        }
                    }
                }
                self.remove_finalizer(&pv).await?;
                done();
                Ok(())
            }
        }
    }

    /// The PV's deletion is done here: later cache events of it are stale. Its watch's deletion
    /// event forgets it; when that event came first, it is forgotten at once.
    fn finished_with(&self, name: &str) {
        self.finished.remember(name.to_string());
        if !self.caches.volumes.contains(&ObjectRef::new(name)) {
            self.finished.forget(name);
        }
    }

    async fn remove_finalizer(&self, cached: &PersistentVolume) -> Result<(), VolumeError> {
        self.change_finalizer(
            cached,
            sidecar_kit::finalizers::remove_ops,
            |_| true,
            "remove the finalizer of",
        )
        .await
    }

    /// Adds or removes our finalizer (`ops`: `add_ops` or `remove_ops`) with a JSON patch that
    /// first tests the list, so a stale cache can never drop someone else's finalizer. The
    /// cached object is tried first; only a failed test reads the PV again, and the change goes
    /// on only while the PV read `stands` for it (a PV now being deleted, or no longer Delete,
    /// gets no finalizer added).
    async fn change_finalizer(
        &self,
        cached: &PersistentVolume,
        ops: fn(&ObjectMeta, &str) -> Option<Vec<Op>>,
        stands: impl Fn(&PersistentVolume) -> bool,
        action: &'static str,
    ) -> Result<(), VolumeError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = cached.metadata.name.clone().unwrap_or_default();
        let mut current = cached.clone();
        for attempt in 0..3 {
            if attempt > 0 {
                current = match api.get(&name).await {
                    Ok(pv) => pv,
                    Err(error) if sidecar_kit::api_errors::is_not_found(&error) => return Ok(()),
                    Err(source) => {
                        return Err(VolumeError::Api {
                            action: "read",
                            source,
                        });
                    }
                };
                if !stands(&current) {
                    return Ok(());
                }
            }
            let Some(ops) = ops(&current.metadata, PV_FINALIZER) else {
                return Ok(());
            };
            let patch = sidecar_kit::patch_ops::patch(ops);
            match api
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) if sidecar_kit::api_errors::is_not_found(&error) => return Ok(()),
                Err(error)
                    if api_errors::after_write(&error, api_errors::Write::Tested)
                        == api_errors::AfterWrite::Changed =>
                {
                    continue;
                }
                Err(source) => return Err(VolumeError::Api { action, source }),
            }
        }
        Err(VolumeError::Api {
            action,
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("finalizers kept changing", "Conflict").with_code(409),
            )),
        })
    }

    /// The deletion secret of a PV made by an older provisioner: the class's template.
    fn class_secret(&self, pv: &PersistentVolume) -> Option<SecretRef> {
        let spec = pv.spec.as_ref()?;
        let class = self
            .caches
            .classes
            .get(&ObjectRef::new(spec.storage_class_name.as_deref()?))?;
        // An in-tree class of the plugin we stand in for: its secrets as translated.
        let class = match crate::decide::migration::provisioning_class(
            &self.cfg.caps.name,
            self.cfg.caps.migrated_from,
            &class,
        ) {
            Some(Ok((translated, _))) => translated,
            Some(Err(_)) | None => (*class).clone(),
        };
        let params: BTreeMap<String, String> = class
            .parameters
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let parsed = parse_class_parameters(&params).ok()?;
        let template = parsed.secrets.get(&SecretKind::Provisioner)?;
        let claim = spec.claim_ref.as_ref();
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let ctx = TemplateContext {
            pv_name: &pv_name,
            pvc_name: claim.and_then(|c| c.name.as_deref()).unwrap_or(""),
            pvc_namespace: claim.and_then(|c| c.namespace.as_deref()).unwrap_or(""),
            pvc_annotations: None,
        };
        resolve(template, &ctx).ok()
    }
}
