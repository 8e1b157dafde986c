//! The claim side: carrying out the binder's decision for a claim (default class, binding,
//! asking a provisioner, waiting, Lost), the binding's writes and the provision operation's
//! metrics.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use kube::runtime::reflector::ObjectRef;
use sidecar_kit::assume::key_of;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;

use super::*;
use crate::decide::reasons::Reason;

impl PvController {
    /// Decides a claim and carries the decision out.
    pub(super) async fn sync_claim(
        &self,
        key: &ObjectRef<PersistentVolumeClaim>,
    ) -> Result<(), SyncError> {
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
        match action {
            ClaimAction::Nothing => Ok(()),
            ClaimAction::AssignDefaultClass(class) => {
                let mut updated = (*claim).clone();
                updated
                    .spec
                    .get_or_insert_with(Default::default)
                    .storage_class_name = Some(class);
                let written = self
                    .put_claim(&updated, Part::Whole, "assign the default class")
                    .await;
                if let Some(counters) = &self.retroactive {
                    counters.record(written.is_ok());
                }
                written.map(drop)
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
                let bound = self
                    .put_volume(&bound, Part::Whole, "bind the volume")
                    .await
                    .inspect_err(|_| self.operation_failed(&key_of(&*claim)))?;
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
                    let updated = with_provisioner(&claim, &provisioner);
                    self.put_claim(&updated, Part::Whole, "annotate the claim")
                        .await
                        .inspect_err(|error| {
                            self.operation_failed(&key);
                            // kube-controller-manager's `provisionClaimOperationExternal`.
                            if let SyncError::Write { source, .. } = error {
                                self.recorder.record(
                                    &reference(&*claim),
                                    EventType::Warning,
                                    Reason::ProvisioningFailed.as_str(),
                                    &format!(
                                        "Error saving claim: {}",
                                        sidecar_kit::api_errors::message(source)
                                    ),
                                );
                            }
                        })?;
                }
                self.recorder
                    .record(&reference(&*claim), EventType::Normal, Reason::ExternalProvisioning.as_str(), &format!(
                        "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
                    ));
                Ok(())
            }
            ClaimAction::ProvisionRefused {
                provisioner,
                annotated,
                message,
            } => {
                // kube-controller-manager's `provisionClaimOperation`: the annotations first
                // (a failure to write them fails the sync without an event, as there), then the
                // plugin's refusal.
                if !annotated {
                    let updated = with_provisioner(&claim, &provisioner);
                    self.put_claim(&updated, Part::Whole, "annotate the claim")
                        .await?;
                }
                self.recorder.record(
                    &reference(&*claim),
                    EventType::Warning,
                    Reason::ProvisioningFailed.as_str(),
                    &message,
                );
                Err(SyncError::Waiting(message))
            }
            ClaimAction::WaitForFirstConsumer => {
                let (reason, message) = first_consumer_event(&self.waiting_pods.of(&ns, &name));
                self.recorder.record(
                    &reference(&*claim),
                    EventType::Normal,
                    reason.as_str(),
                    &message,
                );
                self.mark_pending(&claim, pending).await
            }
            ClaimAction::Pending {
                event,
                reason,
                message,
            } => {
                self.recorder
                    .record(&reference(&*claim), event, reason.as_str(), &message);
                self.mark_pending(&claim, pending).await?;
                Err(SyncError::Waiting(message))
            }
            ClaimAction::Failed {
                reason,
                message,
                error,
            } => {
                self.recorder.record(
                    &reference(&*claim),
                    EventType::Warning,
                    reason.as_str(),
                    &message,
                );
                Err(SyncError::Waiting(error))
            }
            ClaimAction::Wait(why) => {
                self.mark_pending(&claim, pending).await?;
                Err(SyncError::Waiting(why))
            }
            ClaimAction::MigratedTo(driver) => {
                let mut updated = (*claim).clone();
                mark_migrated_to(&mut updated.metadata, driver);
                self.put_claim(&updated, Part::Whole, "mark the claim migrated")
                    .await
                    .map(drop)
            }
            ClaimAction::Lost { reason, message } => {
                let mut updated = (*claim).clone();
                updated.status = Some(lost_status(&claim));
                self.put_claim(&updated, Part::Status, "mark the claim Lost")
                    .await?;
                self.recorder.record(
                    &reference(&*claim),
                    EventType::Warning,
                    reason.as_str(),
                    message,
                );
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

    /// Writes a claim's `Pending` status, if it needs one (see [`pending_status`]).
    async fn mark_pending(
        &self,
        claim: &PersistentVolumeClaim,
        status: Option<k8s_openapi::api::core::v1::PersistentVolumeClaimStatus>,
    ) -> Result<(), SyncError> {
        let Some(status) = status else {
            return Ok(());
        };
        let mut pending = claim.clone();
        pending.status = Some(status);
        self.put_claim(&pending, Part::Status, "mark the claim Pending")
            .await
            .map(drop)
    }

    /// Writes the rest of a binding: the volume's whole reference if it lacks the claim's UID,
    /// its phase, the claim's spec and annotations, its status (see `decide::binding`).
    async fn finish_binding(
        &self,
        claim: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<(), SyncError> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let written;
        let pv = match volume_bound_to(pv, claim) {
            Some(whole) => {
                written = self
                    .put_volume(&whole, Part::Whole, "bind the volume")
                    .await?;
                &written
            }
            None => pv,
        };
        if let Some(marked) = volume_marked_bound(pv) {
            self.put_volume(&marked, Part::Status, "mark the volume Bound")
                .await?;
        }
        let bound_claim;
        let claim = match claim_bound_to(claim, &pv_name) {
            Some(bound) => {
                bound_claim = self
                    .put_claim(&bound, Part::Whole, "bind the claim")
                    .await?;
                &*bound_claim
            }
            None => claim,
        };
        if let Some(status) = bound_status(claim, pv) {
            let mut marked = claim.clone();
            marked.status = Some(status);
            self.put_claim(&marked, Part::Status, "mark the claim Bound")
                .await?;
            tracing::info!(volume = %pv_name, "claim bound");
        }
        Ok(())
    }
}

/// The claim with both storage-provisioner annotations naming `provisioner`.
fn with_provisioner(claim: &PersistentVolumeClaim, provisioner: &str) -> PersistentVolumeClaim {
    let mut updated = claim.clone();
    let a = updated
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    a.insert(ANN_STORAGE_PROVISIONER.into(), provisioner.to_string());
    a.insert(ANN_BETA_STORAGE_PROVISIONER.into(), provisioner.to_string());
    updated
}
