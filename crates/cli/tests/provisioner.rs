//! csi-provisioner scenarios: the real binary against our API server and reference driver.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

#[tokio::test]
async fn provisions_and_deletes_filesystem_and_block_volumes_for_every_access_mode() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    c.class(
        "fast",
        json!({"parameters": {"csi.storage.k8s.io/fstype": "xfs"}, "mountOptions": ["noatime"]}),
    )
    .await;
    c.class("raw", json!({})).await;
    let mut claims = Vec::new();
    for (i, mode) in [
        "ReadWriteOnce",
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOncePod",
    ]
    .iter()
    .enumerate()
    {
        claims.push(
            c.claim(
                &format!("fs-{i}"),
                "fast",
                "1Gi",
                json!({"spec": {"accessModes": [mode]}}),
                false,
            )
            .await,
        );
    }
    claims.push(
        c.claim(
            "blk",
            "raw",
            "2Gi",
            json!({"spec": {"volumeMode": "Block"}}),
            false,
        )
        .await,
    );
    for claim in &claims {
        let pv = c.wait_pv(claim, T).await;
        let spec = pv.spec.clone().unwrap();
        assert_eq!(spec.access_modes, claim.spec.as_ref().unwrap().access_modes);
        assert_eq!(spec.csi.as_ref().unwrap().driver, DRIVER);
        let block = claim.spec.as_ref().unwrap().volume_mode.as_deref() == Some("Block");
        assert_eq!(
            spec.volume_mode.as_deref(),
            Some(if block { "Block" } else { "Filesystem" })
        );
        assert_eq!(
            spec.csi.as_ref().unwrap().fs_type.as_deref(),
            if block { None } else { Some("xfs") }
        );
        assert_eq!(
            pv.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/provisioned-by"],
            DRIVER
        );
        assert_eq!(
            pv.metadata.finalizers,
            Some(vec![
                "external-provisioner.volume.kubernetes.io/finalizer".to_string()
            ])
        );
        assert!(
            spec.node_affinity.is_some(),
            "topology from the driver becomes node affinity"
        );
    }
    assert_eq!(c.driver_volumes().await, 5);
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    c.wait_until("all claims Bound", T, || async {
        claims_api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
    })
    .await;
    c.wait_event(
        "fs-0",
        "ProvisioningSucceeded",
        "Successfully provisioned volume",
    )
    .await;
    for claim in &claims {
        claims_api
            .delete(
                claim.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    c.wait_until("every PV deleted", T, || async {
        pvs.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    assert_eq!(c.driver_volumes().await, 0, "every driver volume deleted");
    let writes = c.api_writes("csi-provisioner");
    let pv_creates = writes
        .get(&("CREATE".to_string(), "persistentvolumes".to_string()))
        .copied()
        .unwrap_or(0);
    assert_eq!(pv_creates, 5);
    let get = |verb: &str, resource: &str| {
        writes
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        get("DELETE", "persistentvolumes"),
        5,
        "one DELETE per volume: {writes:?}"
    );
    assert_eq!(
        get("PATCH", "persistentvolumes"),
        5,
        "one finalizer PATCH per volume: {writes:?}"
    );
    // Batching of intent-log writes depends on timing (measured by `volstack bench`); here
    // only the bound that holds on any machine: one write per record and per removal.
    let intent_log = get("CREATE", "leases") + get("UPDATE", "leases");
    assert!(
        intent_log <= 10,
        "at most one intent-log write per record and per removal: {writes:?}"
    );
    let total: u64 = writes.values().sum::<u64>() - intent_log;
    assert!(
        total <= 5 * 4,
        "at most 2 writes per provisioned and 2 per deleted volume, got {writes:?}"
    );
}

#[tokio::test]
async fn retain_volumes_are_left_alone() {
    let c = Cluster::start(&[], &[], true).await;
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    let claim = c.claim("kept", "keep", "1Gi", json!({}), false).await;
    let pv = c.wait_pv(&claim, T).await;
    assert_eq!(pv.metadata.finalizers, None);
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let name = pv.metadata.name.clone().unwrap();
    c.wait_until("Released", T, || async {
        pvs.get(&name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Released")
    })
    .await;
    // A Delete volume released after it is deleted: the provisioner has handled the volume
    // events up to there, and left the Retain one alone.
    c.class("drop", json!({})).await;
    let later = c.claim("later", "drop", "1Gi", json!({}), false).await;
    let later_pv = c.wait_pv(&later, T).await;
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    let later_name = later_pv.metadata.name.clone().unwrap();
    c.wait_until("the Delete volume to go", T, || async {
        pvs.get_opt(&later_name).await.unwrap().is_none()
    })
    .await;
    assert!(
        pvs.get_opt(&name).await.unwrap().is_some(),
        "Retain keeps the PV"
    );
    assert_eq!(c.driver_volumes().await, 1, "and the volume");
}

#[tokio::test]
async fn bad_input_ends_in_a_provisioning_failed_event_and_no_create_volume() {
    let c = Cluster::start(&[], &[], false).await;
    // Any CreateVolume that reached the driver would fail with this message instead.
    c.faults("CreateVolume=error:INTERNAL\n");
    c.class("plain", json!({})).await;
    c.class(
        "unknown-key",
        json!({"parameters": {"csi.storage.k8s.io/colour": "blue"}}),
    )
    .await;
    c.class(
        "half-secret",
        json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "s"}}),
    )
    .await;
    c.class("bad-template", json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "${pvc.uid}", "csi.storage.k8s.io/provisioner-secret-namespace": "default"}})).await;
    // A template that once panicked a worker for good (an unterminated annotation key).
    c.class("torn-template", json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "${pvc.annotations[']}", "csi.storage.k8s.io/provisioner-secret-namespace": "default"}})).await;
    c.class("missing-secret", json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "nowhere", "csi.storage.k8s.io/provisioner-secret-namespace": "default"}})).await;
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let cases: Vec<(&str, &str, &str, serde_json::Value, &str)> = vec![
        (
            "selector",
            "plain",
            "1Gi",
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}),
            "claim Selector is not supported",
        ),
        (
            "unknown-key",
            "unknown-key",
            "1Gi",
            json!({}),
            "csi.storage.k8s.io/colour",
        ),
        (
            "half-secret",
            "half-secret",
            "1Gi",
            json!({}),
            "come in pairs",
        ),
        (
            "bad-template",
            "bad-template",
            "1Gi",
            json!({}),
            "${pvc.uid}",
        ),
        (
            "torn-template",
            "torn-template",
            "1Gi",
            json!({}),
            "${pvc.annotations[']}",
        ),
        (
            "missing-secret",
            "missing-secret",
            "1Gi",
            json!({}),
            "error getting secret nowhere in namespace default: secrets \"nowhere\" not found",
        ),
        ("size-huge", "plain", "7Ei", json!({}), "too large"),
        (
            "no-class",
            "missing-class",
            "1Gi",
            json!({}),
            "\"missing-class\" not found",
        ),
        (
            "no-csinode",
            "late",
            "1Gi",
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "ghost"}}}),
            "ghost",
        ),
    ];
    for (name, class, size, extra, _) in &cases {
        c.claim(name, class, size, extra.clone(), true).await;
    }
    for (name, _, _, _, words) in &cases {
        let message = c.wait_event(name, "ProvisioningFailed", words).await;
        assert!(
            !message.contains("injected"),
            "{name}: the driver was called: {message}"
        );
    }
    assert_eq!(c.driver_volumes().await, 0);
    // Sizes that are no quantity or not positive never reach the provisioner: the API server
    // refuses the claim as kube-apiserver does (the provisioner's own checks are unit-tested).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    for (name, size, words) in [
        ("size-garbage", "lots", "quantities must match"),
        ("size-zero", "0", "must be greater than zero"),
    ] {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"storageClassName": "plain", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}
        }))
        .unwrap();
        let err = claims
            .create(&Default::default(), &claim)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains(words)),
            "{name}: {err:?}"
        );
    }
}

#[tokio::test]
async fn a_missing_class_is_retried_until_it_appears_and_secrets_are_fetched_live() {
    let c = Cluster::start(&[], &[], false).await;
    let claim = c.claim("waits", "later", "1Gi", json!({}), true).await;
    c.wait_event("waits", "ProvisioningFailed", "not found")
        .await;
    c.class(
        "later",
        json!({"parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-creds",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
            "csi.storage.k8s.io/node-publish-secret-name": "np",
            "csi.storage.k8s.io/node-publish-secret-namespace": "default"
        }}),
    )
    .await;
    c.wait_event(
        "waits",
        "ProvisioningFailed",
        "error getting secret waits-creds in namespace default: secrets \"waits-creds\" not found",
    )
    .await;
    c.apply::<Secret>(
        json!({"metadata": {"name": "waits-creds"}, "stringData": {"password": "hunter2"}}),
    )
    .await;
    let pv = c.wait_pv(&claim, T).await;
    let ann = pv.metadata.annotations.unwrap();
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "waits-creds"
    );
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
        "default"
    );
    let csi = pv.spec.unwrap().csi.unwrap();
    assert_eq!(
        csi.node_publish_secret_ref.unwrap().name.as_deref(),
        Some("np")
    );
    assert!(
        !c.provisioner_log().contains("hunter2"),
        "secrets never reach the logs"
    );
    // A deletion secret gone before its volume does not keep the volume: as upstream, the
    // driver is asked without it.
    Api::<Secret>::namespaced(c.client.clone(), "default")
        .delete("waits-creds", &DeleteParams::default())
        .await
        .unwrap();
    // Released, as the PV controller (not running here) marks it once its claim is gone.
    let name = pv.metadata.name.clone().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    pvs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Released"}})),
    )
    .await
    .unwrap();
    c.wait_until("the volume deleted without its secret", T, || async {
        pvs.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    assert!(
        c.provisioner_log()
            .contains("deleting the volume without its deletion secret"),
        "the missing secret is logged"
    );
}

#[tokio::test]
async fn a_driver_that_times_out_then_succeeds_makes_exactly_one_volume() {
    let c = Cluster::start(&[], &["--timeout=500ms"], false).await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=error:DEADLINE_EXCEEDED:1:after\n");
    let claim = c.claim("slow", "plain", "1Gi", json!({}), true).await;
    c.wait_event("slow", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    c.faults("CreateVolume=hang\n");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.faults("");
    c.wait_pv(&claim, T).await;
    assert_eq!(
        c.driver_volumes().await,
        1,
        "the retry found the volume made behind the timeout"
    );
}

#[tokio::test]
async fn an_invalid_argument_from_the_driver_is_reported_as_infeasible_and_waits_for_the_longest_retry()
 {
    // Failures are retried after 100 ms, 200 ms...; an infeasible claim waits the maximum.
    let c = Cluster::start(&[], &["--retry-interval-max=10m"], false).await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=error:INVALID_ARGUMENT\n");
    c.claim("odd", "plain", "1Gi", json!({}), true).await;
    let message = c
        .wait_event(
            "odd",
            "ProvisioningFailed",
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = ",
        )
        .await;
    assert!(
        message.starts_with("Volume provisioning failed"),
        "{message}"
    );
    // The retry that comes after the backoff's first step is held back.
    c.wait_until("the next attempt to wait", T, || async {
        c.provisioner_log()
            .contains("its next attempt waits for --retry-interval-max")
    })
    .await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_volume_is_in_flight_leaves_no_volume() {
    let c = Cluster::start(&[], &["--timeout=500ms"], false).await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("gone", "plain", "1Gi", json!({}), true).await;
    c.wait_event("gone", "ProvisioningFailed", "Unavailable")
        .await;
    assert_eq!(
        c.driver_volumes().await,
        1,
        "a volume exists behind the error"
    );
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    c.faults("");
    c.wait_until("the orphaned volume to be deleted", T, || async {
        c.driver_volumes().await == 0
    })
    .await;
    let pvs = Api::<PersistentVolume>::all(c.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(pvs.items.is_empty());
}

/// A claim of a WaitForFirstConsumer class made with `node` selected goes back to the
/// scheduler (its selected node removed) with a ProvisioningFailed event holding `words`, and
/// no volume behind it.
async fn sent_back_to_the_scheduler(c: &Cluster, name: &str, size: &str, node: &str, words: &str) {
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let claim = c
        .claim(
            name,
            "late",
            size,
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}}),
            true,
        )
        .await;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    c.wait_until("selected-node removed", T, || async {
        let claim = api.get(name).await.unwrap();
        !claim
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("volume.kubernetes.io/selected-node")
    })
    .await;
    c.wait_event(name, "ProvisioningFailed", words).await;
    assert!(c.pv_for(&claim).await.is_none());
    assert_eq!(c.driver_volumes().await, 0, "no volume behind the refusal");
}

#[tokio::test]
async fn resource_exhausted_with_a_selected_node_reschedules() {
    let c = Cluster::start(&["--capacity=1Gi"], &[], false).await;
    sent_back_to_the_scheduler(&c, "big", "2Gi", "node-1", "ResourceExhausted").await;
}

#[tokio::test]
async fn a_selected_node_without_a_csinode_sends_the_claim_back_to_the_scheduler() {
    let c = Cluster::start(&[], &[], false).await;
    sent_back_to_the_scheduler(
        &c,
        "lost",
        "1Gi",
        "gone",
        "failed to get selected CSINode gone: csinode.storage.k8s.io \"gone\" not found",
    )
    .await;
}

#[tokio::test]
async fn a_conflicting_pv_is_reported_not_overwritten() {
    let c = Cluster::start(&[], &[], false).await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=latency:300ms\n");
    let claim = c.claim("clash", "plain", "1Gi", json!({}), true).await;
    let name = format!("pvc-{}", claim.metadata.uid.clone().unwrap());
    c.apply_cluster::<PersistentVolume>(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "claimRef": {"name": "someone", "namespace": "default", "uid": "other"},
                 "csi": {"driver": "other.csi", "volumeHandle": "x"}}
    }))
    .await;
    // The PV already exists in the cache: nothing to do, nothing overwritten. A claim made
    // afterwards being provisioned shows the provisioner has handled the first one.
    let after = c.claim("after", "plain", "1Gi", json!({}), true).await;
    c.wait_pv(&after, T).await;
    let pv = Api::<PersistentVolume>::all(c.client.clone())
        .get(&name)
        .await
        .unwrap();
    assert_eq!(pv.spec.unwrap().csi.unwrap().driver, "other.csi");
}

#[tokio::test]
async fn topology_requests_follow_the_class_and_selected_node() {
    let c = Cluster::start(
        &["--extra-node=node-2=zone-b", "--topology-value=zone-a"],
        &["--strict-topology"],
        false,
    )
    .await;
    let node2: serde_json::Value = json!({"metadata": {"name": "node-2", "labels": {"topology.hostpath.csi.volstack.dev/node": "zone-b"}}});
    c.apply_cluster::<k8s_openapi::api::core::v1::Node>(node2)
        .await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::CSINode>(json!({
        "metadata": {"name": "node-2"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-2", "topologyKeys": ["topology.hostpath.csi.volstack.dev/node"]}]}
    }))
    .await;
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let claim = c
        .claim(
            "placed",
            "late",
            "1Gi",
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-2"}}}),
            true,
        )
        .await;
    let pv = c.wait_pv(&claim, T).await;
    let terms = pv
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    let values = terms[0].match_expressions.as_ref().unwrap()[0]
        .values
        .clone()
        .unwrap();
    assert_eq!(
        values,
        vec!["zone-b".to_string()],
        "strict topology puts the volume on the selected node's segment"
    );
}

#[tokio::test]
async fn metrics_use_upstream_names() {
    let c = Cluster::start(&[], &["--http-endpoint=127.0.0.1:0"], false).await;
    drop(c);
    // The bound port is only in the log; use a fixed free port instead.
    let port = common::free_port();
    let c = Cluster::start(&[], &[&format!("--http-endpoint=127.0.0.1:{port}")], false).await;
    c.class("plain", json!({})).await;
    let claim = c.claim("m", "plain", "1Gi", json!({}), true).await;
    c.wait_pv(&claim, T).await;
    let body = tokio::process::Command::new("curl")
        .arg("-s")
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body.stdout);
    for name in [
        "csi_sidecar_operations_seconds_bucket",
        "controller_persistentvolumeclaim_provision_total{class=\"plain\",source=\"\"} 1",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    let health = tokio::process::Command::new("curl")
        .arg("-s")
        .arg(format!("http://127.0.0.1:{port}/healthz"))
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout), "ok");
    let _ = Patch::Merge(json!({}));
    let _ = PatchParams::default();
}

/// A volume the driver made while the provisioner saw an error, a crash, the claim deleted
/// while the provisioner is down: after the restart the volume is deleted. `mode` is the
/// `--in-flight-recovery` way (`restarted` the restart's); with `list-volumes` a volume of
/// another cluster is made first (its id is returned).
async fn crash_with_a_volume_in_flight(mode: &str, restarted: &str) -> (Cluster, Option<String>) {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", &format!("--in-flight-recovery={mode}")],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    // Another cluster's provisioner made this volume on the same driver, for a claim this
    // cluster never had.
    let foreign = if mode == "list-volumes" {
        Some(foreign_volume(&c).await)
    } else {
        None
    };
    // The driver makes the volume but answers UNAVAILABLE: the provisioner must assume it exists.
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("victim", "plain", "1Gi", json!({}), true).await;
    c.wait_event("victim", "ProvisioningFailed", "Unavailable")
        .await;
    let made = usize::from(foreign.is_some()) + 1;
    assert_eq!(c.driver_volumes().await, made);
    c.kill_provisioner();
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    c.faults("");
    for arg in &mut c.provisioner_args {
        if arg.starts_with("--in-flight-recovery=") {
            *arg = format!("--in-flight-recovery={restarted}");
        }
    }
    c.start_provisioner();
    c.wait_until(
        "the volume of the deleted claim to be deleted after the restart",
        T,
        || async { c.driver_volumes().await == made - 1 },
    )
    .await;
    let pvs = Api::<PersistentVolume>::all(c.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(pvs.items.is_empty(), "and no PV was made for it");
    (c, foreign)
}

/// A log written to a file, checked to carry no terminal colour sequences (`ESC [ ... m`):
/// colours are for terminals only.
fn plain_log(log: &str) -> String {
    assert!(
        !log.contains('\u{1b}'),
        "a log written to a file carries colour codes: {log}"
    );
    log.to_string()
}

/// A volume marked as another cluster's (the recoverable-volumes convention), for a claim
/// named `default/gone`; returns its id.
async fn foreign_volume(c: &Cluster) -> String {
    use sidecar_kit::recoverable;
    let channel = sidecar_kit::csi::connect(&c.socket).await.unwrap();
    let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
    let parameters = [
        (recoverable::CLUSTER, "another-cluster"),
        (recoverable::SERIAL, "1.0"),
        (recoverable::CLAIM, "default/gone"),
        (
            recoverable::CLAIM_UID,
            "0d1e2f30-0000-4000-8000-000000000000",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let request = csi_proto::v1::CreateVolumeRequest {
        name: "pvc-0d1e2f30-0000-4000-8000-000000000000".into(),
        capacity_range: Some(csi_proto::v1::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi_proto::v1::VolumeCapability {
            access_mode: Some(csi_proto::v1::volume_capability::AccessMode {
                mode: csi_proto::v1::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(csi_proto::v1::volume_capability::AccessType::Mount(
                Default::default(),
            )),
        }],
        parameters,
        ..Default::default()
    };
    client
        .create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

#[tokio::test]
async fn a_crash_while_a_volume_is_in_flight_and_a_deleted_claim_leave_no_volume_with_the_intent_log()
 {
    let (c, _) = crash_with_a_volume_in_flight("intent-log", "intent-log").await;
    assert!(
        c.provisioner_log()
            .contains("recovered in-flight volumes from the intent log"),
        "the restart found the volume in the log"
    );
}

#[tokio::test]
async fn a_crash_while_a_volume_is_in_flight_and_a_deleted_claim_leave_no_volume_with_listed_volumes()
 {
    let (c, foreign) = crash_with_a_volume_in_flight("list-volumes", "list-volumes").await;
    let log = plain_log(&c.provisioner_log());
    assert!(
        log.contains("the claim of a listed volume is gone"),
        "the restart found the volume among the driver's: {log}"
    );
    // The same listing saw the other cluster's volume and took back only this cluster's.
    assert!(log.contains(TOOK_BACK_ONE), "{log}");
    let foreign = foreign.unwrap();
    assert_eq!(
        c.driver_volume_ids().await,
        vec![foreign],
        "another cluster's volume is left alone"
    );
    // Nothing was recorded before CreateVolume: the only Lease writes made the listed
    // volumes' Lease and wrote each start's epoch in it.
    let writes = c.api_writes("csi-provisioner");
    let leases = |verb: &str| {
        writes
            .get(&(verb.to_string(), "leases".to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!((leases("CREATE"), leases("UPDATE")), (1, 2), "{writes:?}");
    assert_eq!(
        writes
            .iter()
            .filter(|((_, resource), _)| resource == "leases")
            .map(|(_, n)| n)
            .sum::<u64>(),
        3,
        "{writes:?}"
    );
    assert!(c.intent_shards().await.iter().all(|(_, v)| v.is_empty()));
}

#[tokio::test]
async fn a_switch_either_way_after_a_crash_finishes_what_the_other_way_left() {
    for (before, after) in [
        ("list-volumes", "intent-log"),
        ("intent-log", "list-volumes"),
    ] {
        let (c, _) = crash_with_a_volume_in_flight(before, after).await;
        let log = plain_log(&c.provisioner_log());
        let found = if before == "list-volumes" {
            "the claim of a listed volume is gone"
        } else {
            "recovered in-flight volumes from the intent log"
        };
        assert!(log.contains(found), "{before} then {after}: {log}");
    }
}

#[tokio::test]
async fn a_listed_volume_whose_claim_stays_becomes_its_pv_and_the_marks_stay_off_the_pv() {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", "--in-flight-recovery=list-volumes"],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    let claim = c.claim("kept", "plain", "1Gi", json!({}), true).await;
    c.wait_event("kept", "ProvisioningFailed", "Unavailable")
        .await;
    let made = c.driver_volume_ids().await;
    assert_eq!(made.len(), 1);
    c.kill_provisioner();
    c.faults("");
    c.start_provisioner();
    let pv = c.wait_pv(&claim, T).await;
    let csi = pv.spec.and_then(|s| s.csi).unwrap();
    assert_eq!(
        vec![csi.volume_handle],
        made,
        "the volume made before the crash"
    );
    let attributes = csi.volume_attributes.unwrap_or_default();
    assert!(
        attributes
            .keys()
            .all(|k| !sidecar_kit::recoverable::is_mark(k)),
        "{attributes:?}"
    );
    assert!(plain_log(&c.provisioner_log()).contains(TOOK_BACK_ONE));
}

#[tokio::test]
async fn a_volume_in_flight_when_a_retained_one_settles_is_still_taken_back() {
    let mut c = Cluster::start(&[], &["--in-flight-recovery=list-volumes"], true).await;
    // The first attempt's retry is an hour away: its volume stays in flight.
    c.kill_provisioner();
    for arg in &mut c.provisioner_args {
        if arg.starts_with("--retry-interval-") {
            *arg = format!("{}=1h", arg.split('=').next().unwrap_or_default());
        }
    }
    c.start_provisioner();
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    c.class("drop", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("stuck", "drop", "1Gi", json!({}), false).await;
    c.wait_event("stuck", "ProvisioningFailed", "Unavailable")
        .await;
    c.faults("");
    let stuck = c.driver_volume_ids().await;
    assert_eq!(stuck.len(), 1);
    let kept = c.claim("kept", "keep", "1Gi", json!({}), false).await;
    let kept_pv = c.wait_pv(&kept, T).await;
    c.wait_until("what is settled to pass the retained volume", T, || async {
        settled(&c).await == Some(("1.2".to_string(), "1.0".to_string()))
    })
    .await;
    c.kill_provisioner();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    for claim in ["stuck", "kept"] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
    }
    let kept_name = kept_pv.metadata.name.clone().unwrap();
    pvs.delete(&kept_name, &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until("the retained PV to go", T, || async {
        pvs.get_opt(&kept_name).await.unwrap().is_none()
    })
    .await;
    c.start_provisioner();
    c.wait_until("the volume in flight to be deleted", T, || async {
        c.driver_volumes().await == 1
    })
    .await;
    let handle = kept_pv.spec.and_then(|s| s.csi).unwrap().volume_handle;
    assert_eq!(
        c.driver_volume_ids().await,
        vec![handle],
        "the retained one stays"
    );
    assert!(plain_log(&c.provisioner_log()).contains(TOOK_BACK_ONE));
}

/// What the provisioner logs when its start-up listing took back one volume.
const TOOK_BACK_ONE: &str =
    "listed the driver's volumes: took back this cluster's without a PV volumes=1";

/// The settled mark in the listed volumes' Lease.
async fn settled_mark(c: &Cluster) -> Option<String> {
    settled(c).await.map(|(mark, _)| mark)
}

/// The settled mark and the unsettled serials in the listed volumes' Lease.
async fn settled(c: &Cluster) -> Option<(String, String)> {
    let name = format!("{}-listed", sidecar_kit::leader::lease_name(DRIVER));
    Api::<k8s_openapi::api::coordination::v1::Lease>::all(c.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|l| l.metadata.name.as_deref() == Some(name.as_str()))
        .and_then(|l| l.metadata.annotations)
        .and_then(|a| {
            let mark = a.get("volstack.dev/settled")?.clone();
            Some((mark, a.get("volstack.dev/unsettled")?.clone()))
        })
}

#[tokio::test]
async fn retained_volumes_whose_pv_and_claim_are_deleted_are_never_taken_back() {
    let mut c = Cluster::start(&[], &["--in-flight-recovery=list-volumes"], true).await;
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    c.class("drop", json!({})).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    // Retain from the start: the settled mark passes the volume once its PV is saved.
    let kept = c.claim("kept", "keep", "1Gi", json!({}), false).await;
    let kept_pv = c.wait_pv(&kept, T).await;
    c.wait_until("the settled mark to pass the first volume", T, || async {
        settled_mark(&c).await.as_deref() == Some("1.1")
    })
    .await;
    // Delete, then changed to Retain: the mark moves when the change is seen.
    let changed = c.claim("changed", "drop", "1Gi", json!({}), false).await;
    let changed_pv = c.wait_pv(&changed, T).await;
    let changed_name = changed_pv.metadata.name.clone().unwrap();
    pvs.patch(
        &changed_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
    )
    .await
    .unwrap();
    c.wait_until("the settled mark to pass the second volume", T, || async {
        settled_mark(&c).await.as_deref() == Some("1.2")
    })
    .await;
    for (claim, pv) in [("kept", &kept_pv), ("changed", &changed_pv)] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        let name = pv.metadata.name.clone().unwrap();
        pvs.delete(&name, &DeleteParams::default()).await.unwrap();
        c.wait_until("the PV to go", T, || async {
            pvs.get_opt(&name).await.unwrap().is_none()
        })
        .await;
    }
    assert_eq!(c.driver_volumes().await, 2);
    c.kill_provisioner();
    c.start_provisioner();
    c.wait_until("the restart's listing", T, || async {
        plain_log(&c.provisioner_log())
            .matches("listed the driver's volumes: took back this cluster's without a PV volumes=0")
            .count()
            == 2
    })
    .await;
    assert_eq!(c.driver_volumes().await, 2, "both volumes are kept");
}

/// A crash while a claim's volume is in flight, and the claim bound to another volume before the
/// restart (a pool's, or one a person made): the volume made for it is deleted and its record
/// dropped. Before, the bound claim was skipped and both stayed for ever.
#[tokio::test]
async fn a_volume_in_flight_for_a_claim_bound_elsewhere_meanwhile_is_deleted_after_a_crash() {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", "--in-flight-recovery=intent-log"],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    // The driver makes the volume but answers UNAVAILABLE: the provisioner must assume it exists.
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("victim", "plain", "1Gi", json!({}), true).await;
    c.wait_event("victim", "ProvisioningFailed", "Unavailable")
        .await;
    assert_eq!(c.driver_volumes().await, 1);
    c.kill_provisioner();
    // While it is down, the claim is bound to a volume someone made by hand.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let uid = claims.get("victim").await.unwrap().metadata.uid.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "by-hand"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "plain",
            "claimRef": {"namespace": "default", "name": "victim", "uid": uid},
            "csi": {"driver": DRIVER, "volumeHandle": "made-by-hand"}
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(c.client.clone())
        .create(&Default::default(), &pv)
        .await
        .unwrap();
    claims
        .patch(
            "victim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": "by-hand"}})),
        )
        .await
        .unwrap();
    c.faults("");
    c.start_provisioner();
    c.wait_until(
        "the volume made for the claim deleted and its record dropped",
        T,
        || async { c.driver_volumes().await == 0 && intent_volumes(&c).await.is_empty() },
    )
    .await;
    assert!(
        c.provisioner_log()
            .contains("recovered in-flight volumes from the intent log"),
        "the restart found the volume in the log"
    );
}

/// Names of the volumes the intent log records.
async fn intent_volumes(c: &Cluster) -> Vec<String> {
    c.intent_shards()
        .await
        .into_iter()
        .flat_map(|(_, volumes)| volumes)
        .collect()
}

#[tokio::test]
async fn already_exists_keeps_the_intent_and_the_volume_is_cleaned_up_when_the_claim_goes() {
    let c = Cluster::start(&[], &["--in-flight-recovery=intent-log"], false).await;
    c.class("plain", json!({})).await;
    // A volume of this name exists with other parameters (as far as the driver says).
    c.faults("CreateVolume=error:ALREADY_EXISTS:1:after\n");
    let claim = c.claim("clash", "plain", "1Gi", json!({}), true).await;
    let name = format!("pvc-{}", claim.metadata.uid.clone().unwrap());
    c.wait_event("clash", "ProvisioningFailed", "AlreadyExists")
        .await;
    // The conflict is reported and the record kept: a volume of that name exists.
    assert!(
        intent_volumes(&c).await.contains(&name),
        "the intent record was dropped on ALREADY_EXISTS"
    );
    assert_eq!(c.driver_volumes().await, 1);
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("clash", &DeleteParams::default())
        .await
        .unwrap();
    c.faults("");
    c.wait_until("the conflicting volume to be deleted", T, || async {
        c.driver_volumes().await == 0
    })
    .await;
    c.wait_until(
        "the intent record to go",
        Duration::from_secs(30),
        || async { !intent_volumes(&c).await.contains(&name) },
    )
    .await;
}
