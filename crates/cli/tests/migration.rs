//! CSI migration: the reference driver poses as `ebs.csi.aws.com`, the driver that stands in
//! for the in-tree `kubernetes.io/aws-ebs`. A claim of an in-tree class is provisioned by it
//! (the PV controller names the CSI driver on the claim, as kube-controller-manager does), the
//! PV written is the in-tree plugin's, a Pod on it gets it attached and published through the
//! driver, and it is deleted through the driver.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const EBS: &str = "ebs.csi.aws.com";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_tree_class_is_provisioned_as_an_in_tree_volume_and_deleted_by_the_migrated_driver() {
    let port = common::free_port();
    let c = Cluster::start_with(
        &["--drivername=ebs.csi.aws.com", "--capacity=1Ti"],
        &[&format!("--http-endpoint=127.0.0.1:{port}")],
        true,
        |o| {
            o.attach = true;
            o.kubelet = true;
        },
    )
    .await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(json!({
        "metadata": {"name": "gp2"},
        "provisioner": "kubernetes.io/aws-ebs",
        "reclaimPolicy": "Delete",
        "parameters": {"fsType": "xfs"},
    }))
    .await;
    let claim = c.claim("data", "gp2", "1Gi", json!({}), false).await;
    c.wait_bound("data", WAIT).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let bound = claims.get("data").await.unwrap();
    let annotations = bound.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["volume.kubernetes.io/storage-provisioner"], EBS,
        "the PV controller names the CSI driver for the in-tree class"
    );
    let pv = c.pv_for(&claim).await.unwrap();
    let spec = pv.spec.as_ref().unwrap();
    assert!(
        spec.csi.is_none(),
        "written as the in-tree plugin's PV: {spec:?}"
    );
    let ebs = spec.aws_elastic_block_store.as_ref().unwrap();
    assert_eq!(
        ebs.fs_type.as_deref(),
        Some("xfs"),
        "the class's fsType, translated"
    );
    let ids = c.driver_volume_ids().await;
    assert_eq!(ids, vec![ebs.volume_id.clone()], "the driver made it");
    assert_eq!(
        pv.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/provisioned-by"],
        "kubernetes.io/aws-ebs"
    );
    assert!(
        pv.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer")
    );

    // A Pod on it: attached by the driver (a VolumeAttachment of the in-tree PV) and published.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    c.wait_pod_phase("app", "Running", WAIT).await;
    let attachments: Api<VolumeAttachment> = Api::all(c.client.clone());
    let attached = attachments.list(&Default::default()).await.unwrap().items;
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].spec.attacher, EBS);
    assert_eq!(
        attached[0].spec.source.persistent_volume_name.as_deref(),
        pv.metadata.name.as_deref()
    );
    assert!(attached[0].status.as_ref().unwrap().attached);
    pods.delete("app", &DeleteParams::default()).await.unwrap();
    c.wait_until("the Pod gone and the volume detached", WAIT, || async {
        pods.get_opt("app").await.unwrap().is_none()
            && attachments
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
    })
    .await;

    // Released: deleted through the CSI handle the in-tree PV translates to.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let name = pv.metadata.name.clone().unwrap();
    c.wait_until("the in-tree PV deleted", WAIT, || async {
        volumes.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    assert_eq!(c.driver_volumes().await, 0, "and its volume at the driver");
    // The metrics of a driver of a migrated plugin, as upstream's: the `migrated` label, true
    // for the calls of the in-tree volume; the start-up's Probe again under the driver's name.
    let text = sidecar_kit::testing::http_get(port, "/metrics").await;
    for wanted in [
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume",migrated="true"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/DeleteVolume",migrated="true"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe",migrated="false"}"#,
    ] {
        assert!(text.contains(wanted), "{wanted} missing from\n{text}");
    }

    // A claim still naming the in-tree plugin, marked migrated to the driver (as
    // kube-controller-manager marks older claims), is provisioned too.
    let legacy = c
        .claim(
            "legacy",
            "gp2",
            "1Gi",
            json!({"metadata": {"annotations": {
                "volume.kubernetes.io/storage-provisioner": "kubernetes.io/aws-ebs",
                "pv.kubernetes.io/migrated-to": EBS}}}),
            false,
        )
        .await;
    c.wait_bound("legacy", WAIT).await;
    let legacy_pv = c.pv_for(&legacy).await.unwrap();
    assert!(legacy_pv.spec.unwrap().aws_elastic_block_store.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_create_repeated_for_a_gone_claim_of_an_in_tree_class_counts_as_migrated() {
    let port = common::free_port();
    let c = claim_failing_in_flight(port, &[]).await;
    assert_eq!(
        c.driver_volumes().await,
        1,
        "a volume exists behind the error"
    );
    c.delete_claim("gone").await;
    // The faults go only once the provisioner works for the gone claim: no attempt for the
    // live claim can then succeed and save a PV.
    c.wait_until(
        "the provisioner to clean up after the gone claim",
        WAIT,
        || async {
            c.provisioner_log()
                .contains("claim is gone while its volume may exist")
        },
    )
    .await;
    c.faults("");
    c.wait_until("the gone claim's volume to be deleted", WAIT, || async {
        c.driver_volumes().await == 0
    })
    .await;
    // Upstream repeats the claim's provisioning, labelled by its class; the cleanup's
    // DeleteVolume is labelled as upstream's cleanupVolume labels it (not migrated).
    let text = sidecar_kit::testing::http_get(port, "/metrics").await;
    for wanted in [
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="Unavailable",method_name="/csi.v1.Controller/CreateVolume",migrated="true"}"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume",migrated="true"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/DeleteVolume",migrated="false"} 1"#,
    ] {
        assert!(text.contains(wanted), "{wanted} missing from\n{text}");
    }
    assert!(
        !text.contains(r#"method_name="/csi.v1.Controller/CreateVolume",migrated="false""#),
        "no CreateVolume counted as not migrated:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_create_repeated_from_the_intent_log_still_counts_as_migrated() {
    let port = common::free_port();
    let mut c = claim_failing_in_flight(port, &["--in-flight-recovery=intent-log"]).await;
    c.kill_provisioner();
    c.delete_claim("gone").await;
    c.faults("");
    c.start_provisioner();
    c.wait_until("the gone claim's volume to be deleted", WAIT, || async {
        c.driver_volumes().await == 0
    })
    .await;
    // The restarted process made only the clean-up's calls: the CreateVolume repeated from
    // the record is labelled by the class it was recorded for.
    let text = sidecar_kit::testing::http_get(port, "/metrics").await;
    let wanted = r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume",migrated="true"} 1"#;
    assert!(text.contains(wanted), "{wanted} missing from\n{text}");
    assert!(
        !text.contains(r#"method_name="/csi.v1.Controller/CreateVolume",migrated="false""#),
        "no CreateVolume counted as not migrated:\n{text}"
    );
}

/// A provisioner posing as the EBS driver (metrics on `port`, a 500 ms timeout, `extra` flags)
/// and the in-tree `gp2` class; the claim `gone` of it has failed once: the driver makes the
/// volume but answers Unavailable (every time, until the faults go), so the volume may exist,
/// in the background, and stays in flight.
async fn claim_failing_in_flight(port: u16, extra: &[&str]) -> Cluster {
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    let mut flags = vec![endpoint.as_str(), "--timeout=500ms"];
    flags.extend_from_slice(extra);
    let c = Cluster::start_with(
        &["--drivername=ebs.csi.aws.com", "--capacity=1Ti"],
        &flags,
        true,
        |_| {},
    )
    .await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(json!({
        "metadata": {"name": "gp2"},
        "provisioner": "kubernetes.io/aws-ebs",
        "reclaimPolicy": "Delete",
    }))
    .await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("gone", "gp2", "1Gi", json!({}), false).await;
    c.wait_event("gone", "ProvisioningFailed", "Unavailable")
        .await;
    c
}
