//! NodeStageVolume and NodeUnstageVolume (STAGE_UNSTAGE_VOLUME, on unless `--disable
//! stage-unstage`): a mount volume is made visible once per node at its staging path, and
//! NodePublishVolume exposes the staging path at each target; a block volume's image is
//! published directly, staging only records it.

use std::path::PathBuf;

use csi_proto::v1 as csi;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::node::{BIND, SYMLINK, clear_target, expose, exposed};
use crate::state::{Change, StagedTarget};

pub(crate) async fn node_stage(
    driver: &Driver,
    req: csi::NodeStageVolumeRequest,
) -> Result<csi::NodeStageVolumeResponse> {
    crate::features::served(driver.cfg.features.stage_unstage, "NodeStageVolume")?;
    let record = driver
        .node_volume(
            &req.volume_id,
            ("staging_target_path", &req.staging_target_path),
            req.volume_capability.as_ref(),
            Error::Precondition,
        )
        .await?;
    let wanted = StagedTarget {
        block: record.block,
        how: if record.block {
            "none"
        } else if driver.bind_mounts {
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
            let dir = driver.content_dir(&record).await?;
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
    let ((), seq) = driver.store.mutate(|table| {
        let Some(current) = table.get(&id) else {
            return Err(Error::VolumeNotFound(id.clone()));
        };
        let mut updated = current.clone();
        updated.staged.insert(path.clone(), wanted.clone());
        Ok(((), vec![Change::Put(updated)]))
    })?;
    driver.store.wait_durable(seq).await?;
    if !record.block {
        let exposed = match driver.content_dir(&record).await {
            Ok(dir) => expose(driver.bind_mounts, &dir, &staging, false, false).await,
            Err(error) => Err(error),
        };
        if let Err(error) = exposed {
            forget_staging(driver, &record.id, &req.staging_target_path).await;
            return Err(error);
        }
        // Its directory exists now (content_dir).
        let ((), seq) = driver.store.mutate(|table| {
            let Some(current) = table.get(&id) else {
                return Ok(((), Vec::new()));
            };
            let mut updated = current.clone();
            updated.lazy_content = false;
            Ok::<_, Error>(((), vec![Change::Put(updated)]))
        })?;
        driver.store.wait_durable(seq).await?;
    }
    tracing::info!(volume_id = %record.id, staging = %req.staging_target_path, how = %wanted.how, "volume staged");
    Ok(csi::NodeStageVolumeResponse {})
}

/// Removes a staging path from a volume's record (best effort: a stage that failed).
async fn forget_staging(driver: &Driver, id: &str, path: &str) {
    let forgotten = driver.store.mutate(|table| {
        let Some(current) = table.get(id) else {
            return Ok(((), Vec::new()));
        };
        let mut updated = current.clone();
        updated.staged.remove(path);
        Ok::<_, Error>(((), vec![Change::Put(updated)]))
    });
    if let Ok(((), seq)) = forgotten {
        let _ = driver.store.wait_durable(seq).await;
    }
}

pub(crate) async fn node_unstage(
    driver: &Driver,
    req: csi::NodeUnstageVolumeRequest,
) -> Result<csi::NodeUnstageVolumeResponse> {
    crate::features::served(driver.cfg.features.stage_unstage, "NodeUnstageVolume")?;
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    if req.staging_target_path.is_empty() {
        return Err(Error::Missing("staging_target_path"));
    }
    let record = driver.volume(&req.volume_id).await?;
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
        let ((), seq) = driver.store.mutate(|table| {
            let Some(current) = table.get(&id) else {
                return Ok(((), Vec::new()));
            };
            let mut updated = current.clone();
            updated.staged.remove(&req.staging_target_path);
            Ok::<_, Error>(((), vec![Change::Put(updated)]))
        })?;
        driver.store.wait_durable(seq).await?;
        tracing::info!(volume_id = %record.id, staging = %req.staging_target_path, "volume unstaged");
    }
    Ok(csi::NodeUnstageVolumeResponse {})
}
