//! The recycler of the embedded stack: Released CSI volumes with reclaim policy `Recycle` are
//! scrubbed through the driver's node service by the node agent that takes them (decisions in
//! `decide_recycle.rs`): ControllerPublish when the driver attaches, NodeStage when it stages,
//! NodePublish into `recycler/<pv>/mount`, every entry removed, then the same steps undone and
//! the claim reference cleared so the PV controller makes the volume Available again. A
//! failure leaves the volume Released with a `VolumeFailedRecycle` event, and is retried.

use std::collections::BTreeMap;
use std::path::Path;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::csi::CallError;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::workqueue::Next;
use sidecar_kit::{finalizers, patch_ops};

use super::NodeAgent;
use super::decide_recycle::{ANN_RECYCLING_NODE, RecycleStep, Scrub, handle_users, recycle_step};

/// A volume whose handle something else uses is looked at again this often.
const IN_USE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a recycling step failed.
#[derive(Debug, thiserror::Error)]
pub enum RecycleError {
    /// A Secret the PV names.
    #[error(transparent)]
    Secret(#[from] sidecar_kit::secrets::SecretError),
    /// A CSI call.
    #[error("{step} failed: {source}")]
    Call {
        /// The call.
        step: &'static str,
        /// The driver's error.
        source: CallError,
    },
    /// Removing the contents.
    #[error("failed to remove the contents of {path}: {source}")]
    Scrub {
        /// The directory.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// NodePublishVolume answered, but its target shows no volume.
    #[error(
        "NodePublishVolume succeeded but {path} shows no volume (not a mount point, not a link): nothing was scrubbed"
    )]
    NotShown {
        /// The target.
        path: String,
    },
    /// An API write (taking the volume, clearing its claim).
    #[error("failed to {action}: {source}")]
    Api {
        /// What was being written (as the message says it).
        action: &'static str,
        /// The API server's error.
        source: kube::Error,
    },
    /// The volume cannot be recycled.
    #[error("{0}")]
    Refused(String),
}

/// Removes the contents of the volume published at `target`, after checking that `target`
/// shows a volume: a driver that answered NodePublishVolume without mounting anything leaves a
/// plain directory, and "scrubbing" it would return the volume with its data.
fn scrub_target(target: &Path) -> Result<(), RecycleError> {
    if !sidecar_kit::mounts::shows_a_volume(target) {
        return Err(RecycleError::NotShown {
            path: target.display().to_string(),
        });
    }
    remove_contents(target)
}

/// Removes everything inside `dir` (not `dir` itself; a symlink is removed, not followed).
fn remove_contents(dir: &Path) -> Result<(), RecycleError> {
    let failed = |source| RecycleError::Scrub {
        path: dir.display().to_string(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        let path = entry.path();
        let kind = entry.file_type().map_err(failed)?;
        if kind.is_dir() {
            std::fs::remove_dir_all(&path).map_err(failed)?;
        } else {
            std::fs::remove_file(&path).map_err(failed)?;
        }
    }
    Ok(())
}

impl NodeAgent {
    /// One pass over a volume that may need recycling.
    pub(super) async fn sync_recycle(&self, name: &str) -> Result<Next, RecycleError> {
        let Some(pv) = self.volumes.get(&ObjectRef::new(name)) else {
            return Ok(Next::Done);
        };
        let labels: BTreeMap<String, String> = self
            .nodes
            .get(&ObjectRef::new(&self.node))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        let volumes = self.volumes.state();
        let published = super::disk::published(&self.paths);
        let users = handle_users(&pv, volumes.iter().map(AsRef::as_ref), &published);
        match recycle_step(&pv, &self.driver, &self.node, &labels, &users) {
            RecycleStep::Ignore | RecycleStep::NotHere => Ok(Next::Done),
            RecycleStep::Take => {
                self.take(&pv).await?;
                Ok(Next::Done)
            }
            RecycleStep::Refuse(why) => {
                self.recycle_failed(&pv, &why);
                Ok(Next::Done)
            }
            RecycleStep::InUse(why) => {
                // Nothing tells this volume when the other user goes: look again later.
                self.recycle_failed(&pv, &why);
                Ok(Next::After(IN_USE_RETRY))
            }
            RecycleStep::Scrub(scrub) => match self.scrub(&scrub).await {
                Ok(()) => {
                    self.release(&pv).await?;
                    self.recorder.record(
                        &reference(&*pv),
                        EventType::Normal,
                        "VolumeRecycled",
                        "Volume recycled",
                    );
                    tracing::info!(pv = name, node = %self.node, "volume recycled");
                    Ok(Next::Done)
                }
                Err(error) => {
                    self.recycle_failed(&pv, &error.to_string());
                    Err(error)
                }
            },
        }
    }

    fn recycle_failed(&self, pv: &PersistentVolume, why: &str) {
        self.recorder.record(
            &reference(pv),
            EventType::Warning,
            "VolumeFailedRecycle",
            &format!("Recycle failed: {why}"),
        );
    }

    /// Writes this node into the PV, at the version seen: one node takes it.
    async fn take(&self, pv: &PersistentVolume) -> Result<(), RecycleError> {
        let ops = vec![
            patch_ops::test_version(&pv.metadata),
            finalizers::annotation_op(&pv.metadata, ANN_RECYCLING_NODE, &self.node),
        ];
        self.patch(pv, ops, "take the volume for recycling").await
    }

    /// Clears the claim reference and the taker: the PV controller makes it Available.
    async fn release(&self, pv: &PersistentVolume) -> Result<(), RecycleError> {
        let ops = vec![
            patch_ops::test_version(&pv.metadata),
            patch_ops::remove(&["spec", "claimRef"]),
            patch_ops::remove(&["metadata", "annotations", ANN_RECYCLING_NODE]),
        ];
        self.patch(pv, ops, "clear the claim of the recycled volume")
            .await
    }

    async fn patch(
        &self,
        pv: &PersistentVolume,
        ops: Vec<patch_ops::Op>,
        action: &'static str,
    ) -> Result<(), RecycleError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let patch = patch_ops::patch(ops);
        api.patch(
            pv.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .map_err(|source| RecycleError::Api { action, source })?;
        Ok(())
    }

    /// Reaches the volume's contents, removes them, and undoes every step.
    async fn scrub(&self, scrub: &Scrub) -> Result<(), RecycleError> {
        let dir = self.paths.recycler(&scrub.pv);
        let stage = dir.join("stage");
        let target = dir.join("mount");
        let call = |step| move |source| RecycleError::Call { step, source };
        let created = |source| RecycleError::Scrub {
            path: dir.display().to_string(),
            source,
        };
        durable_log::files::create_private_dir(&dir).map_err(created)?;
        let attach = sidecar_kit::pv_csi::attach_required(
            self.drivers.get(&ObjectRef::new(&self.driver)).as_deref(),
        );
        let mut publish_context = std::collections::HashMap::new();
        let mut controller = csi::controller_client::ControllerClient::new(self.channel.clone());
        if attach {
            let secrets =
                sidecar_kit::secrets::fetch_ref(&self.client, scrub.controller_secret.as_ref())
                    .await?;
            let request = csi::ControllerPublishVolumeRequest {
                volume_id: scrub.handle.clone(),
                node_id: self.node.clone(),
                volume_capability: Some(scrub.capability.clone()),
                readonly: false,
                secrets,
                volume_context: scrub.attributes.clone(),
            };
            publish_context = self
                .calls
                .call(
                    "/csi.v1.Controller/ControllerPublishVolume",
                    controller.controller_publish_volume(self.calls.request(request)),
                )
                .await
                .map_err(call("ControllerPublishVolume"))?
                .publish_context;
        }
        let mut node = self.node_client();
        let staging_target_path = if self.stage_unstage {
            durable_log::files::create_private_dir(&stage).map_err(created)?;
            let secrets =
                sidecar_kit::secrets::fetch_ref(&self.client, scrub.stage_secret.as_ref()).await?;
            let request = csi::NodeStageVolumeRequest {
                volume_id: scrub.handle.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: stage.display().to_string(),
                volume_capability: Some(scrub.capability.clone()),
                secrets,
                volume_context: scrub.attributes.clone(),
            };
            self.calls
                .call(
                    "/csi.v1.Node/NodeStageVolume",
                    node.node_stage_volume(self.calls.request(request)),
                )
                .await
                .map_err(call("NodeStageVolume"))?;
            stage.display().to_string()
        } else {
            String::new()
        };
        let secrets =
            sidecar_kit::secrets::fetch_ref(&self.client, scrub.publish_secret.as_ref()).await?;
        let request = csi::NodePublishVolumeRequest {
            volume_id: scrub.handle.clone(),
            publish_context,
            staging_target_path: staging_target_path.clone(),
            target_path: target.display().to_string(),
            volume_capability: Some(scrub.capability.clone()),
            readonly: false,
            secrets,
            volume_context: scrub.attributes.clone(),
        };
        self.calls
            .call(
                "/csi.v1.Node/NodePublishVolume",
                node.node_publish_volume(self.calls.request(request)),
            )
            .await
            .map_err(call("NodePublishVolume"))?;
        let scrubbed = scrub_target(&target);
        if scrubbed.is_err() {
            // Undo what was set up, keeping the reason.
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: scrub.handle.clone(),
                target_path: target.display().to_string(),
            };
            let _ = self
                .calls
                .call(
                    "/csi.v1.Node/NodeUnpublishVolume",
                    node.node_unpublish_volume(self.calls.request(request)),
                )
                .await;
        }
        scrubbed?;
        let request = csi::NodeUnpublishVolumeRequest {
            volume_id: scrub.handle.clone(),
            target_path: target.display().to_string(),
        };
        self.calls
            .call(
                "/csi.v1.Node/NodeUnpublishVolume",
                node.node_unpublish_volume(self.calls.request(request)),
            )
            .await
            .map_err(call("NodeUnpublishVolume"))?;
        if self.stage_unstage {
            let request = csi::NodeUnstageVolumeRequest {
                volume_id: scrub.handle.clone(),
                staging_target_path,
            };
            self.calls
                .call(
                    "/csi.v1.Node/NodeUnstageVolume",
                    node.node_unstage_volume(self.calls.request(request)),
                )
                .await
                .map_err(call("NodeUnstageVolume"))?;
        }
        if attach {
            let secrets =
                sidecar_kit::secrets::fetch_ref(&self.client, scrub.controller_secret.as_ref())
                    .await?;
            let request = csi::ControllerUnpublishVolumeRequest {
                volume_id: scrub.handle.clone(),
                node_id: self.node.clone(),
                secrets,
            };
            self.calls
                .call(
                    "/csi.v1.Controller/ControllerUnpublishVolume",
                    controller.controller_unpublish_volume(self.calls.request(request)),
                )
                .await
                .map_err(call("ControllerUnpublishVolume"))?;
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_removes_every_entry_and_keeps_the_directory_and_what_links_point_to() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let dir = tmp.path().join("volume");
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/file"), b"data").unwrap();
        std::fs::write(dir.join(".hidden"), b"data").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        remove_contents(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert!(
            outside.join("keep").exists(),
            "a link is removed, not followed"
        );
        let missing = remove_contents(&tmp.path().join("missing")).unwrap_err();
        assert!(missing.to_string().contains("missing"), "{missing}");
    }

    #[test]
    fn a_target_that_shows_no_volume_is_never_scrubbed() {
        let tmp = tempfile::tempdir().unwrap();
        let plain = tmp.path().join("mount");
        std::fs::create_dir(&plain).unwrap();
        std::fs::write(plain.join("tenant-data"), b"x").unwrap();
        let refused = scrub_target(&plain).unwrap_err();
        assert!(
            refused.to_string().contains("nothing was scrubbed"),
            "{refused}"
        );
        assert!(plain.join("tenant-data").exists());
        // The reference driver without the right to mount shows a volume by a link.
        let volume = tmp.path().join("volume");
        std::fs::create_dir(&volume).unwrap();
        std::fs::write(volume.join("tenant-data"), b"x").unwrap();
        let link = tmp.path().join("linked");
        std::os::unix::fs::symlink(&volume, &link).unwrap();
        scrub_target(&link).unwrap();
        assert_eq!(std::fs::read_dir(&volume).unwrap().count(), 0);
    }
}
