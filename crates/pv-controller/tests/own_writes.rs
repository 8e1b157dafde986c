//! The PV controller remembers its own writes until its caches catch up (issue 33): with the
//! volume watch lagging, a claim bound to one volume leaves that volume taken for the next
//! claim, which is bound to another volume without first trying the taken one (a 409 per try
//! on the old code, until the watch came back).

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

fn volume(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": format!("/tmp/{name}")}},
    }))
    .unwrap()
}

fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": ""},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_just_bound_is_not_offered_to_the_next_claim_while_the_cache_lags() {
    let (server, admin, client) = serve().await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    for name in ["pv-a", "pv-b"] {
        pvs.create(&PostParams::default(), &volume(name))
            .await
            .unwrap();
    }
    let controller = PvController::new(client, default_backoff(), false, Watches::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller.run(4, async {
        let _ = stopped.await;
    }));
    // Both volumes Available: the controller's cache has them.
    wait_for(
        "both volumes Available",
        Duration::from_secs(30),
        || async {
            let all = pvs.list(&Default::default()).await.unwrap().items;
            all.iter()
                .all(|pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
                .then_some(())
        },
    )
    .await;
    watch_open(&server, "persistentvolumes").await;
    // The volume watch goes away and comes back only after 20 s.
    server.set_faults(vec![FaultRule {
        resource: "persistentvolumes".into(),
        verb: "WATCH".into(),
        latency_ms: 20_000,
        error: None,
        probability: 1.0,
    }]);
    server.close_watches(Some("persistentvolumes"));

    let bound_to = |name: &'static str| {
        let claims = claims.clone();
        async move {
            let c = claims.get(name).await.unwrap();
            (c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .then(|| c.spec.and_then(|s| s.volume_name).unwrap_or_default())
        }
    };
    claims
        .create(&PostParams::default(), &claim("first"))
        .await
        .unwrap();
    let first = wait_for("the first claim Bound", Duration::from_secs(15), || {
        bound_to("first")
    })
    .await;
    claims
        .create(&PostParams::default(), &claim("second"))
        .await
        .unwrap();
    let second = wait_for("the second claim Bound", Duration::from_secs(15), || {
        bound_to("second")
    })
    .await;
    assert_ne!(first, second);
    let conflicts: u64 = server
        .request_counts()
        .iter()
        .filter(|((verb, resource, code, client), _)| {
            verb == "PUT"
                && resource == "persistentvolumes"
                && *code == 409
                && client.starts_with(CLIENT)
        })
        .map(|(_, n)| *n)
        .sum();
    assert_eq!(
        conflicts, 0,
        "the volume bound first was offered to the second claim"
    );
    server.set_faults(Vec::new());
    let _ = stop.send(());
    running.await.unwrap();
}
