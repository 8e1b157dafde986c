//! Pure decisions of the controller: parse a request into typed data, then decide against the
//! table what to do. No I/O here; the services in `controller` and `node` carry it out.

use std::collections::{BTreeMap, HashMap};

use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;

use sidecar_kit::recoverable;

use crate::config::{DriverConfig, KnownNode};
use crate::error::{Error, Result};
use crate::state::{Change, ContentSource, Table, VolumeRecord};

mod publish;
mod source;
pub use publish::{PublishRequest, parse_publish, plan_publish, plan_unpublish};
pub use source::{copies_unused_volume, never_used, parse_source, source_size};

/// Parameter selecting the capacity pool.
pub const KIND_PARAMETER: &str = "kind";
/// Metadata the external-provisioner adds with --extra-create-metadata.
pub const METADATA_PARAMETERS: [&str; 3] = [
    "csi.storage.k8s.io/pvc/name",
    "csi.storage.k8s.io/pvc/namespace",
    "csi.storage.k8s.io/pv/name",
];

/// A topology segment as a sorted map.
pub type Segment = BTreeMap<String, String>;

/// A validated volume capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// Block (true) or mount (false).
    pub block: bool,
    /// Access mode.
    pub mode: Mode,
}

/// Validates one capability against what the driver serves.
pub fn check_capability(cfg: &DriverConfig, cap: &csi::VolumeCapability) -> Result<Capability> {
    let mode_value = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::Capability("access_mode is required".into()))?
        .mode;
    let mode = Mode::try_from(mode_value)
        .map_err(|_| Error::Capability(format!("unknown access mode {mode_value}")))?;
    match mode {
        Mode::Unknown => return Err(Error::Capability("access mode UNKNOWN".into())),
        Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter
            if !cfg.single_node_multi_writer =>
        {
            return Err(Error::Capability(format!(
                "access mode {} needs SINGLE_NODE_MULTI_WRITER, which this driver does not advertise",
                mode.as_str_name()
            )));
        }
        _ => {}
    }
    let block = match &cap.access_type {
        None => {
            return Err(Error::Capability(
                "access_type (block or mount) is required".into(),
            ));
        }
        Some(AccessType::Block(_)) => {
            if cfg.disable_block {
                return Err(Error::Capability("block volumes are not supported".into()));
            }
            true
        }
        Some(AccessType::Mount(_)) => false,
    };
    Ok(Capability { block, mode })
}

/// Whether the mode lets only one node use the volume.
pub fn single_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter
    )
}

/// A validated CreateVolume request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// Idempotency key.
    pub name: String,
    /// Minimum bytes (0: none).
    pub required: i64,
    /// Maximum bytes (0: none).
    pub limit: i64,
    /// Block access type.
    pub block: bool,
    /// Capacity pool.
    pub kind: String,
    /// Parameters as given.
    pub parameters: BTreeMap<String, String>,
    /// Requisite segments in order.
    pub requisite: Vec<Segment>,
    /// Preferred segments in order.
    pub preferred: Vec<Segment>,
    /// The snapshot or volume to copy.
    pub source: Option<ContentSource>,
    /// Mutable parameters, checked.
    pub mutable_parameters: BTreeMap<String, String>,
}

fn segment(topology: &csi::Topology) -> Segment {
    topology
        .segments
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Validates a CreateVolume request (every check that does not need the table).
pub fn parse_create(cfg: &DriverConfig, req: &csi::CreateVolumeRequest) -> Result<CreateRequest> {
    if req.name.is_empty() {
        return Err(Error::Missing("name"));
    }
    if req.volume_capabilities.is_empty() {
        return Err(Error::Missing("volume_capabilities"));
    }
    let mut block = None;
    for cap in &req.volume_capabilities {
        let checked = check_capability(cfg, cap)?;
        if block.is_some_and(|b| b != checked.block) {
            return Err(Error::Capability(
                "block and mount access types in one request".into(),
            ));
        }
        block = Some(checked.block);
    }
    let (required, limit) = match &req.capacity_range {
        None => (0, 0),
        Some(range) => (range.required_bytes, range.limit_bytes),
    };
    if required < 0 || limit < 0 {
        return Err(Error::CapacityRange(format!(
            "required_bytes {required} and limit_bytes {limit} must not be negative"
        )));
    }
    if limit > 0 && required > limit {
        return Err(Error::CapacityRange(format!(
            "required_bytes {required} is larger than limit_bytes {limit}"
        )));
    }
    if let Some(max) = cfg.max_volume_size {
        let smallest = if required > 0 {
            required
        } else {
            cfg.default_volume_size.min(max)
        };
        if smallest > max {
            return Err(Error::TooLarge {
                requested: smallest,
                max,
            });
        }
    }
    for key in req.parameters.keys() {
        if key != KIND_PARAMETER
            && !METADATA_PARAMETERS.contains(&key.as_str())
            && !recoverable::is_mark(key)
        {
            return Err(Error::UnknownParameter(key.clone()));
        }
    }
    let kind = req
        .parameters
        .get(KIND_PARAMETER)
        .cloned()
        .unwrap_or_default();
    if !cfg.capacity.is_empty() && !cfg.capacity.contains_key(&kind) {
        let known: Vec<String> = cfg
            .capacity
            .keys()
            .map(|k| {
                if k.is_empty() {
                    "(default)".to_string()
                } else {
                    format!("{k:?}")
                }
            })
            .collect();
        return Err(Error::UnknownKind {
            kind,
            known: known.join(", "),
        });
    }
    let source = parse_source(cfg, req.volume_content_source.as_ref())?;
    if !req.mutable_parameters.is_empty() && !cfg.features.modify {
        return Err(Error::Unsupported(
            "mutable_parameters (ControllerModifyVolume)",
        ));
    }
    let mutable_parameters = crate::modify::check_mutable(&req.mutable_parameters)?;
    let (requisite, preferred) = match &req.accessibility_requirements {
        Some(reqs) if cfg.topology_key.is_some() => (
            reqs.requisite.iter().map(segment).collect(),
            reqs.preferred.iter().map(segment).collect(),
        ),
        _ => (Vec::new(), Vec::new()),
    };
    Ok(CreateRequest {
        name: req.name.clone(),
        required,
        limit,
        block: block.unwrap_or(false),
        kind,
        parameters: req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        requisite,
        preferred,
        source,
        mutable_parameters,
    })
}

/// What CreateVolume does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatePlan {
    /// The volume exists and matches: answer it again.
    Existing(VolumeRecord),
    /// Make this new volume.
    New(VolumeRecord),
}

fn node_segment(cfg: &DriverConfig, node: &KnownNode) -> Option<Segment> {
    cfg.topology_key
        .as_ref()
        .map(|key| BTreeMap::from([(key.clone(), node.topology_value.clone())]))
}

/// The nodes of `segments`, in their order, each once. Linear in nodes plus segments: a
/// request lists every segment of a large cluster (2,000 nodes: a pairwise scan took ~0.5 s,
/// under the table lock every other call waits on).
fn nodes_in<'a>(cfg: &'a DriverConfig, segments: &'a [Segment]) -> Vec<&'a KnownNode> {
    let Some(key) = cfg.topology_key.as_ref() else {
        return Vec::new();
    };
    let mut by_value: std::collections::HashMap<&str, Vec<&KnownNode>> =
        std::collections::HashMap::new();
    for node in &cfg.nodes {
        by_value
            .entry(node.topology_value.as_str())
            .or_default()
            .push(node);
    }
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<&KnownNode> = Vec::new();
    for seg in segments {
        // A node's segment is exactly {key: value}: a segment with other keys matches none.
        let value = match (seg.len(), seg.get(key)) {
            (1, Some(value)) => value.as_str(),
            _ => continue,
        };
        for node in by_value.get(value).into_iter().flatten() {
            if seen.insert(node.id.as_str()) {
                out.push(node);
            }
        }
    }
    out
}

/// The nodes a new volume may go to, best first; `None` stands for "no topology".
fn candidates<'a>(
    cfg: &'a DriverConfig,
    req: &'a CreateRequest,
) -> Result<Vec<Option<&'a KnownNode>>> {
    if cfg.topology_key.is_none() {
        return Ok(vec![None]);
    }
    let allowed: Vec<&KnownNode> = if req.requisite.is_empty() {
        cfg.nodes.iter().collect()
    } else {
        let allowed = nodes_in(cfg, &req.requisite);
        if allowed.is_empty() {
            return Err(Error::Topology(format!(
                "no requisite segment {:?} is served by this driver (it serves {})",
                req.requisite,
                served_segments(cfg)
            )));
        }
        allowed
    };
    let mut ordered: Vec<&KnownNode> = nodes_in(cfg, &req.preferred)
        .into_iter()
        .filter(|n| allowed.iter().any(|a| a.id == n.id))
        .collect();
    for node in allowed {
        if !ordered.iter().any(|n| n.id == node.id) {
            ordered.push(node);
        }
    }
    Ok(ordered.into_iter().map(Some).collect())
}

fn served_segments(cfg: &DriverConfig) -> String {
    let key = cfg.topology_key.clone().unwrap_or_default();
    let values: Vec<String> = cfg
        .nodes
        .iter()
        .map(|n| format!("{key}={}", n.topology_value))
        .collect();
    values.join(", ")
}

/// Decides CreateVolume against the table: an existing compatible volume, a new volume on the
/// first candidate node with room, or the reason why neither.
pub fn plan_create(
    cfg: &DriverConfig,
    table: &Table,
    req: &CreateRequest,
    new_id: &str,
    now_ms: u64,
) -> Result<CreatePlan> {
    if let Some(existing) = table.by_name(&req.name) {
        if table.reserved(&existing.id).is_some() {
            // Still being made: it is neither listed nor durable yet.
            return Err(Error::Pending(req.name.clone()));
        }
        return match difference(cfg, existing, req) {
            None => Ok(CreatePlan::Existing(existing.clone())),
            Some(difference) => Err(Error::NameConflict {
                name: req.name.clone(),
                difference,
            }),
        };
    }
    let mut size = if req.required > 0 {
        req.required
    } else if req.limit > 0 {
        cfg.default_volume_size.min(req.limit)
    } else {
        cfg.default_volume_size
    };
    if let Some(source) = &req.source {
        // A copy is at least as large as what it copies.
        size = size.max(source_size(table, source, req)?);
    }
    let total = cfg.capacity.get(&req.kind).copied();
    let mut shortfalls = Vec::new();
    for node in candidates(cfg, req)? {
        let node_id = node.map(|n| n.id.as_str());
        let fits = match total {
            None => true,
            Some(total) => {
                let free = total - table.used(&req.kind, node_id);
                if free < size {
                    shortfalls.push(format!(
                        "{} has {free} bytes free",
                        node_id.unwrap_or("the pool")
                    ));
                }
                free >= size
            }
        };
        if fits {
            return Ok(CreatePlan::New(VolumeRecord {
                id: new_id.to_string(),
                name: req.name.clone(),
                capacity_bytes: size,
                kind: req.kind.clone(),
                node: node_id.map(str::to_string),
                block: req.block,
                parameters: req.parameters.clone(),
                created_ms: now_ms,
                published: BTreeMap::new(),
                targets: BTreeMap::new(),
                source: req.source.clone(),
                mutable_parameters: req.mutable_parameters.clone(),
                lazy_content: lazy_content(req),
                ..VolumeRecord::default()
            }));
        }
    }
    Err(Error::NoCapacity(format!(
        "{size} bytes of kind {:?} requested; {}",
        req.kind,
        shortfalls.join(", ")
    )))
}

/// Whether a new volume's directory waits for its first use: an empty mount volume. A block
/// volume's image and a copy of a snapshot or volume are made at once.
fn lazy_content(req: &CreateRequest) -> bool {
    !req.block && req.source.is_none()
}

/// How an existing volume differs from a repeated request, if it does.
fn difference(cfg: &DriverConfig, existing: &VolumeRecord, req: &CreateRequest) -> Option<String> {
    if existing.capacity_bytes < req.required
        || (req.limit > 0 && existing.capacity_bytes > req.limit)
    {
        return Some(format!(
            "capacity {} bytes, outside the requested range [{}, {}]",
            existing.capacity_bytes, req.required, req.limit
        ));
    }
    if existing.block != req.block {
        return Some(format!(
            "access type {}",
            if existing.block { "block" } else { "mount" }
        ));
    }
    // The provisioner's marks are not the volume's properties: the first call's stay.
    let unmarked = |p: &BTreeMap<String, String>| {
        p.iter()
            .filter(|(k, _)| !recoverable::is_mark(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<String, String>>()
    };
    if unmarked(&existing.parameters) != unmarked(&req.parameters) {
        return Some(format!("parameters {:?}", unmarked(&existing.parameters)));
    }
    if existing.source != req.source {
        return Some(format!("content source {:?}", existing.source));
    }
    if !req.requisite.is_empty() {
        let node = cfg
            .nodes
            .iter()
            .find(|n| Some(&n.id) == existing.node.as_ref());
        let inside = node
            .and_then(|n| node_segment(cfg, n))
            .is_some_and(|seg| req.requisite.contains(&seg));
        if !inside {
            return Some(format!(
                "topology outside the requisite segments (on node {:?})",
                existing.node
            ));
        }
    }
    None
}

/// The CSI view of a volume.
pub fn to_csi_volume(cfg: &DriverConfig, record: &VolumeRecord) -> csi::Volume {
    let accessible_topology = record
        .node
        .as_ref()
        .and_then(|id| cfg.nodes.iter().find(|n| &n.id == id))
        .and_then(|n| node_segment(cfg, n))
        .map(|seg| {
            vec![csi::Topology {
                segments: seg.into_iter().collect(),
            }]
        })
        .unwrap_or_default();
    let mut volume_context = HashMap::new();
    if !record.kind.is_empty() {
        volume_context.insert(KIND_PARAMETER.to_string(), record.kind.clone());
    }
    // The recoverable-volumes convention: the provisioner's marks come back, with the name.
    let mut marked = false;
    for (key, value) in &record.parameters {
        if recoverable::is_mark(key) && key != recoverable::NAME {
            volume_context.insert(key.clone(), value.clone());
            marked = true;
        }
    }
    if marked {
        volume_context.insert(recoverable::NAME.to_string(), record.name.clone());
    }
    let content_source = record
        .source
        .as_ref()
        .map(|source| csi::VolumeContentSource {
            r#type: Some(match source {
                ContentSource::Snapshot(id) => csi::volume_content_source::Type::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: id.clone(),
                    },
                ),
                ContentSource::Volume(id) => csi::volume_content_source::Type::Volume(
                    csi::volume_content_source::VolumeSource {
                        volume_id: id.clone(),
                    },
                ),
            }),
        });
    csi::Volume {
        capacity_bytes: record.capacity_bytes,
        volume_id: record.id.clone(),
        volume_context,
        content_source,
        accessible_topology,
    }
}

/// Decides DeleteVolume: nothing to do for an unknown id; refused while published.
pub fn plan_delete(table: &Table, id: &str) -> Result<Vec<Change>> {
    if id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    let Some(record) = table.get(id) else {
        return Ok(Vec::new());
    };
    if let Some(node) = record.published.keys().next() {
        return Err(Error::InUse {
            id: id.to_string(),
            detail: format!("published to node {node:?}"),
        });
    }
    if let Some(target) = record.targets.keys().next() {
        return Err(Error::InUse {
            id: id.to_string(),
            detail: format!("node-published at {target:?}"),
        });
    }
    if let Some(staging) = record.staged.keys().next() {
        return Err(Error::InUse {
            id: id.to_string(),
            detail: format!("staged at {staging:?}"),
        });
    }
    if table.copying_from(&ContentSource::Volume(id.to_string())) {
        return Err(Error::InUse {
            id: id.to_string(),
            detail: "a clone of it is being made".into(),
        });
    }
    Ok(vec![Change::Delete(id.to_string())])
}

/// Is `token` a ListVolumes token of ours? Tokens are the id of the last volume returned.
pub fn valid_token(token: &str) -> bool {
    uuid::Uuid::parse_str(token).is_ok()
}

#[cfg(test)]
mod tests;
