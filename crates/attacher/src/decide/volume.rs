//! When a PersistentVolume's attacher finalizer goes: the PV is being deleted and no
//! VolumeAttachment names it any more.

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::patch_ops::Op;

/// The JSON patch removing `finalizer` from `pv`, or None while it must stay (the PV is not
/// being deleted, lacks the finalizer, or `named` says a VolumeAttachment still names it).
pub fn release(pv: &PersistentVolume, finalizer: &str, named: bool) -> Option<Vec<Op>> {
    if pv.metadata.deletion_timestamp.is_none() || named {
        return None;
    }
    sidecar_kit::finalizers::remove_ops(&pv.metadata, finalizer)
}
