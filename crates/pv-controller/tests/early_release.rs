//! A lagging claim watch must not release a volume whose claim exists (issue 33): the PV
//! controller reads the claim from the API server before it marks a volume Released, as
//! kube-controller-manager does.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use apiserver::faults::FaultRule;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::PostParams;
use pv_controller::controller::{PvController, default_backoff};
use serde_json::json;
use sidecar_kit::watch::Watches;

use common::{CLIENT, serve, wait_for, watch_open};

fn phase(pv: &PersistentVolume) -> String {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_claim_the_cache_has_not_seen_yet_stays_bound() {
    let (server, admin, client) = serve().await;
    let controller = PvController::new(client, default_backoff(), false, Watches::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller.run(4, async {
        let _ = stopped.await;
    }));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());

    // The controller is running (a first claim exists, waiting for the volume it names); then
    // its claim watch lags: it is closed (a closed watch passes on no later change) and may
    // come back only after 120 s (longer than the test: on a busy machine
    // the decision may take seconds, and a watch back by then would make the live read moot).
    let warm: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "warm"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "", "volumeName": "pv-warm"},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &warm).await.unwrap();
    // Its claim watch is counted once the server has answered it, and by then the watch is
    // registered where closing watches finds it (waiting for the list alone left a window in
    // which the watch began after the close and was never away).
    watch_open(&server, "persistentvolumeclaims").await;
    server.set_faults(vec![FaultRule {
        resource: "persistentvolumeclaims".into(),
        verb: "WATCH".into(),
        latency_ms: 120_000,
        error: None,
        probability: 1.0,
    }]);
    server.close_watches(Some("persistentvolumeclaims"));

    // A claim and the volume bound to it appear while the claim watch is away.
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "", "volumeName": "pv-data"},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-data"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "",
            "hostPath": {"path": "/srv/pv-data"},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "data",
                         "uid": claim.metadata.uid.clone().unwrap()},
        },
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();

    // The controller decides the volume from its (lagging) cache, which lacks the claim: the
    // phase it writes says what it concluded.
    let decided = wait_for(
        "the controller to give pv-data a phase",
        Duration::from_secs(30),
        || async {
            let pv = pvs.get("pv-data").await.unwrap();
            let phase = phase(&pv);
            (!phase.is_empty() && phase != "Pending").then_some(phase)
        },
    )
    .await;
    assert_eq!(
        decided, "Bound",
        "the claim exists on the server: the volume must not be released"
    );
    let read_live = server
        .request_counts()
        .iter()
        .filter(|((verb, resource, _, client), _)| {
            verb == "GET" && resource == "persistentvolumeclaims" && client.starts_with(CLIENT)
        })
        .map(|(_, n)| *n)
        .sum::<u64>();
    assert!(read_live >= 1, "the claim was read from the server");
    server.set_faults(Vec::new());
    let _ = stop.send(());
    running.await.unwrap();
}
