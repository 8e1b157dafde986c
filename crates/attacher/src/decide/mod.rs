//! Pure decisions of the attacher: observed objects in, data out (the plan for one
//! VolumeAttachment with its ControllerPublish/Unpublish request and API writes, the release of
//! a volume's finalizer, the drift the periodic reconcile repairs). Tested with tables in
//! `tests.rs`; the controller carries them out.

pub mod attach;
pub mod reconcile;
pub mod status;
pub mod volume;

#[cfg(test)]
mod tests;

use k8s_openapi::api::storage::v1::VolumeAttachment;

/// The annotation recording the driver's node id on a VolumeAttachment (read when the CSINode
/// is gone by the time of the detach).
pub const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";

/// What the driver is and can do, as the attacher needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverView {
    /// The driver's name (VolumeAttachments whose `spec.attacher` is this are ours).
    pub name: String,
    /// PUBLISH_UNPUBLISH_VOLUME: without it VolumeAttachments are only marked attached.
    pub publish_unpublish: bool,
    /// PUBLISH_READONLY: without it `readonly` is always false.
    pub publish_readonly: bool,
    /// SINGLE_NODE_MULTI_WRITER: changes how access modes map.
    pub single_node_multi_writer: bool,
    /// LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES: the periodic reconcile runs.
    pub list_published: bool,
}

/// Settings from flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--default-fstype`.
    pub default_fstype: String,
    /// `attachError.errorCode` is written (feature gate MutableCSINodeAllocatableCount).
    pub error_codes: bool,
}

/// The finalizer on VolumeAttachments and PersistentVolumes of `driver`:
/// `external-attacher/` and the driver's name with every character other than `[a-zA-Z0-9-]`
/// as `-` (and an `X` after a trailing `-`).
pub fn finalizer(driver: &str) -> String {
    format!(
        "external-attacher/{}",
        sidecar_kit::leader::lease_name(driver)
    )
}

/// The leader-election Lease of the attacher of `driver`.
pub fn lease(driver: &str) -> String {
    sidecar_kit::leader::lease_name(&format!("external-attacher-leader-{driver}"))
}

/// Whether a VolumeAttachment is for `driver`.
pub fn ours(va: &VolumeAttachment, driver: &str) -> bool {
    va.spec.attacher == driver
}

/// Whether a VolumeAttachment is being deleted.
pub fn deleting(va: &VolumeAttachment) -> bool {
    va.metadata.deletion_timestamp.is_some()
}

/// `status.attached`.
pub fn attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

/// What a watch event must change for the VolumeAttachment to be looked at again: its spec,
/// deletion, finalizers and `attached` (not its error fields, so that writing an error does
/// not cut a backoff short, as upstream).
pub fn fingerprint(va: &VolumeAttachment) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    va.metadata.uid.hash(&mut h);
    va.metadata.deletion_timestamp.is_some().hash(&mut h);
    va.metadata.finalizers.hash(&mut h);
    va.spec.node_name.hash(&mut h);
    va.spec.source.persistent_volume_name.hash(&mut h);
    va.spec.source.inline_volume_spec.is_some().hash(&mut h);
    attached(va).hash(&mut h);
    h.finish()
}
