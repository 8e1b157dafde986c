//! What becomes of a Released volume, as kube-controller-manager reclaims it: left to an
//! external deleter, its hostPath deleter, a recycler, or Failed with its reasons.

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::vocabulary::annotation;
use sidecar_kit::vocabulary::pv_phase as phase;

use super::binder::{ANN_PROVISIONED_BY, VolumeAction};
use super::in_tree::{HOST_PATH, NEITHER_PROVISION_NOR_DELETE};
use crate::decide::reasons::Reason;

/// Whether an external deleter (a CSI provisioner) deletes the volume when it is released with
/// policy `Delete`: a CSI volume, one an external provisioner made, or one of a migrated plugin.
fn deleted_externally(pv: &PersistentVolume) -> bool {
    let migrated = migrated(pv);
    let external = provisioned_by(pv).is_some_and(|by| !by.starts_with("kubernetes.io/"));
    let csi = pv.spec.as_ref().is_some_and(|s| s.csi.is_some());
    migrated || external || csi
}

/// The plugin that provisioned the volume (`pv.kubernetes.io/provisioned-by`), unless empty.
fn provisioned_by(pv: &PersistentVolume) -> Option<&str> {
    annotation(&pv.metadata, ANN_PROVISIONED_BY).filter(|by| !by.is_empty())
}

/// Why no in-tree deleter takes a volume, in kube-controller-manager's words
/// (`findDeletablePlugin`): by the plugin that provisioned it, when that is an in-tree name
/// (its error as it is), otherwise by its source (wrapped with the volume's name): a source a
/// registered plugin serves (NFS, local) has no deleter, any other no plugin at all.
fn no_deleter(pv: &PersistentVolume, name: &str) -> String {
    if let Some(by) = provisioned_by(pv).filter(|by| *by != HOST_PATH) {
        return if NEITHER_PROVISION_NOR_DELETE.contains(&by) {
            "no deletable volume plugin matched".into()
        } else {
            format!("no volume plugin matched name: {by}")
        };
    }
    let served = pv
        .spec
        .as_ref()
        .is_some_and(|s| s.nfs.is_some() || s.local.is_some());
    let why = if served {
        "no deletable volume plugin matched"
    } else {
        "no volume plugin matched"
    };
    format!("error getting deleter volume plugin for volume {name:?}: {why}")
}

/// Whether the volume is marked migrated to a CSI driver (`pv.kubernetes.io/migrated-to`, not
/// empty).
fn migrated(pv: &PersistentVolume) -> bool {
    annotation(&pv.metadata, sidecar_kit::migration::ANN_MIGRATED_TO).is_some_and(|m| !m.is_empty())
}

/// Whether the volume is Released and waits for its external deleter: kube-controller-manager
/// times its `delete` operation from then to the volume's deletion.
pub fn awaits_external_deleter(pv: &PersistentVolume) -> bool {
    phase(pv) == "Released" && reclaim_policy(pv) == "Delete" && deleted_externally(pv)
}

/// What becomes of a Released volume by its reclaim policy, as kube-controller-manager's
/// `reclaimVolume`: its hostPath deleter, its recycler (`decide::recycle`; the stack's node
/// agents recycle CSI volumes), and what CSI drivers and their provisioners do.
pub(crate) fn reclaim(pv: &PersistentVolume) -> VolumeAction {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    // Migrated to a CSI driver: its provisioner reclaims it, whatever the policy (even one
    // kube-controller-manager does not know).
    if migrated(pv) {
        return VolumeAction::Nothing;
    }
    match reclaim_policy(pv) {
        "Retain" => VolumeAction::Nothing,
        "Recycle" => VolumeAction::Recycle,
        "Delete" => {
            let host_path = pv
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| h.path.clone());
            let in_tree_provisioner = provisioned_by(pv)
                .is_some_and(|by| by.starts_with("kubernetes.io/") && by != HOST_PATH);
            if in_tree_provisioner {
                // Looked for by that name first (before its source), and none deletes.
                VolumeAction::Fail {
                    reason: Reason::VolumeFailedDelete,
                    message: no_deleter(pv, name),
                }
            } else if deleted_externally(pv) {
                // An external deleter's (a CSI provisioner's).
                VolumeAction::Nothing
            } else if let Some(path) = host_path {
                if host_path_deletable(&path) {
                    VolumeAction::DeleteHostPath(path)
                } else {
                    VolumeAction::Fail {
                        reason: Reason::VolumeFailedDelete,
                        message: format!(
                            "host_path deleter only supports /tmp/.+ but received provided {path}"
                        ),
                    }
                }
            } else {
                VolumeAction::Fail {
                    reason: Reason::VolumeFailedDelete,
                    message: no_deleter(pv, name),
                }
            }
        }
        _ => VolumeAction::Fail {
            reason: Reason::VolumeUnknownReclaimPolicy,
            message: "Volume has unrecognized PersistentVolumeReclaimPolicy".into(),
        },
    }
}

/// Whether the hostPath deleter takes `path`: a path under `/tmp/` naming something there, with
/// no `..`. kube-controller-manager's pattern is `/tmp/.+` unanchored (`/home/me/tmp/x` and
/// `/tmp/../home` pass it); ours is anchored, since this controller may run on the user's own
/// machine (`volstack up`) where kube-controller-manager runs in a container.
pub fn host_path_deletable(path: &str) -> bool {
    let Some(under) = path.strip_prefix("/tmp/") else {
        return false;
    };
    !path.split('/').any(|c| c == "..") && under.split('/').any(|c| !c.is_empty() && c != ".")
}

/// Whether a volume read again from the API server is still the one to delete with the
/// hostPath deleter at `path`: Released (or Failed, a removal that failed being tried again),
/// policy Delete, that path (kube-controller-manager's `deleteVolumeOperation` reads the
/// volume again and checks it is still released).
pub fn host_path_deletion_stands(pv: &PersistentVolume, path: &str) -> bool {
    matches!(phase(pv), "Released" | "Failed")
        && reclaim_policy(pv) == "Delete"
        && pv.metadata.deletion_timestamp.is_none()
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .is_some_and(|h| h.path == path)
        && host_path_deletable(path)
}

pub(crate) fn reclaim_policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

/// Whether a Released `Recycle` volume is left to the node agents' recycler (the embedded
/// stack's agents recycle CSI volumes) rather than reported as not supported here.
pub fn left_to_node_recyclers(pv: &PersistentVolume, node_recyclers: bool) -> bool {
    node_recyclers && pv.spec.as_ref().is_some_and(|s| s.csi.is_some())
}
