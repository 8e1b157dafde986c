//! Storage-object-in-use protection, as kube-controller-manager's pvc-protection and
//! pv-protection controllers do it: a claim keeps `kubernetes.io/pvc-protection` while a
//! scheduled Pod that has not finished uses it, a volume keeps `kubernetes.io/pv-protection`
//! while it is Bound. Objects lacking the finalizer get it (admission adds it in a real
//! cluster; the controller adds what admission missed).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::finalizers;
use sidecar_kit::patch_ops::Op;

/// The claim finalizer.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The volume finalizer.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// What to write to one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Protection {
    /// Nothing to write.
    Keep,
    /// Add the finalizer (JSON patch operations).
    Add(Vec<Op>),
    /// Remove it: the object is being deleted and nothing uses it.
    Release(Vec<Op>),
}

fn decide(meta: &ObjectMeta, finalizer: &str, in_use: bool) -> Protection {
    if meta.deletion_timestamp.is_none() {
        return finalizers::add_ops(meta, finalizer).map_or(Protection::Keep, Protection::Add);
    }
    if in_use {
        return Protection::Keep;
    }
    finalizers::remove_ops(meta, finalizer).map_or(Protection::Keep, Protection::Release)
}

/// Whether a Pod counts as using its claims: scheduled (kubelet only sees scheduled Pods) and
/// not finished.
pub fn pod_holds_claims(pod: &Pod) -> bool {
    super::consumers::on_node(pod) && !sidecar_kit::vocabulary::pod_finished(pod)
}

/// The claims a Pod names (its own namespace), generic ephemeral volumes' included.
pub use sidecar_kit::vocabulary::pod_claim_names as claims_of;

/// The claim's protection, given the Pods of its namespace.
pub fn claim<'a>(
    claim: &PersistentVolumeClaim,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Protection {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let namespace = claim.metadata.namespace.as_deref();
    let in_use = claim.metadata.deletion_timestamp.is_some()
        && pods.into_iter().any(|pod| {
            pod.metadata.namespace.as_deref() == namespace
                && pod_holds_claims(pod)
                && claims_of(pod).iter().any(|c| c == name)
        });
    decide(&claim.metadata, PVC_PROTECTION, in_use)
}

/// The volume's protection: in use while Bound.
pub fn volume(pv: &PersistentVolume) -> Protection {
    let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    decide(&pv.metadata, PV_PROTECTION, bound)
}
