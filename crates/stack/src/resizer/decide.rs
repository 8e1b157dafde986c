//! Pure decisions of the resizer: whether a claim's volume must grow (ControllerExpandVolume,
//! then the node's part) or change its class of attributes (ControllerModifyVolume), the
//! requests, and the claim's status at each step, as external-resizer writes it with the
//! recovery from failed expansion (`allocatedResources`, `allocatedResourceStatuses`).

use std::collections::HashMap;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use serde_json::{Value, json};
use sidecar_kit::quantity::{claim_request_bytes, format_binary_si, parse_bytes};
use sidecar_kit::secrets::SecretRef;

/// Claim condition while the controller part of an expansion runs.
pub const RESIZING: &str = "Resizing";
/// Claim condition once the controller part is done and the node's part is due.
pub const FS_RESIZE_PENDING: &str = "FileSystemResizePending";
/// Claim condition after ControllerExpandVolume failed.
pub const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
/// Claim condition after NodeExpandVolume failed.
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";
/// Claim condition while ControllerModifyVolume runs (or is retried).
pub const MODIFYING: &str = "ModifyingVolume";
/// Claim condition after ControllerModifyVolume failed.
pub const MODIFY_ERROR: &str = "ModifyVolumeError";

/// The conditions the resizer and the node own (replaced, never duplicated).
const RESIZE_CONDITIONS: [&str; 4] = [
    RESIZING,
    FS_RESIZE_PENDING,
    CONTROLLER_RESIZE_ERROR,
    NODE_RESIZE_ERROR,
];

/// `status.allocatedResourceStatuses["storage"]` values.
pub mod resize_status {
    /// ControllerExpandVolume is (or may be) running.
    pub const CONTROLLER_IN_PROGRESS: &str = "ControllerResizeInProgress";
    /// The driver refused the size for good (retried only when the request changes).
    pub const CONTROLLER_INFEASIBLE: &str = "ControllerResizeInfeasible";
    /// The node's part (NodeExpandVolume) is due.
    pub const NODE_PENDING: &str = "NodeResizePending";
    /// NodeExpandVolume is running.
    pub const NODE_IN_PROGRESS: &str = "NodeResizeInProgress";
    /// The node refused the size for good.
    pub const NODE_INFEASIBLE: &str = "NodeResizeInfeasible";
}

/// `status.modifyVolumeStatus.status` values.
pub mod modify_status {
    /// The class does not exist (yet).
    pub const PENDING: &str = "Pending";
    /// ControllerModifyVolume is running.
    pub const IN_PROGRESS: &str = "InProgress";
    /// The driver refused the parameters for good.
    pub const INFEASIBLE: &str = "Infeasible";
}

/// What the served driver can do, from its controller capabilities.
#[derive(Debug, Clone, Copy)]
pub struct Driver<'a> {
    /// Its name (volumes of other drivers are left alone).
    pub name: &'a str,
    /// EXPAND_VOLUME: without it the size is recorded and only the node grows the volume.
    pub expands: bool,
    /// The node service's EXPAND_VOLUME (with neither, no claim is grown).
    pub node_expands: bool,
    /// MODIFY_VOLUME.
    pub modifies: bool,
}

/// Growing a claim's volume.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    /// The PV.
    pub pv: String,
    /// The new size in bytes.
    pub to: i64,
    /// ControllerExpandVolume; None when the driver has no controller part ("trivial resize":
    /// the new size is recorded and the node's part follows).
    pub request: Option<csi::ControllerExpandVolumeRequest>,
    /// `controllerExpandSecretRef`, fetched at call time.
    pub secret: Option<SecretRef>,
}

/// Changing a claim's volume to another VolumeAttributesClass.
#[derive(Debug, Clone, PartialEq)]
pub enum Modification {
    /// The class named does not exist: the claim says Pending.
    Pending {
        /// The class named.
        target: String,
    },
    /// ControllerModifyVolume with the class's parameters.
    Modify {
        /// The PV.
        pv: String,
        /// The class.
        target: String,
        /// The call (secrets added at call time).
        request: csi::ControllerModifyVolumeRequest,
        /// The Secret the provisioner recorded on the PV for ControllerModifyVolume, else
        /// `controllerExpandSecretRef`.
        secret: Option<SecretRef>,
    },
}

/// The bound volume of `claim`, when it is `driver`'s and bound to this claim, with its
/// CSI source.
fn our_volume<'a>(
    claim: &PersistentVolumeClaim,
    volume: Option<&'a PersistentVolume>,
    driver: &str,
) -> Option<(
    &'a PersistentVolume,
    &'a k8s_openapi::api::core::v1::CSIPersistentVolumeSource,
)> {
    let status = claim.status.as_ref()?;
    if status.phase.as_deref() != Some("Bound") || claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let volume = volume?;
    let spec = volume.spec.as_ref()?;
    let bound_to_claim = spec
        .claim_ref
        .as_ref()
        .is_some_and(|r| r.uid.is_none() || r.uid == claim.metadata.uid);
    let source = spec.csi.as_ref()?;
    (bound_to_claim && source.driver == driver).then_some((volume, source))
}

/// A quantity map's `storage` in bytes.
fn storage(
    map: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Option<i64> {
    parse_bytes(&map?.get("storage")?.0).ok()
}

/// The claim's `allocatedResourceStatuses["storage"]`.
pub fn allocated_status(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get("storage")
        .map(String::as_str)
}

/// What the resizer decides from, of a claim, hashed: its request, class of attributes, phase,
/// volume, recorded capacity and class, and resize status. A change of any of these brings
/// the claim back; its other status writes (conditions) do not. A hash, not text: it is
/// made for every claim event and kept for every claim.
pub fn fingerprint(claim: &PersistentVolumeClaim) -> u64 {
    use std::hash::{Hash, Hasher};
    let spec = claim.spec.as_ref();
    let status = claim.status.as_ref();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        claim_request_bytes(claim),
        spec.and_then(|s| s.volume_attributes_class_name.as_deref()),
        spec.and_then(|s| s.volume_name.as_deref()),
        status.and_then(|s| s.phase.as_deref()),
        claim_capacity(claim),
        allocated_status(claim),
        status.and_then(|s| s.current_volume_attributes_class_name.as_deref()),
        status.map(|s| s.modify_volume_status.is_none()),
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// The PV's capacity in bytes.
pub fn volume_size(volume: &PersistentVolume) -> Option<i64> {
    storage(volume.spec.as_ref()?.capacity.as_ref())
}

/// The claim's `status.capacity` in bytes.
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<i64> {
    storage(claim.status.as_ref()?.capacity.as_ref())
}

/// The expansion a claim needs, if any: its request is above its recorded capacity, and the
/// size to ask for follows external-resizer's recovery rules (an expansion in progress keeps
/// its allocated size; one whose controller part is done waits for the node). A size the
/// driver refused for good is asked again only when the request changes.
pub fn expansion(
    claim: &PersistentVolumeClaim,
    volume: Option<&PersistentVolume>,
    driver: Driver<'_>,
) -> Option<Expansion> {
    if !(driver.expands || driver.node_expands) {
        return None;
    }
    let (volume, source) = our_volume(claim, volume, driver.name)?;
    let spec_size = claim_request_bytes(claim)?;
    if claim_capacity(claim).is_some_and(|c| c >= spec_size) {
        return None;
    }
    let size = volume_size(volume).unwrap_or(0);
    let status = allocated_status(claim);
    let allocated = storage(claim.status.as_ref()?.allocated_resources.as_ref());
    use resize_status::*;
    let to = if size < spec_size {
        match status {
            Some(NODE_PENDING | NODE_IN_PROGRESS) => {
                let allocated = allocated.unwrap_or(spec_size);
                if size >= allocated {
                    return None;
                }
                allocated
            }
            Some(CONTROLLER_IN_PROGRESS | NODE_INFEASIBLE) => allocated.unwrap_or(spec_size),
            Some(CONTROLLER_INFEASIBLE) if allocated == Some(spec_size) => return None,
            _ => spec_size,
        }
    } else {
        match status {
            Some(NODE_PENDING | NODE_IN_PROGRESS) => return None,
            Some(CONTROLLER_INFEASIBLE | NODE_INFEASIBLE) if allocated == Some(spec_size) => {
                return None;
            }
            Some(CONTROLLER_IN_PROGRESS | CONTROLLER_INFEASIBLE | NODE_INFEASIBLE) => {
                allocated.unwrap_or(spec_size)
            }
            _ if allocated.is_none() && has_condition(claim, FS_RESIZE_PENDING) => return None,
            _ => allocated.unwrap_or(spec_size),
        }
    };
    let spec = volume.spec.as_ref()?;
    let request = driver.expands.then(|| csi::ControllerExpandVolumeRequest {
        volume_id: source.volume_handle.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: to,
            limit_bytes: 0,
        }),
        secrets: HashMap::new(),
        volume_capability: sidecar_kit::pv_csi::capability(spec, false, "").ok(),
    });
    Some(Expansion {
        pv: volume.metadata.name.clone()?,
        to,
        request,
        secret: SecretRef::of(source.controller_expand_secret_ref.as_ref()),
    })
}

fn has_condition(claim: &PersistentVolumeClaim, kind: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind))
}

/// The change of class a claim needs, if any: `spec.volumeAttributesClassName` differs from
/// the class its volume has (`status.currentVolumeAttributesClassName`). A class the driver
/// refused for good is tried again only when the claim names another.
pub fn modification(
    claim: &PersistentVolumeClaim,
    volume: Option<&PersistentVolume>,
    class: impl FnOnce(&str) -> Option<VolumeAttributesClass>,
    driver: Driver<'_>,
) -> Option<Modification> {
    if !driver.modifies {
        return None;
    }
    let (volume, source) = our_volume(claim, volume, driver.name)?;
    let target = claim
        .spec
        .as_ref()?
        .volume_attributes_class_name
        .clone()
        .filter(|t| !t.is_empty())?;
    let status = claim.status.as_ref()?;
    let last = status.modify_volume_status.as_ref();
    // Settled on the class named; with a change to another class left over (pending, or
    // refused), the named one is applied again, which also undoes a partial change.
    if status.current_volume_attributes_class_name.as_deref() == Some(target.as_str())
        && last.is_none()
    {
        return None;
    }
    if last.is_some_and(|m| {
        m.status == modify_status::INFEASIBLE
            && m.target_volume_attributes_class_name.as_deref() == Some(target.as_str())
    }) {
        return None;
    }
    // As external-resizer: the class's driverName is not compared with the driver.
    let Some(found) = class(&target) else {
        return Some(Modification::Pending { target });
    };
    let annotations = volume.metadata.annotations.as_ref();
    // The Secret the provisioner recorded for ControllerModifyVolume, else the expansion's.
    let secret = annotations
        .and_then(|a| {
            Some(SecretRef {
                name: a
                    .get(sidecar_kit::vocabulary::ANN_MODIFY_SECRET_NAME)?
                    .clone(),
                namespace: a
                    .get(sidecar_kit::vocabulary::ANN_MODIFY_SECRET_NAMESPACE)?
                    .clone(),
            })
        })
        .or_else(|| SecretRef::of(source.controller_expand_secret_ref.as_ref()));
    Some(Modification::Modify {
        pv: volume.metadata.name.clone()?,
        request: csi::ControllerModifyVolumeRequest {
            volume_id: source.volume_handle.clone(),
            secrets: HashMap::new(),
            mutable_parameters: found.parameters.unwrap_or_default().into_iter().collect(),
        },
        target,
        secret,
    })
}

/// The claim's conditions without those of types `dropped`, with `added` (a merge patch
/// replaces the whole list; none left: null, the field goes).
fn conditions(claim: &PersistentVolumeClaim, dropped: &[&str], added: Option<Value>) -> Value {
    let mut out: Vec<Value> = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !dropped.contains(&c.type_.as_str()))
        .filter(|c| added.as_ref().is_none_or(|a| a["type"] != c.type_.as_str()))
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    out.extend(added);
    if out.is_empty() {
        return Value::Null;
    }
    Value::Array(out)
}

fn condition(kind: &str, reason: &str, message: &str, now: &str) -> Value {
    let mut c = json!({
        "type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now,
    });
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    c
}

/// The claim's status patch as ControllerExpandVolume starts: the size allocated, the
/// controller's part in progress, condition `Resizing` in place of the other resize ones.
pub fn resize_started(claim: &PersistentVolumeClaim, to: i64, now: &str) -> Value {
    json!({"status": {
        "allocatedResources": {"storage": format_binary_si(to)},
        "allocatedResourceStatuses": {"storage": resize_status::CONTROLLER_IN_PROGRESS},
        "conditions": conditions(claim, &RESIZE_CONDITIONS, Some(condition(RESIZING, "", "", now))),
    }})
}

/// The message of condition `FileSystemResizePending`.
pub const FS_RESIZE_PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// The claim's status patch once the driver grew the volume to `capacity`: the node's part
/// pending (`FileSystemResizePending` added), or, without one, the new capacity.
pub fn resize_done(
    claim: &PersistentVolumeClaim,
    capacity: i64,
    node_part: bool,
    now: &str,
) -> Value {
    if node_part {
        let pending = condition(FS_RESIZE_PENDING, "", FS_RESIZE_PENDING_MESSAGE, now);
        return json!({"status": {
            "allocatedResourceStatuses": {"storage": resize_status::NODE_PENDING},
            "conditions": conditions(claim, &[], Some(pending)),
        }});
    }
    finished(claim, capacity)
}

/// The claim's status patch once a volume has its new size everywhere: the capacity, no
/// resize status, no resize condition.
pub fn finished(claim: &PersistentVolumeClaim, capacity: i64) -> Value {
    // The map goes with its last entry, as upstream's patch leaves it.
    let others = claim
        .status
        .as_ref()
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .is_some_and(|m| m.keys().any(|k| k != "storage"));
    let statuses = if others {
        json!({"storage": null})
    } else {
        Value::Null
    };
    json!({"status": {
        "capacity": {"storage": format_binary_si(capacity)},
        "allocatedResourceStatuses": statuses,
        "conditions": conditions(claim, &RESIZE_CONDITIONS, None),
    }})
}

/// Whether the PV's `pre-resize-capacity` annotation can go: the claim records at least the
/// PV's capacity (the node's part is done).
pub fn pre_resize_annotation_done(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    driver: &str,
) -> bool {
    if our_volume(claim, Some(volume), driver).is_none() {
        return false;
    }
    let annotated = volume
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(super::ANN_PRE_RESIZE_CAPACITY));
    annotated
        && matches!(
            (claim_capacity(claim), volume_size(volume)),
            (Some(recorded), Some(size)) if recorded >= size
        )
}

/// Whether a CSI code means the driver refused the size for good (the user must change the
/// request): InvalidArgument, OutOfRange, NotFound.
pub fn infeasible(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::NotFound
    )
}

/// Whether a CSI code means the driver may still be working on the request (the call's
/// outcome is uncertain): the codes that are not final ([`sidecar_kit::csi::is_final`]).
pub fn uncertain(code: tonic::Code) -> bool {
    !sidecar_kit::csi::is_final(code)
}

/// The claim's status patch after ControllerExpandVolume failed with `code` and `error` (the
/// call's error as printed), or None when the outcome is uncertain (nothing is written and
/// the expansion stays in progress).
pub fn resize_failed(
    claim: &PersistentVolumeClaim,
    code: tonic::Code,
    error: &str,
    now: &str,
) -> Option<Value> {
    if uncertain(code) {
        return None;
    }
    let message = format!("failed to expand pvc with {error}");
    let failed = condition(CONTROLLER_RESIZE_ERROR, "", &message, now);
    let mut status = json!({"conditions": conditions(claim, &[], Some(failed))});
    if infeasible(code) {
        status["allocatedResourceStatuses"] =
            json!({"storage": resize_status::CONTROLLER_INFEASIBLE});
    }
    Some(json!({ "status": status }))
}

/// The claim's status patch while its class named does not exist.
pub fn modify_pending() -> Value {
    json!({"status": {"modifyVolumeStatus": {
        "targetVolumeAttributesClassName": null, "status": modify_status::PENDING,
    }}})
}

/// The claim's status patch as ControllerModifyVolume starts.
pub fn modify_started(claim: &PersistentVolumeClaim, target: &str, now: &str) -> Value {
    let message = format!("Modifying volume to {target:?} is in progress.");
    json!({"status": {
        "modifyVolumeStatus": {"targetVolumeAttributesClassName": target, "status": modify_status::IN_PROGRESS},
        "conditions": conditions(claim, &[], Some(condition(MODIFYING, "", &message, now))),
    }})
}

/// The claim's status patch after ControllerModifyVolume failed with `code` and `description`:
/// Infeasible for InvalidArgument, else still in progress (retried).
pub fn modify_failed(
    claim: &PersistentVolumeClaim,
    target: &str,
    code: tonic::Code,
    description: &str,
    now: &str,
) -> Value {
    let (state, message) = if code == tonic::Code::InvalidArgument {
        (
            modify_status::INFEASIBLE,
            format!("Modifying volume to {target:?} failed. Waiting for retry."),
        )
    } else if uncertain(code) {
        (
            modify_status::IN_PROGRESS,
            format!("Modifying volume to {target:?} is still in progress."),
        )
    } else {
        (
            modify_status::IN_PROGRESS,
            format!("Modifying volume to {target:?} failed. Waiting for retry."),
        )
    };
    let reason = sidecar_kit::csi::go_code_name(code);
    let claim_with_modifying =
        conditions(claim, &[], Some(condition(MODIFYING, "", &message, now)));
    let mut listed: Vec<Value> = claim_with_modifying
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != MODIFY_ERROR)
        .collect();
    listed.push(condition(MODIFY_ERROR, reason, description, now));
    json!({"status": {
        "modifyVolumeStatus": {"targetVolumeAttributesClassName": target, "status": state},
        "conditions": listed,
    }})
}

/// The claim's status patch once its volume has the class `target`.
pub fn modify_done(claim: &PersistentVolumeClaim, target: &str) -> Value {
    json!({"status": {
        "currentVolumeAttributesClassName": target,
        "modifyVolumeStatus": null,
        "conditions": conditions(claim, &[MODIFYING, MODIFY_ERROR], None),
    }})
}

/// Whether the claim is waiting for the node's part of an expansion: the controller's part
/// is done (`NodeResizePending`, or the node's part was running or failed and is retried)
/// and its volume is larger than its recorded capacity.
pub fn awaits_node(claim: &PersistentVolumeClaim) -> bool {
    matches!(
        allocated_status(claim),
        Some(resize_status::NODE_PENDING | resize_status::NODE_IN_PROGRESS)
    ) || claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == FS_RESIZE_PENDING))
}

/// The claim's status patch after NodeExpandVolume failed with `message`.
pub fn node_resize_failed(claim: &PersistentVolumeClaim, message: &str, now: &str) -> Value {
    json!({"status": {
        "conditions": conditions(
            claim,
            &[],
            Some(condition(NODE_RESIZE_ERROR, "", message, now)),
        ),
    }})
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
