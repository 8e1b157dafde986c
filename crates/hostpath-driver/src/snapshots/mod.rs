//! Snapshots: CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot and the group
//! controller service. A snapshot is a full copy of its volume's directory under
//! `snapshots/<id>/`, made before its record is logged (a crash in between leaves a directory no
//! record names, removed at the next start), so a snapshot is ready as soon as it is answered.

pub mod group;
pub mod plan;

use csi_proto::v1 as csi;

use crate::driver::{Driver, now_ms};
use crate::error::{Error, Result};
use crate::features::served;
use crate::state::{Change, SnapshotRecord};
use plan::Plan;

pub(crate) async fn make_snapshot(
    driver: &Driver,
    req: csi::CreateSnapshotRequest,
) -> Result<csi::CreateSnapshotResponse> {
    served(driver.cfg.features.snapshots, "CreateSnapshot")?;
    // A repeat of a request still in progress waits for it, then finds its snapshot.
    let _name = driver
        .creating
        .lock(&format!("snapshot/{}", req.name))
        .await;
    let id = uuid::Uuid::new_v4().to_string();
    let (plan, seq) = driver
        .store
        .read(|table| plan::plan_snapshot(table, &req, &id, now_ms()));
    let record = match plan? {
        Plan::Existing(record) => {
            driver.store.wait_durable(seq).await?;
            record
        }
        Plan::New(record) => {
            let seq = store_copies(driver, std::slice::from_ref(&record), Vec::new()).await?;
            driver.store.wait_durable(seq).await?;
            tracing::info!(name = %record.name, snapshot_id = %record.id, source = %record.source_volume_id, "snapshot created");
            record
        }
    };
    Ok(csi::CreateSnapshotResponse {
        snapshot: Some(plan::to_csi_snapshot(&record)),
    })
}

/// Copies the snapshots' volumes, then logs the snapshots (and `then`, e.g. their group) in
/// one critical section, but only if every source volume still exists: one deleted during
/// its copy may have been copied in part (NOT_FOUND, copies removed). Returns the sequence
/// number to wait for.
pub(crate) async fn store_copies(
    driver: &Driver,
    records: &[SnapshotRecord],
    then: Vec<Change>,
) -> Result<u64> {
    copy_snapshots(driver, records).await?;
    let mut changes: Vec<Change> = records
        .iter()
        .map(|r| Change::PutSnapshot(r.clone()))
        .collect();
    changes.extend(then);
    let committed = driver.store.mutate(|table| {
        plan::sources_exist(table, records)?;
        Ok::<_, Error>(((), changes))
    });
    match committed {
        Ok(((), seq)) => Ok(seq),
        Err(error) => {
            discard_copies(driver, records).await;
            Err(error)
        }
    }
}

/// Copies each snapshot's source volume into the snapshot's directory; on failure removes
/// what was copied.
pub(crate) async fn copy_snapshots(driver: &Driver, records: &[SnapshotRecord]) -> Result<()> {
    // A volume never used may have no directory yet: its snapshot is then an empty one.
    let (never_used, _) = driver.store.read(|t| {
        records
            .iter()
            .map(|r| crate::plan::never_used(t, &r.source_volume_id))
            .collect::<Vec<bool>>()
    });
    let jobs: Vec<_> = records
        .iter()
        .zip(never_used)
        .map(|(r, never_used)| {
            (
                driver.store.volume_dir(&r.source_volume_id),
                driver.store.snapshot_dir(&r.id),
                never_used,
            )
        })
        .collect();
    let copied = tokio::task::spawn_blocking(move || {
        for (index, (from, to, never_used)) in jobs.iter().enumerate() {
            let copied = crate::content::nothing_to_copy(from, *never_used).and_then(|empty| {
                if empty {
                    // Only the new directory and its parent need flushing.
                    crate::content::make_empty_dir(to, to.parent().unwrap_or(to))
                } else {
                    crate::content::copy_tree(from, to)
                        .and_then(|()| crate::content::sync_filesystem(to))
                }
            });
            if let Err(error) = copied {
                for (_, done, _) in &jobs[..=index] {
                    let _ = std::fs::remove_dir_all(done);
                }
                return Err((from.clone(), error.to_string()));
            }
        }
        Ok(())
    })
    .await;
    match copied {
        Ok(Ok(())) => Ok(()),
        Ok(Err((path, detail))) => Err(Error::Filesystem {
            action: "copy the volume into a snapshot from",
            path: path.display().to_string(),
            detail,
        }),
        Err(join) => Err(Error::Filesystem {
            action: "copy the volume into a snapshot",
            path: driver.store.snapshots_dir().display().to_string(),
            detail: join.to_string(),
        }),
    }
}

pub(crate) async fn remove_snapshot(
    driver: &Driver,
    req: csi::DeleteSnapshotRequest,
) -> Result<csi::DeleteSnapshotResponse> {
    served(driver.cfg.features.snapshots, "DeleteSnapshot")?;
    let (changes, seq) = driver.store.mutate(|table| {
        let changes = plan::plan_delete_snapshot(table, &req.snapshot_id)?;
        Ok::<_, Error>((changes.clone(), changes))
    })?;
    driver.store.wait_durable(seq).await?;
    remove_snapshot_dirs(driver, &changes).await;
    Ok(csi::DeleteSnapshotResponse {})
}

/// Removes the copies of snapshots that were not logged.
pub(crate) async fn discard_copies(driver: &Driver, records: &[SnapshotRecord]) {
    let dirs: Vec<_> = records
        .iter()
        .map(|r| driver.store.snapshot_dir(&r.id))
        .collect();
    let _ = tokio::task::spawn_blocking(move || {
        for dir in dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    })
    .await;
}

/// Removes the directories of snapshots whose deletion is durable.
pub(crate) async fn remove_snapshot_dirs(driver: &Driver, changes: &[Change]) {
    for change in changes {
        if let Change::DeleteSnapshot(id) = change {
            let dir = driver.store.snapshot_dir(id);
            let outcome = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            if let Ok(Err(error)) = outcome {
                tracing::warn!(snapshot_id = %id, %error, "snapshot directory not removed; the next start removes it");
            }
            tracing::info!(snapshot_id = %id, "snapshot deleted");
        }
    }
}

pub(crate) async fn snapshot_page(
    driver: &Driver,
    req: csi::ListSnapshotsRequest,
) -> Result<csi::ListSnapshotsResponse> {
    served(driver.cfg.features.snapshots, "ListSnapshots")?;
    let (listed, seq) = driver.store.read(|table| plan::list_snapshots(table, &req));
    let (page, next_token) = listed?;
    driver.store.wait_durable(seq).await?;
    Ok(csi::ListSnapshotsResponse {
        entries: page
            .iter()
            .map(|s| csi::list_snapshots_response::Entry {
                snapshot: Some(plan::to_csi_snapshot(s)),
            })
            .collect(),
        next_token,
    })
}

pub(crate) async fn find_snapshot(
    driver: &Driver,
    req: csi::GetSnapshotRequest,
) -> Result<csi::GetSnapshotResponse> {
    served(driver.cfg.features.snapshots, "GetSnapshot")?;
    if req.snapshot_id.is_empty() {
        return Err(Error::Missing("snapshot_id"));
    }
    let (record, seq) = driver.store.read(|t| t.snapshot(&req.snapshot_id).cloned());
    let record = record.ok_or_else(|| Error::SnapshotNotFound(req.snapshot_id.clone()))?;
    driver.store.wait_durable(seq).await?;
    Ok(csi::GetSnapshotResponse {
        snapshot: Some(plan::to_csi_snapshot(&record)),
    })
}
