//! The PV controller against our API server: binding rules that need real concurrency.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

fn static_pv(name: &str, size: &str, class: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": {"size": size}},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": format!("/tmp/{name}")}}
    })
}

async fn bound_volume(c: &Cluster, claim: &str) -> String {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let pvc = api.get(claim).await.unwrap();
        if pvc.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
            return pvc.spec.unwrap().volume_name.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{claim} never Bound"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_smallest_matching_volume_is_bound_and_racing_claims_get_one_each() {
    let c = Cluster::start(&[], &[], true).await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(
        json!({"metadata": {"name": "manual"}, "provisioner": "kubernetes.io/no-provisioner"}),
    )
    .await;
    for (name, size) in [
        ("pv-big", "10Gi"),
        ("pv-small", "2Gi"),
        ("pv-tiny", "500Mi"),
    ] {
        c.apply_cluster::<PersistentVolume>(static_pv(name, size, "manual"))
            .await;
    }
    c.claim("one", "manual", "1Gi", json!({}), false).await;
    assert_eq!(bound_volume(&c, "one").await, "pv-small");
    // Two claims race for the one volume left that fits 5Gi: exactly one wins.
    c.claim("race-a", "manual", "5Gi", json!({}), false).await;
    c.claim("race-b", "manual", "5Gi", json!({}), false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let mut bound = Vec::new();
    for name in ["race-a", "race-b"] {
        let pvc = claims.get(name).await.unwrap();
        if pvc.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
            bound.push(pvc.spec.unwrap().volume_name.unwrap());
        }
    }
    assert_eq!(
        bound,
        vec!["pv-big".to_string()],
        "exactly one claim bound the big volume"
    );
    let pv = Api::<PersistentVolume>::all(c.client.clone())
        .get("pv-big")
        .await
        .unwrap();
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
}

#[tokio::test]
async fn pre_bound_claims_selectors_and_release() {
    let c = Cluster::start(&[], &[], true).await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(
        json!({"metadata": {"name": "manual"}, "provisioner": "kubernetes.io/no-provisioner"}),
    )
    .await;
    for (name, size) in [("pv-a", "1Gi"), ("pv-b", "3Gi"), ("pv-c", "8Gi")] {
        c.apply_cluster::<PersistentVolume>(static_pv(name, size, "manual"))
            .await;
    }
    c.claim(
        "wants-c",
        "manual",
        "1Gi",
        json!({"spec": {"volumeName": "pv-c"}}),
        false,
    )
    .await;
    assert_eq!(
        bound_volume(&c, "wants-c").await,
        "pv-c",
        "spec.volumeName is honoured"
    );
    c.claim(
        "picky",
        "manual",
        "1Gi",
        json!({"spec": {"selector": {"matchLabels": {"size": "3Gi"}}}}),
        false,
    )
    .await;
    assert_eq!(
        bound_volume(&c, "picky").await,
        "pv-b",
        "the selector excludes the smaller volume"
    );
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("picky", &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    c.wait_until("pv-b Released", T, || async {
        pvs.get("pv-b")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Released")
    })
    .await;
    c.claim("no-match", "manual", "100Gi", json!({}), false)
        .await;
    c.wait_event(
        "no-match",
        "FailedBinding",
        "no persistent volumes available",
    )
    .await;
}

#[tokio::test]
async fn default_class_and_missing_class() {
    let c = Cluster::start(&[], &[], true).await;
    // `register` created the default class "hostpath".
    let claim: PersistentVolumeClaim = c
        .apply(json!({"metadata": {"name": "defaulted"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .await;
    assert_eq!(
        bound_volume(&c, "defaulted").await,
        format!("pvc-{}", claim.metadata.uid.unwrap())
    );
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    assert_eq!(
        api.get("defaulted")
            .await
            .unwrap()
            .spec
            .unwrap()
            .storage_class_name
            .as_deref(),
        Some("hostpath")
    );
    c.claim("lost-class", "nope", "1Gi", json!({}), false).await;
    c.wait_event("lost-class", "ProvisioningFailed", "\"nope\" not found")
        .await;
    c.class("nope", json!({})).await;
    bound_volume(&c, "lost-class").await;
}
