//! The stores the provisioner's decisions read (fed by `sidecar_kit::watch`).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::runtime::reflector::Store;
use sidecar_kit::compact::CompactStore;

/// The stores the decisions read.
#[derive(Clone)]
pub struct Caches {
    /// Claims (one per volume: kept as JSON, see [`sidecar_kit::compact`]).
    pub claims: CompactStore<PersistentVolumeClaim>,
    /// Volumes (kept as JSON).
    pub volumes: CompactStore<PersistentVolume>,
    /// StorageClasses (a claim's class, read by name).
    pub classes: Store<StorageClass>,
    /// VolumeAttachments (only with PUBLISH_UNPUBLISH_VOLUME).
    pub attachments: Store<VolumeAttachment>,
    /// Claims by the claim they clone (in their namespace): a source being deleted looks at
    /// its clones, not at every claim.
    pub clones: std::sync::Arc<sidecar_kit::watch_index::ByReference<PersistentVolumeClaim>>,
}

/// Drops what the provisioner never reads of a claim: its status but the phase (a clone's
/// source must be Bound), labels and the creation time.
pub fn shrink_claim(claim: &mut PersistentVolumeClaim) {
    claim.status = claim
        .status
        .take()
        .and_then(|status| status.phase)
        .map(
            |phase| k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                phase: Some(phase),
                ..Default::default()
            },
        );
    claim.metadata.labels = None;
    claim.metadata.creation_timestamp = None;
}

/// What the PV cache keeps beyond what the deleter reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keep {
    /// Node affinity (capacity tracking and node deployment read it).
    pub affinity: bool,
    /// Labels and capacity (the set manager reads them).
    pub labels_and_size: bool,
}

/// Drops what the deleter never reads of a PV: the creation time, everything but the phase in
/// the status, labels
/// and capacity (unless kept), node affinity (unless kept), access modes, mount options, volume
/// attributes and the secret references (the deletion secret is read from the annotations).
pub fn shrink_volume(pv: &mut PersistentVolume, keep: Keep) {
    if !keep.labels_and_size {
        pv.metadata.labels = None;
    }
    pv.metadata.creation_timestamp = None;
    if let Some(status) = pv.status.as_mut() {
        status.message = None;
        status.reason = None;
        status.last_phase_transition_time = None;
    }
    if let Some(spec) = pv.spec.as_mut() {
        if !keep.affinity {
            spec.node_affinity = None;
        }
        if !keep.labels_and_size {
            spec.capacity = None;
        }
        spec.access_modes = None;
        spec.mount_options = None;
        if let Some(csi) = spec.csi.as_mut() {
            csi.volume_attributes = None;
            csi.controller_publish_secret_ref = None;
            csi.node_stage_secret_ref = None;
            csi.node_publish_secret_ref = None;
            csi.controller_expand_secret_ref = None;
            csi.node_expand_secret_ref = None;
        }
    }
}
