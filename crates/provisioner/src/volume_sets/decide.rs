//! The set manager's decisions, by the seed's rules:
//!
//! - the set's volumes are the PersistentVolumes its selector matches, made by the set or by
//!   hand (adopted), whatever their size or template;
//! - volumes are made while fewer than `minimumReplicas` are Available and fewer than
//!   `maximumReplicas` exist (the seed's `<=` would overshoot the maximum by one: `<` is used),
//!   at most `in_flight` at a time per set (the seed says one at a time; a driver whose
//!   CreateVolume takes seconds could never keep a pool full that way, so the bound is the
//!   `--volume-set-creates` flag, and 1 is the seed's rule);
//! - while more than `maximumReplicas` exist, the largest Available volume is deleted first; a
//!   Bound, Released or already-deleting volume is never chosen;
//! - a volume being deleted is on its way out: it is neither counted nor chosen again (counting
//!   it would delete one more than the excess);
//! - a spec that cannot be served (negative or crossed bounds, an empty selector, a template
//!   its own selector would not match, neither a class nor a volume source, a CSI source given
//!   whole, no size) changes nothing and says why.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::selectors::{Labels, label_selector_matches};
use sidecar_kit::vocabulary::{pv_phase, pv_reclaim_policy};

use super::make::SET_FINALIZER;

use super::types::{LABEL_SET, PersistentVolumeSet, PersistentVolumeSetStatus, template_source};

/// What the manager does for one set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetPlan {
    /// Why the spec cannot be served (nothing else is done).
    pub invalid: Option<String>,
    /// How many volumes to make now.
    pub create: usize,
    /// Volumes to delete, largest first.
    pub delete: Vec<String>,
    /// The status to report.
    pub status: PersistentVolumeSetStatus,
    /// Whether at least `minimumReplicas` volumes are Available.
    pub ready: bool,
    /// Whether the new volumes are static (the template gives a volume source): PersistentVolume
    /// objects only, no CreateVolume.
    pub objects_only: bool,
}

/// Why a set's spec cannot be served, if it cannot.
pub fn invalid(set: &PersistentVolumeSet) -> Option<String> {
    let spec = &set.spec;
    if spec.minimum_replicas < 0 || spec.maximum_replicas < 0 {
        return Some("spec.minimumReplicas and spec.maximumReplicas must not be negative".into());
    }
    if spec.minimum_replicas > spec.maximum_replicas {
        return Some(format!(
            "spec.minimumReplicas ({}) must not exceed spec.maximumReplicas ({})",
            spec.minimum_replicas, spec.maximum_replicas
        ));
    }
    let selector = &spec.selector;
    if selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
    {
        return Some("spec.selector must not be empty (it would adopt every volume)".into());
    }
    let labels = spec.template.metadata.labels.clone().unwrap_or_default();
    if !label_selector_matches(selector, &labels) {
        return Some("spec.template.metadata.labels must match spec.selector".into());
    }
    let template = &spec.template.spec;
    match template_source(template).as_deref() {
        Some("csi") => {
            return Some(
                "spec.template.spec.csi: a CSI volume is made through its class (give storageClassName and no volume source)"
                    .into(),
            );
        }
        Some(_) if template.claim_ref.is_some() => {
            return Some(
                "spec.template.spec.claimRef: a set's volumes are not bound in advance".into(),
            );
        }
        Some(_) => {}
        None if template
            .storage_class_name
            .as_deref()
            .is_none_or(str::is_empty) =>
        {
            return Some(
                "spec.template.spec.storageClassName is required (or a volume source, for static volumes)"
                    .into(),
            );
        }
        None => {}
    }
    match template.capacity.as_ref().and_then(|c| c.get("storage")) {
        None => return Some("spec.template.spec.capacity.storage is required".into()),
        Some(q) => match sidecar_kit::quantity::parse_bytes(&q.0) {
            Ok(bytes) if bytes > 0 => {}
            Ok(_) => return Some("spec.template.spec.capacity.storage must be positive".into()),
            Err(e) => return Some(format!("spec.template.spec.capacity.storage: {e}")),
        },
    }
    if template.access_modes.as_ref().is_none_or(Vec::is_empty) {
        return Some("spec.template.spec.accessModes: at least one access mode is required".into());
    }
    None
}

/// Whether `pv` belongs to `set`: its selector matches the volume's labels.
pub fn is_member(set: &PersistentVolumeSet, pv: &PersistentVolume) -> bool {
    let none = BTreeMap::new();
    let labels = pv.metadata.labels.as_ref().unwrap_or(&none);
    label_selector_matches(&set.spec.selector, labels)
}

/// The set's volumes among `volumes`.
pub fn members<'a>(
    set: &PersistentVolumeSet,
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
) -> Vec<&'a PersistentVolume> {
    volumes
        .into_iter()
        .filter(|pv| is_member(set, pv))
        .collect()
}

/// The names of the volumes a pass over the set `name` must read, from the labels of every
/// labelled volume: those its selector matches and those labelled as made by it (`set` is
/// `None` once it is gone). A superset of its members; the decisions filter them. `None` when
/// the selector also matches volumes without labels: then every volume is a candidate.
pub fn candidates<'a>(
    name: &str,
    set: Option<&PersistentVolumeSet>,
    labelled: impl IntoIterator<Item = (&'a String, &'a Labels)>,
) -> Option<Vec<String>> {
    if set.is_some_and(|set| label_selector_matches(&set.spec.selector, &Labels::new())) {
        return None;
    }
    let chosen = labelled
        .into_iter()
        .filter(|(_, labels)| {
            labels.get(LABEL_SET).map(String::as_str) == Some(name)
                || set.is_some_and(|set| label_selector_matches(&set.spec.selector, labels))
        })
        .map(|(volume, _)| volume.clone())
        .collect();
    Some(chosen)
}

/// Whether a volume is unclaimed and not being deleted.
fn free(pv: &PersistentVolume) -> bool {
    pv.spec.as_ref().is_none_or(|s| s.claim_ref.is_none())
        && pv.metadata.deletion_timestamp.is_none()
}

/// Whether a volume is Available: the phase says so, no claim is reserved, not being deleted.
pub fn available(pv: &PersistentVolume) -> bool {
    pv_phase(pv) == "Available" && free(pv)
}

/// Whether a volume is new: no phase yet (the PV controller has not marked it Available), no
/// claim, not being deleted. It will be Available.
fn coming(pv: &PersistentVolume) -> bool {
    matches!(pv_phase(pv), "" | "Pending") && free(pv)
}

fn bound(pv: &PersistentVolume) -> bool {
    pv_phase(pv) == "Bound"
}

fn size(pv: &PersistentVolume) -> i64 {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| sidecar_kit::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

/// How many volumes of a set are being made: the names `in_flight` (their CreateVolume or PV
/// write is under way) or `unseen` (made, their PV not shown by the watch yet) that are not
/// `members` already. A pass can see one volume in two of these places; it is counted once.
pub fn being_made<'a>(
    in_flight: impl IntoIterator<Item = &'a str>,
    unseen: impl IntoIterator<Item = &'a str>,
    members: &[&PersistentVolume],
) -> usize {
    let mut names: std::collections::BTreeSet<&str> = in_flight.into_iter().collect();
    names.extend(unseen);
    for pv in members {
        if let Some(name) = pv.metadata.name.as_deref() {
            names.remove(name);
        }
    }
    names.len()
}

/// The plan for a set with `members` (see [`members`]) and `creating` volumes of it being made
/// ([`being_made`]: they count towards the maximum and, like members not yet marked Available,
/// towards the minimum). Only volumes that exist are deleted for being over the maximum: one
/// being made holds back creations, and if it lands over the maximum a later pass removes it.
///
/// At most `in_flight` volumes are made at a time (those `creating` included). Only volumes
/// `deletable` admits are chosen for deletion (the manager deletes through its
/// driver, or the objects of static volumes it made; a matching volume of another driver or
/// one made by hand is counted, never deleted).
pub fn plan(
    set: &PersistentVolumeSet,
    members: &[&PersistentVolume],
    creating: usize,
    in_flight: usize,
    deletable: impl Fn(&PersistentVolume) -> bool,
) -> SetPlan {
    let spec = &set.spec;
    let staying: Vec<&&PersistentVolume> = members
        .iter()
        .filter(|pv| pv.metadata.deletion_timestamp.is_none())
        .collect();
    let total = staying.len() + creating;
    let available_now = members.iter().filter(|pv| available(pv)).count();
    let bound_now = members.iter().filter(|pv| bound(pv)).count();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let status = PersistentVolumeSetStatus {
        bound_replicas: count(bound_now),
        unbound_replicas: count(available_now),
        replicas: count(staying.len()),
        observed_generation: set.metadata.generation,
        conditions: Vec::new(),
    };
    let minimum = usize::try_from(spec.minimum_replicas).unwrap_or(0);
    let maximum = usize::try_from(spec.maximum_replicas).unwrap_or(0);
    let ready = available_now >= minimum;
    if let Some(why) = invalid(set) {
        return SetPlan {
            invalid: Some(why),
            status,
            ready: false,
            ..SetPlan::default()
        };
    }
    let mut delete = Vec::new();
    if staying.len() > maximum {
        let mut candidates: Vec<&&PersistentVolume> = members
            .iter()
            .filter(|pv| available(pv) && deletable(pv))
            .collect();
        // Largest first; by name among equals, so that repeated passes agree.
        candidates.sort_by(|a, b| {
            size(b)
                .cmp(&size(a))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        delete = candidates
            .into_iter()
            .take(staying.len() - maximum)
            .map(|pv| pv.metadata.name.clone().unwrap_or_default())
            .collect();
    }
    // New volumes (in flight, or saved but not yet marked Available) will be Available.
    let will_be_available =
        available_now + members.iter().filter(|pv| coming(pv)).count() + creating;
    let create = minimum
        .saturating_sub(will_be_available)
        .min(maximum.saturating_sub(total))
        .min(in_flight.max(1).saturating_sub(creating));
    SetPlan {
        invalid: None,
        create,
        delete,
        status,
        ready,
        objects_only: template_source(&spec.template.spec).is_some(),
    }
}

/// Whether the manager of `set` can delete a volume: a CSI volume of its driver (DeleteVolume is
/// how it goes), or a static volume the set made (the object goes); a static volume made by
/// hand or another driver's is counted, never deleted.
pub fn deletable_by(pv: &PersistentVolume, driver: &str, set: &str) -> bool {
    let spec = pv.spec.as_ref();
    match spec.and_then(|s| s.csi.as_ref()) {
        Some(csi) => csi.driver == driver,
        // A static volume the set made (an object only: nothing to delete in any storage);
        // one made by hand or by a provisioner is not the set's to remove.
        None => {
            pv.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SET))
                .is_some_and(|made_by| made_by == set)
                && pv
                    .metadata
                    .annotations
                    .as_ref()
                    .is_none_or(|a| !a.contains_key(sidecar_kit::vocabulary::ANN_PROVISIONED_BY))
        }
    }
}

/// What goes with a deleted set: its unused volumes whose reclaim policy is Delete (`members`
/// are the volumes it made, by their label).
pub fn leftovers<'a>(members: &[&'a PersistentVolume]) -> Vec<&'a PersistentVolume> {
    members
        .iter()
        .copied()
        .filter(|pv| available(pv) && pv_reclaim_policy(pv) == "Delete")
        .collect()
}

/// Deletions the manager started and has not finished (a crash or a failure in between):
/// being deleted and still held by its finalizer.
pub fn unfinished<'a>(members: &[&'a PersistentVolume]) -> Vec<&'a PersistentVolume> {
    members
        .iter()
        .copied()
        .filter(|pv| {
            pv.metadata.deletion_timestamp.is_some()
                && sidecar_kit::finalizers::has(&pv.metadata, SET_FINALIZER)
        })
        .collect()
}

/// How a deletion the manager started ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionEnd {
    /// A claim bound the volume before it was taken out: only the manager's finalizer goes,
    /// the volume follows its claim's reclaim policy.
    Claimed,
    /// Unused: DeleteVolume of this handle (None: not this driver's, nothing to call), then the
    /// finalizers go.
    Delete(Option<String>),
}

/// How the deletion of `pv` ends for a manager of `driver`.
pub fn deletion_end(pv: &PersistentVolume, driver: &str) -> DeletionEnd {
    let unused = pv.spec.as_ref().is_none_or(|s| s.claim_ref.is_none())
        && matches!(pv_phase(pv), "Available" | "Pending" | "");
    if !unused {
        return DeletionEnd::Claimed;
    }
    DeletionEnd::Delete(
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .filter(|c| c.driver == driver)
            .map(|c| c.volume_handle.clone()),
    )
}

/// Whether a set's volume in flight is made (CreateVolume, then its PV) under the token its
/// record holds (the stand-in claim's UID), or undone (deleted; the set makes another): its
/// set is gone, it was found by listing (its request is not known in full), or its record's
/// token does not parse.
pub fn member_token(set_exists: bool, listed: bool, token: &str) -> Option<uuid::Uuid> {
    if !set_exists || listed {
        return None;
    }
    uuid::Uuid::parse_str(token).ok()
}
