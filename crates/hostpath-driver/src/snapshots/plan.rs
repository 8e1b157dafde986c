//! Pure decisions of the snapshot RPCs: what CreateSnapshot, DeleteSnapshot, ListSnapshots and
//! the group-snapshot RPCs do against the table, or which CSI error they answer.

use std::collections::BTreeMap;

use csi_proto::v1 as csi;

use crate::error::{Error, Result};
use crate::state::{Change, ContentSource, GroupRecord, SnapshotRecord, Table};

/// Parameters the external-snapshotter adds with `--extra-create-metadata`.
pub const SNAPSHOT_METADATA: [&str; 3] = [
    "csi.storage.k8s.io/volumesnapshot/name",
    "csi.storage.k8s.io/volumesnapshot/namespace",
    "csi.storage.k8s.io/volumesnapshotcontent/name",
];

/// Parameters the external-snapshotter adds to group snapshots with `--extra-create-metadata`.
pub const GROUP_METADATA: [&str; 3] = [
    "csi.storage.k8s.io/volumegroupsnapshot/name",
    "csi.storage.k8s.io/volumegroupsnapshot/namespace",
    "csi.storage.k8s.io/volumegroupsnapshotcontent/name",
];

/// What a create RPC does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<T> {
    /// It exists already and matches: answer it again.
    Existing(T),
    /// Make it.
    New(T),
}

fn parameters(
    given: &std::collections::HashMap<String, String>,
    known: &[&str],
) -> Result<BTreeMap<String, String>> {
    if let Some(key) = given.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(Error::UnknownSnapshotParameter(key.clone()));
    }
    Ok(given.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Whether every source volume of these snapshots still exists: checked when their copies are
/// logged, since a volume deleted during the copy may have been copied only in part.
pub fn sources_exist(table: &Table, snapshots: &[SnapshotRecord]) -> Result<()> {
    match snapshots
        .iter()
        .find(|s| table.get(&s.source_volume_id).is_none())
    {
        Some(gone) => Err(Error::VolumeNotFound(gone.source_volume_id.clone())),
        None => Ok(()),
    }
}

/// Decides CreateSnapshot: the existing snapshot of that name (same source), a new one copied
/// from the source volume, or the error.
pub fn plan_snapshot(
    table: &Table,
    req: &csi::CreateSnapshotRequest,
    new_id: &str,
    now_ms: u64,
) -> Result<Plan<SnapshotRecord>> {
    if req.name.is_empty() {
        return Err(Error::Missing("name"));
    }
    if req.source_volume_id.is_empty() {
        return Err(Error::Missing("source_volume_id"));
    }
    let parameters = parameters(&req.parameters, &SNAPSHOT_METADATA)?;
    if let Some(existing) = table.snapshot_by_name(&req.name) {
        if existing.source_volume_id == req.source_volume_id {
            return Ok(Plan::Existing(existing.clone()));
        }
        return Err(Error::SnapshotNameConflict {
            name: req.name.clone(),
            volume: existing.source_volume_id.clone(),
        });
    }
    let source = table
        .get(&req.source_volume_id)
        .ok_or_else(|| Error::VolumeNotFound(req.source_volume_id.clone()))?;
    Ok(Plan::New(SnapshotRecord {
        id: new_id.to_string(),
        name: req.name.clone(),
        source_volume_id: source.id.clone(),
        size_bytes: source.capacity_bytes,
        block: source.block,
        kind: source.kind.clone(),
        parameters,
        created_ms: now_ms,
        group_id: None,
    }))
}

/// Decides DeleteSnapshot: nothing for an unknown id; refused for a member of a group.
pub fn plan_delete_snapshot(table: &Table, id: &str) -> Result<Vec<Change>> {
    if id.is_empty() {
        return Err(Error::Missing("snapshot_id"));
    }
    let Some(record) = table.snapshot(id) else {
        return Ok(Vec::new());
    };
    if let Some(group) = &record.group_id {
        return Err(Error::SnapshotInGroup {
            id: id.to_string(),
            group: group.clone(),
        });
    }
    if table.copying_from(&ContentSource::Snapshot(id.to_string())) {
        return Err(Error::SnapshotInUse(id.to_string()));
    }
    Ok(vec![Change::DeleteSnapshot(id.to_string())])
}

/// Answers ListSnapshots: the snapshots after the token that pass the filters, at most
/// `max_entries` of them (0: all), and the token of the next page ("" when there is none).
pub fn list_snapshots(
    table: &Table,
    req: &csi::ListSnapshotsRequest,
) -> Result<(Vec<SnapshotRecord>, String)> {
    if req.max_entries < 0 {
        return Err(Error::InvalidMaxEntries(req.max_entries));
    }
    // Tokens are the id of the last snapshot returned: ids of ours, as for ListVolumes.
    if !req.starting_token.is_empty() && !crate::plan::valid_token(&req.starting_token) {
        return Err(Error::InvalidToken(req.starting_token.clone()));
    }
    let limit = if req.max_entries == 0 {
        usize::MAX
    } else {
        req.max_entries as usize
    };
    let mut matching = table.snapshots_after(&req.starting_token).filter(|s| {
        (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
            && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
    });
    let mut page: Vec<SnapshotRecord> = Vec::new();
    for snapshot in matching.by_ref() {
        page.push(snapshot.clone());
        if page.len() == limit {
            break;
        }
    }
    let next = match (page.last(), matching.next()) {
        (Some(last), Some(_)) => last.id.clone(),
        _ => String::new(),
    };
    Ok((page, next))
}

/// The CSI view of a snapshot. Snapshots are full copies, ready as soon as they exist.
pub fn to_csi_snapshot(record: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: record.size_bytes,
        snapshot_id: record.id.clone(),
        source_volume_id: record.source_volume_id.clone(),
        creation_time: Some(timestamp(record.created_ms)),
        ready_to_use: true,
        group_snapshot_id: record.group_id.clone().unwrap_or_default(),
    }
}

/// A protobuf timestamp from milliseconds since the epoch.
pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// Decides CreateVolumeGroupSnapshot: the existing group of that name (same volumes), or a
/// new group with one new snapshot per volume (ids from `new_id`), or the error.
pub fn plan_group(
    table: &Table,
    req: &csi::CreateVolumeGroupSnapshotRequest,
    mut new_id: impl FnMut() -> String,
    now_ms: u64,
) -> Result<Plan<(GroupRecord, Vec<SnapshotRecord>)>> {
    if req.name.is_empty() {
        return Err(Error::Missing("name"));
    }
    if req.source_volume_ids.is_empty() {
        return Err(Error::Missing("source_volume_ids"));
    }
    let parameters = parameters(&req.parameters, &GROUP_METADATA)?;
    let mut sources: Vec<String> = req.source_volume_ids.clone();
    sources.sort();
    if sources.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::GroupArgument(
            "source_volume_ids names a volume twice".into(),
        ));
    }
    if let Some(existing) = table.group_by_name(&req.name) {
        let mut had = existing.source_volume_ids.clone();
        had.sort();
        if had != sources || existing.parameters != parameters {
            return Err(Error::GroupNameConflict {
                name: req.name.clone(),
                sources: existing.source_volume_ids.join(", "),
            });
        }
        let members = group_members(table, existing)?;
        return Ok(Plan::Existing((existing.clone(), members)));
    }
    let group_id = new_id();
    let mut members = Vec::new();
    for volume_id in &sources {
        let volume = table
            .get(volume_id)
            .ok_or_else(|| Error::VolumeNotFound(volume_id.clone()))?;
        members.push(SnapshotRecord {
            id: new_id(),
            name: format!("{}-{}", req.name, volume.id),
            source_volume_id: volume.id.clone(),
            size_bytes: volume.capacity_bytes,
            block: volume.block,
            kind: volume.kind.clone(),
            parameters: BTreeMap::new(),
            created_ms: now_ms,
            group_id: Some(group_id.clone()),
        });
    }
    let group = GroupRecord {
        id: group_id,
        name: req.name.clone(),
        snapshot_ids: members.iter().map(|s| s.id.clone()).collect(),
        source_volume_ids: sources,
        parameters,
        created_ms: now_ms,
    };
    Ok(Plan::New((group, members)))
}

/// A group's snapshots, in the group's order.
pub fn group_members(table: &Table, group: &GroupRecord) -> Result<Vec<SnapshotRecord>> {
    group
        .snapshot_ids
        .iter()
        .map(|id| {
            table.snapshot(id).cloned().ok_or_else(|| {
                Error::GroupPrecondition(format!(
                    "group snapshot {:?} lost its member snapshot {id:?}",
                    group.id
                ))
            })
        })
        .collect()
}

/// Checks the `snapshot_ids` a caller gives for a group (when it gives any) against the
/// group's members: the spec asks for INVALID_ARGUMENT on a mismatch.
fn check_members(group: &GroupRecord, given: &[String]) -> Result<()> {
    if given.is_empty() {
        return Ok(());
    }
    let mut given: Vec<&String> = given.iter().collect();
    let mut have: Vec<&String> = group.snapshot_ids.iter().collect();
    given.sort();
    have.sort();
    if given != have {
        return Err(Error::GroupArgument(format!(
            "snapshot_ids do not match the members of group snapshot {:?}",
            group.id
        )));
    }
    Ok(())
}

/// Answers GetVolumeGroupSnapshot.
pub fn get_group(
    table: &Table,
    req: &csi::GetVolumeGroupSnapshotRequest,
) -> Result<(GroupRecord, Vec<SnapshotRecord>)> {
    if req.group_snapshot_id.is_empty() {
        return Err(Error::Missing("group_snapshot_id"));
    }
    let group = table
        .group(&req.group_snapshot_id)
        .ok_or_else(|| Error::GroupNotFound(req.group_snapshot_id.clone()))?;
    check_members(group, &req.snapshot_ids)?;
    Ok((group.clone(), group_members(table, group)?))
}

/// Decides DeleteVolumeGroupSnapshot: the group and its snapshots go together; nothing for an
/// unknown group.
pub fn plan_delete_group(
    table: &Table,
    req: &csi::DeleteVolumeGroupSnapshotRequest,
) -> Result<Vec<Change>> {
    if req.group_snapshot_id.is_empty() {
        return Err(Error::Missing("group_snapshot_id"));
    }
    let Some(group) = table.group(&req.group_snapshot_id) else {
        return Ok(Vec::new());
    };
    check_members(group, &req.snapshot_ids)?;
    let mut changes: Vec<Change> = group
        .snapshot_ids
        .iter()
        .filter(|id| table.snapshot(id).is_some())
        .map(|id| Change::DeleteSnapshot(id.clone()))
        .collect();
    changes.push(Change::DeleteGroup(group.id.clone()));
    Ok(changes)
}

/// The CSI view of a group snapshot.
pub fn to_csi_group(group: &GroupRecord, members: &[SnapshotRecord]) -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: group.id.clone(),
        snapshots: members.iter().map(to_csi_snapshot).collect(),
        creation_time: Some(timestamp(group.created_ms)),
        ready_to_use: true,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
