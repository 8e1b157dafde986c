//! Provisioning and deletion: an Immediate claim bound by kube-controller-manager's binder,
//! a WaitForFirstConsumer claim whose Pod kube-scheduler places, both deleted with their
//! volumes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::bed::{Bed, Setup, TOPOLOGY_KEY};

const WAIT: Duration = Duration::from_secs(90);

/// A Pod using `claim`, placed on `node` by kube-scheduler (a node selector) or anywhere.
pub fn pod(name: &str, claim: &str, node: Option<&str>) -> serde_json::Value {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "terminationGracePeriodSeconds": 0,
        }
    });
    if let Some(node) = node {
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    pod
}

/// Waits until kube-scheduler has put the Pod on a node; returns the node.
pub async fn scheduled(bed: &Bed, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    bed.until_some(&format!("pod {name} scheduled"), WAIT, || async {
        pods.get(name)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .filter(|n| !n.is_empty())
    })
    .await
}

/// Deletes a Pod at once (no kubelet would confirm a graceful deletion).
pub async fn delete_pod(bed: &Bed, name: &str) {
    Api::<Pod>::namespaced(bed.admin.clone(), "default")
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn immediate_and_late_binding_claims_are_provisioned_and_deleted_under_the_manifests_rbac() {
    let mut bed = Bed::start(Setup {
        nodes: &["node-1", "node-2"],
        ..Default::default()
    })
    .await;
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;

    bed.claim("now", "fast", "1Gi", json!({})).await;
    let now = bed.bound("now", WAIT).await;
    let annotations = now.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some(crate::bed::DRIVER)
    );

    bed.claim("later", "late", "1Gi", json!({})).await;
    bed.create::<Pod>("default", pod("user", "later", Some("node-2")))
        .await;
    let later = bed.bound("later", WAIT).await;
    assert_eq!(scheduled(&bed, "user").await, "node-2");
    let affinity = serde_json::to_value(&later.spec.as_ref().unwrap().node_affinity).unwrap();
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": TOPOLOGY_KEY, "operator": "In", "values": ["node-2"]}),
        "the volume is where its Pod was scheduled"
    );
    let selected = bed
        .get_claim("later")
        .await
        .and_then(|c| c.metadata.annotations)
        .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned());
    assert_eq!(selected.as_deref(), Some("node-2"));

    delete_pod(&bed, "user").await;
    bed.delete_claim("now", WAIT).await;
    bed.delete_claim("later", WAIT).await;
    bed.until("the driver's volumes deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    bed.finish().await;
}
