//! Whether a volume can hold a claim, as kube-controller-manager matches them: the checks of a
//! volume a claim names (`checkVolumeSatisfyClaim`), the best Available volume for a claim
//! (`FindMatchingVolume`), a volume pre-bound to a claim, and the volumes a claim's decision
//! reads, looked up by name where it can be.

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use sidecar_kit::quantity::parse_bytes;
use sidecar_kit::selectors::label_selector_matches;
use sidecar_kit::vocabulary::pv_phase as phase;
use sidecar_kit::vocabulary::{ANN_BETA_STORAGE_CLASS, annotation, requested_class};

/// Whether the volume's attributes class is the claim's, none and `""` alike (kube-controller-
/// manager's `FindMatchingVolume` skips any other volume, one pre-bound to the claim included).
fn same_attributes_class(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let of_claim = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref());
    let of_volume = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref());
    of_claim.unwrap_or_default() == of_volume.unwrap_or_default()
}

/// A volume's class: the beta annotation, else `spec.storageClassName` (kube-controller-
/// manager's `GetPersistentVolumeClass`).
pub(crate) fn volume_class(pv: &PersistentVolume) -> String {
    annotation(&pv.metadata, ANN_BETA_STORAGE_CLASS)
        .map(str::to_string)
        .or_else(|| pv.spec.as_ref()?.storage_class_name.clone())
        .unwrap_or_default()
}

pub(crate) fn capacity(pv: &PersistentVolume) -> Option<i64> {
    let q = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
    parse_bytes(&q.0).ok()
}

/// Why a volume does not satisfy a claim, if it does not: kube-controller-manager's checks of a
/// volume the claim names, in its order and words (`checkVolumeSatisfyClaim`).
pub fn mismatch(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<String> {
    if pv.metadata.deletion_timestamp.is_some() {
        return Some(format!(
            "the volume is marked for deletion {:?}",
            pv.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    let (cs, ps) = (claim.spec.as_ref(), pv.spec.as_ref());
    let want = sidecar_kit::quantity::claim_request_bytes(claim).unwrap_or(0);
    if capacity(pv).unwrap_or(0) < want {
        return Some("requested PV is too small".into());
    }
    if volume_class(pv) != requested_class(claim).unwrap_or_default() {
        return Some("storageClassName does not match".into());
    }
    if !same_attributes_class(claim, pv) {
        return Some("volumeAttributesClassName does not match".into());
    }
    if volume_mode(cs.and_then(|s| s.volume_mode.as_deref()))
        != volume_mode(ps.and_then(|s| s.volume_mode.as_deref()))
    {
        return Some("incompatible volumeMode".into());
    }
    if !access_modes_fit(
        cs.and_then(|s| s.access_modes.as_deref()),
        ps.and_then(|s| s.access_modes.as_deref()),
    ) {
        return Some("incompatible accessMode".into());
    }
    None
}

/// Whether a volume's labels satisfy the claim's selector (none: any volume).
fn selected(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let Some(selector) = claim.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return true;
    };
    let no_labels = std::collections::BTreeMap::new();
    label_selector_matches(selector, pv.metadata.labels.as_ref().unwrap_or(&no_labels))
}

pub(crate) fn claim_ref_names(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.namespace == claim.metadata.namespace
        && r.name == claim.metadata.name
        && r.uid
            .as_ref()
            .is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_ref())
}

/// The volumes [`decide_claim`] needs for `claim` when they can be looked up by name instead of
/// scanning every volume (the scan made a 10,000-claim storm quadratic):
/// - the claim names a volume (`spec.volumeName`): that volume alone, or none if it is gone;
/// - a volume named `<prefix>-<claim uid>` (the provisioners' naming) whose claimRef names the
///   claim, that can hold it and offers exactly the modes it asks for: that volume (the
///   provisioner's PV waiting to be bound; no volume can fit in fewer modes).
///
/// `None`: the decision needs every volume (a claim still looking for a match).
pub fn named_volumes<V: Borrow<PersistentVolume>>(
    claim: &PersistentVolumeClaim,
    prefixes: &[&str],
    lookup: impl Fn(&str) -> Option<V>,
) -> Option<Vec<V>> {
    if let Some(name) = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
    {
        return Some(lookup(name).into_iter().collect());
    }
    let uid = claim.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    prefixes.iter().find_map(|prefix| {
        let pv = lookup(&format!("{prefix}-{uid}"))?;
        let made_for_it = claim_ref_names(pv.borrow(), claim)
            && pv.borrow().metadata.deletion_timestamp.is_none();
        // Only when it can hold the claim and offers no more access modes than asked for (then
        // exactly those): it is in the first group and wins it ([`volume_for_claim`]).
        // Otherwise another volume may win, and the decision needs them all.
        let first = pre_bound_fits(claim, pv.borrow())
            && mode_count(pv.borrow()) == claim_mode_count(claim);
        (made_for_it && first).then(|| vec![pv])
    })
}

/// The volume a claim without `spec.volumeName` is bound to, as kube-controller-manager finds
/// it (`findByClaim`): the volumes are looked through by their number of access modes, the
/// fewest first, among those offering every mode the claim asks for; in the first such group
/// where something fits, a volume pre-bound to the claim wins, else the smallest matching
/// Available one (none with late binding: the scheduler picks for a node). So an Available
/// volume of fewer modes wins over a volume pre-bound to the claim with more.
///
/// kube-controller-manager's groups are sets of modes, and it looks through sets of as many
/// modes in no set order (`{RWO,ROX}` or `{RWO,RWX}` first); ours takes them as one group,
/// which gives one of the outcomes it can give.
pub fn volume_for_claim<'a, V: Borrow<PersistentVolume>>(
    claim: &PersistentVolumeClaim,
    volumes: &'a [V],
    late: bool,
) -> Option<Found<'a>> {
    let wanted = claim.spec.as_ref().and_then(|s| s.access_modes.as_deref());
    // One pass, no allocation: the groups and their order are one ordering, fewest modes,
    // then pre-bound before Available, then (Available only) the smallest; `min_by` keeps the
    // first of equals, so the first pre-bound volume of a group wins it.
    volumes
        .iter()
        .map(Borrow::borrow)
        .filter(|pv| {
            access_modes_fit(
                wanted,
                pv.spec.as_ref().and_then(|s| s.access_modes.as_deref()),
            )
        })
        .filter_map(|pv| {
            let pre_bound = claim_ref_names(pv, claim) && pre_bound_fits(claim, pv);
            (pre_bound || (!late && available_match(claim, pv)))
                .then(|| (mode_count(pv), pre_bound, pv))
        })
        .min_by(|(a_modes, a_pre, a), (b_modes, b_pre, b)| {
            a_modes
                .cmp(b_modes)
                .then_with(|| b_pre.cmp(a_pre))
                .then_with(|| {
                    if *a_pre {
                        std::cmp::Ordering::Equal
                    } else {
                        capacity(a)
                            .cmp(&capacity(b))
                            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
                    }
                })
        })
        .map(|(_, pre_bound, pv)| {
            if pre_bound {
                Found::PreBound(pv)
            } else {
                Found::Available(pv)
            }
        })
}

/// What [`volume_for_claim`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Found<'a> {
    /// A volume whose claimRef names the claim (its user's pre-binding, or the provisioner's
    /// PV for it): the binding is completed.
    PreBound(&'a PersistentVolume),
    /// An Available volume bound to nothing: the claim is bound to it.
    Available(&'a PersistentVolume),
}

/// Whether an Available volume bound to nothing can be bound to the claim.
fn available_match(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    pv.metadata.deletion_timestamp.is_none()
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_none()
        && phase(pv) == "Available"
        && mismatch(claim, pv).is_none()
        && selected(claim, pv)
}

/// Whether a volume pre-bound to a claim can hold it (kube-controller-manager's matching looks
/// at its size, volume mode, access modes, attributes class and deletion, not at its class).
pub(crate) fn pre_bound_fits(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    if pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let (cs, ps) = (claim.spec.as_ref(), pv.spec.as_ref());
    let want = sidecar_kit::quantity::claim_request_bytes(claim).unwrap_or(0);
    capacity(pv).unwrap_or(0) >= want
        && same_attributes_class(claim, pv)
        && volume_mode(cs.and_then(|s| s.volume_mode.as_deref()))
            == volume_mode(ps.and_then(|s| s.volume_mode.as_deref()))
        && access_modes_fit(
            cs.and_then(|s| s.access_modes.as_deref()),
            ps.and_then(|s| s.access_modes.as_deref()),
        )
}

/// Whether a claim and a volume differ in volume mode (kube-controller-manager's
/// `CheckVolumeModeMismatches`; none means `Filesystem`).
pub fn volume_modes_differ(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    volume_mode(claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
        != volume_mode(pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
}

/// A volume mode as written, `Filesystem` when not.
fn volume_mode(mode: Option<&str>) -> &str {
    mode.unwrap_or("Filesystem")
}

/// Whether a volume offers every access mode a claim asks for.
fn access_modes_fit(claim: Option<&[String]>, volume: Option<&[String]>) -> bool {
    let offered = volume.unwrap_or_default();
    claim
        .unwrap_or_default()
        .iter()
        .all(|m| offered.contains(m))
}

/// The number of distinct access modes a claim asks for.
fn claim_mode_count(claim: &PersistentVolumeClaim) -> usize {
    distinct(claim.spec.as_ref().and_then(|s| s.access_modes.as_deref()))
}

/// The number of distinct access modes a volume offers.
fn mode_count(pv: &PersistentVolume) -> usize {
    distinct(pv.spec.as_ref().and_then(|s| s.access_modes.as_deref()))
}

/// Distinct modes, counted without allocating (a list holds a handful at most).
fn distinct(modes: Option<&[String]>) -> usize {
    let modes = modes.unwrap_or_default();
    modes
        .iter()
        .enumerate()
        .filter(|(i, m)| !modes[..*i].contains(m))
        .count()
}
