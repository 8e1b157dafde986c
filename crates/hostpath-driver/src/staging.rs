//! NodeStageVolume and NodeUnstageVolume (STAGE_UNSTAGE_VOLUME, on unless `--disable
//! stage-unstage`): a mount volume is made visible once per node at its staging path, and
//! NodePublishVolume exposes the staging path at each target; a block volume's image is
//! published directly, staging only records it.

use std::path::PathBuf;

use csi_proto::v1 as csi;

use crate::driver::{Driver, on_disk};
use crate::error::{Error, Result};
use crate::node::{BIND, SYMLINK, clear_target, expose, exposed};
use crate::plan;
use crate::state::{Change, StagedTarget, VolumeRecord};

impl Driver {
    /// A volume's record, or NOT_FOUND.
    pub(crate) fn volume(&self, volume_id: &str) -> Result<VolumeRecord> {
        let (record, _) = self.store.read(|t| t.get(volume_id).cloned());
        record.ok_or_else(|| Error::VolumeNotFound(volume_id.to_string()))
    }

    /// The checks NodeStageVolume and NodePublishVolume share: the volume id and the path
    /// (`path`: its field name and value) given, a valid capability, the volume known and of the
    /// requested access type (else the error `mismatch` makes), and usable on this node.
    pub(crate) fn node_volume(
        &self,
        volume_id: &str,
        path: (&'static str, &str),
        cap: Option<&csi::VolumeCapability>,
        mismatch: fn(String) -> Error,
    ) -> Result<VolumeRecord> {
        if volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        if path.1.is_empty() {
            return Err(Error::Missing(path.0));
        }
        let cap = cap.ok_or(Error::Missing("volume_capability"))?;
        let checked = plan::check_capability(&self.cfg, cap)?;
        let record = self.volume(volume_id)?;
        if record.block != checked.block {
            return Err(mismatch(format!(
                "volume {:?} is a {} volume",
                record.id,
                if record.block { "block" } else { "mount" }
            )));
        }
        self.check_local(&record)?;
        Ok(record)
    }

    /// Whether this node may use the volume: it lives here and (with attach on) is
    /// ControllerPublished here.
    pub(crate) fn check_local(&self, record: &VolumeRecord) -> Result<()> {
        let me = &self.cfg.node.id;
        if record.node.as_ref().is_some_and(|home| home != me) {
            return Err(Error::Precondition(format!(
                "volume {:?} lives on node {:?}, not on this node {me:?}",
                record.id, record.node
            )));
        }
        if self.cfg.enable_attach && !record.published.contains_key(me) {
            return Err(Error::Precondition(format!(
                "volume {:?} is not ControllerPublished to node {me:?}",
                record.id
            )));
        }
        Ok(())
    }

    /// The directory of a mount volume, made first if the volume was created without it
    /// ([`VolumeRecord::lazy_content`]); the caller then logs the record with
    /// `lazy_content` cleared. Made durable before any record says it exists.
    pub(crate) async fn content_dir(&self, record: &VolumeRecord) -> Result<PathBuf> {
        let dir = self.store.volume_dir(&record.id);
        if record.lazy_content {
            let (made, parent) = (dir.clone(), self.store.volumes_dir().to_path_buf());
            on_disk("create volume directory", &dir, move || {
                crate::content::make_empty_dir(&made, &parent)
            })
            .await?;
        }
        Ok(dir)
    }

    pub(crate) async fn node_stage(
        &self,
        req: csi::NodeStageVolumeRequest,
    ) -> Result<csi::NodeStageVolumeResponse> {
        crate::features::served(self.cfg.features.stage_unstage, "NodeStageVolume")?;
        let record = self.node_volume(
            &req.volume_id,
            ("staging_target_path", &req.staging_target_path),
            req.volume_capability.as_ref(),
            Error::Precondition,
        )?;
        let wanted = StagedTarget {
            block: record.block,
            how: if record.block {
                "none"
            } else if self.bind_mounts {
                BIND
            } else {
                SYMLINK
            }
            .to_string(),
        };
        let staging = PathBuf::from(&req.staging_target_path);
        if let Some(existing) = record.staged.get(&req.staging_target_path) {
            if existing.block != wanted.block {
                return Err(Error::PublishConflict(format!(
                    "volume {:?} is already staged at {:?} as a {} volume",
                    record.id,
                    req.staging_target_path,
                    if existing.block { "block" } else { "mount" }
                )));
            }
            // Recorded: staged again only if the path no longer shows the volume.
            if !record.block {
                let dir = self.content_dir(&record).await?;
                if !exposed(&existing.how, &dir, &staging) {
                    tracing::warn!(volume_id = %record.id, staging = %req.staging_target_path, "a staged path shows nothing (a reboot or an unmount); staging it again");
                    expose(existing.how == BIND, &dir, &staging, false, false).await?;
                }
            }
            return Ok(csi::NodeStageVolumeResponse {});
        }
        // Recorded before anything is put at the path: what NodeUnstageVolume may undo is only
        // ever what the driver put there for this volume.
        let id = record.id.clone();
        let path = req.staging_target_path.clone();
        let ((), seq) = self.store.mutate(|table| {
            let Some(current) = table.get(&id) else {
                return Err(Error::VolumeNotFound(id.clone()));
            };
            let mut updated = current.clone();
            updated.staged.insert(path.clone(), wanted.clone());
            Ok(((), vec![Change::Put(updated)]))
        })?;
        self.store.wait_durable(seq).await?;
        if !record.block {
            let exposed = match self.content_dir(&record).await {
                Ok(dir) => expose(self.bind_mounts, &dir, &staging, false, false).await,
                Err(error) => Err(error),
            };
            if let Err(error) = exposed {
                self.forget_staging(&record.id, &req.staging_target_path)
                    .await;
                return Err(error);
            }
            // Its directory exists now (content_dir).
            let ((), seq) = self.store.mutate(|table| {
                let Some(current) = table.get(&id) else {
                    return Ok(((), Vec::new()));
                };
                let mut updated = current.clone();
                updated.lazy_content = false;
                Ok::<_, Error>(((), vec![Change::Put(updated)]))
            })?;
            self.store.wait_durable(seq).await?;
        }
        tracing::info!(volume_id = %record.id, staging = %req.staging_target_path, how = %wanted.how, "volume staged");
        Ok(csi::NodeStageVolumeResponse {})
    }

    /// Removes a staging path from a volume's record (best effort: a stage that failed).
    async fn forget_staging(&self, id: &str, path: &str) {
        let forgotten = self.store.mutate(|table| {
            let Some(current) = table.get(id) else {
                return Ok(((), Vec::new()));
            };
            let mut updated = current.clone();
            updated.staged.remove(path);
            Ok::<_, Error>(((), vec![Change::Put(updated)]))
        });
        if let Ok(((), seq)) = forgotten {
            let _ = self.store.wait_durable(seq).await;
        }
    }

    pub(crate) async fn node_unstage(
        &self,
        req: csi::NodeUnstageVolumeRequest,
    ) -> Result<csi::NodeUnstageVolumeResponse> {
        crate::features::served(self.cfg.features.stage_unstage, "NodeUnstageVolume")?;
        if req.volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Error::Missing("staging_target_path"));
        }
        let (record, _) = self.store.read(|t| t.get(&req.volume_id).cloned());
        let record = record.ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
        if let Some(target) = record.targets.keys().next() {
            return Err(Error::InUse {
                id: req.volume_id.clone(),
                detail: format!("still published at {target:?}"),
            });
        }
        // Only a path recorded for this volume is touched (it is recorded before anything is
        // put there); kubelet removes the directory itself.
        if let Some(staged) = record.staged.get(&req.staging_target_path) {
            if !staged.block {
                clear_target(&PathBuf::from(&req.staging_target_path), true).await?;
            }
            let id = record.id.clone();
            let ((), seq) = self.store.mutate(|table| {
                let Some(current) = table.get(&id) else {
                    return Ok(((), Vec::new()));
                };
                let mut updated = current.clone();
                updated.staged.remove(&req.staging_target_path);
                Ok::<_, Error>(((), vec![Change::Put(updated)]))
            })?;
            self.store.wait_durable(seq).await?;
            tracing::info!(volume_id = %record.id, staging = %req.staging_target_path, "volume unstaged");
        }
        Ok(csi::NodeUnstageVolumeResponse {})
    }
}
