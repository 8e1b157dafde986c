//! ControllerPublishVolume and ControllerUnpublishVolume: the request validated, then the
//! changes to the table (the publications of a volume on nodes) or the CSI error.

use csi::volume_capability::access_mode::Mode;

use csi_proto::v1 as csi;

use super::{Capability, check_capability, single_node};
use crate::config::DriverConfig;
use crate::error::{Error, Result};
use crate::state::{Change, Publication, Table};

/// A validated ControllerPublishVolume request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// Volume id.
    pub volume_id: String,
    /// Node id.
    pub node_id: String,
    /// The access type and mode, validated.
    pub capability: Capability,
    /// Whether the volume is published read-only.
    pub readonly: bool,
}

/// Validates ControllerPublishVolume.
pub fn parse_publish(
    cfg: &DriverConfig,
    req: &csi::ControllerPublishVolumeRequest,
) -> Result<PublishRequest> {
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    if req.node_id.is_empty() {
        return Err(Error::Missing("node_id"));
    }
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or(Error::Missing("volume_capability"))?;
    Ok(PublishRequest {
        volume_id: req.volume_id.clone(),
        node_id: req.node_id.clone(),
        capability: check_capability(cfg, cap)?,
        readonly: req.readonly,
    })
}

/// Decides ControllerPublishVolume: the changes to make (none when already published the same
/// way) or the CSI error.
pub fn plan_publish(
    cfg: &DriverConfig,
    table: &Table,
    req: &PublishRequest,
) -> Result<Vec<Change>> {
    let record = table
        .get(&req.volume_id)
        .ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
    if !cfg.nodes.iter().any(|n| n.id == req.node_id) {
        return Err(Error::NodeNotFound(req.node_id.clone()));
    }
    if record.block != req.capability.block {
        return Err(Error::Capability(format!(
            "volume {:?} is a {} volume",
            record.id,
            if record.block { "block" } else { "mount" }
        )));
    }
    let wanted = Publication {
        readonly: req.readonly,
        access_mode: req.capability.mode as i32,
    };
    if let Some(existing) = record.published.get(&req.node_id) {
        if *existing == wanted {
            return Ok(Vec::new());
        }
        return Err(Error::PublishConflict(format!(
            "volume {:?} is already published to node {:?} with readonly={} and mode {}",
            record.id,
            req.node_id,
            existing.readonly,
            Mode::try_from(existing.access_mode).map_or("UNKNOWN", |m| m.as_str_name())
        )));
    }
    if let Some(home) = &record.node
        && home != &req.node_id
    {
        return Err(Error::Precondition(format!(
            "volume {:?} lives on node {home:?} and is not accessible from node {:?}",
            record.id, req.node_id
        )));
    }
    if let Some(other) = record.published.keys().next()
        && single_node(req.capability.mode)
    {
        return Err(Error::Precondition(format!(
            "volume {:?} is already published to node {other:?} and mode {} allows one node",
            record.id,
            req.capability.mode.as_str_name()
        )));
    }
    if cfg.max_volumes_per_node > 0
        && table.attached(&req.node_id) as i64 >= cfg.max_volumes_per_node
    {
        return Err(Error::AttachLimit {
            node: req.node_id.clone(),
            limit: cfg.max_volumes_per_node,
        });
    }
    let mut updated = record.clone();
    updated.published.insert(req.node_id.clone(), wanted);
    Ok(vec![Change::Put(updated)])
}

/// Decides ControllerUnpublishVolume: unknown volumes and nodes are already unpublished; an
/// empty node id unpublishes from every node.
pub fn plan_unpublish(table: &Table, volume_id: &str, node_id: &str) -> Result<Vec<Change>> {
    if volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    let Some(record) = table.get(volume_id) else {
        return Ok(Vec::new());
    };
    let mut updated = record.clone();
    if node_id.is_empty() {
        updated.published.clear();
    } else {
        updated.published.remove(node_id);
    }
    if updated == *record {
        return Ok(Vec::new());
    }
    Ok(vec![Change::Put(updated)])
}
