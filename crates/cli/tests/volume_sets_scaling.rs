//! PersistentVolumeSets scaled down against the real `csi-provisioner --enable-volume-sets`:
//! largest available volumes first, volumes whose deletion secret is gone, static volumes.

#![allow(clippy::unwrap_used)]

mod common;
mod volume_sets_env;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use provisioner::volume_sets::types::{LABEL_SET, PersistentVolumeSet};
use serde_json::json;
use volume_sets_env::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_deletes_the_largest_available_volumes_first() {
    let c = Cluster::start(&["--capacity=1Ti"], &FLAGS, true).await;
    c.class("pool", json!({})).await;
    make_set(&c, "mixed", 2, 6, "1Mi").await;
    c.wait_until("2 volumes of 1Mi", Duration::from_secs(30), || async {
        count(&c, "mixed", "Available").await == 2
    })
    .await;
    // A larger template and a higher minimum: two volumes of 4Mi join; the old ones stay.
    patch_set(
        &c,
        "mixed",
        json!({"spec": {"minimumReplicas": 4, "template": {"spec": {"capacity": {"storage": "4Mi"}}}}}),
    )
    .await;
    c.wait_until("4 volumes", Duration::from_secs(30), || async {
        count(&c, "mixed", "Available").await == 4
    })
    .await;
    // A hand-made volume that matches the selector is adopted (and is the largest).
    let hand_made: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "hand-made", "labels": {"pool": "mixed"}},
        "spec": {"capacity": {"storage": "8Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "pool",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/nowhere"}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(c.client.clone())
        .create(&PostParams::default(), &hand_made)
        .await
        .unwrap();
    c.wait_until("the set counting 5", Duration::from_secs(15), || async {
        set_status(&c, "mixed").await["replicas"] == 5
    })
    .await;
    // Scaled down to 2 (the scale subresource moves maximumReplicas): the two 4Mi volumes go;
    // the hand-made one belongs to no CSI driver of ours and is left alone.
    patch_set(&c, "mixed", json!({"spec": {"minimumReplicas": 1}})).await;
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .patch_scale(
            "mixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    c.wait_until(
        "the two 4Mi volumes deleted",
        Duration::from_secs(30),
        || async {
            let sizes: BTreeSet<String> = members(&c, "mixed").await.iter().map(size).collect();
            members(&c, "mixed").await.len() == 3
                && sizes == BTreeSet::from(["1Mi".to_string(), "8Mi".to_string()])
                && c.driver_volumes().await == 2
        },
    )
    .await;
    // The status follows once the controller sees the deletions (it may still say 5 here).
    c.wait_until(
        "the set's status counting 3",
        Duration::from_secs(30),
        || async { set_status(&c, "mixed").await["replicas"] == 3 },
    )
    .await;
}

/// As upstream's deletions, a set's volume whose deletion secret is gone is still deleted
/// (DeleteVolume without it) when the set scales down, instead of waiting for the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_deletes_volumes_whose_deletion_secret_is_gone() {
    let c = Cluster::start(&["--capacity=1Gi"], &FLAGS, true).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(c.client.clone(), "default");
    let secret = serde_json::from_value(
        json!({"metadata": {"name": "pool-creds"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    c.class(
        "pool",
        json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "pool-creds",
                              "csi.storage.k8s.io/provisioner-secret-namespace": "default"}}),
    )
    .await;
    make_set(&c, "guarded", 2, 2, "1Mi").await;
    c.wait_until("2 volumes", Duration::from_secs(30), || async {
        count(&c, "guarded", "Available").await == 2 && c.driver_volumes().await == 2
    })
    .await;
    for pv in members(&c, "guarded").await {
        let annotations = pv.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("volume.kubernetes.io/provisioner-deletion-secret-name")
                .map(String::as_str),
            Some("pool-creds"),
            "the volume records its deletion secret"
        );
    }
    secrets
        .delete("pool-creds", &DeleteParams::default())
        .await
        .unwrap();
    patch_set(&c, "guarded", json!({"spec": {"minimumReplicas": 0}})).await;
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .patch_scale(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    c.wait_until(
        "both volumes deleted without their secret",
        Duration::from_secs(30),
        || async { members(&c, "guarded").await.is_empty() && c.driver_volumes().await == 0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_with_a_volume_source_makes_static_volumes_and_scales_them_down() {
    let c = Cluster::start(&["--capacity=1Ti"], &FLAGS, true).await;
    // The seed's template: a whole PV spec, here an NFS export and no class.
    let set: PersistentVolumeSet = serde_json::from_value(json!({
        "apiVersion": "storage.volstack.dev/v1alpha1",
        "kind": "PersistentVolumeSet",
        "metadata": {"name": "nfs"},
        "spec": {
            "minimumReplicas": 2,
            "maximumReplicas": 3,
            "selector": {"pool": "nfs"},
            "template": {
                "metadata": {"labels": {"pool": "nfs"}},
                "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany"],
                         "nfs": {"server": "nfs.example", "path": "/exports/pool"},
                         "persistentVolumeReclaimPolicy": "Delete"},
            },
        },
    }))
    .unwrap();
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    c.wait_until(
        "2 static volumes Available",
        Duration::from_secs(30),
        || async { count(&c, "nfs", "Available").await == 2 },
    )
    .await;
    for pv in members(&c, "nfs").await {
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.nfs.as_ref().unwrap().path, "/exports/pool");
        assert!(spec.csi.is_none(), "made as an object only");
        assert_eq!(size(&pv), "5Gi");
        assert_eq!(pv.metadata.labels.as_ref().unwrap()[LABEL_SET], "nfs");
        assert!(
            pv.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key("pv.kubernetes.io/provisioned-by")),
            "{:?}",
            pv.metadata
        );
    }
    // A claim without a class binds one; the set makes another.
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "shared", "namespace": "default"},
        "spec": {"storageClassName": "", "accessModes": ["ReadWriteMany"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    c.wait_until(
        "one bound, two Available",
        Duration::from_secs(30),
        || async {
            count(&c, "nfs", "Bound").await == 1 && count(&c, "nfs", "Available").await == 2
        },
    )
    .await;
    // Scaled down: Available ones go (objects only), the bound one stays.
    patch_set(
        &c,
        "nfs",
        json!({"spec": {"minimumReplicas": 0, "maximumReplicas": 1}}),
    )
    .await;
    c.wait_until(
        "only the bound volume left",
        Duration::from_secs(30),
        || async {
            let left = members(&c, "nfs").await;
            left.len() == 1 && phase(&left[0]) == "Bound"
        },
    )
    .await;
}
