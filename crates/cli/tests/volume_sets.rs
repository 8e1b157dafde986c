//! PersistentVolumeSets against the real `csi-provisioner --enable-volume-sets`: a pool refills
//! as claims bind to its volumes, falls back to dynamic provisioning when empty, and under
//! driver failures and SIGKILLs never leaks a volume nor holds more than its maximum. Scaling
//! down: `volume_sets_scaling.rs`.

#![allow(clippy::unwrap_used)]

mod common;
mod volume_sets_env;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use provisioner::volume_sets::types::{LABEL_SET, PersistentVolumeSet};
use rand::Rng;
use serde_json::json;
use volume_sets_env::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_refills_as_claims_bind_and_claims_beyond_it_are_provisioned() {
    let c = Cluster::start(&["--capacity=1Ti"], &FLAGS, true).await;
    c.class("pool", json!({})).await;
    make_set(&c, "fast", 5, 10, "1Mi").await;
    c.wait_until(
        "5 Available volumes in the pool",
        Duration::from_secs(30),
        || async { count(&c, "fast", "Available").await == 5 },
    )
    .await;
    c.wait_until(
        "the set Ready with 5 unbound",
        Duration::from_secs(15),
        || async {
            let s = set_status(&c, "fast").await;
            s["unboundReplicas"] == 5 && s["conditions"][0]["status"] == "True"
        },
    )
    .await;
    let first = members(&c, "fast").await;
    assert!(first.iter().all(|pv| {
        let labels = pv.metadata.labels.as_ref().unwrap();
        labels[LABEL_SET] == "fast" && pv.spec.as_ref().unwrap().claim_ref.is_none()
    }));

    // Claims arrive: each binds to a pool volume at once, and the pool refills behind them.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    for i in 0..6 {
        c.claim(&format!("c-{i}"), "pool", "1Mi", json!({}), false)
            .await;
        c.wait_bound(&format!("c-{i}"), Duration::from_secs(30))
            .await;
    }
    for i in 0..6 {
        let claim = claims.get(&format!("c-{i}")).await.unwrap();
        let volume = claim.spec.unwrap().volume_name.unwrap();
        assert!(
            volume.starts_with("fast-"),
            "claim c-{i} bound to {volume}, not a pool volume"
        );
    }
    c.wait_until(
        "the pool back to its minimum within its maximum",
        Duration::from_secs(30),
        || async {
            count(&c, "fast", "Available").await >= 4 && count(&c, "fast", "Bound").await == 6
        },
    )
    .await;
    // 6 bound + 4 Available = the maximum of 10: the fifth cannot be made.
    c.wait_until(
        "the set at its maximum",
        Duration::from_secs(15),
        || async {
            let s = set_status(&c, "fast").await;
            s["replicas"] == 10
                && s["boundReplicas"] == 6
                && s["unboundReplicas"] == 4
                && s["conditions"][0]["reason"] == "BelowMinimum"
        },
    )
    .await;
    assert_eq!(members(&c, "fast").await.len(), 10);

    // The pool empties: the claim after it is provisioned dynamically.
    for i in 6..11 {
        c.claim(&format!("c-{i}"), "pool", "1Mi", json!({}), false)
            .await;
        c.wait_bound(&format!("c-{i}"), Duration::from_secs(30))
            .await;
    }
    let dynamic: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.spec?.volume_name)
        .filter(|v| v.starts_with("pvc-"))
        .collect();
    assert_eq!(dynamic.len(), 1, "one claim beyond the pool: {dynamic:?}");
    assert_eq!(members(&c, "fast").await.len(), 10);

    // Claims deleted: their pool volumes are deleted by policy (Delete), and the set refills.
    for i in 0..11 {
        claims
            .delete(&format!("c-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    c.wait_until(
        "the pool at its minimum again, the driver holding only its volumes",
        Duration::from_secs(60),
        || async {
            let m = members(&c, "fast").await;
            let all = Api::<PersistentVolume>::all(c.client.clone())
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            m.len() == 5
                && m.iter().all(|pv| phase(pv) == "Available")
                && all.len() == 5
                && c.driver_volumes().await == 5
        },
    )
    .await;

    // The set deleted: its unused volumes go with it.
    Api::<PersistentVolumeSet>::all(c.client.clone())
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until(
        "the pool's volumes deleted",
        Duration::from_secs(30),
        || async { members(&c, "fast").await.is_empty() && c.driver_volumes().await == 0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_failures_and_sigkills_leak_nothing_and_never_pass_the_maximum() {
    sets_under_chaos("auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_failures_and_sigkills_leak_nothing_with_the_intent_log() {
    sets_under_chaos("intent-log").await;
}

/// `recovery` is the `--in-flight-recovery` way (`auto` lists the reference driver's volumes).
async fn sets_under_chaos(recovery: &str) {
    let recovery = format!("--in-flight-recovery={recovery}");
    let mut c = Cluster::start(
        &["--capacity=1Ti"],
        &["--enable-volume-sets", "--timeout=1s", &recovery],
        true,
    )
    .await;
    c.class("pool", json!({})).await;
    let mut rng = c.seed_chaos("volume set chaos");
    c.faults("CreateVolume=error:UNAVAILABLE:0.2:after\nDeleteVolume=error:DEADLINE_EXCEEDED:0.2\n*=error:UNAVAILABLE:0.05\n");
    make_set(&c, "chaos", 8, 12, "1Mi").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let mut most = 0;
    let mut kills = 0;
    for round in 0..40 {
        if round % 4 == 1 {
            c.claim(&format!("c-{round}"), "pool", "1Mi", json!({}), false)
                .await;
        }
        if round % 8 == 6 {
            let _ = claims
                .delete(&format!("c-{}", round - 5), &DeleteParams::default())
                .await;
        }
        if rng.random::<f64>() < 0.3 {
            c.kill_provisioner();
            kills += 1;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            c.start_provisioner();
        }
        c.ensure_running();
        most = most.max(members(&c, "chaos").await.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.faults("");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        c.ensure_running();
        let m = members(&c, "chaos").await;
        most = most.max(m.len());
        let all = Api::<PersistentVolume>::all(c.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let handles: BTreeSet<String> = all
            .iter()
            .filter_map(|pv| Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()))
            .collect();
        let ids: BTreeSet<String> = c.driver_volume_ids().await.into_iter().collect();
        let available = m.iter().filter(|pv| phase(pv) == "Available").count();
        let deleting: Vec<&str> = all
            .iter()
            .filter(|pv| pv.metadata.deletion_timestamp.is_some())
            .filter_map(|pv| pv.metadata.name.as_deref())
            .collect();
        let intents: Vec<String> = c
            .intent_shards()
            .await
            .into_iter()
            .flat_map(|(_, v)| v)
            .collect();
        let settled = ids == handles
            && deleting.is_empty()
            && (available >= 8 || m.len() == 12)
            && intents.is_empty();
        if settled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: driver {ids:?}, PVs {handles:?}, being deleted {deleting:?}, intents {intents:?}, {} members, {available} Available\n{}",
            m.len(),
            c.provisioner_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("volume sets chaos: {kills} SIGKILLs, at most {most} volumes in the set (maximum 12)");
    assert!(
        most <= 12,
        "the set held {most} volumes, above its maximum of 12"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_pool_volumes_with_recycle_are_scrubbed_on_a_node_and_return_to_the_pool() {
    let c = Cluster::start_with(&["--capacity=1Ti"], &FLAGS, true, |o| o.kubelet = true).await;
    c.class("pool", json!({})).await;
    make_set(&c, "reuse", 1, 1, "1Mi").await;
    patch_set(
        &c,
        "reuse",
        json!({"spec": {"template": {"spec": {"persistentVolumeReclaimPolicy": "Recycle"}}}}),
    )
    .await;
    c.wait_until("one Available volume", Duration::from_secs(30), || async {
        count(&c, "reuse", "Available").await == 1
    })
    .await;
    let pv = members(&c, "reuse").await.remove(0);
    let pv_name = pv.metadata.name.clone().unwrap();
    assert_eq!(
        pv.spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Recycle")
    );
    let data = c.volume_dir(&pv);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    for round in 0..2 {
        let claim = format!("user-{round}");
        c.claim(&claim, "pool", "1Mi", json!({}), false).await;
        c.wait_bound(&claim, Duration::from_secs(30)).await;
        let bound = claims.get(&claim).await.unwrap();
        assert_eq!(
            bound.spec.unwrap().volume_name.as_deref(),
            Some(pv_name.as_str())
        );
        assert!(
            std::fs::read_dir(&data).unwrap().next().is_none(),
            "round {round}: the volume is handed over empty"
        );
        std::fs::create_dir_all(data.join("cache/deep")).unwrap();
        std::fs::write(data.join("cache/deep/secret.txt"), b"last tenant's data").unwrap();
        std::fs::write(data.join("top.txt"), b"more").unwrap();
        if round == 1 {
            // The node cannot publish it: the volume stays Released and says why.
            c.faults("NodePublishVolume=error:INTERNAL:1.0\n");
        }
        claims
            .delete(&claim, &DeleteParams::default())
            .await
            .unwrap();
        if round == 1 {
            c.wait_event(&pv_name, "VolumeFailedRecycle", "NodePublishVolume")
                .await;
            let stuck = Api::<PersistentVolume>::all(c.client.clone())
                .get(&pv_name)
                .await
                .unwrap();
            assert_eq!(phase(&stuck), "Released");
            assert!(
                data.join("top.txt").exists(),
                "nothing removed without the node"
            );
            c.faults("");
        }
        c.wait_until(
            "the volume Available again",
            Duration::from_secs(30),
            || async { count(&c, "reuse", "Available").await == 1 },
        )
        .await;
        assert!(
            std::fs::read_dir(&data).unwrap().next().is_none(),
            "round {round}: the contents are removed"
        );
        c.wait_event(&pv_name, "VolumeRecycled", "Volume recycled")
            .await;
    }
    // The set never made a second volume: the recycled one is its member again.
    assert_eq!(members(&c, "reuse").await.len(), 1);
    assert_eq!(c.driver_volumes().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_refusing_every_volume_is_reported_on_the_set_and_the_pool_fills_once_it_stops() {
    let c = Cluster::start(&["--capacity=1Ti"], &FLAGS, true).await;
    c.class("pool", json!({})).await;
    c.faults("CreateVolume=error:INVALID_ARGUMENT:1.0\n");
    make_set(&c, "refused", 3, 3, "1Mi").await;
    let message = c
        .wait_event("refused", "ProvisioningFailed", "InvalidArgument")
        .await;
    assert!(message.contains("CreateVolume of refused-"), "{message}");
    assert!(members(&c, "refused").await.is_empty());
    c.wait_until("the set not Ready", Duration::from_secs(15), || async {
        set_status(&c, "refused").await["conditions"][0]["reason"] == "BelowMinimum"
    })
    .await;
    c.faults("");
    c.wait_until(
        "the pool filled after the backoff",
        Duration::from_secs(60),
        || async { count(&c, "refused", "Available").await == 3 && c.driver_volumes().await == 3 },
    )
    .await;
    // A class that refers to the claim cannot make pool volumes: said on the set.
    c.class(
        "per-claim",
        json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}",
                              "csi.storage.k8s.io/provisioner-secret-namespace": "default"}}),
    )
    .await;
    make_set(&c, "templated", 0, 1, "1Mi").await;
    patch_set(
        &c,
        "templated",
        json!({"spec": {"minimumReplicas": 1, "template": {"spec": {"storageClassName": "per-claim"}}}}),
    )
    .await;
    c.wait_event("templated", "ProvisioningFailed", "refers to the claim")
        .await;
}

/// A set made before its StorageClass fails and backs off; the class's creation brings it back
/// at once. The provisioner's retries are an hour apart here, so nothing else fills the pool
/// within the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_made_before_its_class_fills_once_the_class_comes() {
    let mut flags = FLAGS.to_vec();
    flags.extend(["--retry-interval-start=1h", "--retry-interval-max=1h"]);
    let c = Cluster::start(&["--capacity=1Ti"], &flags, true).await;
    make_set(&c, "early", 2, 2, "1Mi").await;
    c.wait_event(
        "early",
        "ProvisioningFailed",
        "storageclass.storage.k8s.io \"pool\" not found",
    )
    .await;
    c.class("pool", json!({})).await;
    c.wait_until(
        "the pool filled once its class exists",
        Duration::from_secs(30),
        || async { count(&c, "early", "Available").await == 2 },
    )
    .await;
}

const T: Duration = Duration::from_secs(30);

/// A set's volumes made while every CreateVolume answered with an error, then a crash: the
/// restart finds them among the driver's volumes, deletes them, and the set makes its minimum.
#[tokio::test]
async fn a_sets_volumes_left_in_flight_at_a_crash_are_replaced() {
    let mut c = Cluster::start(
        &["--capacity=1Ti"],
        &["--enable-volume-sets", "--in-flight-recovery=list-volumes"],
        true,
    )
    .await;
    c.class("pool", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    make_set(&c, "left", 2, 2, "1Mi").await;
    c.wait_until("volumes made without an answer", T, || async {
        c.driver_volumes().await >= 2
    })
    .await;
    c.kill_provisioner();
    c.faults("");
    let before: BTreeSet<String> = c.driver_volume_ids().await.into_iter().collect();
    c.start_provisioner();
    c.wait_until("the set's minimum, made again", T, || async {
        let m = members(&c, "left").await;
        let handles: BTreeSet<String> = m
            .iter()
            .filter_map(|pv| Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()))
            .collect();
        let ids: BTreeSet<String> = c.driver_volume_ids().await.into_iter().collect();
        m.len() == 2 && m.iter().all(|pv| phase(pv) == "Available") && ids == handles
    })
    .await;
    let now: BTreeSet<String> = c.driver_volume_ids().await.into_iter().collect();
    assert!(
        before.is_disjoint(&now),
        "the volumes left in flight were deleted: {before:?} {now:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_plain_map_selector_is_read_as_its_match_labels() {
    let c = Cluster::start(&["--capacity=1Ti"], &FLAGS, true).await;
    c.class("pool", json!({})).await;
    // Sent as JSON (the typed set would write a LabelSelector): the selector is the seed's map.
    let sets = kube::api::ApiResource::erase::<PersistentVolumeSet>(&());
    let set: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "storage.volstack.dev/v1alpha1",
        "kind": "PersistentVolumeSet",
        "metadata": {"name": "plain"},
        "spec": {
            "minimumReplicas": 2,
            "maximumReplicas": 2,
            "selector": {"pool": "plain"},
            "template": {
                "metadata": {"labels": {"pool": "plain"}},
                "spec": {"storageClassName": "pool", "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"]},
            },
        },
    }))
    .unwrap();
    Api::<kube::api::DynamicObject>::all_with(c.client.clone(), &sets)
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    c.wait_until(
        "2 volumes in the plain-map set",
        Duration::from_secs(30),
        || async { count(&c, "plain", "Available").await == 2 },
    )
    .await;
    let stored = Api::<PersistentVolumeSet>::all(c.client.clone())
        .get("plain")
        .await
        .unwrap();
    assert_eq!(
        stored.spec.selector.match_labels.unwrap()["pool"],
        "plain",
        "read back as matchLabels"
    );
}
