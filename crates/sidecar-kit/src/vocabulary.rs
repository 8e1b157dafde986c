//! The words every controller shares: well-known annotations and finalizers (kube's and the
//! CSI sidecars' names), references to objects, and this machine's host name.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
/// Whether `claim` is the claim of `pod`'s ephemeral volume: the Pod controls it (its owner
/// reference names the Pod's UID). A claim of the same name that is not is never used for it.
pub fn claim_is_for_pod(
    claim: &PersistentVolumeClaim,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> bool {
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return false;
    };
    claim.metadata.owner_references.iter().flatten().any(|r| {
        r.controller == Some(true) && r.kind == "Pod" && r.api_version == "v1" && r.uid == uid
    })
}

/// kubelet's annotation on a Node: each CSI driver's node id, as a JSON object.
pub const ANN_NODE_IDS: &str = "csi.volume.kubernetes.io/nodeid";

/// The driver → node id map of a Node's `csi.volume.kubernetes.io/nodeid` annotation (empty
/// without it), or why it does not parse.
pub fn node_ids(
    meta: &ObjectMeta,
) -> Result<std::collections::BTreeMap<String, String>, serde_json::Error> {
    match annotation(meta, ANN_NODE_IDS) {
        Some(text) => serde_json::from_str(text),
        None => Ok(std::collections::BTreeMap::new()),
    }
}

/// The external provisioner's finalizer on the volumes it deletes.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The provisioner of classes whose volumes are made by hand.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// Finalizer on a claim that is the source of clones still being provisioned.
pub const CLONING_PROTECTION_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/cloning-protection";

/// A PV's phase (`""` before the PV controller has set one).
pub fn pv_phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// A PV's reclaim policy (`Retain` when unset, the API's default for static volumes).
pub fn pv_reclaim_policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

/// The time now, for the timestamps of objects (conditions).
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Now, as the API writes times (seconds, UTC).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Whether a Pod has finished (phase Succeeded or Failed): it holds no volume any more.
pub fn pod_finished(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The claims a Pod names (in its own namespace): its `persistentVolumeClaim` volumes, and
/// the claims of its generic ephemeral volumes (`<pod>-<volume>`).
pub fn pod_claim_names(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|volumes| {
            volumes
                .iter()
                .filter_map(|v| {
                    if let Some(c) = &v.persistent_volume_claim {
                        return Some(c.claim_name.clone());
                    }
                    v.ephemeral
                        .as_ref()
                        .map(|_| format!("{pod_name}-{}", v.name))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An annotation's value.
pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The class a claim asks for, as written: the beta annotation, else `spec.storageClassName`.
/// `Some("")` asks for no class (only volumes without one); `None` leaves it to the default
/// class.
pub fn requested_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| claim.spec.as_ref()?.storage_class_name.as_deref())
}

/// The name of a claim's class, if it has one (an empty request names none).
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    requested_class(claim).filter(|c| !c.is_empty())
}

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
    fn a_claims_class_is_the_beta_annotation_else_its_spec_and_empty_names_none() {
        let claim = |annotation: Option<&str>, spec: Option<&str>| PersistentVolumeClaim {
            metadata: ObjectMeta {
                annotations: annotation
                    .map(|a| [(ANN_BETA_STORAGE_CLASS.to_string(), a.to_string())].into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                storage_class_name: spec.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cases = [
            (None, None, None, None),
            (None, Some(""), Some(""), None),
            (None, Some("fast"), Some("fast"), Some("fast")),
            (Some("beta"), Some("fast"), Some("beta"), Some("beta")),
        ];
        for (annotation, spec, requested, named) in cases {
            let c = claim(annotation, spec);
            assert_eq!(requested_class(&c), requested, "{annotation:?} {spec:?}");
            assert_eq!(claim_class(&c), named, "{annotation:?} {spec:?}");
        }
    }

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
