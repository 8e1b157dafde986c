//! The periodic reconcile: the driver's published nodes (ListVolumes) against
//! `status.attached`. A VolumeAttachment where they disagree is synced again with force: an
//! attached one the driver lost is published again, a detached or deleting one the driver still
//! publishes is unpublished.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};

use super::attach::{node_id_for_detach, volume_spec};
use super::attached;

/// The driver's view: volume id → ids of the nodes it is published to.
pub type Published = HashMap<String, HashSet<String>>;

/// Whether a forced sync still stands when its worker runs: the reconcile judged the version
/// `judged` against the driver, and the cache now holds `current`. A judgement on a version
/// the cache has since replaced, or made while our own status write had not reached the cache
/// (`own_write_pending`), compared the driver with a stale object (an attach in flight looks
/// like drift: published, not yet marked attached). The sync then goes on without force and
/// the next pass judges again.
pub fn force_stands(judged: Option<&str>, current: Option<&str>, own_write_pending: bool) -> bool {
    !own_write_pending && judged.is_some() && judged == current
}

/// The names of the VolumeAttachments of `driver` to sync again with force. Those whose volume
/// or node cannot be resolved are skipped (their normal sync reports why).
pub fn drift<'a>(
    vas: impl IntoIterator<Item = &'a VolumeAttachment>,
    volume: impl Fn(&str) -> Option<&'a PersistentVolume>,
    csinode: impl Fn(&str) -> Option<&'a CSINode>,
    driver: &str,
    published: &Published,
) -> Vec<String> {
    let mut out = Vec::new();
    for va in vas {
        if va.spec.attacher != driver {
            continue;
        }
        let pv = va
            .spec
            .source
            .persistent_volume_name
            .as_deref()
            .and_then(&volume);
        let Ok(spec) = volume_spec(va, pv) else {
            continue;
        };
        let Some(source) = spec.csi.as_ref() else {
            continue;
        };
        let Ok(node_id) = node_id_for_detach(va, csinode(&va.spec.node_name), None, driver) else {
            continue;
        };
        // A migrated in-tree volume's handle as the driver lists it (upstream's
        // RepairVolumeHandle; one that cannot be made whole is skipped, as upstream skips it).
        let handle = if pv.is_some_and(sidecar_kit::migration::is_migratable) {
            match sidecar_kit::migration::repair_volume_handle(
                &source.driver,
                &source.volume_handle,
                &node_id,
            ) {
                Ok(handle) => handle,
                Err(_) => continue,
            }
        } else {
            source.volume_handle.clone()
        };
        let on_node = published
            .get(&handle)
            .is_some_and(|nodes| nodes.contains(&node_id));
        if on_node != attached(va) {
            out.push(va.metadata.name.clone().unwrap_or_default());
        }
    }
    out
}
