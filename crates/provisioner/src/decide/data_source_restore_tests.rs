//! Restoring from a snapshot: the checks upstream makes, in its order.

use super::*;

fn snap_ref() -> SourceRef {
    SourceRef {
        kind: "VolumeSnapshot".into(),
        name: "snap".into(),
        namespace: "default".into(),
        api_group: Some(SNAPSHOT_GROUP.into()),
    }
}

fn snapshot() -> Value {
    json!({
        "metadata": {"name": "snap", "namespace": "default", "uid": "snap-uid"},
        "spec": {"source": {"persistentVolumeClaimName": "src"}},
        "status": {"boundVolumeSnapshotContentName": "content", "readyToUse": true, "restoreSize": "1Gi"}
    })
}

fn content() -> Value {
    json!({
        "metadata": {"name": "content"},
        "spec": {
            "driver": DRIVER,
            "sourceVolumeMode": "Filesystem",
            "volumeSnapshotRef": {"name": "snap", "namespace": "default", "uid": "snap-uid"},
        },
        "status": {"snapshotHandle": "snap-handle", "readyToUse": true, "restoreSize": 1073741824}
    })
}

#[test]
fn restore_checks_in_upstream_order() {
    let new = claim("new").class("fast").size("1Gi").build();
    let restore =
        |c: &PersistentVolumeClaim, s: Option<&Value>, k: Option<&Value>, prevent: bool| {
            snapshot_source(c, &snap_ref(), s, k, DRIVER, "fast", prevent, false)
        };
    let ok = restore(&new, Some(&snapshot()), Some(&content()), true).unwrap();
    // A restore already sent to the driver goes on while the snapshot is deleted.
    let mut leaving = snapshot();
    leaving["metadata"]["deletionTimestamp"] = json!("2026-11-23T00:00:00Z");
    assert!(
        snapshot_source(
            &new,
            &snap_ref(),
            Some(&leaving),
            Some(&content()),
            DRIVER,
            "fast",
            true,
            true
        )
        .is_ok()
    );
    assert!(matches!(
        ok.r#type,
        Some(csi::volume_content_source::Type::Snapshot(s)) if s.snapshot_id == "snap-handle"
    ));
    let edit = |base: Value, pointer: &str, value: Value| {
        let mut v = base;
        *v.pointer_mut(pointer).unwrap() = value;
        v
    };
    let deleting = {
        let mut s = snapshot();
        s["metadata"]["deletionTimestamp"] = json!("2026-11-23T00:00:00Z");
        s
    };
    let small = claim("new").class("fast").size("512Mi").build();
    let block = claim("new").class("fast").size("1Gi").block().build();
    let allowed = {
        let mut k = content();
        k["metadata"]["annotations"] = json!({ALLOW_VOLUME_MODE_CHANGE: "true"});
        k
    };
    let denied = {
        let mut k = content();
        k["metadata"]["annotations"] = json!({ALLOW_VOLUME_MODE_CHANGE: "false"});
        k
    };
    let garbled = {
        let mut k = content();
        k["metadata"]["annotations"] = json!({ALLOW_VOLUME_MODE_CHANGE: "yes"});
        k
    };
    // (claim, snapshot, content, prevent conversion, expected: Ok or a message fragment)
    let cases: Vec<RestoreCase> = vec![
        (
            new.clone(),
            None,
            None,
            true,
            Some("error getting snapshot snap from api server"),
        ),
        (
            new.clone(),
            Some(deleting),
            None,
            true,
            Some("snapshot snap is being deleted"),
        ),
        (
            new.clone(),
            Some(edit(snapshot(), "/status", json!({}))),
            None,
            true,
            Some("snapshot snap not bound"),
        ),
        (
            new.clone(),
            Some(snapshot()),
            None,
            true,
            Some("error getting snapshotcontent content for snapshot default/snap"),
        ),
        (
            new.clone(),
            Some(snapshot()),
            Some(edit(content(), "/spec/volumeSnapshotRef/uid", json!("old"))),
            true,
            Some("is bound to a different snapshot"),
        ),
        (
            new.clone(),
            Some(snapshot()),
            Some(edit(content(), "/spec/driver", json!("other.csi"))),
            true,
            Some("is not handled by CSI driver of StorageClass fast"),
        ),
        (
            new.clone(),
            Some(edit(snapshot(), "/status/readyToUse", json!(false))),
            Some(content()),
            true,
            Some("snapshot snap is not Ready"),
        ),
        (
            new.clone(),
            Some(snapshot()),
            Some(edit(content(), "/status", json!({}))),
            true,
            Some("snapshot handle content is not available"),
        ),
        (
            small,
            Some(snapshot()),
            Some(content()),
            true,
            Some("requested volume size 536870912 is less than the size 1073741824"),
        ),
        (
            block.clone(),
            Some(snapshot()),
            Some(content()),
            true,
            Some("annotation is not present on snapshotcontent content"),
        ),
        (
            block.clone(),
            Some(snapshot()),
            Some(denied),
            true,
            Some("is set to false on snapshotcontent content"),
        ),
        (
            block.clone(),
            Some(snapshot()),
            Some(garbled),
            true,
            Some("failed to convert"),
        ),
        (block.clone(), Some(snapshot()), Some(allowed), true, None),
        (block, Some(snapshot()), Some(content()), false, None),
    ];
    for (c, s, k, prevent, expected) in cases {
        match (restore(&c, s.as_ref(), k.as_ref(), prevent), expected) {
            (Ok(_), None) => {}
            (Err(error), Some(fragment)) => {
                let text = error.to_string();
                assert!(
                    text.starts_with(
                        "error getting handle for DataSource Type VolumeSnapshot by Name snap: "
                    ),
                    "{text}"
                );
                assert!(text.contains(fragment), "{text} lacks {fragment:?}");
            }
            (got, want) => panic!("got {got:?}, want {want:?} for {s:?} {k:?}"),
        }
    }
}
