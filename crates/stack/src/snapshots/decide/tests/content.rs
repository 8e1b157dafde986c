//! A VolumeSnapshotContent's own decisions: the sidecar's CSI calls and the status it keeps.

use super::*;

fn content_world<'a>(
    content: &'a VolumeSnapshotContent,
    class: Option<&'a VolumeSnapshotClass>,
) -> ContentWorld<'a> {
    ContentWorld {
        content,
        class,
        snapshot_exists: true,
        driver: DRIVER,
    }
}

#[test]
fn the_sidecar_creates_checks_and_deletes_csi_snapshots() {
    let s = of_claim(Some("fast"));
    let fast = class("fast", true, "Delete");
    let mut content = content_for(&s, false, "Delete");
    content.status = None;
    let plan = decide_content(&content_world(&content, Some(&fast)));
    assert_eq!(
        plan.steps,
        vec![
            ContentStep::AddFinalizer,
            ContentStep::CreateSnapshot {
                name: "snapshot-uid-1".into(),
                source_volume_id: "vol-1".into(),
                parameters: BTreeMap::from([("kind".to_string(), "fast".to_string())]),
            }
        ]
    );
    // A reserved key it does not know is refused.
    let mut odd = fast.clone();
    odd.parameters
        .as_mut()
        .unwrap()
        .insert("csi.storage.k8s.io/unknown".into(), "x".into());
    let plan = decide_content(&content_world(&content, Some(&odd)));
    assert_eq!(plan.outcome, Outcome::Retry);
    // Ready: nothing; another driver's: nothing.
    content.metadata.finalizers = Some(vec![FINALIZER_CONTENT.into()]);
    let ready = content_for(&s, true, "Delete");
    let mut ready_finalized = ready.clone();
    ready_finalized.metadata.finalizers = content.metadata.finalizers.clone();
    assert!(
        decide_content(&content_world(&ready_finalized, Some(&fast)))
            .steps
            .is_empty()
    );
    let mut foreign = content.clone();
    foreign.spec.driver = "other".into();
    assert!(
        decide_content(&content_world(&foreign, Some(&fast)))
            .steps
            .is_empty()
    );
    // Pre-provisioned: checked with the driver.
    let mut pre = content.clone();
    pre.spec.source = ContentSource {
        volume_handle: None,
        snapshot_handle: Some("h".into()),
    };
    assert_eq!(
        decide_content(&content_world(&pre, None)).steps,
        vec![ContentStep::CheckSnapshot("h".into())]
    );
    // Deletion: only once the snapshot controller marked it, never while being created.
    let mut deleting = ready_finalized.clone();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert!(
        decide_content(&content_world(&deleting, Some(&fast)))
            .steps
            .is_empty()
    );
    deleting.metadata.annotations = Some(BTreeMap::from([(
        ANN_BEING_DELETED.to_string(),
        "yes".to_string(),
    )]));
    assert_eq!(
        decide_content(&content_world(&deleting, Some(&fast))).steps,
        vec![
            ContentStep::DeleteSnapshot("snap-handle".into()),
            ContentStep::RemoveFinalizer
        ]
    );
    // Being created (the answer was lost): CreateSnapshot again until it answers, then delete.
    deleting
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANN_BEING_CREATED.into(), "yes".into());
    let plan = decide_content(&content_world(&deleting, Some(&fast)));
    assert_eq!(plan.outcome, Outcome::Retry);
    assert!(
        matches!(plan.steps.as_slice(), [ContentStep::CreateSnapshot { name, .. }] if name == "snapshot-uid-1"),
        "{:?}",
        plan.steps
    );
    // A ready content with the annotation left behind loses it.
    let mut leftover = ready_finalized.clone();
    leftover.metadata.annotations = Some(BTreeMap::from([(
        ANN_BEING_CREATED.to_string(),
        "yes".to_string(),
    )]));
    assert_eq!(
        decide_content(&content_world(&leftover, Some(&fast))).steps,
        vec![ContentStep::ClearBeingCreated]
    );
    let mut retained = ready_finalized;
    retained.spec.deletion_policy = "Retain".into();
    retained.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let world = ContentWorld {
        snapshot_exists: false,
        ..content_world(&retained, Some(&fast))
    };
    assert_eq!(
        decide_content(&world).steps,
        vec![ContentStep::RemoveFinalizer]
    );
}

#[test]
fn content_status_keeps_what_was_first_recorded() {
    let first = content_status(None, "h1", false, 5, 0);
    assert_eq!(
        (
            first.snapshot_handle.as_deref(),
            first.creation_time,
            first.ready_to_use,
            first.restore_size
        ),
        (Some("h1"), Some(5), Some(false), None)
    );
    let mut with_error = first.clone();
    with_error.error = Some(SnapshotError::default());
    let later = content_status(Some(&with_error), "h2", true, 9, 100);
    assert_eq!(
        (
            later.snapshot_handle.as_deref(),
            later.creation_time,
            later.restore_size,
            later.error
        ),
        (Some("h1"), Some(5), Some(100), None)
    );
}
