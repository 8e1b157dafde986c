#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::*;
use crate::snapshots::types::{
    API_VERSION, ContentSource, SnapshotError, SnapshotRef, SnapshotSource, VolumeSnapshot,
    VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentSpec,
    VolumeSnapshotContentStatus, VolumeSnapshotSpec, VolumeSnapshotStatus,
};

const DRIVER: &str = "hostpath.csi.volstack.dev";
const NOW: &str = "2026-11-23T10:00:00Z";

mod content;

fn snapshot(source: SnapshotSource, class: Option<&str>) -> VolumeSnapshot {
    VolumeSnapshot {
        api_version: API_VERSION.into(),
        kind: "VolumeSnapshot".into(),
        metadata: ObjectMeta {
            name: Some("snap".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: VolumeSnapshotSpec {
            source,
            volume_snapshot_class_name: class.map(str::to_string),
        },
        status: None,
    }
}

fn of_claim(class: Option<&str>) -> VolumeSnapshot {
    snapshot(
        SnapshotSource {
            persistent_volume_claim_name: Some("data".into()),
            volume_snapshot_content_name: None,
        },
        class,
    )
}

fn class(name: &str, default: bool, policy: &str) -> VolumeSnapshotClass {
    let mut c = VolumeSnapshotClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        driver: DRIVER.into(),
        deletion_policy: policy.into(),
        parameters: Some(BTreeMap::from([
            ("kind".to_string(), "fast".to_string()),
            (
                PARAM_SECRET_NAME.to_string(),
                "s-${volumesnapshot.name}".to_string(),
            ),
            (
                PARAM_SECRET_NAMESPACE.to_string(),
                "${volumesnapshot.namespace}".to_string(),
            ),
        ])),
        ..Default::default()
    };
    if default {
        c.metadata.annotations = Some(BTreeMap::from([(
            ANN_DEFAULT_CLASS.to_string(),
            "true".to_string(),
        )]));
    }
    c
}

fn claim(bound: bool, finalized: bool) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some("claim-uid".into()),
            finalizers: finalized.then(|| vec![FINALIZER_CLAIM.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("pv-data".into()),
            ..Default::default()
        }),
        status: bound.then(|| PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
    }
}

fn volume() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-data".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "vol-1".into(),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                name: Some("data".into()),
                namespace: Some("default".into()),
                uid: Some("claim-uid".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

struct Fixture {
    snapshot: VolumeSnapshot,
    content: Option<VolumeSnapshotContent>,
    classes: Vec<VolumeSnapshotClass>,
    claim: Option<PersistentVolumeClaim>,
    volume: Option<PersistentVolume>,
    restoring: bool,
    claim_busy: bool,
}

impl Fixture {
    fn new(snapshot: VolumeSnapshot) -> Self {
        Fixture {
            snapshot,
            content: None,
            classes: vec![class("fast", true, "Delete")],
            claim: Some(claim(true, false)),
            volume: Some(volume()),
            restoring: false,
            claim_busy: false,
        }
    }

    fn decide(&self) -> Plan<SnapshotStep> {
        let classes: Vec<&VolumeSnapshotClass> = self.classes.iter().collect();
        decide_snapshot(&SnapshotWorld {
            snapshot: &self.snapshot,
            content: self.content.as_ref(),
            classes: &classes,
            claim: self.claim.as_ref(),
            volume: self.volume.as_ref(),
            restoring: self.restoring,
            claim_busy: self.claim_busy,
            driver: DRIVER,
            now: NOW,
        })
    }
}

fn reasons(plan: &Plan<SnapshotStep>) -> Vec<&'static str> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            SnapshotStep::Event(_, reason, _) => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_snapshot_of_a_claim_gets_its_content() {
    let f = Fixture::new(of_claim(Some("fast")));
    let plan = f.decide();
    assert_eq!(plan.outcome, Outcome::Done);
    assert_eq!(
        plan.steps[0],
        SnapshotStep::AddFinalizer(FINALIZER_AS_SOURCE)
    );
    assert_eq!(plan.steps[1], SnapshotStep::ProtectClaim("data".into()));
    let SnapshotStep::CreateContent(content) = &plan.steps[2] else {
        panic!("{:?}", plan.steps)
    };
    assert_eq!(content.metadata.name.as_deref(), Some("snapcontent-uid-1"));
    assert_eq!(content.spec.source.volume_handle.as_deref(), Some("vol-1"));
    assert_eq!(content.spec.deletion_policy, "Delete");
    assert_eq!(
        content.spec.volume_snapshot_ref.uid.as_deref(),
        Some("uid-1")
    );
    assert_eq!(
        content.spec.source_volume_mode.as_deref(),
        Some("Filesystem")
    );
    let annotations = content.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[ANN_SECRET_NAME], "s-snap");
    assert_eq!(annotations[ANN_SECRET_NAMESPACE], "default");
    assert_eq!(reasons(&plan), vec!["CreatingSnapshot"]);
    let SnapshotStep::SetStatus(status) = plan.steps.last().unwrap() else {
        panic!()
    };
    assert_eq!(
        status.bound_volume_snapshot_content_name.as_deref(),
        Some("snapcontent-uid-1")
    );
}

#[test]
fn the_default_class_is_the_one_default_class_of_the_volumes_driver() {
    let mut f = Fixture::new(of_claim(None));
    assert_eq!(
        f.decide().steps.last(),
        Some(&SnapshotStep::SetClass("fast".into()))
    );
    f.classes.push(class("other", true, "Retain"));
    let plan = f.decide();
    assert_eq!(plan.outcome, Outcome::Retry);
    assert_eq!(reasons(&plan), vec!["SetDefaultSnapshotClassFailed"]);
    f.classes = vec![class("fast", false, "Delete")];
    let plan = f.decide();
    let SnapshotStep::Event(_, _, message) = &plan.steps[1] else {
        panic!("{:?}", plan.steps)
    };
    assert_eq!(message, "cannot find default snapshot class");
}

#[test]
fn the_same_failure_again_writes_nothing() {
    let mut f = Fixture::new(of_claim(Some("fast")));
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_AS_SOURCE.into()]);
    f.claim = Some(claim(false, true));
    let first = f.decide();
    let SnapshotStep::SetStatus(status) = first.steps.last().unwrap().clone() else {
        panic!("{:?}", first.steps)
    };
    f.snapshot.status = Some(status);
    let again = f.decide();
    assert_eq!((again.steps, again.outcome), (Vec::new(), Outcome::Retry));
}

#[test]
fn a_snapshot_of_an_unbound_or_missing_claim_fails_with_an_error_status() {
    let mut f = Fixture::new(of_claim(Some("fast")));
    f.claim = Some(claim(false, false));
    let plan = f.decide();
    assert_eq!(plan.outcome, Outcome::Retry);
    assert_eq!(reasons(&plan), vec!["SnapshotContentCreationFailed"]);
    let SnapshotStep::SetStatus(status) = plan.steps.last().unwrap() else {
        panic!()
    };
    assert_eq!(status.ready_to_use, Some(false));
    assert!(
        status
            .error
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("is not yet bound to a PV"),
        "{status:?}"
    );
    f.claim = None;
    assert!(matches!(
        f.decide().steps.last(),
        Some(SnapshotStep::SetStatus(_))
    ));
    f.claim = Some(claim(true, false));
    f.classes.clear();
    assert_eq!(reasons(&f.decide()), vec!["GetSnapshotClassFailed"]);
    let both = snapshot(
        SnapshotSource {
            persistent_volume_claim_name: Some("a".into()),
            volume_snapshot_content_name: Some("b".into()),
        },
        None,
    );
    assert_eq!(
        reasons(&Fixture::new(both).decide()),
        vec!["SnapshotValidationError"]
    );
}

fn content_for(snapshot: &VolumeSnapshot, ready: bool, policy: &str) -> VolumeSnapshotContent {
    VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some(content_name(snapshot)),
            ..Default::default()
        },
        spec: VolumeSnapshotContentSpec {
            deletion_policy: policy.into(),
            driver: DRIVER.into(),
            source: ContentSource {
                volume_handle: Some("vol-1".into()),
                snapshot_handle: None,
            },
            volume_snapshot_ref: SnapshotRef {
                name: Some("snap".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            ..Default::default()
        },
        status: Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some("snap-handle".into()),
            creation_time: Some(1_700_000_000_000_000_000),
            ready_to_use: Some(ready),
            restore_size: Some(1 << 30),
            error: None,
        }),
        ..Default::default()
    }
}

#[test]
fn a_ready_content_makes_the_snapshot_ready_and_releases_the_claim() {
    let mut f = Fixture::new(of_claim(Some("fast")));
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_AS_SOURCE.into()]);
    f.claim = Some(claim(true, true));
    f.content = Some(content_for(&f.snapshot, true, "Delete"));
    let plan = f.decide();
    assert_eq!(reasons(&plan), vec!["SnapshotCreated", "SnapshotReady"]);
    let status = plan
        .steps
        .iter()
        .find_map(|s| match s {
            SnapshotStep::SetStatus(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(status.ready_to_use, Some(true));
    assert_eq!(status.restore_size.as_deref(), Some("1Gi"));
    assert_eq!(
        status.creation_time.as_deref(),
        Some("2023-11-14T22:13:20Z")
    );
    assert!(
        plan.steps
            .contains(&SnapshotStep::AddFinalizer(FINALIZER_BOUND))
    );
    assert!(
        plan.steps
            .contains(&SnapshotStep::ReleaseClaim("data".into()))
    );
    // Another snapshot of the claim still in progress keeps the claim protected.
    f.claim_busy = true;
    assert!(
        !f.decide()
            .steps
            .contains(&SnapshotStep::ReleaseClaim("data".into()))
    );
    // Applied: nothing more to do.
    f.claim_busy = false;
    f.snapshot.status = Some(status);
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_AS_SOURCE.into(), FINALIZER_BOUND.into()]);
    f.claim = Some(claim(true, false));
    assert_eq!(f.decide().steps, Vec::new());
    // A content of another snapshot under this name is refused.
    f.content.as_mut().unwrap().spec.volume_snapshot_ref.uid = Some("old".into());
    assert_eq!(reasons(&f.decide()), vec!["SnapshotContentMisbound"]);
}

#[test]
fn a_pre_provisioned_content_is_bound_then_followed() {
    let s = snapshot(
        SnapshotSource {
            persistent_volume_claim_name: None,
            volume_snapshot_content_name: Some("pre".into()),
        },
        None,
    );
    let mut f = Fixture::new(s.clone());
    assert_eq!(reasons(&f.decide()), vec!["SnapshotContentMissing"]);
    let mut content = content_for(&s, true, "Retain");
    content.metadata.name = Some("pre".into());
    content.spec.source = ContentSource {
        volume_handle: None,
        snapshot_handle: Some("h".into()),
    };
    content.spec.volume_snapshot_ref.uid = None;
    f.content = Some(content.clone());
    assert_eq!(
        f.decide().steps.last(),
        Some(&SnapshotStep::BindContent {
            content: "pre".into(),
            uid: "uid-1".into()
        })
    );
    content.spec.volume_snapshot_ref.uid = Some("uid-1".into());
    f.content = Some(content.clone());
    let plan = f.decide();
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, SnapshotStep::SetStatus(st) if st.ready_to_use == Some(true)))
    );
    assert!(
        !plan
            .steps
            .contains(&SnapshotStep::AddFinalizer(FINALIZER_BOUND)),
        "Retain"
    );
    content.spec.volume_snapshot_ref.name = Some("someone".into());
    f.content = Some(content);
    assert_eq!(reasons(&f.decide()), vec!["SnapshotContentMisbound"]);
}

#[test]
fn deleting_a_snapshot_deletes_or_keeps_its_content_by_policy() {
    let mut f = Fixture::new(of_claim(Some("fast")));
    f.snapshot.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_AS_SOURCE.into(), FINALIZER_BOUND.into()]);
    f.content = Some(content_for(&f.snapshot, true, "Delete"));
    f.restoring = true;
    let plan = f.decide();
    assert_eq!(
        (reasons(&plan), plan.outcome),
        (vec!["SnapshotDeletePending"], Outcome::Retry)
    );
    f.restoring = false;
    let plan = f.decide();
    assert_eq!(
        plan.steps,
        vec![
            SnapshotStep::MarkBeingDeleted("snapcontent-uid-1".into()),
            SnapshotStep::DeleteContent("snapcontent-uid-1".into()),
            SnapshotStep::RemoveFinalizer(FINALIZER_AS_SOURCE),
        ]
    );
    // The content is gone: the last finalizer goes.
    f.content = None;
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_BOUND.into()]);
    assert_eq!(
        f.decide().steps,
        vec![SnapshotStep::RemoveFinalizer(FINALIZER_BOUND)]
    );
    // Retain: the content stays, marked, and the finalizers go at once.
    f.snapshot.metadata.finalizers = Some(vec![FINALIZER_AS_SOURCE.into(), FINALIZER_BOUND.into()]);
    f.content = Some(content_for(&f.snapshot, true, "Retain"));
    assert_eq!(
        f.decide().steps,
        vec![
            SnapshotStep::MarkBeingDeleted("snapcontent-uid-1".into()),
            SnapshotStep::RemoveFinalizer(FINALIZER_AS_SOURCE),
            SnapshotStep::RemoveFinalizer(FINALIZER_BOUND),
        ]
    );
}

#[test]
fn pending_restores_and_unfinished_snapshots_of_the_claim_are_seen() {
    let s = of_claim(Some("fast"));
    let restore = |name: &str, ns: &str, phase: Option<&str>| PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            data_source: Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: "snap".into(),
            }),
            ..Default::default()
        }),
        status: phase.map(|p| PersistentVolumeClaimStatus {
            phase: Some(p.into()),
            ..Default::default()
        }),
    };
    assert!(restoring(&s, [&restore("r", "default", None)]));
    assert!(restoring(&s, [&restore("r", "default", Some("Pending"))]));
    assert!(!restoring(&s, [&restore("r", "default", Some("Bound"))]));
    assert!(!restoring(&s, [&restore("r", "other", Some("Pending"))]));
    assert!(!restoring(&s, [&claim(true, false)]));

    let mut other = of_claim(Some("fast"));
    other.metadata.uid = Some("uid-2".into());
    assert!(
        claim_busy(&s, [&s, &other]),
        "another unfinished snapshot of the claim"
    );
    assert!(!claim_busy(&s, [&s]), "itself does not count");
    let mut ready = other.clone();
    ready.status = Some(VolumeSnapshotStatus {
        ready_to_use: Some(true),
        ..Default::default()
    });
    assert!(!claim_busy(&s, [&ready]));
    let mut leaving = other.clone();
    leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert!(!claim_busy(&s, [&leaving]));
}

#[test]
fn a_class_brings_back_the_snapshots_not_ready_that_name_it_or_none() {
    let ready = |mut s: VolumeSnapshot| {
        s.status = Some(VolumeSnapshotStatus {
            ready_to_use: Some(true),
            ..Default::default()
        });
        s
    };
    let rows: [(VolumeSnapshot, &str, bool); 5] = [
        (of_claim(Some("fast")), "fast", true),
        (of_claim(None), "fast", true),
        (of_claim(Some("slow")), "fast", false),
        (ready(of_claim(Some("fast"))), "fast", false),
        (ready(of_claim(None)), "fast", false),
    ];
    for (i, (s, class, want)) in rows.iter().enumerate() {
        assert_eq!(may_wait_for_class(s, class), *want, "row {i}");
    }
}
