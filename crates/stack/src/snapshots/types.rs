//! Typed `snapshot.storage.k8s.io/v1` objects, with the fields the snapshot controller reads
//! and writes (it changes objects with patches, so fields it does not know are never lost).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};

use super::crds::GROUP;

/// `snapshot.storage.k8s.io/v1`.
pub const API_VERSION: &str = "snapshot.storage.k8s.io/v1";

/// A VolumeSnapshotClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    /// `snapshot.storage.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `VolumeSnapshotClass`.
    #[serde(default)]
    pub kind: String,
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The CSI driver.
    #[serde(default)]
    pub driver: String,
    /// Delete or Retain.
    #[serde(default)]
    pub deletion_policy: String,
    /// CreateSnapshot parameters (and secret references).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}
sidecar_kit::custom_resource!(
    VolumeSnapshotClass,
    GROUP,
    "v1",
    "VolumeSnapshotClass",
    "volumesnapshotclasses",
    ClusterResourceScope
);

/// A VolumeSnapshot's source: exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSource {
    /// A claim to snapshot (dynamic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    /// An existing content (pre-provisioned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// A VolumeSnapshot's spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// The source.
    #[serde(default)]
    pub source: SnapshotSource,
    /// The class (set to the default class when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// An error recorded in a status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotError {
    /// When.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// `message`: what failed, as the controller or the driver said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A VolumeSnapshot's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// The content it is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// Ready to restore from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The smallest volume it restores into, as a quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<String>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
}

/// A VolumeSnapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    /// `snapshot.storage.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `VolumeSnapshot`.
    #[serde(default)]
    pub kind: String,
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`: the source and the class.
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    /// `status`: the bound content, readiness, size, error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}
sidecar_kit::custom_resource!(
    VolumeSnapshot,
    GROUP,
    "v1",
    "VolumeSnapshot",
    "volumesnapshots",
    NamespaceResourceScope
);

/// A content's source: exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentSource {
    /// The CSI volume to snapshot (dynamic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    /// An existing CSI snapshot (pre-provisioned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

/// The VolumeSnapshot a content is bound to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRef {
    /// `snapshot.storage.k8s.io/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `VolumeSnapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `name` of the VolumeSnapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `namespace` of the VolumeSnapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// UID (empty until bound, for pre-provisioned contents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The snapshot's resourceVersion when the content was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// A content's spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// Delete or Retain.
    #[serde(default)]
    pub deletion_policy: String,
    /// The CSI driver.
    #[serde(default)]
    pub driver: String,
    /// The source.
    #[serde(default)]
    pub source: ContentSource,
    /// Filesystem or Block: the mode of the snapshotted volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
    /// The class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// The snapshot it is bound to.
    #[serde(default)]
    pub volume_snapshot_ref: SnapshotRef,
}

/// A content's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// The CSI snapshot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Unix nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// Ready to restore from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
}

/// A VolumeSnapshotContent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    /// `snapshot.storage.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `VolumeSnapshotContent`.
    #[serde(default)]
    pub kind: String,
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`: the driver, the source, the deletion policy, the snapshot it belongs to.
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    /// `status`: the handle, readiness, size, error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}
sidecar_kit::custom_resource!(
    VolumeSnapshotContent,
    GROUP,
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    ClusterResourceScope
);
