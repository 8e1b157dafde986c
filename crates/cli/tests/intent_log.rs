//! The intent log against an API server that enforces kube-apiserver's 256 KiB annotation
//! limit: thousands of volumes in flight behind a failing driver are all recorded, then all
//! provisioned, and the log empties.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams};
use serde_json::json;

const CLAIMS: usize = 5_000;

/// Records in the intent log, the Leases holding them, and the largest annotation total.
async fn intent_records(c: &Cluster) -> (usize, usize, usize) {
    let shards = c.intent_shards().await;
    let records = shards.iter().map(|(_, volumes)| volumes.len()).sum();
    let largest = shards.iter().map(|(bytes, _)| *bytes).max().unwrap_or(0);
    (records, shards.len(), largest)
}

#[tokio::test]
async fn five_thousand_volumes_in_flight_fit_in_the_log_and_all_provision_afterwards() {
    let c = Cluster::start(
        &["--capacity=100Ti"],
        &["--worker-threads=50", "--in-flight-recovery=intent-log"],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    // Every CreateVolume fails as if the driver were unreachable: each claim stays in flight.
    c.faults("CreateVolume=error:UNAVAILABLE\n");
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in (worker..CLAIMS).step_by(16) {
                let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": format!("c{i:05}"), "annotations": {
                        "volume.kubernetes.io/storage-provisioner": common::DRIVER}},
                    "spec": {"storageClassName": "plain", "accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Mi"}}}
                }))
                .unwrap();
                api.create(&PostParams::default(), &claim).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    c.wait_until(
        "every claim to be recorded in the intent log",
        Duration::from_secs(300),
        || async { intent_records(&c).await.0 >= CLAIMS },
    )
    .await;
    let (records, shards, largest) = intent_records(&c).await;
    assert_eq!(records, CLAIMS);
    assert!(shards > 1, "5,000 records cannot fit in one object");
    assert!(
        largest <= 256 * 1024,
        "an intent Lease holds {largest} bytes of annotations"
    );
    assert!(
        !c.provisioner_log().contains("Too long"),
        "the API server refused an intent log write"
    );
    // The driver recovers: every claim is provisioned and the log empties.
    c.faults("");
    c.wait_until(
        "every claim to have a PV",
        Duration::from_secs(600),
        || async {
            Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(c.client.clone())
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .len()
                == CLAIMS
        },
    )
    .await;
    c.wait_until(
        "the intent log to empty",
        Duration::from_secs(120),
        || async { intent_records(&c).await.0 == 0 },
    )
    .await;
    assert_eq!(c.driver_volumes().await, CLAIMS);
}
