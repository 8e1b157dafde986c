//! Data sources: a clone of a claim (the cloning-protection finalizer goes on the source and
//! comes off again) and a restore from a VolumeSnapshot whose VolumeSnapshotContent the test
//! pre-provisions, as an administrator would for an existing snapshot.

use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::bed::{Bed, DRIVER, Setup};

const WAIT: Duration = Duration::from_secs(90);
const CLONING_PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";

pub fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A ready VolumeSnapshot `name` in `default` of the driver's snapshot `handle`, bound to a
/// pre-provisioned VolumeSnapshotContent, with the statuses a snapshot controller would write.
pub async fn pre_provisioned_snapshot(bed: &Bed, name: &str, handle: &str) {
    let snapshots = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    let contents = snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents");
    let content_name = format!("{name}-content");
    let snapshot = bed
        .create_dynamic(
            &snapshots,
            Some("default"),
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name},
                "spec": {"source": {"volumeSnapshotContentName": content_name}},
            }),
        )
        .await;
    bed.create_dynamic(
        &contents,
        None,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": content_name},
            "spec": {
                "deletionPolicy": "Retain", "driver": DRIVER,
                "source": {"snapshotHandle": handle},
                "volumeSnapshotRef": {"name": name, "namespace": "default", "uid": snapshot.metadata.uid},
            },
        }),
    )
    .await;
    let content_status = json!({"status": {"snapshotHandle": handle, "readyToUse": true}});
    Api::<DynamicObject>::all_with(bed.admin.clone(), &contents)
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(&content_status),
        )
        .await
        .unwrap();
    let snapshot_status =
        json!({"status": {"boundVolumeSnapshotContentName": content_name, "readyToUse": true}});
    Api::<DynamicObject>::namespaced_with(bed.admin.clone(), "default", &snapshots)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&snapshot_status),
        )
        .await
        .unwrap();
}

/// The driver's snapshot of a volume.
pub async fn driver_snapshot(bed: &Bed, volume: &str, name: &str) -> String {
    let channel = sidecar_kit::csi::connect(&bed.socket).await.unwrap();
    csi::controller_client::ControllerClient::new(channel)
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: volume.to_string(),
            name: name.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id
}

/// Claims `src` (Bound) and its clone `copy` of `class`; a pre-provisioned snapshot `snap` of
/// `src`'s volume, and the claim `restored` of `restore_class` restoring it (not waited for).
pub async fn clone_and_restore(bed: &Bed, class: &str, restore_class: &str) {
    bed.claim("src", class, "1Gi", json!({})).await;
    let source = bed.bound("src", WAIT).await;
    bed.claim(
        "copy",
        class,
        "1Gi",
        json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}}),
    )
    .await;
    bed.bound("copy", WAIT).await;
    let handle = source.spec.unwrap().csi.unwrap().volume_handle;
    let snapshot = driver_snapshot(bed, &handle, "snap-of-src").await;
    pre_provisioned_snapshot(bed, "snap", &snapshot).await;
    bed.claim(
        "restored",
        restore_class,
        "1Gi",
        json!({"spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}}),
    )
    .await;
}

/// Deletes the claims of [`clone_and_restore`] and waits until the driver holds no volume.
pub async fn delete_all(bed: &Bed) {
    for claim in ["copy", "restored", "src"] {
        bed.delete_claim(claim, WAIT).await;
    }
    bed.until("the driver's volumes deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
}

fn finalizers(claim: Option<PersistentVolumeClaim>) -> Vec<String> {
    claim
        .and_then(|c| c.metadata.finalizers)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_clone_and_a_restore_from_a_snapshot_are_provisioned_under_the_manifests_rbac() {
    let mut bed = Bed::start(Setup::default()).await;
    stack::snapshots::crds::install(&bed.admin).await.unwrap();
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    clone_and_restore(&bed, "fast", "fast").await;
    // The source is protected (it loses the finalizer when it is deleted and no clone of it is
    // pending: at the end of the test).
    assert!(
        finalizers(bed.get_claim("src").await).contains(&CLONING_PROTECTION.to_string()),
        "the source claim has the cloning-protection finalizer"
    );
    bed.bound("restored", WAIT).await;
    delete_all(&bed).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.admin.clone(), "default");
    bed.until("every claim gone", WAIT, || async {
        claims
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    bed.finish().await;
}
