//! csi-provisioner and the scheduler: claims sent back to the scheduler (their selected node
//! removed) and the topology CreateVolume asks for. The real binary against our API server
//! and reference driver.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use serde_json::json;

const T: Duration = Duration::from_secs(15);
/// The reference driver's topology key.
const KEY: &str = "topology.hostpath.csi.volstack.dev/node";

/// A claim of a WaitForFirstConsumer class made with `node` selected goes back to the
/// scheduler (its selected node removed) with a ProvisioningFailed event holding `words`, and
/// no volume behind it.
async fn sent_back_to_the_scheduler(c: &Cluster, name: &str, size: &str, node: &str, words: &str) {
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let claim = c
        .claim(
            name,
            "late",
            size,
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}}),
            true,
        )
        .await;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    c.wait_until("selected-node removed", T, || async {
        let claim = api.get(name).await.unwrap();
        !claim
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("volume.kubernetes.io/selected-node")
    })
    .await;
    c.wait_event(name, "ProvisioningFailed", words).await;
    assert!(c.pv_for(&claim).await.is_none());
    assert_eq!(c.driver_volumes().await, 0, "no volume behind the refusal");
}

#[tokio::test]
async fn resource_exhausted_with_a_selected_node_reschedules() {
    let c = Cluster::start(&["--capacity=1Gi"], &[], false).await;
    sent_back_to_the_scheduler(&c, "big", "2Gi", "node-1", "ResourceExhausted").await;
}

#[tokio::test]
async fn a_selected_node_without_a_csinode_sends_the_claim_back_to_the_scheduler() {
    let c = Cluster::start(&[], &[], false).await;
    sent_back_to_the_scheduler(
        &c,
        "lost",
        "1Gi",
        "gone",
        "failed to get selected CSINode gone: csinode.storage.k8s.io \"gone\" not found",
    )
    .await;
}

/// Sending a claim back to the scheduler keeps its ProvisioningFailed event when removing the
/// selected node fails (the claim's writes answered 500), and the removal is tried again.
#[tokio::test]
async fn a_failed_send_back_keeps_its_event_and_is_tried_again() {
    let c = Cluster::start(&[], &[], false).await;
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    c.stack.server.set_faults(vec![
        serde_json::from_value(
            json!({"resource": "persistentvolumeclaims", "verb": "UPDATE", "error": 500}),
        )
        .unwrap(),
    ]);
    c.claim(
        "stuck",
        "late",
        "1Gi",
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "gone"}}}),
        true,
    )
    .await;
    c.wait_event(
        "stuck",
        "ProvisioningFailed",
        "failed to get selected CSINode gone",
    )
    .await;
    c.wait_log("removing the selected node failed").await;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let selected = |claim: PersistentVolumeClaim| {
        claim
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("volume.kubernetes.io/selected-node")
    };
    assert!(selected(api.get("stuck").await.unwrap()), "not written");
    c.stack.server.set_faults(Vec::new());
    c.wait_until("selected-node removed", T, || async {
        !selected(api.get("stuck").await.unwrap())
    })
    .await;
}

#[tokio::test]
async fn topology_requests_follow_the_class_and_selected_node() {
    let c = Cluster::start(
        &["--extra-node=node-2=zone-b", "--topology-value=zone-a"],
        &["--strict-topology"],
        false,
    )
    .await;
    let node2: serde_json::Value = json!({"metadata": {"name": "node-2", "labels": {"topology.hostpath.csi.volstack.dev/node": "zone-b"}}});
    c.apply_cluster::<k8s_openapi::api::core::v1::Node>(node2)
        .await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::CSINode>(json!({
        "metadata": {"name": "node-2"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-2", "topologyKeys": ["topology.hostpath.csi.volstack.dev/node"]}]}
    }))
    .await;
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let claim = c
        .claim(
            "placed",
            "late",
            "1Gi",
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-2"}}}),
            true,
        )
        .await;
    let pv = c.wait_pv(&claim, T).await;
    assert_eq!(
        common::affinity_values(&pv),
        vec!["zone-b".to_string()],
        "strict topology puts the volume on the selected node's segment"
    );
}

/// The requirement kept for a claim's retries goes with a final CreateVolume error: the next
/// attempt asks for the segments of the nodes of then (upstream drops its per-claim cache on
/// ProvisioningFinished).
/// Kept, the retry would ask for zone-a, which no node is in any more.
#[tokio::test]
async fn a_retry_after_a_final_error_asks_for_the_topology_of_the_nodes_of_then() {
    let c = Cluster::start(
        &["--extra-node=node-2=zone-b", "--topology-value=zone-a"],
        &[],
        false,
    )
    .await;
    c.faults("CreateVolume=error:INVALID_ARGUMENT\n");
    c.class("now", json!({})).await;
    let claim = c.claim("moved", "now", "1Gi", json!({}), true).await;
    c.wait_event("moved", "ProvisioningFailed", "InvalidArgument")
        .await;
    // node-1 moves to a segment the driver has no node in; node-2 (zone-b) joins.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    nodes
        .patch(
            "node-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {KEY: "zone-c"}}})),
        )
        .await
        .unwrap();
    c.apply_cluster::<k8s_openapi::api::core::v1::Node>(
        json!({"metadata": {"name": "node-2", "labels": {KEY: "zone-b"}}}),
    )
    .await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::CSINode>(json!({
        "metadata": {"name": "node-2"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-2", "topologyKeys": [KEY]}]}
    }))
    .await;
    c.faults("");
    let pv = c.wait_pv(&claim, Duration::from_secs(60)).await;
    assert_eq!(common::affinity_values(&pv), vec!["zone-b".to_string()]);
}
