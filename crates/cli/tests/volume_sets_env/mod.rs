//! The PersistentVolumeSet tests' helpers: making and changing sets, and reading their
//! volumes and status.

#![allow(dead_code, clippy::unwrap_used)]

use crate::common::Cluster;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use provisioner::volume_sets::types::PersistentVolumeSet;
use serde_json::json;

pub const FLAGS: [&str; 1] = ["--enable-volume-sets"];

pub async fn make_set(c: &Cluster, name: &str, min: i32, max: i32, size: &str) {
    let set: PersistentVolumeSet = serde_json::from_value(json!({
        "apiVersion": "storage.volstack.dev/v1alpha1",
        "kind": "PersistentVolumeSet",
        "metadata": {"name": name},
        "spec": {
            "minimumReplicas": min,
            "maximumReplicas": max,
            "selector": {"matchLabels": {"pool": name}},
            "template": {
                "metadata": {"labels": {"pool": name}},
                "spec": {"storageClassName": "pool", "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"]},
            },
        },
    }))
    .unwrap();
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
}

pub async fn patch_set(c: &Cluster, name: &str, patch: serde_json::Value) {
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

pub fn phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The set's volumes that are not being deleted.
pub async fn members(c: &Cluster, set: &str) -> Vec<PersistentVolume> {
    Api::<PersistentVolume>::all(c.client.clone())
        .list(&ListParams::default().labels(&format!("pool={set}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pv| pv.metadata.deletion_timestamp.is_none())
        .collect()
}

pub async fn count(c: &Cluster, set: &str, wanted_phase: &str) -> usize {
    members(c, set)
        .await
        .iter()
        .filter(|pv| phase(pv) == wanted_phase)
        .count()
}

pub async fn set_status(c: &Cluster, name: &str) -> serde_json::Value {
    let set = Api::<PersistentVolumeSet>::all(c.client.clone())
        .get(name)
        .await
        .unwrap();
    serde_json::to_value(set.status).unwrap()
}

pub fn size(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"]
        .0
        .clone()
}
