//! The embedded stack's snapshot controller with the real provisioner: dynamic snapshots from
//! the default class, restores, deletion by policy, pre-provisioned contents.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use stack::snapshots::decide::{
    FINALIZER_AS_SOURCE, FINALIZER_BOUND, FINALIZER_CLAIM, FINALIZER_CONTENT,
};
use stack::snapshots::types::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};

const T: Duration = Duration::from_secs(20);

async fn driver_snapshots(c: &Cluster) -> Vec<csi::Snapshot> {
    let channel = sidecar_kit::csi::connect(&c.socket).await.unwrap();
    csi::controller_client::ControllerClient::new(channel)
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .collect()
}

async fn create_snapshot(c: &Cluster, name: &str, source: serde_json::Value) -> VolumeSnapshot {
    let snapshot: VolumeSnapshot = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": source,
    }))
    .unwrap();
    Api::<VolumeSnapshot>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap()
}

async fn wait_ready(c: &Cluster, name: &str) -> VolumeSnapshot {
    let api = Api::<VolumeSnapshot>::namespaced(c.client.clone(), "default");
    let what = format!("{name} ready to use");
    common::poll_for(
        &what,
        T,
        || c.provisioner_log(),
        || async {
            let s = api.get(name).await.unwrap();
            if s.status.as_ref().and_then(|st| st.ready_to_use) == Some(true) {
                Ok(s)
            } else {
                Err(format!("{:?}", s.status))
            }
        },
    )
    .await
}

/// A cluster whose snapshot controller backs off for an hour: only events bring a failed
/// snapshot back within a test.
async fn with_an_hours_backoff() -> Cluster {
    Cluster::start_with(&["--capacity=100Gi"], &[], true, |options| {
        options.snapshot_backoff = sidecar_kit::workqueue::Backoff {
            start: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        };
    })
    .await
}

/// Waits until the snapshot `name`'s status error contains `words`.
async fn wait_error(c: &Cluster, name: &str, words: &str) {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(c.client.clone(), "default");
    let what = format!("{name}'s error saying {words:?}");
    common::poll_for(
        &what,
        T,
        || c.provisioner_log(),
        || async {
            let status = snapshots.get(name).await.unwrap().status;
            let message = status
                .as_ref()
                .and_then(|s| s.error.as_ref())
                .and_then(|e| e.message.clone())
                .unwrap_or_default();
            match message.contains(words) {
                true => Ok(()),
                false => Err(format!("{status:?}")),
            }
        },
    )
    .await;
}

/// A pre-provisioned content `name` for the driver's snapshot `handle`, naming the snapshot of
/// the same name in the default namespace.
async fn import_content(c: &Cluster, name: &str, handle: &str, deletion_policy: &str) {
    c.apply_cluster::<VolumeSnapshotContent>(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "deletionPolicy": deletion_policy,
            "source": {"snapshotHandle": handle},
            "volumeSnapshotRef": {"name": name, "namespace": "default"},
        },
    }))
    .await;
}

/// A VolumeSnapshotClass `name` of the driver.
async fn snapshot_class(c: &Cluster, name: &str, deletion_policy: &str) {
    c.apply_cluster::<VolumeSnapshotClass>(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": name},
        "driver": DRIVER,
        "deletionPolicy": deletion_policy,
    }))
    .await;
}

async fn bound_source(c: &Cluster) -> k8s_openapi::api::core::v1::PersistentVolume {
    c.class("fast", json!({})).await;
    let claim = c.claim("src", "fast", "1Gi", json!({}), false).await;
    let pv = c.wait_pv(&claim, T).await;
    c.wait_bound("src", T).await;
    pv
}

#[tokio::test]
async fn a_dynamic_snapshot_is_taken_restored_and_deleted_with_its_content() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    let pv = bound_source(&c).await;
    let handle = pv
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone();
    // Written as a pod would (a volume never used gets its directory at its first use).
    let dir = c.dir.path().join("driver/volumes").join(&handle);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("file.txt"), "snapshot me").unwrap();
    // No class named: the stack's default class for the driver is used.
    let created = create_snapshot(
        &c,
        "snap",
        json!({"source": {"persistentVolumeClaimName": "src"}}),
    )
    .await;
    let snap = wait_ready(&c, "snap").await;
    assert_eq!(
        snap.spec.volume_snapshot_class_name.as_deref(),
        Some("csi-hostpath-snapclass")
    );
    let status = snap.status.clone().unwrap();
    let content_name = format!("snapcontent-{}", created.metadata.uid.clone().unwrap());
    assert_eq!(
        status.bound_volume_snapshot_content_name.as_deref(),
        Some(content_name.as_str())
    );
    assert_eq!(status.restore_size.as_deref(), Some("1Gi"));
    assert!(status.creation_time.is_some() && status.error.is_none());
    let finalizers = snap.metadata.finalizers.clone().unwrap();
    assert!(finalizers.contains(&FINALIZER_AS_SOURCE.to_string()));
    c.wait_event("snap", "SnapshotReady", "is ready to use")
        .await;
    let contents: Api<VolumeSnapshotContent> = Api::all(c.client.clone());
    let content = contents.get(&content_name).await.unwrap();
    assert_eq!(content.spec.driver, DRIVER);
    assert_eq!(
        content.spec.source.volume_handle.as_deref(),
        Some(handle.as_str())
    );
    assert!(
        content
            .metadata
            .finalizers
            .unwrap()
            .contains(&FINALIZER_CONTENT.to_string())
    );
    let on_driver = driver_snapshots(&c).await;
    assert_eq!(on_driver.len(), 1);
    assert_eq!(
        content.status.unwrap().snapshot_handle.as_deref(),
        Some(on_driver[0].snapshot_id.as_str())
    );
    // The claim's protection goes once the snapshot is ready; the bound finalizer is there.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    c.wait_until("the claim released", T, || async {
        !claims
            .get("src")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER_CLAIM.to_string())
    })
    .await;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(c.client.clone(), "default");
    c.wait_until("the bound finalizer", T, || async {
        snapshots
            .get("snap")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER_BOUND.to_string())
    })
    .await;

    let restored = c
        .claim(
            "restored",
            "fast",
            "1Gi",
            json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "snap", "apiGroup": "snapshot.storage.k8s.io"}}}),
            false,
        )
        .await;
    let restored_pv = c.wait_pv(&restored, T).await;
    let restored_handle = restored_pv.spec.unwrap().csi.unwrap().volume_handle;
    assert_eq!(
        std::fs::read_to_string(
            c.dir
                .path()
                .join("driver/volumes")
                .join(restored_handle)
                .join("file.txt")
        )
        .unwrap(),
        "snapshot me"
    );

    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until(
        "the snapshot, its content and the driver's snapshot gone",
        T,
        || async {
            snapshots.get_opt("snap").await.unwrap().is_none()
                && contents.get_opt(&content_name).await.unwrap().is_none()
                && driver_snapshots(&c).await.is_empty()
        },
    )
    .await;
}

#[tokio::test]
async fn retained_contents_outlive_their_snapshot_and_pre_provisioned_ones_bind() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    bound_source(&c).await;
    snapshot_class(&c, "keep", "Retain").await;
    let created = create_snapshot(
        &c,
        "kept",
        json!({"source": {"persistentVolumeClaimName": "src"}, "volumeSnapshotClassName": "keep"}),
    )
    .await;
    wait_ready(&c, "kept").await;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(c.client.clone(), "default");
    snapshots
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until("the snapshot gone", T, || async {
        snapshots.get_opt("kept").await.unwrap().is_none()
    })
    .await;
    let contents: Api<VolumeSnapshotContent> = Api::all(c.client.clone());
    let retained = contents
        .get(&format!("snapcontent-{}", created.metadata.uid.unwrap()))
        .await
        .unwrap();
    let handle = retained.status.unwrap().snapshot_handle.unwrap();
    assert_eq!(
        driver_snapshots(&c).await.len(),
        1,
        "Retain keeps the driver's snapshot"
    );

    // That snapshot, pre-provisioned again: a content naming its handle and a snapshot naming
    // the content.
    import_content(&c, "imported", &handle, "Delete").await;
    create_snapshot(
        &c,
        "imported",
        json!({"source": {"volumeSnapshotContentName": "imported"}}),
    )
    .await;
    let imported = wait_ready(&c, "imported").await;
    assert_eq!(
        imported.status.unwrap().restore_size.as_deref(),
        Some("1Gi")
    );
    let bound = contents.get("imported").await.unwrap();
    assert_eq!(bound.spec.volume_snapshot_ref.uid, imported.metadata.uid);
}

#[tokio::test]
async fn a_snapshot_a_pending_claim_restores_from_is_deleted_only_after_that_claim() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    bound_source(&c).await;
    create_snapshot(
        &c,
        "snap",
        json!({"source": {"persistentVolumeClaimName": "src"}}),
    )
    .await;
    wait_ready(&c, "snap").await;
    // Its class does not exist: the claim stays Pending, restoring from the snapshot.
    let source = json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "snap", "apiGroup": "snapshot.storage.k8s.io"}}});
    c.claim("restoring", "no-such-class", "1Gi", source, false)
        .await;
    // The PV controller has seen the claim: so has the snapshot controller, which shares its
    // claim watch (both hear each event before the next one is read).
    c.wait_event("restoring", "ProvisioningFailed", "not found")
        .await;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(c.client.clone(), "default");
    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_event(
        "snap",
        "SnapshotDeletePending",
        "being used to restore a PVC",
    )
    .await;
    let held = snapshots.get("snap").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        held.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER_AS_SOURCE.to_string()),
        "kept while the claim restores from it"
    );
    // The claim goes: so does the snapshot.
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("restoring", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until("the snapshot gone after its restoring claim", T, || async {
        snapshots.get_opt("snap").await.unwrap().is_none()
    })
    .await;
}

/// A snapshot of a claim not bound yet fails and waits; the claim's binding brings it back
/// through the controller's index of snapshots by source claim. The snapshot controller's
/// backoff is an hour here, so nothing else brings it back within the deadline.
#[tokio::test]
async fn a_snapshot_waiting_for_its_claim_is_taken_once_the_claim_is_bound() {
    let c = with_an_hours_backoff().await;
    // Bound only once a Pod uses it.
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    c.claim("src", "late", "1Gi", json!({}), false).await;
    // Its class named: the default class is found from the claim's volume, which it has not.
    create_snapshot(
        &c,
        "snap",
        json!({
            "volumeSnapshotClassName": "csi-hostpath-snapclass",
            "source": {"persistentVolumeClaimName": "src"},
        }),
    )
    .await;
    wait_error(&c, "snap", "is not yet bound to a PV").await;
    // A Pod uses the claim: the scheduler picks a node, the claim is provisioned and bound.
    c.apply::<k8s_openapi::api::core::v1::Pod>(json!({
        "metadata": {"name": "app"},
        "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "src"}}],
        },
    }))
    .await;
    c.wait_bound("src", T).await;
    let snap = wait_ready(&c, "snap").await;
    assert!(snap.status.unwrap().error.is_none(), "the error is cleared");
}

/// A snapshot naming a pre-provisioned content not made yet fails and waits; the content's
/// creation brings it back at once. The controller's backoff is an hour here, so nothing else
/// binds it within the deadline.
#[tokio::test]
async fn a_snapshot_made_before_its_content_is_bound_when_the_content_comes() {
    let c = with_an_hours_backoff().await;
    let pv = bound_source(&c).await;
    let volume = pv.spec.unwrap().csi.unwrap().volume_handle;
    let handle = c.driver_snapshot(&volume, "made-elsewhere").await;
    create_snapshot(
        &c,
        "imported",
        json!({"source": {"volumeSnapshotContentName": "imported"}}),
    )
    .await;
    wait_error(&c, "imported", "VolumeSnapshotContent imported is missing").await;
    import_content(&c, "imported", &handle, "Retain").await;
    let imported = wait_ready(&c, "imported").await;
    assert_eq!(
        imported
            .status
            .unwrap()
            .bound_volume_snapshot_content_name
            .as_deref(),
        Some("imported")
    );
}

/// A snapshot naming a class not made yet fails and waits; the class's creation brings it back
/// at once (the controller's backoff is an hour here).
#[tokio::test]
async fn a_snapshot_made_before_its_class_is_taken_when_the_class_comes() {
    let c = with_an_hours_backoff().await;
    bound_source(&c).await;
    create_snapshot(
        &c,
        "snap",
        json!({
            "volumeSnapshotClassName": "later",
            "source": {"persistentVolumeClaimName": "src"},
        }),
    )
    .await;
    wait_error(&c, "snap", "\"later\" not found").await;
    snapshot_class(&c, "later", "Delete").await;
    let snap = wait_ready(&c, "snap").await;
    assert!(snap.status.unwrap().error.is_none(), "the error is cleared");
}
