//! Quantities as each server stores them: the same claims, volumes and storage capacities,
//! sizes written in every form, made on kube-apiserver and on ours; each must answer the same
//! text.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Sizes as users write them (positive: a claim's request must be).
const SIZES: [&str; 28] = [
    "1Gi",
    "1024Mi",
    "2048Ki",
    "1536Ki",
    "1000Mi",
    "3Mi",
    "1.5Gi",
    "0.5Gi",
    "0.5Ki",
    "0.3Ki",
    "1023",
    "1500",
    "10000",
    "100000000",
    "1073741824",
    "1000M",
    "1.5M",
    "05M",
    "1.5",
    "0.1",
    "1e3",
    "1E3",
    "1.5e6",
    "1E",
    "1n",
    "0.1n",
    "1e-12",
    "+5M",
];

/// (claim's stored request, volume's stored capacity, storage capacity's stored capacity) for
/// each size, made through `client`: the first two are resource lists (rounded up to milli
/// units there), the last a lone quantity.
async fn stored(client: &kube::Client) -> Vec<(String, String, String)> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let mut answers = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("q-{i}")},
            "spec": {"storageClassName": "none", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}},
        }))
        .unwrap();
        let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("q-{i}")},
            "spec": {"storageClassName": "none", "accessModes": ["ReadWriteOnce"],
                     "capacity": {"storage": size}, "hostPath": {"path": "/tmp/q"}},
        }))
        .unwrap();
        let volume = volumes
            .create(&PostParams::default(), &volume)
            .await
            .unwrap();
        let capacity: CSIStorageCapacity = serde_json::from_value(json!({
            "metadata": {"name": format!("q-{i}")},
            "storageClassName": "none",
            "capacity": size,
        }))
        .unwrap();
        let lone = capacities
            .create(&PostParams::default(), &capacity)
            .await
            .unwrap()
            .capacity
            .map(|q| q.0)
            .unwrap_or_default();
        let request = claim
            .spec
            .and_then(|s| s.resources?.requests?.remove("storage"));
        let capacity = volume.spec.and_then(|s| s.capacity?.remove("storage"));
        answers.push((
            request.map(|q| q.0).unwrap_or_default(),
            capacity.map(|q| q.0).unwrap_or_default(),
            lone,
        ));
    }
    answers
}

#[tokio::test]
async fn sizes_are_stored_in_kube_apiservers_canonical_form() {
    let plane = crate::bed::bare_control_plane().await;
    let theirs = stored(&plane.admin().await.unwrap()).await;
    let ours = stored(&crate::bed::our_server("quantities-test").await.client).await;
    let differences: Vec<String> = SIZES
        .iter()
        .zip(theirs.iter().zip(&ours))
        .filter(|(_, (want, got))| want != got)
        .map(|(size, (want, got))| format!("{size:?}: kube-apiserver {want:?}, ours {got:?}"))
        .collect();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The check compares something: kube-apiserver rewrote sizes.
    let rewritten = ("1Gi".to_string(), "1Gi".to_string(), "1Gi".to_string());
    assert_eq!(theirs[1], rewritten, "{theirs:?}");
}
