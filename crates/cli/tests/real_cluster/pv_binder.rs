//! `volstack pv-controller` in place of kube-controller-manager's binder (started without
//! `persistentvolume-binder-controller`), under its ServiceAccount with
//! `deploy/kubernetes/pv-controller-rbac.yaml`: it leads through its Lease, binds a claim the
//! provisioner made a volume for, releases the volume when the claim goes (the provisioner
//! then deletes it), and serves its health, `workqueue_*` and operation metrics.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

use crate::bed::{Bed, Setup};
use sidecar_kit::testing::http_get;

const WAIT: Duration = Duration::from_secs(90);

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

#[tokio::test]
async fn our_pv_controller_binds_and_releases_in_place_of_kube_controller_managers_binder() {
    let mut bed = Bed::start(Setup::our_binder()).await;
    let port = free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    bed.pv_controller(
        "pv-controller",
        &[
            "--leader-elect",
            "--leader-elect-resource-namespace=default",
            &endpoint,
        ],
    )
    .await;
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    // Nothing else binds on this cluster: a Bound claim is our controller's doing.
    bed.claim("data", "fast", "1Gi", json!({})).await;
    let pv = bed.bound("data", WAIT).await;
    let annotations = pv.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some(crate::bed::DRIVER)
    );
    let lease = Api::<Lease>::namespaced(bed.admin.clone(), "default")
        .get(pv_controller::runner::LEASE)
        .await
        .unwrap();
    assert!(
        lease.spec.and_then(|s| s.holder_identity).is_some(),
        "the replica leads through its Lease"
    );
    assert_eq!(http_get(port, "/healthz/leader-election").await, "ok");
    let metrics = http_get(port, "/metrics").await;
    for wanted in [
        r#"workqueue_adds_total{name="claims"}"#,
        r#"workqueue_adds_total{name="volumes"}"#,
        r#"pv_collector_bound_pvc_count{namespace="default",storage_class="fast",volume_attributes_class=""} 1"#,
        r#"pv_collector_bound_pv_count{storage_class="fast"} 1"#,
        // kube-controller-manager names its election after its lease.
        r#"leader_election_master_status{name="volstack-pv-controller"}"#,
        "retroactive_storageclass_total 0",
        "retroactive_storageclass_errors_total 0",
    ] {
        assert!(
            sidecar_kit::testing::has_metric(&metrics, wanted),
            "{wanted} missing from\n{metrics}"
        );
    }
    // From asking the provisioner to the binding, under the provisioner's name (observed once
    // the claim's status write returns, which may be after the claim is seen Bound).
    let provisioned = "\nvolume_operation_total_seconds_count{operation_name=\"provision\",plugin_name=\"hostpath.csi.volstack.dev\"} 1\n";
    bed.until("the provision operation timed", WAIT, || async {
        http_get(port, "/metrics").await.contains(provisioned)
    })
    .await;
    // The claim goes: the volume is Released by ours, and deleted by the provisioner.
    bed.delete_claim("data", WAIT).await;
    bed.until("the driver's volume deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    // From the release to the volume's deletion by the provisioner (the class's provisioner).
    let deleted = "\nvolume_operation_total_seconds_count{operation_name=\"delete\",plugin_name=\"hostpath.csi.volstack.dev\"} 1\n";
    bed.until("the delete operation timed", WAIT, || async {
        http_get(port, "/metrics").await.contains(deleted)
    })
    .await;
    bed.finish().await;
}
