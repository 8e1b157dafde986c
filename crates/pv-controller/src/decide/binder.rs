//! Binding claims to volumes, as kube-controller-manager's PV controller does it (seed 000,
//! "Controller workflow for provisioning volumes"): default class, pre-binding, the smallest
//! matching Available volume, else the class's provisioner; and the volume side: Available,
//! Bound, Released, and what reclaiming a Released volume means.

use sidecar_kit::vocabulary::pv_phase as phase;
use std::borrow::Borrow;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus,
};
use k8s_openapi::api::storage::v1::StorageClass;
pub use sidecar_kit::vocabulary::{
    ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER, ANN_PROVISIONED_BY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
};

use super::matching::claim_ref_names;
pub use super::matching::{Found, mismatch, named_volumes, volume_for_claim};
pub use super::reclaim::{
    awaits_external_deleter, host_path_deletable, host_path_deletion_stands, left_to_node_recyclers,
};
use super::reclaim::{reclaim, reclaim_policy};
use crate::decide::reasons::Reason;

/// The pseudo-provisioner of classes for static volumes only.
pub use sidecar_kit::vocabulary::NO_PROVISIONER;

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAction {
    /// Nothing (bound and consistent, or waiting for someone else).
    Nothing,
    /// Set `spec.storageClassName` to the default class (claims created with no class).
    AssignDefaultClass(String),
    /// Bind to this volume: write the volume's claimRef, then the claim.
    Bind(String),
    /// The volume already names the claim: finish the claim side and both phases.
    CompleteBinding(String),
    /// Ask the class's provisioner for a volume (annotate the claim).
    Provision {
        /// The provisioner.
        provisioner: String,
        /// Whether the annotations are already there (then only the event is due).
        annotated: bool,
    },
    /// The class's in-tree plugin (hostPath) takes it but cannot provision: annotate the claim
    /// as for [`ClaimAction::Provision`], then a Warning `ProvisioningFailed` with `message`,
    /// and the sync fails (retried with backoff).
    ProvisionRefused {
        /// The plugin.
        provisioner: String,
        /// Whether the annotations are already there.
        annotated: bool,
        /// The event's message, also the sync's error.
        message: String,
    },
    /// WaitForFirstConsumer class without a selected node: wait for the scheduler.
    WaitForFirstConsumer,
    /// Stay Pending, with an event.
    Pending {
        /// Event type.
        event: EventType,
        /// Event reason.
        reason: Reason,
        /// Event message.
        message: String,
    },
    /// A Warning event, the claim's status left as it is, and the sync fails with `error`
    /// (retried with backoff). Either the class's provisioner cannot be asked (the class is
    /// missing, or no plugin provisions for it: `ProvisioningFailed`, see
    /// [`ClaimAction::provisioning_failed`]; kube-controller-manager's `provisionClaim` returns
    /// before marking the claim), or the volume this controller named in the claim is held by
    /// another claim (`FailedBinding`; kube-controller-manager's "should never happen": someone
    /// removed the claim's `bind-completed`).
    Failed {
        /// The event's reason.
        reason: Reason,
        /// The event's message.
        message: String,
        /// The sync's error.
        error: String,
    },
    /// Stay Pending without an event (why, for the log), looked at again later.
    Wait(String),
    /// Set (`Some`) or remove (`None`) `pv.kubernetes.io/migrated-to` on the claim: the CSI
    /// driver that serves the in-tree plugin its storage-provisioner annotation names.
    MigratedTo(Option<String>),
    /// A bound claim lost its volume, or another claim holds it: phase Lost, with this
    /// Warning event.
    Lost {
        /// `ClaimLost` or `ClaimMisbound`.
        reason: Reason,
        /// kube-controller-manager's words.
        message: &'static str,
    },
}

impl ClaimAction {
    /// A Warning `ProvisioningFailed` event with `message`, which is also the sync's error.
    pub fn provisioning_failed(message: String) -> Self {
        ClaimAction::Failed {
            reason: Reason::ProvisioningFailed,
            error: message.clone(),
            message,
        }
    }
}

/// What to do with a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeAction {
    /// Nothing to write: the volume is as it should be.
    Nothing,
    /// Set the phase.
    SetPhase(&'static str),
    /// Remove a claimRef this controller set for a claim that bound elsewhere.
    Unbind,
    /// Clear the UID of a claimRef the user set, for a claim that bound elsewhere: the volume
    /// stays reserved for a claim of that name.
    ClearClaimUid,
    /// kube-controller-manager cannot reclaim it (no deleter or recycler for its source, an
    /// unknown policy): phase Failed, with this Warning event.
    Fail {
        /// The event's reason.
        reason: Reason,
        /// The event's message (and the volume's status message).
        message: String,
    },
    /// Set (`Some`) or remove (`None`) `pv.kubernetes.io/migrated-to`: the CSI driver that
    /// serves a volume an in-tree plugin provisioned.
    MigratedTo(Option<String>),
    /// Released with policy Recycle: scrub and make Available again.
    Recycle,
    /// Released with policy Delete, a hostPath volume under `/tmp/` ([`host_path_deletable`]):
    /// kube-controller-manager's hostPath deleter removes the path (on the controller's own
    /// host, as it does), then the PV goes.
    DeleteHostPath(String),
    /// Bound by its claimRef to a claim not bound yet whose volume mode is not the volume's:
    /// the claim's sync passes it over, so nothing binds; kube-controller-manager's two Warning
    /// `VolumeMismatch` events (on the volume and on this claim) say why.
    VolumeModeMismatch {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
    },
    /// The claim the volume is bound to is missing from the cache, or the cache holds a claim
    /// of that name with another UID: read it from the API server before releasing (a lagging
    /// claim watch must not release a volume whose claim exists), then decide again with what
    /// the server said ([`ClaimSource::Server`]).
    ReadClaimLive,
}

/// Where the claims a volume is decided on come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimSource {
    /// The informer cache, which may lag behind the server.
    Cache,
    /// A read from the API server.
    Server,
}

use k8s_openapi::api::core::v1::ObjectReference;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::{annotation, requested_class};

/// Whether kube-controller-manager marks the claim `Pending` after this decision
/// (`syncUnboundClaim`'s `updateClaimStatus(ClaimPending, nil)`): when it waits for its first
/// consumer, for the volume it names, or cannot bind (a mismatch, a volume bound elsewhere, no
/// class); not when it asks a provisioner, whose failure it only reports.
pub fn leaves_claim_pending(action: &ClaimAction) -> bool {
    match action {
        ClaimAction::WaitForFirstConsumer | ClaimAction::Wait(_) => true,
        ClaimAction::Pending { .. } => true,
        ClaimAction::Nothing
        | ClaimAction::AssignDefaultClass(_)
        | ClaimAction::Bind(_)
        | ClaimAction::CompleteBinding(_)
        | ClaimAction::Provision { .. }
        | ClaimAction::ProvisionRefused { .. }
        | ClaimAction::Failed { .. }
        | ClaimAction::MigratedTo(_)
        | ClaimAction::Lost { .. } => false,
    }
}

/// The status of a claim marked `Pending` with no volume, as kube-controller-manager writes it:
/// the phase, and neither access modes, capacity nor current attributes class. `None` when the claim has it already (no
/// write).
pub fn pending_status(claim: &PersistentVolumeClaim) -> Option<PersistentVolumeClaimStatus> {
    let mut status = claim.status.clone().unwrap_or_default();
    // Empty lists and maps are none (a server may send them back either way).
    status.access_modes = status.access_modes.filter(|m| !m.is_empty());
    status.capacity = status.capacity.filter(|c| !c.is_empty());
    let pending = PersistentVolumeClaimStatus {
        phase: Some("Pending".into()),
        access_modes: None,
        capacity: None,
        current_volume_attributes_class_name: None,
        ..status.clone()
    };
    (pending != status).then_some(pending)
}

/// Decides a claim, as kube-controller-manager's `syncClaim`: a claim whose binding completed
/// (`pv.kubernetes.io/bind-completed`) is checked against its volume; any other is bound to the
/// volume it names, one pre-bound to it or the best match, else provisioned.
pub fn decide_claim<V: Borrow<PersistentVolume>, C: Borrow<StorageClass>>(
    claim: &PersistentVolumeClaim,
    volumes: &[V],
    classes: &[C],
    default_class: Option<&StorageClass>,
) -> ClaimAction {
    let claim_phase = claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if let Some(update) = claim_migrated_to_update(claim) {
        return ClaimAction::MigratedTo(update);
    }
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    let named = volume_name.and_then(|name| {
        volumes
            .iter()
            .map(Borrow::borrow)
            .find(|v: &&PersistentVolume| v.metadata.name.as_deref() == Some(name))
    });
    if annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some() {
        return decide_bound_claim(claim, claim_phase, volume_name, named);
    }
    if let Some(volume_name) = volume_name {
        // kube-controller-manager records no event for a volume not there (yet).
        let Some(pv) = named else {
            return ClaimAction::Wait(format!("volume {volume_name:?} not found"));
        };
        let has_ref = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some();
        if !has_ref {
            return match mismatch(claim, pv) {
                None => ClaimAction::Bind(volume_name.to_string()),
                Some(why) => ClaimAction::Pending {
                    event: EventType::Warning,
                    reason: Reason::VolumeMismatch,
                    message: format!("Cannot bind to requested volume {volume_name:?}: {why}"),
                },
            };
        }
        if claim_ref_names(pv, claim) {
            return ClaimAction::CompleteBinding(volume_name.to_string());
        }
        let message = format!("volume {volume_name:?} already bound to a different claim.");
        if annotation(&claim.metadata, ANN_BOUND_BY_CONTROLLER).is_some() {
            let key = |ns: Option<&str>, name: Option<&str>| {
                format!("{}/{}", ns.unwrap_or_default(), name.unwrap_or_default())
            };
            let holder = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            return ClaimAction::Failed {
                reason: Reason::FailedBinding,
                message,
                error: format!(
                    "invalid binding of claim {:?} to volume {volume_name:?}: volume already claimed by {:?}",
                    key(
                        claim.metadata.namespace.as_deref(),
                        claim.metadata.name.as_deref()
                    ),
                    key(
                        holder.and_then(|r| r.namespace.as_deref()),
                        holder.and_then(|r| r.name.as_deref())
                    ),
                ),
            };
        }
        return ClaimAction::Pending {
            event: EventType::Warning,
            reason: Reason::FailedBinding,
            message,
        };
    }
    let class = requested_class(claim);
    let class_name = class.unwrap_or_default();
    let sc = classes
        .iter()
        .map(Borrow::borrow)
        .find(|c: &&StorageClass| {
            !class_name.is_empty() && c.metadata.name.as_deref() == Some(class_name)
        });
    let late =
        sc.is_some_and(|sc| sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    // A volume pre-bound to this claim (by its user, or the provisioner's PV for it) or, with
    // immediate binding, the best Available one: with late binding the scheduler picks the
    // volume (it pre-binds one for the node).
    match volume_for_claim(claim, volumes, late) {
        Some(Found::PreBound(pv)) => {
            return ClaimAction::CompleteBinding(pv.metadata.name.clone().unwrap_or_default());
        }
        Some(Found::Available(pv)) => {
            return ClaimAction::Bind(pv.metadata.name.clone().unwrap_or_default());
        }
        None => {}
    }
    // Present is enough, whatever its value (kube-controller-manager's
    // IsDelayBindingProvisioning).
    let selected = annotation(&claim.metadata, ANN_SELECTED_NODE).is_some();
    if late && !selected {
        return ClaimAction::WaitForFirstConsumer;
    }
    if class_name.is_empty() {
        // No volume fits: a claim created without a class gets the default one, if any.
        if class.is_none()
            && let Some(default) = default_class.and_then(|c| c.metadata.name.clone())
        {
            return ClaimAction::AssignDefaultClass(default);
        }
        return ClaimAction::Pending {
            event: EventType::Normal,
            reason: Reason::FailedBinding,
            message: "no persistent volumes available for this claim and no storage class is set"
                .into(),
        };
    }
    let Some(sc) = sc else {
        return ClaimAction::provisioning_failed(format!(
            "storageclass.storage.k8s.io {class_name:?} not found"
        ));
    };
    // kube-controller-manager looks for an in-tree plugin for a `kubernetes.io/` provisioner
    // that is not migrated to CSI (`kubernetes.io/no-provisioner` included); any other name is
    // an external provisioner's.
    let in_tree = sc.provisioner.starts_with("kubernetes.io/")
        && sidecar_kit::migration::Plugin::from_in_tree_name(&sc.provisioner).is_none();
    if in_tree || sc.provisioner.is_empty() {
        return super::in_tree::provisioning(claim, sc);
    }
    // CSI migration (on for every migratable plugin in kube-controller-manager): a class of an
    // in-tree plugin is provisioned by the CSI driver that stands in for it.
    let provisioner = sidecar_kit::migration::driver_of(&sc.provisioner);
    // kube-controller-manager's setClaimProvisioner looks at the GA name only (it writes both).
    let annotated = annotation(&claim.metadata, ANN_STORAGE_PROVISIONER) == Some(provisioner);
    ClaimAction::Provision {
        provisioner: provisioner.to_string(),
        annotated,
    }
}

/// kube-controller-manager's `updateMigrationAnnotations` for a claim: one whose
/// storage-provisioner annotation (GA, else beta) names a migrated in-tree plugin is marked
/// migrated to its CSI driver; the mark goes from any other. `None` when nothing changes.
fn claim_migrated_to_update(claim: &PersistentVolumeClaim) -> Option<Option<String>> {
    let named = annotation(&claim.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER))?;
    migration_mark(named, &claim.metadata)
}

/// kube-controller-manager's `syncBoundClaim`: a claim whose binding completed keeps its
/// volume, gets it back (a volume that lost its claimRef is bound again), or is Lost (once).
fn decide_bound_claim(
    claim: &PersistentVolumeClaim,
    claim_phase: &str,
    volume_name: Option<&str>,
    pv: Option<&PersistentVolume>,
) -> ClaimAction {
    let lost = |reason, message| {
        if claim_phase == "Lost" {
            ClaimAction::Nothing
        } else {
            ClaimAction::Lost { reason, message }
        }
    };
    let Some(name) = volume_name else {
        return lost(
            Reason::ClaimLost,
            "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
        );
    };
    let Some(pv) = pv else {
        return lost(
            Reason::ClaimLost,
            "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
        );
    };
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return ClaimAction::Bind(name.to_string());
    };
    if claim_ref.uid.as_deref().unwrap_or_default()
        == claim.metadata.uid.as_deref().unwrap_or_default()
    {
        // kube-controller-manager binds again each time (writing only what differs): a claim
        // whose access modes are not its volume's gets them.
        let modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_deref());
        let claim_modes = claim
            .status
            .as_ref()
            .and_then(|s| s.access_modes.as_deref());
        return if claim_phase == "Bound"
            && phase(pv) == "Bound"
            && super::binding::same_modes(claim_modes, modes)
        {
            ClaimAction::Nothing
        } else {
            ClaimAction::CompleteBinding(name.to_string())
        };
    }
    lost(
        Reason::ClaimMisbound,
        "Two claims are bound to the same volume, this one is bound incorrectly",
    )
}

/// Whether the resync queues `claim` because a volume no claimRef names may fit it: the claim
/// names no volume, and its class (none counting as `""`) is among `classes`, those of the
/// unbound volumes.
pub fn may_take_unbound_volume(
    claim: &PersistentVolumeClaim,
    classes: &std::collections::HashSet<String>,
) -> bool {
    let unbound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_none_or(str::is_empty);
    unbound && classes.contains(requested_class(claim).unwrap_or_default())
}

/// kube-controller-manager's `updateMigrationAnnotations` for a volume: one provisioned by a
/// migrated in-tree plugin is marked migrated to its CSI driver; the mark goes from any other.
/// `None` when nothing changes; `Some(None)` removes the mark.
fn migrated_to_update(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Option<String>> {
    migration_mark(annotation(meta, ANN_PROVISIONED_BY)?, meta)
}

/// The `pv.kubernetes.io/migrated-to` an object provisioned by (or for) `provisioner` should
/// carry: the CSI driver of a migrated in-tree plugin, else none. `None` when it has it.
fn migration_mark(
    provisioner: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Option<String>> {
    let current = annotation(meta, sidecar_kit::migration::ANN_MIGRATED_TO);
    match sidecar_kit::migration::Plugin::from_in_tree_name(provisioner) {
        Some(plugin) if current != Some(plugin.csi_name()) => {
            Some(Some(plugin.csi_name().to_string()))
        }
        Some(_) => None,
        None => current.filter(|m| !m.is_empty()).map(|_| None),
    }
}

/// The claim a claimRef names, if `claim` (the claim of that name) is still it: the same UID,
/// or any UID when the claimRef has none (a pre-binding by name).
pub fn bound_claim<'a>(
    claim_ref: &ObjectReference,
    claim: Option<&'a PersistentVolumeClaim>,
) -> Option<&'a PersistentVolumeClaim> {
    let ref_uid = claim_ref.uid.as_deref().unwrap_or_default();
    claim.filter(|c| ref_uid.is_empty() || c.metadata.uid.as_deref() == Some(ref_uid))
}

/// Whether the claim a volume was bound to is gone (deleted, or replaced by a new claim of the
/// same name): what releases the volume. A volume pre-bound by name only waits for its claim.
pub fn claim_is_gone(pv: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> bool {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    let bound_by_uid = claim_ref.uid.as_deref().is_some_and(|u| !u.is_empty());
    bound_by_uid && bound_claim(claim_ref, claim).is_none()
}

/// Decides a volume. `claims` are all claims (the decision looks up the one its claimRef names),
/// as `source` read them: a volume is released only once the server says its claim is gone.
pub fn decide_volume<P: Borrow<PersistentVolumeClaim>>(
    pv: &PersistentVolume,
    claims: &[P],
    source: ClaimSource,
) -> VolumeAction {
    let current = phase(pv);
    if let Some(update) = migrated_to_update(&pv.metadata) {
        return VolumeAction::MigratedTo(update);
    }
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return if current == "Available" {
            VolumeAction::Nothing
        } else {
            VolumeAction::SetPhase("Available")
        };
    };
    if claim_ref.uid.as_deref().is_none_or(str::is_empty) {
        // Reserved for a claim of that name; that claim's sync binds it.
        return if current == "Available" {
            VolumeAction::Nothing
        } else {
            VolumeAction::SetPhase("Available")
        };
    }
    let claim = claims
        .iter()
        .map(Borrow::borrow)
        .find(|c: &&PersistentVolumeClaim| {
            c.metadata.namespace == claim_ref.namespace && c.metadata.name == claim_ref.name
        });
    let ref_uid = claim_ref.uid.clone().unwrap_or_default();
    match bound_claim(claim_ref, claim) {
        None if ref_uid.is_empty() => {
            // Pre-bound to a claim that does not exist yet.
            if current == "Available" {
                VolumeAction::Nothing
            } else {
                VolumeAction::SetPhase("Available")
            }
        }
        None => {
            if current != "Released" && current != "Failed" {
                return match source {
                    ClaimSource::Cache => VolumeAction::ReadClaimLive,
                    ClaimSource::Server => VolumeAction::SetPhase("Released"),
                };
            }
            // Released, or Failed (kept, so the user sees what went wrong): its policy is
            // carried out again at every sync, as kube-controller-manager's `syncVolume` does
            // (a recycle that failed is tried again; a failure already shown is not repeated).
            reclaim(pv)
        }
        Some(claim) => {
            let bound_here = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                == pv.metadata.name.as_deref();
            let claim_volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_default();
            if bound_here {
                if current == "Bound" {
                    VolumeAction::Nothing
                } else {
                    VolumeAction::SetPhase("Bound")
                }
            } else if claim_volume.is_empty() {
                if super::matching::volume_modes_differ(claim, pv) {
                    return VolumeAction::VolumeModeMismatch {
                        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                        name: claim.metadata.name.clone().unwrap_or_default(),
                    };
                }
                // The claim is not bound yet: its sync binds it (to this volume, or another).
                VolumeAction::Nothing
            } else if annotation(&pv.metadata, ANN_PROVISIONED_BY).is_some()
                && reclaim_policy(pv) == "Delete"
            {
                // Provisioned for a claim that bound elsewhere: not needed; Released, then
                // reclaimed at each sync as any Released volume (an external provisioner's is
                // left to it; the hostPath deleter removes one of its own).
                if current == "Released" || current == "Failed" {
                    reclaim(pv)
                } else {
                    VolumeAction::SetPhase("Released")
                }
            } else if annotation(&pv.metadata, ANN_BOUND_BY_CONTROLLER).is_some() {
                VolumeAction::Unbind
            } else if claim_ref.uid.as_deref().is_some_and(|u| !u.is_empty()) {
                // Pre-bound by its user: it stays reserved for a claim of that name.
                VolumeAction::ClearClaimUid
            } else if current == "Available" {
                VolumeAction::Nothing
            } else {
                VolumeAction::SetPhase("Available")
            }
        }
    }
}

#[cfg(test)]
#[path = "binder_tests.rs"]
mod tests;
