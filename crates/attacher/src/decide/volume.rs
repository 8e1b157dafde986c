//! When a PersistentVolume's attacher finalizer goes: once no VolumeAttachment names it, when
//! the PV is being deleted or, as upstream, when it is an in-tree PV of a migrated plugin that
//! is not (or no longer) marked migrated to our driver (CSI migration turned off: the in-tree
//! attach/detach controller has it back).

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::migration::{ANN_MIGRATED_TO, is_migratable};
use sidecar_kit::patch_ops::Op;

/// Whether our finalizer has nothing to protect on `pv` any more, whoever names it.
pub fn releasable(pv: &PersistentVolume, driver: &str) -> bool {
    pv.metadata.deletion_timestamp.is_some() || handed_back(pv, driver)
}

/// An in-tree PV not marked migrated to `driver`.
fn handed_back(pv: &PersistentVolume, driver: &str) -> bool {
    is_migratable(pv)
        && sidecar_kit::vocabulary::annotation(&pv.metadata, ANN_MIGRATED_TO) != Some(driver)
}

/// The JSON patch removing `finalizer` from `pv`, or None while it must stay (the PV is not
/// [`releasable`], lacks the finalizer, or `named` says a VolumeAttachment still names it).
pub fn release(
    pv: &PersistentVolume,
    finalizer: &str,
    driver: &str,
    named: bool,
) -> Option<Vec<Op>> {
    if !releasable(pv, driver) || named {
        return None;
    }
    sidecar_kit::finalizers::remove_ops(&pv.metadata, finalizer)
}
