//! What issue 36 added, on the real control plane: CSI migration of an in-tree class
//! (kube-controller-manager hands the claim to the CSI driver that stands in for the plugin;
//! our provisioner, serving that driver, provisions, writes the in-tree PV and deletes it), and
//! generic ephemeral volumes (kube-controller-manager's ephemeral-volume controller makes the
//! Pod's claim; our provisioner provisions it; the garbage collector deletes it with the Pod).

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::bed::{Bed, Setup};

const WAIT: Duration = Duration::from_secs(90);
const EBS: &str = "ebs.csi.aws.com";

#[tokio::test]
async fn an_in_tree_class_is_served_by_the_driver_that_stands_in_for_its_plugin() {
    let mut bed = Bed::start(Setup {
        driver_args: &["--drivername=ebs.csi.aws.com"],
        ..Default::default()
    })
    .await;
    // The driver registered on its node under the migrated name, as node-driver-registrar does.
    let csinode: CSINode = Api::<CSINode>::all(bed.admin.clone())
        .get("node-1")
        .await
        .unwrap();
    let mut entry = csinode.spec.drivers[0].clone();
    entry.name = EBS.into();
    Api::<CSINode>::all(bed.admin.clone())
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "add", "path": "/spec/drivers/-", "value": entry}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    bed.create_cluster::<CSIDriver>(
        json!({"metadata": {"name": EBS}, "spec": {"attachRequired": false}}),
    )
    .await;
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.create_cluster::<StorageClass>(json!({
        "metadata": {"name": "gp2"},
        "provisioner": "kubernetes.io/aws-ebs",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "parameters": {"fsType": "xfs"},
    }))
    .await;
    bed.claim("data", "gp2", "1Gi", json!({})).await;
    let pv = bed.bound("data", WAIT).await;
    // kube-controller-manager named the CSI driver on the claim.
    let claim = bed.get_claim("data").await.unwrap();
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()["volume.kubernetes.io/storage-provisioner"],
        EBS
    );
    // The PV is the in-tree plugin's.
    let spec = pv.spec.as_ref().unwrap();
    assert!(spec.csi.is_none(), "{spec:?}");
    let ebs = spec.aws_elastic_block_store.as_ref().unwrap();
    assert_eq!(ebs.fs_type.as_deref(), Some("xfs"));
    assert_eq!(bed.driver_volumes().await, vec![ebs.volume_id.clone()]);
    assert_eq!(
        pv.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/provisioned-by"],
        "kubernetes.io/aws-ebs"
    );
    // kube-controller-manager marks it migrated to the driver, and leaves its deletion to it.
    let name = pv.metadata.name.clone().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(bed.admin.clone());
    bed.until("the PV marked migrated-to the driver", WAIT, || async {
        pvs.get(&name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .get("pv.kubernetes.io/migrated-to")
            .map(String::as_str)
            == Some(EBS)
    })
    .await;
    bed.delete_claim("data", WAIT).await;
    bed.until("the driver's volume deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    bed.finish().await;
}

#[tokio::test]
async fn a_pods_generic_ephemeral_volume_is_provisioned_and_goes_with_the_pod() {
    let mut bed = Bed::start(Setup::default()).await;
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "scratch"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}],
                 "volumes": [{"name": "work", "ephemeral": {"volumeClaimTemplate": {
                     "metadata": {"labels": {"team": "a"}},
                     "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                              "resources": {"requests": {"storage": "1Mi"}}}}}}]},
    }))
    .unwrap();
    let pod = pods.create(&Default::default(), &pod).await.unwrap();
    // kube-controller-manager made the claim, owned by the Pod; kube-scheduler picked a node
    // for it; our provisioner provisioned it there.
    let pv = bed.bound("scratch-work", WAIT).await;
    let claim: PersistentVolumeClaim = bed.get_claim("scratch-work").await.unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", pod.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(claim.metadata.labels.as_ref().unwrap()["team"], "a");
    assert_eq!(bed.driver_volumes().await.len(), 1);
    // The Pod goes (no kubelet here: deleted at once); the garbage collector takes its claim,
    // and the volume goes by its reclaim policy.
    pods.delete(
        "scratch",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(bed.admin.clone());
    let name = pv.metadata.name.clone().unwrap();
    bed.until("the Pod's claim and volume deleted", WAIT, || async {
        bed.get_claim("scratch-work").await.is_none() && pvs.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    assert!(bed.driver_volumes().await.is_empty());
    bed.finish().await;
}
