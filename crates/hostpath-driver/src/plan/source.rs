//! CreateVolume's content source: a snapshot to restore or a volume to clone, its rules from the
//! CSI specification (INVALID_ARGUMENT for a source the driver cannot copy, NOT_FOUND for one
//! that does not exist, OUT_OF_RANGE for a capacity range that cannot hold it).

use csi_proto::v1 as csi;

use super::CreateRequest;
use crate::config::DriverConfig;
use crate::error::{Error, Result};
use crate::state::{ContentSource, Table};

/// Validates the content source against the features that are on.
pub fn parse_source(
    cfg: &DriverConfig,
    source: Option<&csi::VolumeContentSource>,
) -> Result<Option<ContentSource>> {
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        None => Err(Error::SourceIncompatible(
            "volume_content_source names neither a snapshot nor a volume".into(),
        )),
        Some(csi::volume_content_source::Type::Snapshot(s)) => {
            if !cfg.features.snapshots {
                return Err(Error::Unsupported(
                    "volume_content_source of type snapshot (snapshots are disabled)",
                ));
            }
            if s.snapshot_id.is_empty() {
                return Err(Error::Missing("volume_content_source.snapshot.snapshot_id"));
            }
            Ok(Some(ContentSource::Snapshot(s.snapshot_id.clone())))
        }
        Some(csi::volume_content_source::Type::Volume(v)) => {
            if !cfg.features.clones {
                return Err(Error::Unsupported(
                    "volume_content_source of type volume (clones are disabled)",
                ));
            }
            if v.volume_id.is_empty() {
                return Err(Error::Missing("volume_content_source.volume.volume_id"));
            }
            Ok(Some(ContentSource::Volume(v.volume_id.clone())))
        }
    }
}

/// The size of the source, after checking that it exists, has the request's access type and
/// fits under the request's limit.
/// Whether the volume `id` was never used ([`crate::state::VolumeRecord::lazy_content`]): its
/// directory may not exist, and a copy of it is then empty.
pub fn never_used(table: &Table, id: &str) -> bool {
    table.get(id).is_some_and(|v| v.lazy_content)
}

/// Whether a new volume's content `source` is a volume never used.
pub fn copies_unused_volume(table: &Table, source: Option<&ContentSource>) -> bool {
    match source {
        Some(ContentSource::Volume(id)) => never_used(table, id),
        None | Some(ContentSource::Snapshot(_)) => false,
    }
}

pub fn source_size(table: &Table, source: &ContentSource, req: &CreateRequest) -> Result<i64> {
    let (bytes, block, what, id) = match source {
        ContentSource::Snapshot(id) => {
            let snapshot = table.snapshot(id).ok_or_else(|| Error::SourceNotFound {
                kind: "snapshot",
                id: id.clone(),
            })?;
            (snapshot.size_bytes, snapshot.block, "snapshot", id)
        }
        ContentSource::Volume(id) => {
            let volume = table.get(id).ok_or_else(|| Error::SourceNotFound {
                kind: "volume",
                id: id.clone(),
            })?;
            (volume.capacity_bytes, volume.block, "volume", id)
        }
    };
    if block != req.block {
        return Err(Error::SourceIncompatible(format!(
            "{what} {id:?} holds a {} volume and the request is for a {} volume",
            if block { "block" } else { "mount" },
            if req.block { "block" } else { "mount" }
        )));
    }
    if req.limit > 0 && bytes > req.limit {
        return Err(Error::OutOfRange(format!(
            "{what} {id:?} holds {bytes} bytes, more than limit_bytes {}",
            req.limit
        )));
    }
    Ok(bytes)
}
