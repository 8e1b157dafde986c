//! Drop-in: with the Go sidecars' own RBAC (fixtures/upstream-*-rbac.yaml) and nothing else,
//! every upstream feature of ours works without one 403: leader election, provisioning, clone,
//! restore, capacity with its owner, attach and detach.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::bed::{Bed, Setup, fixture};
use crate::data_sources::{clone_and_restore, delete_all};
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

    clone_and_restore(&bed, "fast", "late").await;
    bed.create::<Pod>("default", pod("user", "restored", None))
        .await;
    bed.bound("restored", WAIT).await;
    bed.until("the restored volume attached", WAIT, || async {
        bed.attachments()
            .await
            .iter()
            .any(|va| va.status.as_ref().is_some_and(|s| s.attached))
    })
    .await;
    delete_pod(&bed, "user").await;
    bed.no_attachments(WAIT).await;
    delete_all(&bed).await;
    bed.finish().await;
}
