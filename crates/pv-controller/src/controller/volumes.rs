//! The volume side: carrying out the binder's decision for a volume (phases, unbinding,
//! release after a live read of its claim, Failed, recycling) and the delete operation's
//! metrics.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;

use super::*;

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
            VolumeAction::Unbind => {
                let mut updated = (*pv).clone();
                if let Some(spec) = updated.spec.as_mut() {
                    spec.claim_ref = None;
                }
                if let Some(a) = updated.metadata.annotations.as_mut() {
                    a.remove(ANN_BOUND_BY_CONTROLLER);
                }
                self.put_volume(&updated, Part::Whole, "unbind the volume")
                    .await
                    .map(drop)
            }
            VolumeAction::ClearClaimUid => {
                let mut updated = (*pv).clone();
                if let Some(claim_ref) = updated.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                    claim_ref.uid = None;
                }
                self.put_volume(&updated, Part::Whole, "clear the volume's claim UID")
                    .await
                    .map(drop)
            }
            VolumeAction::Fail { reason, message } => self.fail(&pv, reason, &message).await,
            VolumeAction::DeleteHostPath(path) => self.delete_host_path(&pv, path).await,
            VolumeAction::VolumeModeMismatch { namespace, name } => {
                // kube-controller-manager's syncVolume, word for word.
                self.recorder.record(
                    &reference(&*pv),
                    EventType::Warning,
                    "VolumeMismatch",
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
                    "VolumeMismatch",
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
            // As kube-controller-manager for a volume no recycler plugin serves.
            VolumeAction::Recycle => {
                self.fail(
                    &pv,
                    "VolumeFailedRecycle",
                    "No recycler plugin found for the volume!",
                )
                .await
            }
        }
    }

    /// Marks a volume Failed with the reason (status message and a Warning event), as
    /// kube-controller-manager's `updateVolumePhaseWithEvent`: the event only on the change.
    /// kube-controller-manager's hostPath deleter: removes the path (`os.RemoveAll`: a missing
    /// one is no error), then deletes the PV; a failure marks it Failed with the error.
    async fn delete_host_path(&self, pv: &PersistentVolume, path: String) -> Result<(), SyncError> {
        let removed =
            tokio::task::spawn_blocking(move || remove_under_tmp(std::path::Path::new(&path)))
                .await
                .map_err(|join| join.to_string())
                .and_then(|done| done.map_err(|error| error.to_string()));
        if let Err(error) = removed {
            return self.fail(pv, "VolumeFailedDelete", &error).await;
        }
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        match Api::<PersistentVolume>::all(self.client.clone())
            .delete(name, &kube::api::DeleteParams::default())
            .await
        {
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

    async fn fail(
        &self,
        pv: &PersistentVolume,
        reason: &str,
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
            .record(&reference(pv), EventType::Warning, reason, message);
        Ok(())
    }
}

/// Removes `path`, a path under `/tmp/` (see `decide::binder::host_path_deletable`), when its
/// directory resolves (symbolic links followed) to one under `/tmp` too: a link on the way
/// cannot lead the removal elsewhere. A last component that is a link is removed as a link.
fn remove_under_tmp(path: &std::path::Path) -> std::io::Result<()> {
    let tmp = std::fs::canonicalize("/tmp")?;
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{} is not a path under /tmp",
            path.display()
        )));
    };
    let parent = match std::fs::canonicalize(parent) {
        Ok(parent) => parent,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !parent.starts_with(&tmp) {
        return Err(std::io::Error::other(format!(
            "{} resolves to {}, outside /tmp",
            path.display(),
            parent.join(name).display()
        )));
    }
    remove_all(&parent.join(name))
}

/// Removes `path` and whatever is under it, as Go's `os.RemoveAll`: a directory with its
/// contents, a file or a link itself; a path not there is no error.
fn remove_all(path: &std::path::Path) -> std::io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(error) => Err(error),
    };
    match result {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_host_path_removal_stays_under_tmp() {
        let inside = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        // Outside /tmp: /var/tmp, on Linux.
        let outside = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        std::fs::create_dir_all(outside.path().join("precious")).unwrap();
        std::os::unix::fs::symlink(outside.path(), inside.path().join("link")).unwrap();
        // A link on the way out of /tmp: refused, nothing removed.
        let error = remove_under_tmp(&inside.path().join("link/precious")).unwrap_err();
        assert!(error.to_string().contains("outside /tmp"), "{error}");
        assert!(outside.path().join("precious").exists());
        // A link as the last component: the link goes, not what it names.
        remove_under_tmp(&inside.path().join("link")).unwrap();
        assert!(!inside.path().join("link").exists());
        assert!(outside.path().join("precious").exists());
        // A directory with contents, then one not there (no error, as os.RemoveAll).
        let data = inside.path().join("data");
        std::fs::create_dir_all(data.join("a/b")).unwrap();
        std::fs::write(data.join("a/b/f"), b"x").unwrap();
        remove_under_tmp(&data).unwrap();
        assert!(!data.exists());
        remove_under_tmp(&data).unwrap();
        remove_under_tmp(&inside.path().join("nowhere/data")).unwrap();
    }
}
