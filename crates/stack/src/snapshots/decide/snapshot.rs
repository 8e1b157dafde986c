//! A VolumeSnapshot's steps: its class, its content (made for a dynamic snapshot, bound for a
//! pre-provisioned one), its status from the content's, the source claim's protection and its
//! deletion.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use sidecar_kit::events::EventType;

use super::dynamic::{Dynamic, dynamic};
use super::{
    ANN_BEING_DELETED, FINALIZER_AS_SOURCE, FINALIZER_BOUND, FINALIZER_CLAIM, Outcome, Plan,
    annotation, done, has, rfc3339_from_nanos,
};
use crate::snapshots::types::{
    SnapshotError, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotStatus,
};

/// One step on a VolumeSnapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotStep {
    /// Add a finalizer to the snapshot.
    AddFinalizer(&'static str),
    /// Remove a finalizer from the snapshot.
    RemoveFinalizer(&'static str),
    /// Set `spec.volumeSnapshotClassName` (the default class).
    SetClass(String),
    /// Add the source-protection finalizer to the claim of this name (snapshot's namespace).
    ProtectClaim(String),
    /// Remove it.
    ReleaseClaim(String),
    /// Create this content.
    CreateContent(Box<VolumeSnapshotContent>),
    /// Bind a pre-provisioned content: set its `volumeSnapshotRef.uid`.
    BindContent {
        /// Content name.
        content: String,
        /// The snapshot's uid.
        uid: String,
    },
    /// Replace the snapshot's status.
    SetStatus(VolumeSnapshotStatus),
    /// Annotate the content: its snapshot is being deleted.
    MarkBeingDeleted(String),
    /// Delete the content object.
    DeleteContent(String),
    /// Record an event on the snapshot.
    Event(EventType, &'static str, String),
}

/// What a VolumeSnapshot refers to, looked up by the controller.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotWorld<'a> {
    /// The snapshot.
    pub snapshot: &'a VolumeSnapshot,
    /// Its content: the one named by its source or status, else `snapcontent-<uid>`.
    pub content: Option<&'a VolumeSnapshotContent>,
    /// Every class (for the default and the named one).
    pub classes: &'a [&'a VolumeSnapshotClass],
    /// The source claim (dynamic).
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// Its volume.
    pub volume: Option<&'a PersistentVolume>,
    /// A Pending claim restores from this snapshot.
    pub restoring: bool,
    /// Another snapshot of the same claim is not ready yet.
    pub claim_busy: bool,
    /// The driver this controller serves.
    pub driver: &'a str,
    /// Now, RFC 3339 (for error times).
    pub now: &'a str,
}

pub(super) fn key(snapshot: &VolumeSnapshot) -> String {
    format!(
        "{}/{}",
        snapshot.metadata.namespace.as_deref().unwrap_or_default(),
        snapshot.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The name of a dynamic snapshot's content.
pub fn content_name(snapshot: &VolumeSnapshot) -> String {
    format!(
        "snapcontent-{}",
        snapshot.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The content a snapshot refers to.
pub fn wanted_content(snapshot: &VolumeSnapshot) -> String {
    snapshot
        .spec
        .source
        .volume_snapshot_content_name
        .clone()
        .or_else(|| {
            snapshot
                .status
                .as_ref()
                .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        })
        .unwrap_or_else(|| content_name(snapshot))
}

/// Whether a content's reference points back at this snapshot (name, namespace, and uid when
/// `uid_required` or the content has one).
pub(super) fn points_back(
    content: &VolumeSnapshotContent,
    snapshot: &VolumeSnapshot,
    uid_required: bool,
) -> bool {
    let r = &content.spec.volume_snapshot_ref;
    let uid_ok = match r.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => Some(uid) == snapshot.metadata.uid.as_deref(),
        None => !uid_required,
    };
    r.name == snapshot.metadata.name && r.namespace == snapshot.metadata.namespace && uid_ok
}

/// The status of a snapshot given its content's, as the snapshot controller propagates it.
pub fn status_from(
    old: Option<&VolumeSnapshotStatus>,
    content: &VolumeSnapshotContent,
) -> VolumeSnapshotStatus {
    let mut status = old.cloned().unwrap_or_default();
    status.bound_volume_snapshot_content_name = content.metadata.name.clone();
    let cs = content.status.clone().unwrap_or_default();
    let ready = cs.ready_to_use.unwrap_or(false);
    status.ready_to_use = Some(ready);
    if status.creation_time.is_none() {
        status.creation_time = cs.creation_time.map(rfc3339_from_nanos);
    }
    if let Some(size) = cs.restore_size.filter(|s| *s > 0) {
        let unset = status.restore_size.as_deref().is_none_or(|q| q == "0");
        if unset {
            status.restore_size = Some(sidecar_kit::quantity::format_binary_si(size));
        }
    }
    status.error = if ready { None } else { cs.error.clone() };
    status
}

pub(super) fn fail(
    w: &SnapshotWorld<'_>,
    mut steps: Vec<SnapshotStep>,
    reason: &'static str,
    message: String,
) -> Plan<SnapshotStep> {
    let mut status = w.snapshot.status.clone().unwrap_or_default();
    let repeated = status.error.as_ref().and_then(|e| e.message.as_deref()) == Some(&message)
        && status.ready_to_use == Some(false);
    // The same failure again: no new event, no status write (a write would only bring the
    // snapshot straight back, and the time would change every retry).
    if !repeated {
        status.ready_to_use = Some(false);
        status.error = Some(SnapshotError {
            time: Some(w.now.to_string()),
            message: Some(message.clone()),
        });
        steps.push(SnapshotStep::Event(EventType::Warning, reason, message));
        steps.push(SnapshotStep::SetStatus(status));
    }
    Plan {
        steps,
        outcome: Outcome::Retry,
    }
}

/// The VolumeSnapshot a claim restores from (its `dataSource`), if any.
pub fn restores_from(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .filter(|d| {
            d.kind == "VolumeSnapshot"
                && d.api_group.as_deref() == Some(crate::snapshots::crds::GROUP)
        })
        .map(|d| d.name.clone())
}

/// Whether a snapshot may be waiting for the VolumeSnapshotClass `class`: it is not ready yet
/// and names that class, or names none (the class may be the default one it lacked).
pub fn may_wait_for_class(snapshot: &VolumeSnapshot, class: &str) -> bool {
    let ready = snapshot.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    !ready
        && snapshot
            .spec
            .volume_snapshot_class_name
            .as_deref()
            .is_none_or(|named| named == class)
}

/// Whether a Pending claim (or one without a phase yet) of the snapshot's namespace restores
/// from it: the snapshot is then kept.
pub fn restoring<'a>(
    snapshot: &VolumeSnapshot,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> bool {
    claims.into_iter().any(|c| {
        let pending = c
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Pending");
        c.metadata.namespace == snapshot.metadata.namespace
            && restores_from(c) == snapshot.metadata.name
            && pending
    })
}

/// Whether another live snapshot of the same claim is not ready yet: the claim keeps its
/// protection until that one is done too.
pub fn claim_busy<'a>(
    snapshot: &VolumeSnapshot,
    snapshots: impl IntoIterator<Item = &'a VolumeSnapshot>,
) -> bool {
    let claim = &snapshot.spec.source.persistent_volume_claim_name;
    claim.is_some()
        && snapshots.into_iter().any(|s| {
            s.metadata.uid != snapshot.metadata.uid
                && s.metadata.namespace == snapshot.metadata.namespace
                && &s.spec.source.persistent_volume_claim_name == claim
                && s.metadata.deletion_timestamp.is_none()
                && s.status.as_ref().and_then(|st| st.ready_to_use) != Some(true)
        })
}

/// Decides what to do with a VolumeSnapshot.
pub fn decide_snapshot(w: &SnapshotWorld<'_>) -> Plan<SnapshotStep> {
    if w.snapshot.metadata.deletion_timestamp.is_some() {
        return decide_deletion(w);
    }
    let source = &w.snapshot.spec.source;
    let (claim_name, content_source) = match (
        source
            .persistent_volume_claim_name
            .as_deref()
            .filter(|n| !n.is_empty()),
        source
            .volume_snapshot_content_name
            .as_deref()
            .filter(|n| !n.is_empty()),
    ) {
        (Some(claim), None) => (Some(claim), None),
        (None, Some(content)) => (None, Some(content)),
        _ => {
            return fail(
                w,
                Vec::new(),
                "SnapshotValidationError",
                "Exactly one of PersistentVolumeClaimName and VolumeSnapshotContentName should be specified"
                    .into(),
            );
        }
    };
    let mut steps = Vec::new();
    if !has(&w.snapshot.metadata, FINALIZER_AS_SOURCE) {
        steps.push(SnapshotStep::AddFinalizer(FINALIZER_AS_SOURCE));
    }
    let (mut steps, content) = match (content_source, claim_name) {
        (Some(name), _) => {
            let Some(content) = w.content else {
                return fail(
                    w,
                    steps,
                    "SnapshotContentMissing",
                    format!("VolumeSnapshotContent {name} is missing"),
                );
            };
            if content.spec.source.snapshot_handle.is_none() {
                return fail(
                    w,
                    steps,
                    "SnapshotContentMismatch",
                    format!(
                        "VolumeSnapshotContent {name} is not pre-provisioned: it has no spec.source.snapshotHandle"
                    ),
                );
            }
            if !points_back(content, w.snapshot, false) {
                return fail(
                    w,
                    steps,
                    "SnapshotContentMisbound",
                    format!("VolumeSnapshotContent {name} is bound to a different snapshot"),
                );
            }
            if content
                .spec
                .volume_snapshot_ref
                .uid
                .as_deref()
                .is_none_or(str::is_empty)
            {
                steps.push(SnapshotStep::BindContent {
                    content: name.to_string(),
                    uid: w.snapshot.metadata.uid.clone().unwrap_or_default(),
                });
                return done(steps);
            }
            (steps, content)
        }
        (None, Some(claim_name)) => match dynamic(w, claim_name, steps) {
            Dynamic::Bound(steps, content) => (steps, content),
            Dynamic::Ends(plan) => return plan,
        },
        (None, None) => return done(steps),
    };
    let status = status_from(w.snapshot.status.as_ref(), content);
    let old = w.snapshot.status.clone().unwrap_or_default();
    if status != old {
        if old.creation_time.is_none() && status.creation_time.is_some() {
            steps.push(SnapshotStep::Event(
                EventType::Normal,
                "SnapshotCreated",
                format!(
                    "Snapshot {} was successfully created by the CSI driver.",
                    key(w.snapshot)
                ),
            ));
        }
        if old.ready_to_use != Some(true) && status.ready_to_use == Some(true) {
            steps.push(SnapshotStep::Event(
                EventType::Normal,
                "SnapshotReady",
                format!("Snapshot {} is ready to use.", key(w.snapshot)),
            ));
        }
        steps.push(SnapshotStep::SetStatus(status.clone()));
    }
    if content.spec.deletion_policy == "Delete" && !has(&w.snapshot.metadata, FINALIZER_BOUND) {
        steps.push(SnapshotStep::AddFinalizer(FINALIZER_BOUND));
    }
    if let (Some(claim_name), Some(claim)) = (claim_name, w.claim)
        && status.ready_to_use == Some(true)
        && has(&claim.metadata, FINALIZER_CLAIM)
        && !w.claim_busy
    {
        steps.push(SnapshotStep::ReleaseClaim(claim_name.to_string()));
    }
    done(steps)
}

/// A VolumeSnapshot being deleted: its content goes too (deletionPolicy Delete) or stays
/// (Retain); the finalizers go once no claim restores from it and a Delete content is gone.
fn decide_deletion(w: &SnapshotWorld<'_>) -> Plan<SnapshotStep> {
    let meta = &w.snapshot.metadata;
    let content = w.content.filter(|c| points_back(c, w.snapshot, true));
    if content.is_some() && w.restoring && has(meta, FINALIZER_AS_SOURCE) {
        return Plan {
            steps: vec![SnapshotStep::Event(
                EventType::Warning,
                "SnapshotDeletePending",
                "Snapshot is being used to restore a PVC".into(),
            )],
            outcome: Outcome::Retry,
        };
    }
    let mut steps = Vec::new();
    let mut waiting = false;
    if let Some(content) = content {
        let name = content.metadata.name.clone().unwrap_or_default();
        if annotation(&content.metadata, ANN_BEING_DELETED) != Some("yes") {
            steps.push(SnapshotStep::MarkBeingDeleted(name.clone()));
        }
        if content.spec.deletion_policy == "Delete" {
            if content.metadata.deletion_timestamp.is_none() {
                steps.push(SnapshotStep::DeleteContent(name));
            }
            waiting = true;
        }
    }
    if let (Some(claim_name), Some(claim)) = (
        w.snapshot
            .spec
            .source
            .persistent_volume_claim_name
            .as_deref(),
        w.claim,
    ) && has(&claim.metadata, FINALIZER_CLAIM)
        && !w.claim_busy
    {
        steps.push(SnapshotStep::ReleaseClaim(claim_name.to_string()));
    }
    if has(meta, FINALIZER_AS_SOURCE) {
        steps.push(SnapshotStep::RemoveFinalizer(FINALIZER_AS_SOURCE));
    }
    if has(meta, FINALIZER_BOUND) && !waiting {
        steps.push(SnapshotStep::RemoveFinalizer(FINALIZER_BOUND));
    }
    // While a Delete content exists, its deletion (a content event) brings the snapshot back.
    done(steps)
}
