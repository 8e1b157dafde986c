//! What completing a binding writes, as kube-controller-manager's `bind` does it in turn: the
//! volume's reference to the claim (`bindVolumeToClaim`), the volume's phase, the claim's volume
//! name and annotations (`bindClaimToVolume`), the claim's status (`updateClaimStatus`). Each
//! answers `None` when its object already says it, so a binding resumed after a failed write
//! (from up-to-date objects) repeats none of the writes that went through.

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus, PersistentVolumeStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use sidecar_kit::vocabulary::{ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, annotation, reference};

/// The size a volume had before an expansion its claim's filesystem has not caught up with
/// (kube-controller-manager's expand controller writes it): a claim bound to it records that
/// size, so the resize finishes on the node.
pub const ANN_PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// The volume with the claim's whole reference when its reference is missing or has no (or an
/// empty) UID: a volume pre-bound by name and namespace, by the user, so it gets no
/// `bound-by-controller`. Callers pass a volume whose reference names the claim (see
/// `claim_ref_names`). `None` when the reference has a UID (as a provisioned volume's has).
pub fn volume_bound_to(
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Option<PersistentVolume> {
    let has_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .is_some_and(|uid| !uid.is_empty());
    if has_uid {
        return None;
    }
    let mut whole = pv.clone();
    whole.spec.get_or_insert_with(Default::default).claim_ref = Some(reference(claim));
    Some(whole)
}

/// The volume let go of its claim (kube-controller-manager's `unbindVolume`): bound by the
/// controller (`bound-by-controller`), its claimRef and that annotation removed (no
/// annotations left: none at all); pre-bound by the user, only its claimRef's UID cleared, so
/// it stays reserved for a claim of that name.
pub fn volume_unbound(pv: &PersistentVolume) -> PersistentVolume {
    let mut updated = pv.clone();
    let by_controller = updated
        .metadata
        .annotations
        .as_mut()
        .and_then(|a| a.remove(ANN_BOUND_BY_CONTROLLER))
        .is_some();
    if updated
        .metadata
        .annotations
        .as_ref()
        .is_some_and(std::collections::BTreeMap::is_empty)
    {
        updated.metadata.annotations = None;
    }
    if let Some(spec) = updated.spec.as_mut() {
        if by_controller {
            spec.claim_ref = None;
        } else if let Some(claim_ref) = spec.claim_ref.as_mut() {
            claim_ref.uid = None;
        }
    }
    updated
}

/// The volume with its phase Bound (see [`volume_in_phase`]). `None` when it is Bound already.
pub fn volume_marked_bound(pv: &PersistentVolume) -> Option<PersistentVolume> {
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
        return None;
    }
    Some(volume_in_phase(pv, "Bound"))
}

/// The volume in `phase` with no status message, as kube-controller-manager's
/// `updateVolumePhase` writes a phase other than Failed (a Failed volume's message goes once
/// it is Available, Bound or Released again); the rest of its status as it is.
pub fn volume_in_phase(pv: &PersistentVolume, phase: &str) -> PersistentVolume {
    let mut updated = pv.clone();
    let status = updated
        .status
        .get_or_insert_with(PersistentVolumeStatus::default);
    status.phase = Some(phase.into());
    status.message = None;
    updated
}

/// The status of a claim that lost its volume, as kube-controller-manager's `updateClaimStatus`
/// without a volume writes it: phase Lost, no access modes, no capacity.
pub fn lost_status(claim: &PersistentVolumeClaim) -> PersistentVolumeClaimStatus {
    PersistentVolumeClaimStatus {
        phase: Some("Lost".into()),
        access_modes: None,
        capacity: None,
        ..claim.status.clone().unwrap_or_default()
    }
}

/// The claim with its side of a binding to `pv_name` written, as kube-controller-manager's
/// `bindClaimToVolume`: `spec.volumeName`, `bind-completed`, and `bound-by-controller` when the
/// controller names the volume (not when the claim named it). `None` when it has them.
pub fn claim_bound_to(
    claim: &PersistentVolumeClaim,
    pv_name: &str,
) -> Option<PersistentVolumeClaim> {
    let named = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv_name);
    if named && annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some() {
        return None;
    }
    let mut bound = claim.clone();
    bound.spec.get_or_insert_with(Default::default).volume_name = Some(pv_name.to_string());
    let annotations = bound
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations
        .entry(ANN_BIND_COMPLETED.into())
        .or_insert_with(|| "yes".into());
    if !named {
        annotations
            .entry(ANN_BOUND_BY_CONTROLLER.into())
            .or_insert_with(|| "yes".into());
    }
    Some(bound)
}

/// The status of a claim bound to `pv`, as kube-controller-manager's `updateClaimStatus` with
/// a volume writes it: phase Bound, the volume's capacity and access modes, and, going from
/// Pending, its attributes class as the current one. A volume with a
/// [`ANN_PRE_RESIZE_CAPACITY`] gives that size instead (its own when the annotation does not
/// parse as a quantity), the claim's other capacities kept. A claim Bound already gets only the
/// volume's access modes when they differ (its capacity may differ on purpose); `None` when
/// nothing changes.
pub fn bound_status(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Option<PersistentVolumeClaimStatus> {
    let mut status = claim.status.clone().unwrap_or_default();
    let spec = pv.spec.as_ref();
    if status.phase.as_deref() == Some("Bound") {
        let modes = spec.and_then(|s| s.access_modes.clone());
        if same_modes(status.access_modes.as_deref(), modes.as_deref()) {
            return None;
        }
        status.access_modes = modes;
        return Some(status);
    }
    if status.phase.as_deref().is_none_or(|p| p == "Pending") {
        status.current_volume_attributes_class_name =
            spec.and_then(|s| s.volume_attributes_class_name.clone());
    }
    status.phase = Some("Bound".into());
    status.capacity = match annotation(&pv.metadata, ANN_PRE_RESIZE_CAPACITY) {
        Some(before) => {
            let size = if sidecar_kit::quantity::Quantity::parse(before).is_ok() {
                Quantity(before.to_string())
            } else {
                spec.and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("storage").cloned())
                    .unwrap_or_else(|| Quantity("0".into()))
            };
            let mut capacity = status.capacity.take().unwrap_or_default();
            capacity.insert("storage".into(), size);
            Some(capacity)
        }
        None => spec.and_then(|s| s.capacity.clone()),
    };
    status.access_modes = spec.and_then(|s| s.access_modes.clone());
    Some(status)
}

/// Whether two lists of access modes are the same, an empty list being none (a server may send
/// either back).
pub fn same_modes(a: Option<&[String]>, b: Option<&[String]>) -> bool {
    a.filter(|m| !m.is_empty()) == b.filter(|m| !m.is_empty())
}
