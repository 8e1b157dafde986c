//! A VolumeSnapshotContent's steps (the csi-snapshotter's part): CreateSnapshot, its status,
//! the CSI snapshot's deletion and the content's finalizer.

use std::collections::BTreeMap;

use sidecar_kit::events::EventType;

use super::{
    ANN_BEING_CREATED, ANN_BEING_DELETED, FINALIZER_CONTENT, Outcome, Plan, RESERVED, annotation,
    done, has,
};
use crate::snapshots::types::{
    VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentStatus,
};

/// One step on a VolumeSnapshotContent (the csi-snapshotter's part).
#[derive(Debug, Clone, PartialEq)]
pub enum ContentStep {
    /// Add the content finalizer.
    AddFinalizer,
    /// Remove it.
    RemoveFinalizer,
    /// CreateSnapshot (marked being-created around the call), then record the answer.
    CreateSnapshot {
        /// CSI name: `snapshot-<snapshot uid>`.
        name: String,
        /// The volume.
        source_volume_id: String,
        /// Class parameters for the driver.
        parameters: BTreeMap<String, String>,
    },
    /// Look up a pre-provisioned snapshot and record it.
    CheckSnapshot(String),
    /// DeleteSnapshot, then clear the status.
    DeleteSnapshot(String),
    /// Remove the being-created annotation.
    ClearBeingCreated,
    /// Record an event on the content.
    Event(EventType, &'static str, String),
}

/// What a content refers to.
#[derive(Debug, Clone, Copy)]
pub struct ContentWorld<'a> {
    /// The content.
    pub content: &'a VolumeSnapshotContent,
    /// Its class, if it names one that exists.
    pub class: Option<&'a VolumeSnapshotClass>,
    /// Whether the VolumeSnapshot it refers to still exists (same uid).
    pub snapshot_exists: bool,
    /// The driver this controller serves.
    pub driver: &'a str,
}

/// Parameters for CreateSnapshot: the class's, without the secret references; another key in
/// the reserved `csi.storage.k8s.io/` prefix is an error.
pub fn snapshot_parameters(
    class: &VolumeSnapshotClass,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in class.parameters.clone().unwrap_or_default() {
        if RESERVED.contains(&key.as_str()) {
            continue;
        }
        if key.starts_with("csi.storage.k8s.io/") {
            return Err(format!(
                "found unknown parameter key {key:?} with reserved namespace csi.storage.k8s.io/"
            ));
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// Decides what to do with a content of our driver.
pub fn decide_content(w: &ContentWorld<'_>) -> Plan<ContentStep> {
    let c = w.content;
    if c.spec.driver != w.driver {
        return done(Vec::new());
    }
    let uid = c.spec.volume_snapshot_ref.uid.clone().unwrap_or_default();
    let status = c.status.clone().unwrap_or_default();
    let being_created = annotation(&c.metadata, ANN_BEING_CREATED).is_some();
    if c.metadata.deletion_timestamp.is_some() {
        // CreateSnapshot may still be running on the driver (its answer was lost): ask again
        // until it answers, so the snapshot it made is known and can be deleted.
        if being_created
            && let (Some(volume), false) = (&c.spec.source.volume_handle, uid.is_empty())
        {
            let parameters = w
                .class
                .map(snapshot_parameters)
                .and_then(Result::ok)
                .unwrap_or_default();
            return Plan {
                steps: vec![ContentStep::CreateSnapshot {
                    name: format!("snapshot-{uid}"),
                    source_volume_id: volume.clone(),
                    parameters,
                }],
                outcome: Outcome::Retry,
            };
        }
        let unbound_preprovisioned = c.spec.source.snapshot_handle.is_some() && uid.is_empty();
        let released = annotation(&c.metadata, ANN_BEING_CREATED).is_none()
            && (annotation(&c.metadata, ANN_BEING_DELETED) == Some("yes") || !w.snapshot_exists);
        if !(unbound_preprovisioned || released) || !has(&c.metadata, FINALIZER_CONTENT) {
            return done(Vec::new());
        }
        let mut steps = Vec::new();
        if c.spec.deletion_policy == "Delete"
            && let Some(handle) = status.snapshot_handle.clone()
        {
            steps.push(ContentStep::DeleteSnapshot(handle));
        }
        steps.push(ContentStep::RemoveFinalizer);
        return done(steps);
    }
    let mut steps = Vec::new();
    if !uid.is_empty() && !has(&c.metadata, FINALIZER_CONTENT) {
        steps.push(ContentStep::AddFinalizer);
    }
    if status.ready_to_use == Some(true) {
        if being_created {
            // Left by a crash between recording the answer and removing the annotation.
            steps.push(ContentStep::ClearBeingCreated);
        }
        return done(steps);
    }
    match (&c.spec.source.volume_handle, &c.spec.source.snapshot_handle) {
        (Some(volume), None) if !uid.is_empty() => {
            let Some(class) = w.class else {
                steps.push(ContentStep::Event(
                    EventType::Warning,
                    "SnapshotCreationFailed",
                    format!(
                        "Failed to create snapshot: failed to get snapshot class {:?}",
                        c.spec
                            .volume_snapshot_class_name
                            .clone()
                            .unwrap_or_default()
                    ),
                ));
                return Plan {
                    steps,
                    outcome: Outcome::Retry,
                };
            };
            match snapshot_parameters(class) {
                Ok(parameters) => steps.push(ContentStep::CreateSnapshot {
                    name: format!("snapshot-{uid}"),
                    source_volume_id: volume.clone(),
                    parameters,
                }),
                Err(message) => {
                    steps.push(ContentStep::Event(
                        EventType::Warning,
                        "SnapshotCreationFailed",
                        format!("Failed to create snapshot: {message}"),
                    ));
                    return Plan {
                        steps,
                        outcome: Outcome::Retry,
                    };
                }
            }
        }
        (None, Some(handle)) => steps.push(ContentStep::CheckSnapshot(handle.clone())),
        _ => {}
    }
    done(steps)
}

/// The content status after a CreateSnapshot or ListSnapshots answer: handle and creation time
/// are kept once set; the error is cleared once ready.
pub fn content_status(
    old: Option<&VolumeSnapshotContentStatus>,
    handle: &str,
    ready: bool,
    created_nanos: i64,
    size_bytes: i64,
) -> VolumeSnapshotContentStatus {
    let mut status = old.cloned().unwrap_or_default();
    if status.snapshot_handle.is_none() {
        status.snapshot_handle = Some(handle.to_string());
    }
    if status.creation_time.is_none() {
        status.creation_time = Some(created_nanos);
    }
    status.ready_to_use = Some(ready);
    if size_bytes > 0 {
        status.restore_size = Some(size_bytes);
    }
    if ready {
        status.error = None;
    }
    status
}
