//! kube-controller-manager's in-tree volume plugins, as its PV controller finds them
//! (`ProbeControllerVolumePlugins`): hostPath, NFS, local volumes and the CSI plugin are
//! registered; of those only hostPath provisions (when kube-controller-manager runs with
//! `--enable-hostpath-provisioner`, off by default) and deletes. Every other `kubernetes.io/`
//! name is no plugin at all (migrated ones are served by their CSI driver before this).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use sidecar_kit::vocabulary::annotation;

use super::binder::{ANN_STORAGE_PROVISIONER, ClaimAction};

/// The hostPath plugin: it provisions (when enabled) and deletes.
pub const HOST_PATH: &str = "kubernetes.io/host-path";

/// The other plugins registered: found by name, but none provisions or deletes.
pub const NEITHER_PROVISION_NOR_DELETE: [&str; 3] = [
    "kubernetes.io/nfs",
    "kubernetes.io/local-volume",
    "kubernetes.io/csi",
];

/// What kube-controller-manager's `provisionClaim` does for a class whose provisioner is an
/// in-tree name (not migrated) or empty. An unknown name: Warning `ProvisioningFailed` `no
/// volume plugin matched name: …`; a registered plugin that does not provision: `no
/// provisionable volume plugin matched`; hostPath (`provisionClaimOperation`): a claim with a
/// data source is refused first; otherwise the claim is annotated as for any provisioner, then
/// refused, for the class's mount options (the plugin takes none) or because hostPath
/// provisioning is off (kube-controller-manager's default; this controller has no such
/// provisioner).
pub fn provisioning(claim: &PersistentVolumeClaim, class: &StorageClass) -> ClaimAction {
    let name = class.provisioner.as_str();
    if NEITHER_PROVISION_NOR_DELETE.contains(&name) {
        return ClaimAction::provisioning_failed("no provisionable volume plugin matched".into());
    }
    if name != HOST_PATH {
        return ClaimAction::provisioning_failed(format!("no volume plugin matched name: {name}"));
    }
    if claim.spec.as_ref().is_some_and(|s| s.data_source.is_some()) {
        return ClaimAction::provisioning_failed(format!(
            "plugin {name:?} is not a CSI plugin. Only CSI plugin can provision a claim with a datasource"
        ));
    }
    let mount_options = class.mount_options.as_deref().unwrap_or_default();
    let message = if mount_options.is_empty() {
        format!("Failed to create provisioner: provisioning in volume plugin {name:?} is disabled")
    } else {
        format!(
            "Mount options are not supported by the provisioner but StorageClass {:?} has mount options [{}]",
            class.metadata.name.as_deref().unwrap_or_default(),
            mount_options.join(" ")
        )
    };
    ClaimAction::ProvisionRefused {
        provisioner: name.to_string(),
        annotated: annotation(&claim.metadata, ANN_STORAGE_PROVISIONER) == Some(name),
        message,
    }
}
