//! The stores the provisioner's decisions read (fed by `sidecar_kit::watch`).

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::runtime::reflector::Store;

/// The stores the decisions read.
#[derive(Clone)]
pub struct Caches {
    /// Claims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Volumes.
    pub volumes: Store<PersistentVolume>,
    /// Classes.
    pub classes: Store<StorageClass>,
    /// CSINodes (only with topology).
    pub csinodes: Store<CSINode>,
    /// Nodes (only with topology).
    pub nodes: Store<Node>,
    /// VolumeAttachments (only with PUBLISH_UNPUBLISH_VOLUME).
    pub attachments: Store<VolumeAttachment>,
    /// VolumeAttributesClasses (only with the gate).
    pub vacs: Store<VolumeAttributesClass>,
}
