//! csi-provisioner scenarios: the real binary against our API server and reference driver.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

/// The provisioner's PV finalizer.
const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn has_provisioner_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == PV_FINALIZER))
}

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
        assert_eq!(pv.metadata.finalizers, Some(vec![PV_FINALIZER.to_string()]));
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
    // No finalizer of ours; the API server adds no protection one here (no kubelet side).
    assert_eq!(pv.metadata.finalizers, None);
    c.delete_claim("kept").await;
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let name = pv.metadata.name.clone().unwrap();
    c.wait_pv_phase(&name, "Released", T).await;
    // A Delete volume released after it is deleted: the provisioner has handled the volume
    // events up to there, and left the Retain one alone.
    c.class("drop", json!({})).await;
    let later = c.claim("later", "drop", "1Gi", json!({}), false).await;
    let later_pv = c.wait_pv(&later, T).await;
    c.delete_claim("later").await;
    c.wait_pv_gone(later_pv.metadata.name.as_deref().unwrap(), T)
        .await;
    assert!(
        pvs.get_opt(&name).await.unwrap().is_some(),
        "Retain keeps the PV"
    );
    assert_eq!(c.driver_volumes().await, 1, "and the volume");
}

#[tokio::test]
async fn a_bound_volume_whose_policy_becomes_delete_gets_the_finalizer_and_is_deleted() {
    let c = Cluster::start(&[], &[], true).await;
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    let claim = c.claim("data", "keep", "1Gi", json!({}), false).await;
    let pv = c.wait_pv(&claim, T).await;
    assert_eq!(pv.metadata.finalizers, None, "Retain: no finalizer");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let name = pv.metadata.name.clone().unwrap();
    // The binder marks the volume Bound before the claim.
    c.wait_bound("data", T).await;
    pvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})),
    )
    .await
    .unwrap();
    // Upstream's handleProtectionFinalizer: a Bound Delete volume gets the finalizer, so
    // deleting the PV object cannot leak the volume.
    c.wait_until("the finalizer", T, || async {
        has_provisioner_finalizer(&pvs.get(&name).await.unwrap())
    })
    .await;
    c.delete_claim("data").await;
    c.wait_pv_gone(&name, T).await;
    assert_eq!(c.driver_volumes().await, 0, "the volume deleted too");
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
            "either name and namespace for Provisioner secrets specified, Both must be specified",
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
        // Upstream reads the VolumeAttributesClass after the secret: the secret is reported.
        (
            "vac-and-secret",
            "missing-secret",
            "1Gi",
            json!({"spec": {"volumeAttributesClassName": "nowhere-vac"}}),
            "error getting secret nowhere in namespace default",
        ),
        ("size-huge", "plain", "7Ei", json!({}), "too large"),
        (
            "no-csinode",
            "late",
            "1Gi",
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "ghost"}}}),
            "ghost",
        ),
    ];
    c.claim("no-class", "missing-class", "1Gi", json!({}), true)
        .await;
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
    // A class gone after the claim was handed to the driver is only logged, as upstream's
    // (an event would be queued before the sync's failure is logged, and written by now).
    c.wait_log(r#"storageclass.storage.k8s.io "missing-class" not found"#)
        .await;
    assert!(
        c.events_for("no-class").await.is_empty(),
        "no event for a missing class"
    );
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
    // Logged and retried, without an event, as upstream.
    c.wait_log(r#"storageclass.storage.k8s.io "later" not found"#)
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
async fn metrics_use_upstream_names() {
    let c = Cluster::start(&[], &["--http-endpoint=127.0.0.1:0"], false).await;
    drop(c);
    // The bound port is only in the log; use a fixed free port instead.
    let port = common::free_port();
    // With the PV controller: a clone's source must be Bound.
    let c = Cluster::start(&[], &[&format!("--http-endpoint=127.0.0.1:{port}")], true).await;
    c.class("plain", json!({})).await;
    let claim = c.claim("m", "plain", "1Gi", json!({}), false).await;
    let pv = c.wait_pv(&claim, T).await;
    // A clone is counted under its source's kind; a deletion is timed.
    let clone = c
        .claim(
            "m-copy",
            "plain",
            "1Gi",
            json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "m"}}}),
            false,
        )
        .await;
    c.wait_pv(&clone, T).await;
    c.delete_claim("m-copy").await;
    c.wait_pv_gone(&format!("pvc-{}", clone.metadata.uid.clone().unwrap()), T)
        .await;
    assert!(
        Api::<PersistentVolume>::all(c.client.clone())
            .get_opt(pv.metadata.name.as_deref().unwrap())
            .await
            .unwrap()
            .is_some(),
        "the source's PV kept"
    );
    let text = sidecar_kit::testing::http_get(port, "/metrics").await;
    for name in [
        "csi_sidecar_operations_seconds_bucket",
        // The start-up calls, as upstream counts them (the name unknown before GetPluginInfo).
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\"} 1",
        "csi_sidecar_operations_seconds_count{driver_name=\"hostpath.csi.volstack.dev\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/ControllerGetCapabilities\"} 1",
        "controller_persistentvolumeclaim_provision_total{class=\"plain\",source=\"\"} 1",
        "controller_persistentvolumeclaim_provision_total{class=\"plain\",source=\"PersistentVolumeClaim\"} 1",
        "controller_persistentvolume_delete_total{class=\"plain\"} 1",
        "controller_persistentvolume_delete_duration_seconds_count{class=\"plain\"} 1",
        "process_resident_memory_bytes",
    ] {
        assert!(
            sidecar_kit::testing::has_metric(&text, name),
            "missing {name} in\n{text}"
        );
    }
    assert_eq!(sidecar_kit::testing::http_get(port, "/healthz").await, "ok");
}

#[tokio::test]
async fn a_claim_whose_class_names_another_provisioner_is_left_without_an_event() {
    // No PV controller: the claim keeps the annotation that names us while its class names
    // someone else (a class recreated under the same name).
    let c = Cluster::start(&[], &[], false).await;
    c.class("plain", json!({})).await;
    c.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(json!({
        "metadata": {"name": "theirs"}, "provisioner": "example.com/someone-else"
    }))
    .await;
    c.claim("misnamed", "theirs", "1Gi", json!({}), true).await;
    // Upstream's words, logged; then stop (errStopProvision): no ProvisioningFailed event.
    c.wait_log("Unknown provisioner requested in claim's StorageClass")
        .await;
    // A claim made after it is provisioned: the provisioner went on past the first one.
    let later = c.claim("later", "plain", "1Gi", json!({}), true).await;
    c.wait_pv(&later, T).await;
    let events = c.events_for("misnamed").await;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "ProvisioningFailed"),
        "{events:?}"
    );
    assert_eq!(c.driver_volumes().await, 1);
}
