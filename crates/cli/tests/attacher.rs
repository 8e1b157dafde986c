//! `csi-attacher` (the real binary) against our API server and the reference driver with
//! `--enable-attach`: attach, detach, a re-list after the watch was away, the reconcile
//! repairing drift both ways, the trivial handler, leadership and metrics, and SIGKILL chaos
//! over 200 attachments. Failures: `attacher_failures.rs`.

#![allow(clippy::unwrap_used)]

mod attacher_env;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use attacher_env::*;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_then_detach_protects_the_volume_until_no_attachment_names_it() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-a", json!({})).await;
    env.attach("va-a", "pv-a", "node-1", &[]).await;
    let va = env.wait_attached("va-a").await;
    assert_eq!(finalizers(&va.metadata), vec![FINALIZER]);
    assert_eq!(
        va.metadata.annotations.unwrap()["csi.alpha.kubernetes.io/node-id"],
        "node-1"
    );
    let status = va.status.unwrap();
    assert!(
        status
            .attachment_metadata
            .unwrap()
            .contains_key("hostpath.csi.volstack.dev/path"),
        "the publish context is the attachment metadata"
    );
    assert!(status.attach_error.is_none());
    assert!(finalizers(&env.pv("pv-a").await.unwrap().metadata).contains(&FINALIZER.to_string()));
    assert_eq!(
        env.published().await[&id],
        BTreeSet::from(["node-1".to_string()])
    );
    // Three writes: the PV's finalizer, the attachment's finalizer and node id, the status.
    assert_eq!(
        env.writes(),
        3,
        "writes for the first attach of a volume: {:?}",
        env.stack.server.request_counts()
    );

    // A second node: the driver refuses a single-node volume on two nodes.
    env.attach("va-b", "pv-a", "node-2", &[]).await;
    let error = env
        .wait_error("va-b", false, "rpc error: code = FailedPrecondition")
        .await;
    assert_eq!(error["errorCode"], json!(9), "{error}");
    assert!(error["time"].is_string());

    // The PV is deleted while attached: it waits for its attachments.
    Api::<PersistentVolume>::all(env.client())
        .delete("pv-a", &DeleteParams::default())
        .await
        .unwrap();
    env.detach("va-a").await;
    env.wait_until("va-a gone", || async { env.va("va-a").await.is_none() })
        .await;
    assert!(
        env.published()
            .await
            .get(&id)
            .is_none_or(|n| !n.contains("node-1")),
        "unpublished from node-1"
    );
    assert!(
        env.pv("pv-a").await.is_some(),
        "va-b still names the PV: it keeps the finalizer"
    );
    env.detach("va-b").await;
    env.wait_until("va-b gone", || async { env.va("va-b").await.is_none() })
        .await;
    env.wait_until("the PV gone once nothing names it", || async {
        env.pv("pv-a").await.is_none()
    })
    .await;
    assert!(env.published().await.is_empty());
}

/// Requests of `verb` on VolumeAttachments the attacher made, answered with `code` (any when
/// None).
fn attacher_requests(env: &Env, verb: &str, code: Option<u16>) -> u64 {
    env.stack
        .server
        .request_counts()
        .into_iter()
        .filter(|((v, resource, c, client), _)| {
            v == verb
                && resource == "volumeattachments"
                && code.is_none_or(|code| *c == code)
                && client.starts_with("csi-attacher")
        })
        .map(|(_, n)| n)
        .sum()
}

/// An attachment deleted while the attacher's watch was away, and aged out of the API
/// server's history before the watch came back, is learnt from the re-list: the PV being
/// deleted that it was the last to name loses our finalizer. (A re-list that did not look at
/// such PVs again would leave it to the 10-minute resync.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_releases_the_volume_an_attachment_deleted_meanwhile_was_the_last_to_name() {
    const HISTORY: usize = 50;
    let env = Env::start_with(&["--enable-attach"], &[], |options| {
        options.watch_history = Some(HISTORY)
    })
    .await;
    env.volume("pv-r", json!({})).await;
    // Ours attaches it (the PV gets our finalizer); another attacher's attachment names it too.
    env.attach("va-r", "pv-r", "node-1", &[]).await;
    env.wait_attached("va-r").await;
    let attachments = Api::<VolumeAttachment>::all(env.client());
    let other =
        sidecar_kit::testing::attachment("va-other", "other.csi.example.com", "node-2", "pv-r")
            .build();
    attachments
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    // The PV is deleted and ours detached: the other attachment keeps it.
    Api::<PersistentVolume>::all(env.client())
        .delete("pv-r", &DeleteParams::default())
        .await
        .unwrap();
    env.detach("va-r").await;
    env.wait_until("va-r gone", || async { env.va("va-r").await.is_none() })
        .await;
    let pv = env.pv("pv-r").await.expect("va-other still names pv-r");
    assert!(finalizers(&pv.metadata).contains(&FINALIZER.to_string()));

    // The attacher's watch of attachments is closed and cannot come back ...
    let lists_before = attacher_requests(&env, "LIST", None);
    env.stack.server.set_faults(vec![
        serde_json::from_value(
            json!({"resource": "volumeattachments", "verb": "WATCH", "error": 500}),
        )
        .unwrap(),
    ]);
    env.stack.server.close_watches(Some("volumeattachments"));
    common::poll_for(
        "the attacher's watch of attachments refused",
        WAIT,
        || env.log(),
        || async {
            match attacher_requests(&env, "WATCH", Some(500)) {
                0 => Err("not yet".to_string()),
                _ => Ok(()),
            }
        },
    )
    .await;
    // ... while the other attachment goes, and more changes than the history holds are made.
    attachments
        .delete("va-other", &DeleteParams::default())
        .await
        .unwrap();
    let maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(env.client(), "default");
    for i in 0..HISTORY + 10 {
        let map =
            serde_json::from_value(json!({"metadata": {"name": format!("filler-{i}")}})).unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    // va-other, which the attacher does not know is gone, still keeps the PV. (A check made
    // while it may not have looked yet: it can only catch a release that came early.)
    let pv = env.pv("pv-r").await.expect("pv-r kept for va-other");
    assert!(finalizers(&pv.metadata).contains(&FINALIZER.to_string()));
    env.stack.server.set_faults(Vec::new());
    // The watch cannot resume; the re-list shows no attachment names the PV any more. (The
    // deadline covers the watcher's backoff after its refused attempts, up to 30 s.)
    common::poll_until(
        "pv-r released and gone",
        Duration::from_secs(60),
        || env.log(),
        || async { env.pv("pv-r").await.is_none() },
    )
    .await;
    assert!(
        attacher_requests(&env, "LIST", None) > lists_before,
        "the attacher re-listed attachments: {:?}",
        env.stack.server.request_counts()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_driver_in_its_csinode_is_attached_by_its_node_annotation() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-n", json!({})).await;
    // Node "legacy" has no CSINode; its annotation names node-1's id for the driver (as
    // kubelet writes it), next to another driver's.
    let ids = json!({ DRIVER: "node-1", "other.csi.example.com": "elsewhere" }).to_string();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "legacy", "annotations": {"csi.volume.kubernetes.io/nodeid": ids}}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    env.attach("va-n", "pv-n", "legacy", &[]).await;
    let va = env.wait_attached("va-n").await;
    assert_eq!(
        va.metadata.annotations.unwrap()["csi.alpha.kubernetes.io/node-id"],
        "node-1",
        "the id came from the Node's annotation"
    );
    assert_eq!(
        env.published().await[&id],
        BTreeSet::from(["node-1".to_string()])
    );
    // Detached through the same id.
    env.detach("va-n").await;
    env.wait_until("va-n gone", || async { env.va("va-n").await.is_none() })
        .await;
    assert!(env.published().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_repairs_what_the_driver_lost_and_what_it_kept() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let lost = env.volume("pv-lost", json!({})).await;
    let kept = env.volume("pv-kept", json!({})).await;
    env.attach("va-lost", "pv-lost", "node-1", &[]).await;
    env.attach("va-kept", "pv-kept", "node-1", &["test.volstack.dev/hold"])
        .await;
    env.wait_attached("va-lost").await;
    env.wait_attached("va-kept").await;

    // The driver loses a publication behind the cluster's back: published again.
    let mut client = env.controller().await;
    client
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: lost.clone(),
            node_id: "node-1".into(),
            secrets: Default::default(),
        })
        .await
        .unwrap();
    assert!(!env.published().await.contains_key(&lost));
    env.wait_until("the lost publication repaired", || async {
        env.published().await.contains_key(&lost)
    })
    .await;
    assert!(env.va("va-lost").await.unwrap().status.unwrap().attached);

    // A detached attachment (held by another finalizer) the driver publishes again:
    // unpublished.
    env.detach("va-kept").await;
    env.wait_until("va-kept detached", || async {
        let va = env.va("va-kept").await.unwrap();
        !finalizers(&va.metadata).contains(&FINALIZER.to_string())
            && !va.status.is_some_and(|s| s.attached)
    })
    .await;
    assert!(!env.published().await.contains_key(&kept));
    let cap = csi::VolumeCapability::mount(
        "",
        csi::volume_capability::access_mode::Mode::SingleNodeWriter,
    );
    client
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: kept.clone(),
            node_id: "node-1".into(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap();
    env.wait_until("the stray publication removed", || async {
        !env.published().await.contains_key(&kept)
    })
    .await;
    assert!(
        env.log()
            .contains("the driver disagrees with status.attached")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_controller_publish_is_only_marked_attached() {
    let env = Env::start(&[], &[]).await;
    env.volume("pv-t", json!({})).await;
    env.attach("va-t", "pv-t", "node-1", &[]).await;
    let va = env.wait_attached("va-t").await;
    assert!(finalizers(&va.metadata).is_empty(), "no finalizers");
    assert!(va.status.unwrap().attachment_metadata.is_none());
    assert!(finalizers(&env.pv("pv-t").await.unwrap().metadata).is_empty());
    assert!(env.log().contains("using trivial handler"));
    env.detach("va-t").await;
    assert!(env.va("va-t").await.is_none(), "gone at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_chaos_over_200_attachments_ends_matching_the_driver() {
    const N: usize = 200;
    let mut env = Env::start(&["--enable-attach"], &["--worker-threads=8"]).await;
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(env.volume(&format!("pv-{i:03}"), json!({})).await);
    }
    for i in 0..N {
        env.attach(&format!("va-{i:03}"), &format!("pv-{i:03}"), "node-1", &[])
            .await;
    }
    // Kill the attacher at uneven moments while it attaches, and while half the attachments
    // are deleted.
    let mut rng_state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(150 + next() % 400)).await;
        env.kill_attacher();
        if round == 3 {
            for i in (0..N).step_by(2) {
                env.detach(&format!("va-{i:03}")).await;
            }
        }
        env.start_attacher();
    }
    let want: BTreeMap<String, BTreeSet<String>> = (1..N)
        .step_by(2)
        .map(|i| (ids[i].clone(), BTreeSet::from(["node-1".to_string()])))
        .collect();
    let vas: Api<VolumeAttachment> = Api::all(env.client());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = vas.list(&ListParams::default()).await.unwrap().items;
        let settled = list.len() == N / 2
            && list
                .iter()
                .all(|v| v.status.as_ref().is_some_and(|s| s.attached));
        if settled && env.published().await == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: {} attachments, {} attached, driver publishes {}\n{}",
            list.len(),
            list.iter()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                .count(),
            env.published().await.len(),
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in (1..N).step_by(2) {
        let va = env.va(&format!("va-{i:03}")).await.unwrap();
        assert_eq!(finalizers(&va.metadata), vec![FINALIZER], "va-{i:03}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_detaches_do_not_hold_up_attaches() {
    // Two workers per direction; every ControllerUnpublishVolume hangs.
    let env = Env::start(
        &["--enable-attach"],
        &["--worker-threads=2", "--timeout=2m"],
    )
    .await;
    for i in 0..3 {
        env.volume(&format!("pv-{i}"), json!({})).await;
        env.attach(&format!("va-{i}"), &format!("pv-{i}"), "node-1", &[])
            .await;
    }
    for i in 0..3 {
        env.wait_attached(&format!("va-{i}")).await;
    }
    env.faults("ControllerUnpublishVolume=hang\n");
    for i in 0..3 {
        env.detach(&format!("va-{i}")).await;
    }
    // Upstream's one pool would have both workers stuck in the hung detaches.
    env.volume("pv-new", json!({})).await;
    env.attach("va-new", "pv-new", "node-1", &[]).await;
    env.wait_attached("va-new").await;
    assert_eq!(
        env.published().await.len(),
        4,
        "the three hung detaches have not happened"
    );
    env.faults("");
    for i in 0..3 {
        let name = format!("va-{i}");
        env.wait_until(&format!("{name} gone"), || async {
            env.va(&name).await.is_none()
        })
        .await;
    }
    assert_eq!(env.published().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_leads_through_upstreams_lease_and_serves_upstreams_metrics() {
    let port = common::free_port();
    let env = Env::start(
        &["--enable-attach"],
        &[
            "--leader-election",
            &format!("--http-endpoint=127.0.0.1:{port}"),
        ],
    )
    .await;
    env.volume("pv-m", json!({})).await;
    env.attach("va-m", "pv-m", "node-1", &[]).await;
    env.wait_attached("va-m").await;
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(env.client(), "kube-system")
            .get("external-attacher-leader-hostpath-csi-volstack-dev")
            .await
            .unwrap();
    assert!(lease.spec.unwrap().holder_identity.is_some());
    let page = sidecar_kit::testing::http_get(port, "/metrics").await;
    for wanted in [
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.volstack.dev",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume"} 1"#,
        // The start-up calls, as upstream counts them: before the driver's name is known,
        // under `unknown-driver`.
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"}"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginInfo"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.volstack.dev",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginCapabilities"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.volstack.dev",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerGetCapabilities"} 1"#,
        r#"workqueue_adds_total{name="csi-attacher-va"}"#,
        r#"workqueue_adds_total{name="csi-attacher-va-detach"}"#,
        r#"workqueue_adds_total{name="csi-attacher-pv"}"#,
        // csi-lib-utils names no election: the Go sidecar's series is `name=""`.
        r#"leader_election_master_status{name=""}"#,
    ] {
        assert!(
            sidecar_kit::testing::has_metric(&page, wanted),
            "{wanted} missing from\n{page}"
        );
    }
    assert_eq!(
        sidecar_kit::testing::http_get(port, "/healthz/leader-election").await,
        "ok"
    );
}
