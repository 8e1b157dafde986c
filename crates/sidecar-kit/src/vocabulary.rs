//! The words every controller shares: well-known annotations and finalizers (kube's and the
//! CSI sidecars' names), references to objects, and this machine's host name.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;

/// The provisioner a claim waits for (set by the PV controller).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The same, under its beta name (still written and read).
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The node the scheduler picked for a WaitForFirstConsumer claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The class of a claim, under its beta annotation (before `spec.storageClassName`).
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// A binding made by the PV controller (not by the user).
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// A claim whose binding the PV controller finished.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The provisioner that made a volume.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The default StorageClass.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The default StorageClass, beta name.
pub const ANN_BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// The Secret DeleteVolume needs, recorded on the volume.
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Its namespace.
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// The Secret ControllerModifyVolume needs, recorded on the volume.
pub const ANN_MODIFY_SECRET_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
/// Its namespace.
pub const ANN_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";
/// The external provisioner's finalizer on the volumes it deletes.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The reference to an object that claimRefs and events' involvedObject carry (apiVersion,
/// kind, namespace, name, uid, resourceVersion).
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    let mut r = object.object_ref(&());
    r.resource_version = object.meta().resource_version.clone();
    r
}

/// This machine's host name (event source host, leader identities): the kernel's, else
/// `$HOSTNAME`, else `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn references_name_the_object_as_claim_refs_and_events_do() {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = reference(&claim);
        assert_eq!(
            (
                r.api_version.as_deref(),
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref(),
                r.resource_version.as_deref()
            ),
            (
                Some("v1"),
                Some("PersistentVolumeClaim"),
                Some("ns"),
                Some("c"),
                Some("u"),
                Some("7")
            )
        );
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = reference(&pv);
        assert_eq!(
            (r.kind.as_deref(), r.namespace),
            (Some("PersistentVolume"), None)
        );
        assert!(!hostname().is_empty());
    }
}
