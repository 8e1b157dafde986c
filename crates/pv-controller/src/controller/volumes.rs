//! The volume side: carrying out the binder's decision for a volume (phases, unbinding,
//! release after a live read of its claim, Failed, recycling) and the delete operation's
//! metrics.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;

use super::*;
use crate::decide::reasons::Reason;
use crate::decide::recycle::NO_RECYCLER;

impl PvController {
    /// The delete operation of a volume left to its external deleter starts (once).
    fn deletion_started(&self, pv: &PersistentVolume) {
        if let Some(ops) = &self.operations {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            ops.start(name, uid_of(&pv.metadata), &self.deleter_of(pv), "delete");
        }
    }

    /// The plugin a volume's delete operation is counted under, as kube-controller-manager
    /// names it for an external deleter: its class's provisioner (the CSI driver of a migrated
    /// plugin), `N/A` when the class is gone.
    fn deleter_of(&self, pv: &PersistentVolume) -> String {
        let class = crate::decide::matching::volume_class(pv);
        self.classes
            .get(&ObjectRef::new(&class))
            .map(|c| sidecar_kit::migration::driver_of(&c.provisioner).to_string())
            .unwrap_or_else(|| crate::metrics::NO_PLUGIN.to_string())
    }

    /// The claim `pv`'s claimRef names, read from the API server (none when it is gone).
    async fn read_named_claim(
        &self,
        pv: &PersistentVolume,
    ) -> Result<Vec<PersistentVolumeClaim>, SyncError> {
        let Some((namespace, name)) = claim_named_by(pv) else {
            return Ok(Vec::new());
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        match claims.get_opt(&name).await {
            Ok(found) => Ok(found.into_iter().collect()),
            Err(source) => Err(SyncError::ReadClaim {
                claim: format!("{namespace}/{name}"),
                volume: pv.metadata.name.clone().unwrap_or_default(),
                source,
            }),
        }
    }

    /// Decides a volume and carries the decision out.
    pub(super) async fn sync_volume(&self, name: &str) -> Result<(), SyncError> {
        let Some(pv) = self.volume(name) else {
            return Ok(());
        };
        // Only the claim the volume names matters: look it up instead of scanning all claims.
        let named: Vec<std::sync::Arc<PersistentVolumeClaim>> = claim_named_by(&pv)
            .and_then(|(ns, name)| self.claim(&ObjectRef::new(&name).within(&ns)))
            .into_iter()
            .collect();
        let mut action = decide_volume(&pv, &named, ClaimSource::Cache);
        if action == VolumeAction::ReadClaimLive {
            // As kube-controller-manager: the cache may lag; the server decides.
            let live = self.read_named_claim(&pv).await?;
            action = decide_volume(&pv, &live, ClaimSource::Server);
        }
        if awaits_external_deleter(&pv) {
            self.deletion_started(&pv);
        }
        match action {
            // Never the answer for a claim read from the server (a row of `decide_volume`'s
            // table); were it, nothing is written and the next event looks again.
            VolumeAction::ReadClaimLive | VolumeAction::Nothing => Ok(()),
            VolumeAction::SetPhase(phase) => {
                let updated = volume_in_phase(&pv, phase);
                let written = self
                    .put_volume(&updated, Part::Status, "set the volume phase")
                    .await?;
                // Released for its external deleter: the delete operation starts now, as the
                // deleter may be done before this controller syncs the volume again.
                if awaits_external_deleter(&written) {
                    self.deletion_started(&written);
                }
                tracing::info!(phase, "volume phase changed");
                Ok(())
            }
            VolumeAction::Unbind | VolumeAction::ClearClaimUid => self
                .put_volume(&volume_unbound(&pv), Part::Whole, "unbind the volume")
                .await
                .map(drop),
            VolumeAction::Fail { reason, message } => self.fail(&pv, reason, &message).await,
            VolumeAction::DeleteHostPath(path) => self.delete_host_path(&pv, path).await,
            VolumeAction::VolumeModeMismatch { namespace, name } => {
                // kube-controller-manager's syncVolume, word for word.
                self.recorder.record(
                    &reference(&*pv),
                    EventType::Warning,
                    Reason::VolumeMismatch.as_str(),
                    &format!(
                        "Cannot bind PersistentVolume to requested PersistentVolumeClaim {name:?} due to incompatible volumeMode."
                    ),
                );
                let Some(claim) = self.claims.get(&ObjectRef::new(&name).within(&namespace)) else {
                    return Ok(());
                };
                self.recorder.record(
                    &reference(&*claim),
                    EventType::Warning,
                    Reason::VolumeMismatch.as_str(),
                    &format!(
                        "Cannot bind PersistentVolume {name:?} to requested PersistentVolumeClaim due to incompatible volumeMode.",
                        name = pv.metadata.name.as_deref().unwrap_or_default()
                    ),
                );
                Ok(())
            }
            VolumeAction::MigratedTo(driver) => {
                let mut updated = (*pv).clone();
                mark_migrated_to(&mut updated.metadata, driver);
                self.put_volume(&updated, Part::Whole, "mark the volume migrated")
                    .await
                    .map(drop)
            }
            VolumeAction::Recycle if left_to_node_recyclers(&pv, self.node_recyclers) => {
                tracing::debug!(pv = name, "left to the node agents' recycler");
                Ok(())
            }
            // With recyclers, on the recycle queue: the volume is read again and its users
            // looked for before its plugin (hostPath and NFS have one), as
            // kube-controller-manager's `recycleVolumeOperation` does.
            VolumeAction::Recycle if self.recycler.is_some() => {
                self.recycle_queue.add(name.to_string());
                Ok(())
            }
            // As kube-controller-manager for a volume no recycler plugin serves.
            VolumeAction::Recycle => {
                self.fail(&pv, Reason::VolumeFailedRecycle, NO_RECYCLER)
                    .await
            }
        }
    }

    /// The volume as the API server has it now (none when it is gone): what the hostPath
    /// deleter and the recycler act on, not the cache's word.
    pub(super) async fn read_volume(
        &self,
        name: &str,
    ) -> Result<Option<PersistentVolume>, kube::Error> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(name)
            .await
    }

    /// kube-controller-manager's hostPath deleter: reads the volume from the API server and
    /// goes on only if it is still to be deleted so (its `deleteVolumeOperation` reads it
    /// again too), removes the path (`crate::host_path`), then deletes the PV, that very one
    /// (its UID as precondition); a failure to remove marks it Failed with the error.
    async fn delete_host_path(&self, pv: &PersistentVolume, path: String) -> Result<(), SyncError> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let read = self.read_volume(name).await;
        let Some(live) = read.map_err(|source| SyncError::ReadVolume {
            volume: name.to_string(),
            source,
        })?
        else {
            return Ok(());
        };
        if !host_path_deletion_stands(&live, &path) {
            tracing::info!(
                pv = name,
                "the volume changed: not deleted (its next sync decides)"
            );
            return Ok(());
        }
        let removed =
            tokio::task::spawn_blocking(move || crate::host_path::remove_under_tmp(&path))
                .await
                .map_err(|join| join.to_string())
                .and_then(|done| done.map_err(|error| error.to_string()));
        if let Err(error) = removed {
            return self.fail(&live, Reason::VolumeFailedDelete, &error).await;
        }
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: live.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pv = name, "hostPath volume deleted");
                Ok(())
            }
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(()),
            Err(source) => Err(SyncError::Write {
                action: "delete the volume",
                source,
            }),
        }
    }

    /// Marks a volume Failed with the reason (status message and a Warning event), as
    /// kube-controller-manager's `updateVolumePhaseWithEvent`: the event only on the change.
    pub(super) async fn fail(
        &self,
        pv: &PersistentVolume,
        reason: Reason,
        message: &str,
    ) -> Result<(), SyncError> {
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
            return Ok(());
        }
        let mut updated = pv.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        status.phase = Some("Failed".into());
        status.message = Some(message.to_string());
        self.put_volume(&updated, Part::Status, "mark the volume Failed")
            .await?;
        self.recorder
            .record(&reference(pv), EventType::Warning, reason.as_str(), message);
        Ok(())
    }
}
