//! Node deployment (`--node-deployment`): the provisioner of one node provisions the claims
//! kube-scheduler placed there, and takes an Immediate claim for its node by setting the
//! selected node itself.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::bed::{Bed, Setup, TOPOLOGY_KEY};
use crate::provisioning::pod;

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_node_deployed_provisioner_provisions_its_nodes_claims_and_takes_immediate_ones() {
    let mut bed = Bed::start(Setup {
        nodes: &["node-1", "node-2"],
        ..Default::default()
    })
    .await;
    bed.provisioner(
        "csi-provisioner-node-1",
        &[
            "--node-deployment",
            "--node-deployment-base-delay=200ms",
            "--node-deployment-max-delay=1s",
        ],
        &[("NODE_NAME", "node-1")],
    )
    .await;
    bed.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    bed.class("now", json!({"volumeBindingMode": "Immediate"}))
        .await;

    bed.claim("placed", "late", "1Gi", json!({})).await;
    bed.create::<Pod>("default", pod("user", "placed", Some("node-1")))
        .await;
    let placed = bed.bound("placed", WAIT).await;
    let affinity = serde_json::to_value(&placed.spec.as_ref().unwrap().node_affinity).unwrap();
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": TOPOLOGY_KEY, "operator": "In", "values": ["node-1"]})
    );

    bed.claim("taken", "now", "1Gi", json!({})).await;
    bed.bound("taken", WAIT).await;
    let selected = bed
        .get_claim("taken")
        .await
        .and_then(|c| c.metadata.annotations)
        .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned());
    assert_eq!(
        selected.as_deref(),
        Some("node-1"),
        "the node's provisioner took the claim"
    );
    bed.finish().await;
}
