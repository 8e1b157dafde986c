//! Drop-in: with the Go sidecars' own RBAC (fixtures/upstream-*-rbac.yaml) and nothing else,
//! every upstream feature of ours works without one 403: leader election, provisioning, clone,
//! restore, capacity with its owner, attach and detach.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, VolumeAttachment};
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::bed::{Bed, Setup, fixture};
use crate::data_sources::{driver_snapshot, pre_provisioned_snapshot};
use crate::provisioning::{delete_pod, pod};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn every_upstream_feature_works_under_the_go_sidecars_rbac_exactly() {
    let mut bed = Bed::start(Setup {
        manifests: vec![
            fixture("upstream-provisioner-rbac.yaml"),
            fixture("upstream-attacher-rbac.yaml"),
        ],
        driver_args: &["--enable-attach", "--capacity=10Gi"],
        attach_required: true,
        storage_capacity: true,
        ..Default::default()
    })
    .await;
    stack::snapshots::crds::install(&bed.admin).await.unwrap();
    // The owner of the capacity objects: a Pod the test makes (level 0), as a StatefulSet's
    // replica would be found.
    bed.create::<Pod>(
        "default",
        json!({"metadata": {"name": "csi-provisioner-0"},
               "spec": {"nodeSelector": {"example.com/never": "true"},
                        "containers": [{"name": "c", "image": "volstack/csi-provisioner:latest"}]}}),
    )
    .await;
    bed.provisioner(
        "csi-provisioner",
        &[
            "--leader-election",
            "--enable-capacity",
            "--capacity-ownerref-level=0",
        ],
        &[("POD_NAME", "csi-provisioner-0"), ("NAMESPACE", "default")],
    )
    .await;
    bed.attacher("csi-attacher", &["--leader-election"]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;

    let capacities: Api<CSIStorageCapacity> = Api::namespaced(bed.admin.clone(), "default");
    bed.until("capacity owned by the provisioner's Pod", WAIT, || async {
        let items = capacities.list(&ListParams::default()).await.unwrap().items;
        !items.is_empty()
            && items.iter().all(|c| {
                c.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| o.len() == 1 && o[0].kind == "Pod")
            })
    })
    .await;

    bed.claim("src", "fast", "1Gi", json!({})).await;
    let source = bed.bound("src", WAIT).await;
    bed.claim(
        "copy",
        "fast",
        "1Gi",
        json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}}),
    )
    .await;
    bed.bound("copy", WAIT).await;
    let handle = source.spec.unwrap().csi.unwrap().volume_handle;
    let snapshot = driver_snapshot(&bed, &handle, "snap-of-src").await;
    pre_provisioned_snapshot(&bed, "snap", &snapshot).await;
    bed.claim(
        "restored",
        "late",
        "1Gi",
        json!({"spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}}),
    )
    .await;
    bed.create::<Pod>("default", pod("user", "restored", None))
        .await;
    bed.bound("restored", WAIT).await;
    let attachments: Api<VolumeAttachment> = Api::all(bed.admin.clone());
    bed.until("the restored volume attached", WAIT, || async {
        attachments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|va| va.status.as_ref().is_some_and(|s| s.attached))
    })
    .await;
    delete_pod(&bed, "user").await;
    bed.until("the attachment gone", WAIT, || async {
        attachments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    for claim in ["copy", "restored", "src"] {
        bed.delete_claim(claim, WAIT).await;
    }
    bed.until("the driver's volumes deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    bed.finish().await;
}
