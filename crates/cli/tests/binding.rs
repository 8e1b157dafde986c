//! The PV controller against our API server: binding rules that need real concurrency.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

fn static_pv(name: &str, size: &str, class: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": {"size": size}},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": format!("/tmp/{name}")}}
    })
}

/// The StorageClass `manual` of static volumes (no provisioner).
async fn manual_class(c: &Cluster) {
    c.apply_cluster::<StorageClass>(
        json!({"metadata": {"name": "manual"}, "provisioner": "kubernetes.io/no-provisioner"}),
    )
    .await;
}

async fn bound_volume(c: &Cluster, claim: &str) -> String {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let what = format!("{claim} Bound");
    common::poll_for(&what, T, String::new, || async {
        let pvc = api.get(claim).await.unwrap();
        match pvc.status.and_then(|s| s.phase).as_deref() {
            Some("Bound") => Ok(pvc.spec.unwrap().volume_name.unwrap()),
            phase => Err(format!("phase {phase:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn the_smallest_matching_volume_is_bound_and_racing_claims_get_one_each() {
    let c = Cluster::start(&[], &[], true).await;
    manual_class(&c).await;
    for (name, size) in [
        ("pv-big", "10Gi"),
        ("pv-small", "2Gi"),
        ("pv-tiny", "500Mi"),
    ] {
        c.apply_cluster::<PersistentVolume>(static_pv(name, size, "manual"))
            .await;
    }
    c.claim("one", "manual", "1Gi", json!({}), false).await;
    assert_eq!(bound_volume(&c, "one").await, "pv-small");
    // Two claims race for the one volume left that fits 5Gi: exactly one wins.
    c.claim("race-a", "manual", "5Gi", json!({}), false).await;
    c.claim("race-b", "manual", "5Gi", json!({}), false).await;
    // The volume's claimRef is where the race is decided: once it names the winner, the loser
    // can never bind it. Wait for that, then for the winner to be Bound and the loser to be
    // told there is no volume for it.
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let winner = common::poll_for("pv-big claimed", T, String::new, || async {
        let pv = pvs.get("pv-big").await.unwrap();
        let named = pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.name);
        named.ok_or_else(String::new)
    })
    .await;
    let loser = if winner == "race-a" {
        "race-b"
    } else {
        "race-a"
    };
    assert_eq!(bound_volume(&c, &winner).await, "pv-big");
    // kube-controller-manager's words for a class no in-tree plugin provisions.
    c.wait_event(
        loser,
        "ProvisioningFailed",
        "no volume plugin matched name: kubernetes.io/no-provisioner",
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let lost = claims.get(loser).await.unwrap();
    assert_ne!(
        lost.spec.unwrap().volume_name.as_deref(),
        Some("pv-big"),
        "exactly one claim bound the big volume"
    );
    let pv = pvs.get("pv-big").await.unwrap();
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
}

#[tokio::test]
async fn pre_bound_claims_selectors_and_release() {
    let c = Cluster::start(&[], &[], true).await;
    manual_class(&c).await;
    for (name, size) in [("pv-a", "1Gi"), ("pv-b", "3Gi"), ("pv-c", "8Gi")] {
        c.apply_cluster::<PersistentVolume>(static_pv(name, size, "manual"))
            .await;
    }
    c.claim(
        "wants-c",
        "manual",
        "1Gi",
        json!({"spec": {"volumeName": "pv-c"}}),
        false,
    )
    .await;
    assert_eq!(
        bound_volume(&c, "wants-c").await,
        "pv-c",
        "spec.volumeName is honoured"
    );
    c.claim(
        "picky",
        "manual",
        "1Gi",
        json!({"spec": {"selector": {"matchLabels": {"size": "3Gi"}}}}),
        false,
    )
    .await;
    assert_eq!(
        bound_volume(&c, "picky").await,
        "pv-b",
        "the selector excludes the smaller volume"
    );
    c.delete_claim("picky").await;
    c.wait_pv_phase("pv-b", "Released", T).await;
    c.claim("no-match", "manual", "100Gi", json!({}), false)
        .await;
    c.wait_event(
        "no-match",
        "ProvisioningFailed",
        "no volume plugin matched name: kubernetes.io/no-provisioner",
    )
    .await;
}

/// The class a claim is stored with.
async fn class_of(api: &Api<PersistentVolumeClaim>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .storage_class_name
}

#[tokio::test]
async fn default_class_and_missing_class() {
    let c = Cluster::start(&[], &[], true).await;
    // `register` created the default class "hostpath".
    let claim: PersistentVolumeClaim = c
        .apply(json!({"metadata": {"name": "defaulted"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .await;
    assert_eq!(
        bound_volume(&c, "defaulted").await,
        format!("pvc-{}", claim.metadata.uid.unwrap())
    );
    let api: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    assert_eq!(
        class_of(&api, "defaulted").await.as_deref(),
        Some("hostpath")
    );
    c.claim("lost-class", "nope", "1Gi", json!({}), false).await;
    c.wait_event("lost-class", "ProvisioningFailed", "\"nope\" not found")
        .await;
    c.class("nope", json!({})).await;
    bound_volume(&c, "lost-class").await;

    // Admission gives the default class at creation only. A claim created while no class is
    // the default gets one from the PV controller once there is one (retroactive assignment).
    let classes: Api<StorageClass> = Api::all(c.client.clone());
    let mark = |default: &str| json!({"metadata": {"annotations": {"storageclass.kubernetes.io/is-default-class": default}}});
    let merge = |v: &serde_json::Value| Patch::Merge(v.clone());
    classes
        .patch("hostpath", &PatchParams::default(), &merge(&mark("false")))
        .await
        .unwrap();
    let early: PersistentVolumeClaim = c
        .apply(json!({"metadata": {"name": "before-default"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .await;
    assert_eq!(early.spec.unwrap().storage_class_name, None);
    classes
        .patch("hostpath", &PatchParams::default(), &merge(&mark("true")))
        .await
        .unwrap();
    bound_volume(&c, "before-default").await;
    assert_eq!(
        class_of(&api, "before-default").await.as_deref(),
        Some("hostpath")
    );
}

#[tokio::test]
async fn a_volume_pre_bound_to_a_claim_deleted_before_binding_is_released() {
    // The pass over volumes whose claim is missing is pushed out of the test's reach: only the
    // claim's deletion event (through the claimRef index) can release the volume.
    let c = Cluster::start_with(&[], &[], true, |o| {
        o.orphan_resync = Duration::from_secs(3600)
    })
    .await;
    manual_class(&c).await;
    // The claim asks for more than the volume pre-bound to it holds, so the binding never
    // completes; the claim never names the volume.
    let claim = c.claim("gone", "manual", "5Gi", json!({}), false).await;
    let mut pv = static_pv("pre-bound", "1Gi", "manual");
    pv["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
        "name": "gone", "uid": claim.metadata.uid.clone().unwrap(),
    });
    c.apply_cluster::<PersistentVolume>(pv).await;
    // A volume made after it turning Available shows the controller has seen the pre-bound
    // one (watch events arrive in order) while its claim existed.
    c.apply_cluster::<PersistentVolume>(static_pv("marker", "1Gi", "other"))
        .await;
    c.wait_pv_phase("marker", "Available", T).await;
    c.delete_claim("gone").await;
    // The claim's deletion alone must bring the volume back: its claimRef names the claim.
    c.wait_pv_phase("pre-bound", "Released", T).await;
}

/// A claim naming a volume that does not exist yet waits and backs off; the volume's
/// creation, pre-bound to the claim, brings it back at once. The controller's backoff is an
/// hour here, so nothing else binds it within the deadline.
#[tokio::test]
async fn a_claim_waiting_for_the_volume_it_names_is_bound_when_the_volume_comes() {
    // One worker: the claims are looked at in the order they were queued.
    let c = Cluster::start_with(&[], &[], true, |o| {
        o.pv_controller = Some((
            1,
            sidecar_kit::workqueue::Backoff {
                start: Duration::from_secs(3600),
                max: Duration::from_secs(3600),
            },
        ));
    })
    .await;
    manual_class(&c).await;
    c.claim(
        "early",
        "manual",
        "1Gi",
        json!({"spec": {"volumeName": "late"}}),
        false,
    )
    .await;
    // A claim made after it bound to a volume made after it: the controller's one worker has
    // looked at the first claim by then (it was queued first) and found no volume. Both sides of the marker
    // are pre-bound, so whichever the controller hears of first, the volume's event brings the
    // marker claim back.
    let mut for_marker = static_pv("for-marker", "1Gi", "manual");
    for_marker["spec"]["claimRef"] = json!({"namespace": "default", "name": "marker"});
    c.apply_cluster::<PersistentVolume>(for_marker).await;
    c.claim(
        "marker",
        "manual",
        "1Gi",
        json!({"spec": {"volumeName": "for-marker"}}),
        false,
    )
    .await;
    assert_eq!(bound_volume(&c, "marker").await, "for-marker");
    // Made for the claim, as an administrator pre-binds both sides.
    let mut late = static_pv("late", "1Gi", "manual");
    late["spec"]["claimRef"] = json!({"namespace": "default", "name": "early"});
    c.apply_cluster::<PersistentVolume>(late).await;
    assert_eq!(bound_volume(&c, "early").await, "late");
}

#[tokio::test]
async fn binding_keeps_kubectls_last_applied_configuration() {
    // The PV controller writes claims and volumes back whole: an annotation missing from its
    // cache would be removed by the write, and `kubectl apply` would lose its three-way merge.
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    let c = Cluster::start(&[], &[], true).await;
    manual_class(&c).await;
    let mut pv = static_pv("pv-applied", "1Gi", "manual");
    pv["metadata"]["annotations"] = json!({LAST_APPLIED: "{\"kind\":\"PersistentVolume\"}"});
    c.apply_cluster::<PersistentVolume>(pv).await;
    // The claim is server-side applied: its field ownership must survive the binding too
    // (the controller's caches leave it out; an empty list would clear it).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "applied", "annotations": {LAST_APPLIED: "{\"kind\":\"PersistentVolumeClaim\"}"}},
        "spec": {"storageClassName": "manual", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims
        .patch(
            "applied",
            &PatchParams::apply("admin"),
            &Patch::Apply(&claim),
        )
        .await
        .unwrap();
    assert_eq!(bound_volume(&c, "applied").await, "pv-applied");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let pv = pvs.get("pv-applied").await.unwrap();
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(
        pv.metadata
            .annotations
            .unwrap_or_default()
            .get(LAST_APPLIED)
            .map(String::as_str),
        Some("{\"kind\":\"PersistentVolume\"}"),
        "the volume's last-applied configuration was removed by the bind"
    );
    let claim = claims.get("applied").await.unwrap();
    assert_eq!(
        claim
            .metadata
            .annotations
            .unwrap_or_default()
            .get(LAST_APPLIED)
            .map(String::as_str),
        Some("{\"kind\":\"PersistentVolumeClaim\"}"),
        "the claim's last-applied configuration was removed by the bind"
    );
    let managers: Vec<String> = claim
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m == "admin"),
        "the claim's field ownership was cleared by the bind: {managers:?}"
    );
}

#[tokio::test]
async fn a_late_binding_claim_of_static_volumes_gets_one_on_its_pods_node() {
    // The scheduler runs in the stack; the nodes are registered as kubelet does.
    let c = Cluster::start_with(&[], &[], true, |o| o.extra_nodes = vec!["node-2".into()]).await;
    c.apply_cluster::<StorageClass>(json!({"metadata": {"name": "local"},
        "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let on = |node: &str| {
        json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})
    };
    for (name, node) in [("local-1", "node-1"), ("local-2", "node-2")] {
        let mut pv = static_pv(name, "1Gi", "local");
        common::merge(&mut pv, &on(node));
        c.apply_cluster::<PersistentVolume>(pv).await;
    }
    c.claim("data", "local", "1Gi", json!({}), false).await;
    // Not bound before a Pod uses it: the PV controller says it waits.
    c.wait_event("data", "WaitForFirstConsumer", "waiting for first consumer")
        .await;
    // The Pod can only go to node-2 (its node selector): the scheduler pre-binds local-2.
    c.apply::<k8s_openapi::api::core::v1::Pod>(json!({
        "metadata": {"name": "app"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "node-2"},
                 "containers": [{"name": "app", "image": "busybox"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))
    .await;
    assert_eq!(bound_volume(&c, "data").await, "local-2");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), "default");
    common::poll_for("the Pod on node-2", T, String::new, || async {
        let pod = pods.get("app").await.unwrap();
        match pod.spec.and_then(|s| s.node_name).as_deref() {
            Some("node-2") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_late_binding_claim_names_the_pods_waiting_for_the_scheduler() {
    let c = Cluster::start_with(&[], &[], true, |_| {}).await;
    c.apply_cluster::<StorageClass>(json!({"metadata": {"name": "local"},
        "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    c.claim("data", "local", "1Gi", json!({}), false).await;
    c.wait_event("data", "WaitForFirstConsumer", "waiting for first consumer")
        .await;
    // Two Pods use the claim and no node can take either: the claim waits for them, by name.
    let stuck = |pod: &str| {
        json!({
            "metadata": {"name": pod},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "no-such-node"},
                     "containers": [{"name": "app", "image": "busybox"}],
                     "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
        })
    };
    for (pod, message) in [
        ("web-b", "waiting for pod web-b to be scheduled"),
        ("web-a", "waiting for pods web-a,web-b to be scheduled"),
    ] {
        c.apply::<k8s_openapi::api::core::v1::Pod>(stuck(pod)).await;
        c.wait_event("data", "WaitForPodScheduled", message).await;
    }
}

#[tokio::test]
async fn a_claim_whose_provisioner_annotation_cannot_be_saved_gets_an_event_and_is_retried() {
    let c = Cluster::start(&[], &[], true).await;
    c.class("plain", json!({})).await;
    // Every claim update refused: the binder cannot write the storage-provisioner annotation.
    c.stack.server.set_faults(vec![
        serde_json::from_value(
            json!({"resource": "persistentvolumeclaims", "verb": "UPDATE", "error": 409}),
        )
        .unwrap(),
    ]);
    let claim = c.claim("data", "plain", "1Gi", json!({}), false).await;
    // kube-controller-manager's provisionClaimOperationExternal.
    c.wait_event("data", "ProvisioningFailed", "Error saving claim: ")
        .await;
    c.stack.server.set_faults(Vec::new());
    c.wait_pv(&claim, T).await;
}

#[tokio::test]
async fn a_claim_left_to_an_absent_provisioner_is_bound_to_a_volume_made_later() {
    // The resync is what looks at the claim again (kube-controller-manager's every 15 s):
    // short here, so the test does not wait for the default.
    let c = Cluster::start_with(&[], &[], true, |o| o.orphan_resync = Duration::from_secs(1)).await;
    c.apply_cluster::<StorageClass>(
        json!({"metadata": {"name": "elsewhere"}, "provisioner": "example.com/not-running"}),
    )
    .await;
    c.claim("waits", "elsewhere", "1Gi", json!({}), false).await;
    c.wait_event("waits", "ExternalProvisioning", "example.com/not-running")
        .await;
    // An administrator makes a volume for it: no event of the claim follows.
    c.apply_cluster::<PersistentVolume>(static_pv("by-hand", "1Gi", "elsewhere"))
        .await;
    assert_eq!(bound_volume(&c, "waits").await, "by-hand");
}

#[tokio::test]
async fn a_volume_pre_bound_to_a_claim_of_another_volume_mode_says_why_it_is_not_bound() {
    let c = Cluster::start(&[], &[], true).await;
    manual_class(&c).await;
    let claim = c.claim("files", "manual", "1Gi", json!({}), false).await;
    let mut pv = static_pv("raw", "1Gi", "manual");
    pv["spec"]["volumeMode"] = json!("Block");
    pv["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
        "name": "files", "uid": claim.metadata.uid.clone().unwrap(),
    });
    c.apply_cluster::<PersistentVolume>(pv).await;
    // kube-controller-manager's two Warning events, one on each side.
    c.wait_event(
        "files",
        "VolumeMismatch",
        "Cannot bind PersistentVolume \"raw\" to requested PersistentVolumeClaim due to incompatible volumeMode.",
    )
    .await;
    c.wait_event(
        "raw",
        "VolumeMismatch",
        "Cannot bind PersistentVolume to requested PersistentVolumeClaim \"files\" due to incompatible volumeMode.",
    )
    .await;
}

#[tokio::test]
async fn a_released_host_path_volume_under_tmp_is_deleted_with_its_directory() {
    let c = Cluster::start(&[], &[], true).await;
    manual_class(&c).await;
    // kube-controller-manager's hostPath deleter takes paths matching /tmp/.+ (a temporary
    // directory of this test; TMPDIR elsewhere would fall outside it).
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("inside")).unwrap();
    std::fs::write(data.join("inside/file"), b"x").unwrap();
    let mut pv = static_pv("scratch", "1Gi", "manual");
    pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    pv["spec"]["hostPath"]["path"] = json!(data.to_str().unwrap());
    c.apply_cluster::<PersistentVolume>(pv).await;
    let mut elsewhere = static_pv("kept-path", "5Gi", "manual");
    elsewhere["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    elsewhere["spec"]["hostPath"]["path"] = json!("/srv/kept-path");
    c.apply_cluster::<PersistentVolume>(elsewhere).await;
    c.claim("scratch", "manual", "1Gi", json!({}), false).await;
    c.claim("other", "manual", "5Gi", json!({}), false).await;
    assert_eq!(bound_volume(&c, "scratch").await, "scratch");
    assert_eq!(bound_volume(&c, "other").await, "kept-path");
    for name in ["scratch", "other"] {
        c.delete_claim(name).await;
    }
    c.wait_pv_gone("scratch", T).await;
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    assert!(!data.exists(), "its directory removed");
    assert!(dir.path().exists(), "not what is above it");
    // Outside /tmp: Failed, in kube-controller-manager's words.
    c.wait_until("the other volume Failed", T, || async {
        let status = pvs
            .get("kept-path")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        status.phase.as_deref() == Some("Failed")
            && status.message.as_deref()
                == Some(
                    "host_path deleter only supports /tmp/.+ but received provided /srv/kept-path",
                )
    })
    .await;
}

#[tokio::test]
async fn with_the_protection_controllers_claims_and_volumes_are_created_with_their_finalizers() {
    // kube-apiserver's StorageObjectInUseProtection admission: the finalizer is in the object
    // the create returns, so no controller has to write it (and race the binder's writes).
    let c = Cluster::start_with(&[], &[], true, |o| o.kubelet = true).await;
    manual_class(&c).await;
    let claim = c.claim("kept", "manual", "1Gi", json!({}), false).await;
    assert_eq!(
        claim.metadata.finalizers,
        Some(vec!["kubernetes.io/pvc-protection".to_string()])
    );
    let pv = c
        .apply_cluster::<PersistentVolume>(static_pv("kept", "1Gi", "manual"))
        .await;
    assert_eq!(
        pv.metadata.finalizers,
        Some(vec!["kubernetes.io/pv-protection".to_string()])
    );
    // The protection controllers take them off: the claim and then the volume can go.
    assert_eq!(bound_volume(&c, "kept").await, "kept");
    c.delete_claim("kept").await;
    c.wait_pv_phase("kept", "Released", T).await;
    Api::<PersistentVolume>::all(c.client.clone())
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_pv_gone("kept", T).await;
}
