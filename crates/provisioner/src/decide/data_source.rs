//! A claim's data source, as the external-provisioner decides it: which object the claim names
//! (`dataSource` first, then `dataSourceRef`), whether a ReferenceGrant lets it cross
//! namespaces, whether it is ours to copy (a PersistentVolumeClaim to clone, a VolumeSnapshot to
//! restore) or a populator's, and every check on the source before CreateVolume, with upstream's
//! messages. Pure: the objects are looked up by the controller and passed in.

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::Value;

use super::claim::requested_bytes;

/// The API group of VolumeSnapshots.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// The annotation on a VolumeSnapshotContent that allows restoring it with another volume mode.
pub const ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";

/// The object a claim names as its data source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRef {
    /// `kind` of the reference (`PersistentVolumeClaim`, `VolumeSnapshot`, a populator's).
    pub kind: String,
    /// `name` of the reference.
    pub name: String,
    /// Namespace (the claim's unless `dataSourceRef.namespace` says otherwise).
    pub namespace: String,
    /// API group (None for the core group).
    pub api_group: Option<String>,
}

/// What to do with a claim's data source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Copy another claim's volume (CLONE_VOLUME).
    Clone,
    /// Restore a VolumeSnapshot (CREATE_DELETE_SNAPSHOT).
    Snapshot,
    /// Another kind: a volume populator fills the volume; the provisioner leaves the claim alone.
    Populator,
}

/// Why a claim's data source cannot be used. Every one ends in a `ProvisioningFailed` event and
/// no CreateVolume; the claim is retried with backoff (the source may become ready).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataSourceError {
    /// `dataSourceRef.namespace` without the gate.
    #[error(
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    )]
    NamespaceWithoutGate,
    /// No ReferenceGrant allows the claim to use a source in another namespace.
    #[error(
        "accessing {source_namespace}/{source_name} of {kind} dataSource from {claim} isn't allowed"
    )]
    NotGranted {
        /// Source namespace.
        source_namespace: String,
        /// Source name.
        source_name: String,
        /// Source kind.
        kind: String,
        /// The claim, namespace/name.
        claim: String,
    },
    /// The source has no name.
    #[error("the PVC source not found for PVC {0}")]
    EmptyName(String),
    /// A VolumeSnapshot of another API group.
    #[error(
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got {0}"
    )]
    SnapshotGroup(String),
    /// The driver cannot restore snapshots.
    #[error(
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    )]
    NoSnapshotCapability,
    /// The driver cannot clone.
    #[error(
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    )]
    NoCloneCapability,
    /// A check of the source failed.
    #[error("error getting handle for DataSource Type {kind} by Name {name}: {check}")]
    Source {
        /// Source kind.
        kind: String,
        /// Source name.
        name: String,
        /// The failed check.
        check: SourceCheck,
    },
}

/// A failed check of a clone's or a restore's source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceCheck {
    /// The source claim does not exist.
    #[error(
        "error getting PVC {name} (namespace {namespace:?}) from api server: persistentvolumeclaims {name:?} not found"
    )]
    ClaimMissing {
        /// The source claim's name.
        name: String,
        /// The source claim's namespace.
        namespace: String,
    },
    /// The source claim is not Bound.
    #[error("the PVC DataSource {name} must have a status of Bound.  Got {phase}")]
    ClaimNotBound {
        /// The source claim's name.
        name: String,
        /// Its phase.
        phase: String,
    },
    /// The source claim is being deleted.
    #[error("the PVC DataSource {0} is currently being deleted")]
    ClaimDeleting(String),
    /// The source claim names no class.
    #[error("the source PVC ({0}) storageclass cannot be empty")]
    SourceWithoutClass(String),
    /// The new claim names no class.
    #[error("the requested PVC ({0}) storageclass cannot be empty")]
    ClaimWithoutClass(String),
    /// The new claim asks for less than the source claim.
    #[error(
        "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_size}"
    )]
    CloneTooSmall {
        /// Bytes asked for.
        requested: i64,
        /// The source claim's request.
        source_size: i64,
    },
    /// The source claim names no volume.
    #[error("volume name is empty in source PVC {0}")]
    NoVolumeName(String),
    /// The source volume is missing, not CSI, another driver's, or not bound to the source claim.
    #[error("claim in dataSource not bound or invalid")]
    VolumeInvalid,
    /// Clone across volume modes.
    #[error(
        "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {source_mode}, but new PVC requested {requested}"
    )]
    CloneMode {
        /// The source volume's mode.
        source_mode: String,
        /// The new claim's mode.
        requested: String,
    },
    /// The VolumeSnapshot does not exist.
    #[error(
        "error getting snapshot {0} from api server: volumesnapshots.snapshot.storage.k8s.io {0:?} not found"
    )]
    SnapshotMissing(String),
    /// The VolumeSnapshot is being deleted.
    #[error("snapshot {0} is being deleted")]
    SnapshotDeleting(String),
    /// No content is bound.
    #[error("snapshot {0} not bound")]
    SnapshotNotBound(String),
    /// The bound content does not exist.
    #[error("error getting snapshotcontent {content} for snapshot {snapshot}")]
    ContentMissing {
        /// Content name.
        content: String,
        /// Snapshot, namespace/name.
        snapshot: String,
    },
    /// The content points at another snapshot.
    #[error("snapshotcontent {content} for snapshot {snapshot} is bound to a different snapshot")]
    ContentMisbound {
        /// Content name.
        content: String,
        /// Snapshot, namespace/name.
        snapshot: String,
    },
    /// The content is another driver's.
    #[error(
        "snapshotcontent {content} for snapshot {snapshot} is not handled by CSI driver of StorageClass {class}"
    )]
    ContentDriver {
        /// Content name.
        content: String,
        /// Snapshot, namespace/name.
        snapshot: String,
        /// The claim's class.
        class: String,
    },
    /// readyToUse is not true.
    #[error("snapshot {0} is not Ready")]
    SnapshotNotReady(String),
    /// The content has no snapshotHandle yet.
    #[error("snapshot handle {0} is not available")]
    NoHandle(String),
    /// The claim asks for less than the snapshot's restoreSize.
    #[error(
        "requested volume size {requested} is less than the size {restore} for the source snapshot {snapshot}"
    )]
    RestoreTooSmall {
        /// Bytes asked for.
        requested: i64,
        /// restoreSize in bytes.
        restore: i64,
        /// Snapshot name.
        snapshot: String,
    },
    /// The restore changes the volume mode without the content's permission.
    #[error(
        "requested volume {claim} modifies the mode of the source volume but does not have permission to do so. {reason}"
    )]
    ModeConversion {
        /// The claim, namespace/name.
        claim: String,
        /// Which permission is missing.
        reason: String,
    },
}

fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The object a claim names: `dataSource` wins; `dataSourceRef` may name another namespace
/// only with the CrossNamespaceVolumeDataSource gate.
pub fn source_of(
    claim: &PersistentVolumeClaim,
    cross_namespace: bool,
) -> Result<Option<SourceRef>, DataSourceError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let Some(spec) = claim.spec.as_ref() else {
        return Ok(None);
    };
    if let Some(source) = &spec.data_source {
        return Ok(Some(SourceRef {
            kind: source.kind.clone(),
            name: source.name.clone(),
            namespace,
            api_group: source.api_group.clone(),
        }));
    }
    let Some(source) = &spec.data_source_ref else {
        return Ok(None);
    };
    let source_namespace = match source.namespace.as_deref() {
        Some(ns) if !ns.is_empty() && !cross_namespace => {
            return Err(DataSourceError::NamespaceWithoutGate);
        }
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => namespace,
    };
    Ok(Some(SourceRef {
        kind: source.kind.clone(),
        name: source.name.clone(),
        namespace: source_namespace,
        api_group: source.api_group.clone(),
    }))
}

/// Whether a ReferenceGrant (gateway.networking.k8s.io, in the source's namespace) lets this
/// claim use the source: one `from` entry for PersistentVolumeClaims of the claim's namespace,
/// one `to` entry for the source's group and kind, by name or for every name.
pub fn granted(grants: &[Value], claim_namespace: &str, source: &SourceRef) -> bool {
    let group = source.api_group.clone().unwrap_or_default();
    grants.iter().any(|grant| {
        let in_source_namespace =
            grant.pointer("/metadata/namespace").and_then(Value::as_str) == Some(&source.namespace);
        let from = grant
            .pointer("/spec/from")
            .and_then(Value::as_array)
            .is_some_and(|entries| {
                entries.iter().any(|f| {
                    f.get("group")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .is_empty()
                        && f.get("kind").and_then(Value::as_str) == Some("PersistentVolumeClaim")
                        && f.get("namespace").and_then(Value::as_str) == Some(claim_namespace)
                })
            });
        let to = grant
            .pointer("/spec/to")
            .and_then(Value::as_array)
            .is_some_and(|entries| {
                entries.iter().any(|t| {
                    t.get("group").and_then(Value::as_str).unwrap_or_default() == group
                        && t.get("kind").and_then(Value::as_str) == Some(source.kind.as_str())
                        && t.get("name")
                            .and_then(Value::as_str)
                            .is_none_or(|name| name.is_empty() || name == source.name)
                })
            });
        in_source_namespace && from && to
    })
}

/// What the source is, checked against what the driver can do. Populators are decided by kind
/// alone, as upstream does.
pub fn kind_of(
    claim: &PersistentVolumeClaim,
    source: &SourceRef,
    can_clone: bool,
    can_restore: bool,
) -> Result<SourceKind, DataSourceError> {
    if source.name.is_empty() {
        return Err(DataSourceError::EmptyName(
            claim.metadata.name.clone().unwrap_or_default(),
        ));
    }
    match source.kind.as_str() {
        "VolumeSnapshot" => {
            let group = source.api_group.clone().unwrap_or_default();
            if group != SNAPSHOT_GROUP {
                return Err(DataSourceError::SnapshotGroup(group));
            }
            if !can_restore {
                return Err(DataSourceError::NoSnapshotCapability);
            }
            Ok(SourceKind::Snapshot)
        }
        "PersistentVolumeClaim" => {
            if !can_clone {
                return Err(DataSourceError::NoCloneCapability);
            }
            Ok(SourceKind::Clone)
        }
        _ => Ok(SourceKind::Populator),
    }
}

fn volume_mode(mode: Option<&str>) -> &str {
    mode.unwrap_or("Filesystem")
}

/// Checks a clone's source claim and volume; answers the content source for CreateVolume.
///
/// `already_sent`: CreateVolume of this clone was sent before (it is in the intent log). Then a
/// source being deleted does not stop it: the cloning-protection finalizer keeps the source
/// until the clone is done, and refusing would leave both waiting for each other forever (as
/// upstream does).
pub fn clone_source(
    claim: &PersistentVolumeClaim,
    source: &SourceRef,
    source_claim: Option<&PersistentVolumeClaim>,
    source_volume: Option<&PersistentVolume>,
    driver: &str,
    already_sent: bool,
) -> Result<csi::VolumeContentSource, DataSourceError> {
    let fail = |check: SourceCheck| DataSourceError::Source {
        kind: source.kind.clone(),
        name: source.name.clone(),
        check,
    };
    let Some(source_claim) = source_claim else {
        return Err(fail(SourceCheck::ClaimMissing {
            name: source.name.clone(),
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        }));
    };
    let phase = source_claim
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if phase != "Bound" {
        return Err(fail(SourceCheck::ClaimNotBound {
            name: source.name.clone(),
            phase,
        }));
    }
    if source_claim.metadata.deletion_timestamp.is_some() && !already_sent {
        return Err(fail(SourceCheck::ClaimDeleting(source.name.clone())));
    }
    let source_spec = source_claim.spec.clone().unwrap_or_default();
    if source_spec.storage_class_name.is_none() {
        return Err(fail(SourceCheck::SourceWithoutClass(source.name.clone())));
    }
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.storage_class_name.is_none() {
        return Err(fail(SourceCheck::ClaimWithoutClass(
            claim.metadata.name.clone().unwrap_or_default(),
        )));
    }
    let requested = requested_bytes(claim).unwrap_or(0);
    let source_size = requested_bytes(source_claim).unwrap_or(0);
    if requested < source_size {
        return Err(fail(SourceCheck::CloneTooSmall {
            requested,
            source_size,
        }));
    }
    let volume_name = source_spec.volume_name.clone().unwrap_or_default();
    if volume_name.is_empty() {
        return Err(fail(SourceCheck::NoVolumeName(source.name.clone())));
    }
    let volume = source_volume
        .filter(|pv| pv.metadata.name.as_deref() == Some(volume_name.as_str()))
        .ok_or_else(|| fail(SourceCheck::VolumeInvalid))?;
    let pv_spec = volume.spec.clone().unwrap_or_default();
    let csi = pv_spec
        .csi
        .as_ref()
        .filter(|csi| csi.driver == driver)
        .ok_or_else(|| fail(SourceCheck::VolumeInvalid))?;
    let bound_to_source = pv_spec.claim_ref.as_ref().is_some_and(|r| {
        r.uid == source_claim.metadata.uid
            && r.namespace == source_claim.metadata.namespace
            && r.name == source_claim.metadata.name
    });
    let volume_bound = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound_to_source || !volume_bound {
        return Err(fail(SourceCheck::VolumeInvalid));
    }
    let requested_mode = volume_mode(spec.volume_mode.as_deref());
    let source_mode = volume_mode(pv_spec.volume_mode.as_deref());
    if requested_mode != source_mode {
        return Err(fail(SourceCheck::CloneMode {
            source_mode: source_mode.to_string(),
            requested: requested_mode.to_string(),
        }));
    }
    Ok(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: csi.volume_handle.clone(),
            },
        )),
    })
}

fn text<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// A `restoreSize` (a quantity or a number of bytes) in bytes.
fn restore_bytes(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => sidecar_kit::quantity::parse_bytes(s).ok(),
        _ => None,
    }
}

/// Checks a restore's VolumeSnapshot and its bound VolumeSnapshotContent (both
/// `snapshot.storage.k8s.io/v1`, as JSON); answers the content source for CreateVolume.
/// `already_sent`: as for clones, a snapshot being deleted does not stop a restore whose
/// CreateVolume was sent (the snapshot controller holds the snapshot for it).
#[allow(clippy::too_many_arguments)]
pub fn snapshot_source(
    claim: &PersistentVolumeClaim,
    source: &SourceRef,
    snapshot: Option<&Value>,
    content: Option<&Value>,
    driver: &str,
    class_name: &str,
    prevent_volume_mode_conversion: bool,
    already_sent: bool,
) -> Result<csi::VolumeContentSource, DataSourceError> {
    let fail = |check: SourceCheck| DataSourceError::Source {
        kind: source.kind.clone(),
        name: source.name.clone(),
        check,
    };
    let snapshot_key = format!("{}/{}", source.namespace, source.name);
    let Some(snapshot) = snapshot else {
        return Err(fail(SourceCheck::SnapshotMissing(source.name.clone())));
    };
    let deleting = snapshot
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    if deleting && !already_sent {
        return Err(fail(SourceCheck::SnapshotDeleting(source.name.clone())));
    }
    let Some(content_name) = text(snapshot, "/status/boundVolumeSnapshotContentName") else {
        return Err(fail(SourceCheck::SnapshotNotBound(source.name.clone())));
    };
    let Some(content) = content.filter(|c| text(c, "/metadata/name") == Some(content_name)) else {
        return Err(fail(SourceCheck::ContentMissing {
            content: content_name.to_string(),
            snapshot: snapshot_key,
        }));
    };
    let points_back = text(content, "/spec/volumeSnapshotRef/uid")
        == text(snapshot, "/metadata/uid")
        && text(content, "/spec/volumeSnapshotRef/namespace") == Some(source.namespace.as_str())
        && text(content, "/spec/volumeSnapshotRef/name") == Some(source.name.as_str());
    if !points_back {
        return Err(fail(SourceCheck::ContentMisbound {
            content: content_name.to_string(),
            snapshot: snapshot_key,
        }));
    }
    if text(content, "/spec/driver") != Some(driver) {
        return Err(fail(SourceCheck::ContentDriver {
            content: content_name.to_string(),
            snapshot: snapshot_key,
            class: class_name.to_string(),
        }));
    }
    if snapshot
        .pointer("/status/readyToUse")
        .and_then(Value::as_bool)
        != Some(true)
    {
        return Err(fail(SourceCheck::SnapshotNotReady(source.name.clone())));
    }
    let Some(handle) = text(content, "/status/snapshotHandle") else {
        return Err(fail(SourceCheck::NoHandle(content_name.to_string())));
    };
    if let Some(restore) = snapshot
        .pointer("/status/restoreSize")
        .and_then(restore_bytes)
    {
        let requested = requested_bytes(claim).unwrap_or(0);
        if requested < restore {
            return Err(fail(SourceCheck::RestoreTooSmall {
                requested,
                restore,
                snapshot: source.name.clone(),
            }));
        }
    }
    if prevent_volume_mode_conversion {
        let source_mode = text(content, "/spec/sourceVolumeMode");
        let requested_mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
        if let (Some(from), Some(to)) = (source_mode, requested_mode)
            && from != to
        {
            let annotation = text(
                content,
                &format!(
                    "/metadata/annotations/{}",
                    ALLOW_VOLUME_MODE_CHANGE
                        .replace('~', "~0")
                        .replace('/', "~1")
                ),
            );
            let reason = match annotation.map(parse_go_bool) {
                None => Some(format!(
                    "{ALLOW_VOLUME_MODE_CHANGE} annotation is not present on snapshotcontent {content_name}"
                )),
                Some(Err(value)) => Some(format!(
                    "failed to convert {ALLOW_VOLUME_MODE_CHANGE} annotation value to boolean with error: strconv.ParseBool: parsing {value:?}: invalid syntax"
                )),
                Some(Ok(false)) => Some(format!(
                    "{ALLOW_VOLUME_MODE_CHANGE} is set to false on snapshotcontent {content_name}"
                )),
                Some(Ok(true)) => None,
            };
            if let Some(reason) = reason {
                return Err(fail(SourceCheck::ModeConversion {
                    claim: claim_key(claim),
                    reason,
                }));
            }
        }
    }
    Ok(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: handle.to_string(),
            },
        )),
    })
}

/// Go's strconv.ParseBool.
fn parse_go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(other.to_string()),
    }
}

#[cfg(test)]
#[path = "data_source_tests.rs"]
mod tests;
