//! PersistentVolumeSets (`--enable-volume-sets`, with `rbac-volume-sets.yaml` and the
//! definition from `deploy/kubernetes`): the pool fills, kube-controller-manager's binder binds
//! a claim to a pool volume, and the pool makes another.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ApiResource, ListParams};
use serde_json::json;

use crate::bed::{Bed, Setup, manifest};

const WAIT: Duration = Duration::from_secs(90);
const SET_LABEL: &str = "storage.volstack.dev/persistentvolumeset=warm";

#[tokio::test]
async fn a_pool_fills_and_kube_controller_managers_binder_binds_a_claim_to_it() {
    let mut bed = Bed::start(Setup {
        manifests: vec![
            manifest("persistentvolumeset-crd.json"),
            manifest("rbac.yaml"),
            manifest("rbac-volume-sets.yaml"),
        ],
        ..Default::default()
    })
    .await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.provisioner("csi-provisioner", &["--enable-volume-sets"], &[])
        .await;
    let sets = ApiResource {
        group: "storage.volstack.dev".into(),
        version: "v1alpha1".into(),
        api_version: "storage.volstack.dev/v1alpha1".into(),
        kind: "PersistentVolumeSet".into(),
        plural: "persistentvolumesets".into(),
    };
    bed.create_dynamic(
        &sets,
        None,
        json!({
            "apiVersion": "storage.volstack.dev/v1alpha1", "kind": "PersistentVolumeSet",
            "metadata": {"name": "warm"},
            "spec": {
                "minimumReplicas": 2, "maximumReplicas": 3,
                "selector": {"matchLabels": {"pool": "warm"}},
                "template": {
                    "metadata": {"labels": {"pool": "warm"}},
                    "spec": {"storageClassName": "fast", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]},
                },
            },
        }),
    )
    .await;
    let volumes: Api<PersistentVolume> = Api::all(bed.admin.clone());
    let available = || async {
        volumes
            .list(&ListParams::default().labels(SET_LABEL))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
            .count()
    };
    bed.until("two Available pool volumes", WAIT, || async {
        available().await >= 2
    })
    .await;

    bed.claim("data", "fast", "1Gi", json!({})).await;
    let bound = bed.bound("data", WAIT).await;
    assert!(
        bound
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("warm-")),
        "the claim got a pool volume: {:?}",
        bound.metadata.name
    );
    bed.until("the pool made up for the bound volume", WAIT, || async {
        available().await >= 2
    })
    .await;
    bed.finish().await;
}
