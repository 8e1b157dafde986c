//! Upstream's cloning protection: a claim being cloned keeps the
//! `provisioner.storage.kubernetes.io/cloning-protection` finalizer until no clone of it is
//! pending and no CreateVolume copying its volume may still be in flight. Pure: the claims and
//! the intent log are read by the controller.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

/// Whether a claim in `namespace` still clones `source`: it names it in `dataSource` (kind
/// PersistentVolumeClaim) and is Pending (or has no phase yet). Upstream's cloning-protection
/// controller looks only at `dataSource`, in the same namespace.
pub fn clones_pending<'a>(
    source: &str,
    namespace: &str,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> bool {
    claims.into_iter().any(|c| {
        let names_source = cloned_claim(c).is_some_and(|(_, name)| name == source);
        let pending = c
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Pending");
        c.metadata.namespace.as_deref() == Some(namespace) && names_source && pending
    })
}

/// The claim a claim clones, as (namespace, name): its `dataSource` of kind
/// PersistentVolumeClaim, in its own namespace (what upstream's cloning protection follows).
pub fn cloned_claim(claim: &PersistentVolumeClaim) -> Option<(String, String)> {
    let source = claim.spec.as_ref()?.data_source.as_ref()?;
    (source.kind == "PersistentVolumeClaim").then(|| {
        (
            claim.metadata.namespace.clone().unwrap_or_default(),
            source.name.clone(),
        )
    })
}

/// What the cloning-protection controller does with a source claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloningProtection {
    /// Nothing: not being deleted, or without the finalizer.
    Nothing,
    /// Clones are still provisioned from it: look again later.
    Wait,
    /// Remove the finalizer (from the claim read live, written back with `update`, as
    /// upstream's RBAC grants).
    Release,
}

/// Decides the cloning-protection finalizer of a claim being deleted. `pending` is asked only
/// then (it reads the claim's clones and the intent log): whether a clone of it is Pending, or
/// a CreateVolume copying its volume may still be in flight (the intent log holds one whose
/// content source is the claim's volume, even if the clone's claim is gone); the source stays
/// until that is done.
pub fn cloning_protection(
    claim: &PersistentVolumeClaim,
    pending: impl FnOnce(&str, &str) -> bool,
) -> CloningProtection {
    let finalizer = sidecar_kit::vocabulary::CLONING_PROTECTION_FINALIZER;
    if !sidecar_kit::finalizers::has(&claim.metadata, finalizer)
        || claim.metadata.deletion_timestamp.is_none()
    {
        return CloningProtection::Nothing;
    }
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    if pending(namespace, name) {
        return CloningProtection::Wait;
    }
    CloningProtection::Release
}
