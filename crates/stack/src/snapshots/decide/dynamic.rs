//! A dynamic snapshot (one that names a claim): its class (the driver's one default when it
//! names none), then its content, bound when it exists and made from the claim's volume when
//! not.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::events::EventType;

use super::snapshot::{SnapshotStep, SnapshotWorld, content_name, fail, key, points_back};
use super::{
    ANN_DEFAULT_CLASS, ANN_SECRET_NAME, ANN_SECRET_NAMESPACE, FINALIZER_CLAIM, PARAM_SECRET_NAME,
    PARAM_SECRET_NAMESPACE, Plan, annotation, done, has,
};
use crate::snapshots::types::{
    API_VERSION, ContentSource, SnapshotRef, VolumeSnapshotClass, VolumeSnapshotContent,
    VolumeSnapshotContentSpec,
};

/// Where a dynamic snapshot stands after [`dynamic`].
pub(super) enum Dynamic<'a> {
    /// Its content exists and points back: its status follows the content's (the steps so
    /// far go on).
    Bound(Vec<SnapshotStep>, &'a VolumeSnapshotContent),
    /// This pass ends here: a default class set, a content made, or a failure.
    Ends(Plan<SnapshotStep>),
}

/// Why no class is named yet.
enum NoClass {
    /// The one default class of the volume's driver, to be written into the snapshot.
    Default(String),
    /// None or several defaults.
    Failed(String),
}

/// The class a dynamic snapshot names.
fn class_name(w: &SnapshotWorld<'_>) -> Result<String, NoClass> {
    if let Some(name) = w.snapshot.spec.volume_snapshot_class_name.as_deref() {
        return Ok(name.to_string());
    }
    let driver = w
        .volume
        .and_then(|v| v.spec.as_ref())
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.driver.as_str());
    let defaults: Vec<&&VolumeSnapshotClass> = w
        .classes
        .iter()
        .filter(|c| {
            annotation(&c.metadata, ANN_DEFAULT_CLASS) == Some("true")
                && Some(c.driver.as_str()) == driver
        })
        .collect();
    Err(match defaults.as_slice() {
        [one] => NoClass::Default(one.metadata.name.clone().unwrap_or_default()),
        [] => NoClass::Failed("cannot find default snapshot class".to_string()),
        many => NoClass::Failed(format!(
            "{} default snapshot classes were found",
            many.len()
        )),
    })
}

/// A dynamic snapshot: its class, its claim and volume, its content (made when missing).
pub(super) fn dynamic<'a>(
    w: &SnapshotWorld<'a>,
    claim_name: &str,
    mut steps: Vec<SnapshotStep>,
) -> Dynamic<'a> {
    let class_name = match class_name(w) {
        Ok(name) => name,
        Err(NoClass::Default(name)) => {
            steps.push(SnapshotStep::SetClass(name));
            return Dynamic::Ends(done(steps));
        }
        Err(NoClass::Failed(message)) => {
            return Dynamic::Ends(fail(w, steps, "SetDefaultSnapshotClassFailed", message));
        }
    };
    if let Some(content) = w.content {
        if !points_back(content, w.snapshot, true) {
            let message = format!(
                "VolumeSnapshotContent {} is bound to a different snapshot",
                content.metadata.name.as_deref().unwrap_or_default()
            );
            return Dynamic::Ends(fail(w, steps, "SnapshotContentMisbound", message));
        }
        return Dynamic::Bound(steps, content);
    }
    let content = match new_content(w, &class_name, claim_name, &mut steps) {
        Ok(content) => content,
        Err((reason, message)) => return Dynamic::Ends(fail(w, steps, reason, message)),
    };
    let mut status = w.snapshot.status.clone().unwrap_or_default();
    status.bound_volume_snapshot_content_name = content.metadata.name.clone();
    status.ready_to_use = Some(false);
    steps.push(SnapshotStep::CreateContent(Box::new(content)));
    steps.push(SnapshotStep::Event(
        EventType::Normal,
        "CreatingSnapshot",
        format!(
            "Waiting for a snapshot {} to be created by the CSI driver.",
            key(w.snapshot)
        ),
    ));
    steps.push(SnapshotStep::SetStatus(status));
    Dynamic::Ends(done(steps))
}

/// The content a dynamic snapshot of `claim_name` gets, from its class; or the failure's
/// reason and message. Protecting the claim is pushed onto `steps` as soon as the claim is
/// found, failure or not (as upstream adds the finalizer before checking the binding).
fn new_content(
    w: &SnapshotWorld<'_>,
    class_name: &str,
    claim_name: &str,
    steps: &mut Vec<SnapshotStep>,
) -> Result<VolumeSnapshotContent, (&'static str, String)> {
    let creation_failed = |detail: String| {
        (
            "SnapshotContentCreationFailed",
            format!("Failed to create snapshot content with error {detail}"),
        )
    };
    let Some(class) = w
        .classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(class_name))
    else {
        return Err((
            "GetSnapshotClassFailed",
            format!(
                "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io {class_name:?} not found"
            ),
        ));
    };
    let namespace = w.snapshot.metadata.namespace.as_deref().unwrap_or_default();
    let Some(claim) = w.claim else {
        return Err(creation_failed(format!(
            "failed to get input parameters to create snapshot {}: persistentvolumeclaim {claim_name:?} not found",
            key(w.snapshot)
        )));
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(creation_failed(format!(
            "cannot add finalizer on claim {namespace}/{claim_name} for snapshot {} because it is being deleted",
            key(w.snapshot)
        )));
    }
    if !has(&claim.metadata, FINALIZER_CLAIM) {
        steps.push(SnapshotStep::ProtectClaim(claim_name.to_string()));
    }
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound {
        return Err(creation_failed(format!(
            "the PVC {claim_name} is not yet bound to a PV, will not attempt to take a snapshot"
        )));
    }
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let Some(volume) = w
        .volume
        .filter(|v| v.metadata.name.as_deref() == Some(volume_name.as_str()))
    else {
        return Err(creation_failed(
            "claim in dataSource not bound or invalid".into(),
        ));
    };
    let spec = volume.spec.clone().unwrap_or_default();
    let refers_back = spec.claim_ref.as_ref().is_some_and(|r| {
        r.name == claim.metadata.name
            && r.namespace == claim.metadata.namespace
            && (r.uid.is_none() || r.uid == claim.metadata.uid)
    });
    if !refers_back {
        return Err(creation_failed(
            "claim in dataSource not bound or invalid".into(),
        ));
    }
    let Some(csi) = spec.csi.as_ref() else {
        return Err(creation_failed(format!(
            "cannot find CSI PersistentVolumeSource for volume {volume_name}"
        )));
    };
    let mut annotations = BTreeMap::new();
    let params = class.parameters.clone().unwrap_or_default();
    if let (Some(name), Some(ns)) = (
        params.get(PARAM_SECRET_NAME),
        params.get(PARAM_SECRET_NAMESPACE),
    ) {
        let content = content_name(w.snapshot);
        let snapshot_name = w.snapshot.metadata.name.as_deref().unwrap_or_default();
        let expand = |template: &str| {
            template
                .replace("${volumesnapshotcontent.name}", &content)
                .replace("${volumesnapshot.namespace}", namespace)
                .replace("${volumesnapshot.name}", snapshot_name)
        };
        annotations.insert(ANN_SECRET_NAME.to_string(), expand(name));
        annotations.insert(ANN_SECRET_NAMESPACE.to_string(), expand(ns));
    }
    Ok(VolumeSnapshotContent {
        api_version: API_VERSION.into(),
        kind: "VolumeSnapshotContent".into(),
        metadata: ObjectMeta {
            name: Some(content_name(w.snapshot)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        spec: VolumeSnapshotContentSpec {
            deletion_policy: class.deletion_policy.clone(),
            driver: class.driver.clone(),
            source: ContentSource {
                volume_handle: Some(csi.volume_handle.clone()),
                snapshot_handle: None,
            },
            source_volume_mode: Some(
                spec.volume_mode
                    .clone()
                    .unwrap_or_else(|| "Filesystem".into()),
            ),
            volume_snapshot_class_name: Some(class_name.to_string()),
            volume_snapshot_ref: SnapshotRef {
                api_version: Some(API_VERSION.into()),
                kind: Some("VolumeSnapshot".into()),
                name: w.snapshot.metadata.name.clone(),
                namespace: w.snapshot.metadata.namespace.clone(),
                uid: w.snapshot.metadata.uid.clone(),
                resource_version: w.snapshot.metadata.resource_version.clone(),
            },
        },
        status: None,
    })
}
