//! csi-provisioner with data sources: clones and restores against our API server, the reference
//! driver and the PV controller; every refusal ends in a ProvisioningFailed event and no
//! CreateVolume.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);
const CLONING: &str = "provisioner.storage.kubernetes.io/cloning-protection";

async fn bound_claim(
    c: &Cluster,
    name: &str,
    size: &str,
    extra: Value,
) -> (PersistentVolumeClaim, PersistentVolume) {
    let claim = c.claim(name, "fast", size, extra, false).await;
    let pv = c.wait_pv(&claim, T).await;
    c.wait_bound(name, T).await;
    (claim, pv)
}

fn clone_of(source: &str) -> Value {
    json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": source}}})
}

/// Deletes the claim `src` and waits until the cloning protection says it keeps it; it is
/// then marked for deletion with the finalizer still on.
async fn delete_source_kept(c: &Cluster) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    claims
        .delete("src", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_log("keeping the cloning-protection finalizer").await;
    let source = claims.get("src").await.unwrap();
    assert!(source.metadata.deletion_timestamp.is_some());
    assert!(
        source
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&CLONING.to_string())
    );
}

async fn finalizers(c: &Cluster, name: &str) -> Option<Vec<String>> {
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
        .map(|claim| claim.metadata.finalizers.unwrap_or_default())
}

#[tokio::test]
async fn a_source_is_kept_for_a_pending_clone_that_has_not_started_copying() {
    // The provisioner's retries are an hour apart: only the clone's own events bring the
    // source back (a source kept for its clones waits in backoff).
    let c = Cluster::start(
        &["--capacity=100Gi"],
        &["--retry-interval-start=1h", "--retry-interval-max=1h"],
        true,
    )
    .await;
    c.class("fast", json!({})).await;
    c.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    bound_claim(&c, "src", "1Gi", json!({})).await;
    // A first clone puts the cloning-protection finalizer on the source.
    let copy = c.claim("copy", "fast", "1Gi", clone_of("src"), false).await;
    c.wait_pv(&copy, T).await;
    // A second one waits for its first consumer: no copy from the source is in flight, only
    // the clone's claim says one is to come.
    c.claim("later", "late", "1Gi", clone_of("src"), false)
        .await;
    // (The provisioner hears of "later" before the source's deletion: one watch, in order.)
    delete_source_kept(&c).await;
    // The waiting clone goes: the source goes too, at once.
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until("src gone once no clone of it is pending", T, || async {
        finalizers(&c, "src").await.is_none()
    })
    .await;
}

#[tokio::test]
async fn clones_copy_their_source_which_stays_protected_while_a_clone_is_pending() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    c.class("fast", json!({})).await;
    let (_, source_pv) = bound_claim(&c, "src", "1Gi", json!({})).await;
    std::fs::write(c.volume_dir(&source_pv).join("data.txt"), "cloned content").unwrap();

    let clone = c.claim("copy", "fast", "2Gi", clone_of("src"), false).await;
    let clone_pv = c.wait_pv(&clone, T).await;
    assert_eq!(
        std::fs::read_to_string(c.volume_dir(&clone_pv).join("data.txt")).unwrap(),
        "cloned content"
    );
    assert_eq!(
        clone_pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "2Gi"
    );
    assert!(
        finalizers(&c, "src")
            .await
            .unwrap()
            .contains(&CLONING.to_string())
    );

    // A clone that cannot be made yet keeps the source from going away.
    c.faults("CreateVolume=error:UNAVAILABLE\n");
    let pending = c
        .claim("pending", "fast", "1Gi", clone_of("src"), false)
        .await;
    c.wait_event("pending", "ProvisioningFailed", "code = Unavailable")
        .await;
    // The protection controller looks at the deleted source and keeps it while the clone is
    // pending (its CreateVolume failed with UNAVAILABLE, which may have started a copy: the
    // intent log holds one from the source's volume too).
    delete_source_kept(&c).await;
    assert!(c.pv_for(&pending).await.is_none());
    c.faults("");
    c.wait_pv(&pending, T).await;
    c.wait_until("src gone once its clones are done", T, || async {
        finalizers(&c, "src").await.is_none()
    })
    .await;
}

#[tokio::test]
async fn clones_that_break_a_rule_get_an_event_and_no_volume() {
    let c = Cluster::start(&["--capacity=100Gi"], &[], true).await;
    c.class("fast", json!({})).await;
    bound_claim(&c, "src", "2Gi", json!({})).await;
    let before = c.driver_volumes().await;
    let cases = [
        (
            "smaller",
            "1Gi",
            clone_of("src"),
            "new PVC request must be greater than or equal in size",
        ),
        ("missing", "2Gi", clone_of("nope"), "error getting PVC nope"),
        (
            "block",
            "2Gi",
            json!({"spec": {"volumeMode": "Block", "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}}),
            "Source is Filesystem, but new PVC requested Block",
        ),
        (
            "snapshot-group",
            "2Gi",
            json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "s", "apiGroup": "example.com"}}}),
            "Expected snapshot.storage.k8s.io, Got example.com",
        ),
        (
            "remote",
            "2Gi",
            json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": "other"}}}),
            "CrossNamespaceVolumeDataSource feature is disabled",
        ),
    ];
    for (name, size, extra, words) in cases {
        c.claim(name, "fast", size, extra, false).await;
        let message = c.wait_event(name, "ProvisioningFailed", words).await;
        // Upstream v6 records the error itself (v5 prefixed it with the class).
        assert!(
            !message.starts_with("failed to provision volume with StorageClass"),
            "{message}"
        );
    }
    // A populator's kind is left to the populator.
    c.populator_claim_left_alone("populated", "fast").await;
    // From upstream's CSI layer's own recorder, as `kubectl describe` shows it there.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    let populator = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| {
            e.involved_object.name.as_deref() == Some("populated")
                && e.reason.as_deref() == Some("Provisioning")
        })
        .unwrap();
    assert_eq!(
        populator.source.and_then(|s| s.component).as_deref(),
        Some("external-provisioner")
    );
    assert_eq!(
        c.driver_volumes().await,
        before,
        "no CreateVolume for any of them"
    );
}

#[tokio::test]
async fn a_driver_without_clones_or_snapshots_is_not_asked_for_them() {
    let c = Cluster::start(&["--disable=clones", "--disable=snapshots"], &[], true).await;
    c.class("fast", json!({})).await;
    bound_claim(&c, "src", "1Gi", json!({})).await;
    c.claim("copy", "fast", "1Gi", clone_of("src"), false).await;
    c.wait_event(
        "copy",
        "ProvisioningFailed",
        "controller CLONE_VOLUME capability is not reported",
    )
    .await;
    c.claim(
        "restore",
        "fast",
        "1Gi",
        json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "s", "apiGroup": "snapshot.storage.k8s.io"}}}),
        false,
    )
    .await;
    c.wait_event(
        "restore",
        "ProvisioningFailed",
        "CREATE_DELETE_SNAPSHOT capability is not reported",
    )
    .await;
    assert_eq!(c.driver_volumes().await, 1);
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A VolumeSnapshot bound to a content for `handle`, with the statuses the snapshot controller
/// writes; `ready` and the content's `sourceVolumeMode` as given.
async fn snapshot_objects(c: &Cluster, name: &str, handle: &str, ready: bool, mode: &str) {
    let contents: Api<DynamicObject> = Api::all_with(
        c.client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "default",
        &resource("VolumeSnapshot", "volumesnapshots"),
    );
    let snapshot: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"source": {"volumeSnapshotContentName": format!("content-{name}")}},
    }))
    .unwrap();
    let snapshot = snapshots
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
    let content: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": format!("content-{name}")},
        "spec": {
            "driver": DRIVER,
            "deletionPolicy": "Delete",
            "sourceVolumeMode": mode,
            "source": {"snapshotHandle": handle},
            "volumeSnapshotRef": {"name": name, "namespace": "default", "uid": snapshot.metadata.uid},
        },
    }))
    .unwrap();
    contents
        .create(&PostParams::default(), &content)
        .await
        .unwrap();
    contents
        .patch_status(
            &format!("content-{name}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"snapshotHandle": handle, "readyToUse": true, "restoreSize": 1 << 30}})),
        )
        .await
        .unwrap();
    set_ready(c, name, ready).await;
}

async fn set_ready(c: &Cluster, name: &str, ready: bool) {
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "default",
        &resource("VolumeSnapshot", "volumesnapshots"),
    );
    snapshots
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "boundVolumeSnapshotContentName": format!("content-{name}"),
                "readyToUse": ready,
                "restoreSize": "1Gi",
            }})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn restores_wait_for_a_ready_snapshot_and_keep_the_volume_mode() {
    // The snapshot objects are played by hand here (readyToUse switched by the test), so the
    // stack's snapshot controller does not run; tests/snapshots.rs runs it.
    let c = Cluster::start_with(&["--capacity=100Gi"], &[], true, |o| o.snapshots = false).await;
    stack::snapshots::crds::install(&c.client).await.unwrap();
    c.class("fast", json!({})).await;
    let (_, source_pv) = bound_claim(&c, "src", "1Gi", json!({})).await;
    std::fs::write(c.volume_dir(&source_pv).join("data.txt"), "snapshotted").unwrap();
    let volume = source_pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
    let handle = c.driver_snapshot(&volume.volume_handle, "snap").await;
    snapshot_objects(&c, "snap", &handle, false, "Filesystem").await;
    let restore = json!({"spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "snap", "apiGroup": "snapshot.storage.k8s.io"}}});
    let claim = c
        .claim("restored", "fast", "1Gi", restore.clone(), false)
        .await;
    c.wait_event(
        "restored",
        "ProvisioningFailed",
        "snapshot snap is not Ready",
    )
    .await;
    assert!(c.pv_for(&claim).await.is_none());
    set_ready(&c, "snap", true).await;
    let pv = c.wait_pv(&claim, T).await;
    assert_eq!(
        std::fs::read_to_string(c.volume_dir(&pv).join("data.txt")).unwrap(),
        "snapshotted"
    );
    // Too small for the snapshot, or a Block volume from a Filesystem snapshot: refused.
    c.claim("tiny", "fast", "512Mi", restore.clone(), false)
        .await;
    c.wait_event(
        "tiny",
        "ProvisioningFailed",
        "is less than the size 1073741824 for the source snapshot snap",
    )
    .await;
    let mut block = restore.clone();
    block["spec"]["volumeMode"] = json!("Block");
    c.claim("as-block", "fast", "1Gi", block, false).await;
    c.wait_event(
        "as-block",
        "ProvisioningFailed",
        "does not have permission to do so",
    )
    .await;
}

/// A gateway-api ReferenceGrant definition, as a cluster with the gateway CRDs has it.
async fn install_reference_grants(c: &Cluster) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "referencegrants.gateway.networking.k8s.io",
                     "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/2466"}},
        "spec": {
            "group": "gateway.networking.k8s.io",
            "names": {"kind": "ReferenceGrant", "listKind": "ReferenceGrantList", "plural": "referencegrants", "singular": "referencegrant"},
            "scope": "Namespaced",
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(c.client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_clone_from_another_namespace_needs_the_gate_and_a_reference_grant() {
    let c = Cluster::start(
        &["--capacity=100Gi"],
        &["--feature-gates=CrossNamespaceVolumeDataSource=true"],
        true,
    )
    .await;
    install_reference_grants(&c).await;
    c.class("fast", json!({})).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data"}})).unwrap(),
        )
        .await
        .unwrap();
    let data: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "data");
    let source = data
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "shared"},
                "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let source_pv = c.wait_pv(&source, T).await;
    c.wait_until("the shared claim Bound", T, || async {
        data.get("shared")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Bound")
    })
    .await;
    std::fs::write(
        c.volume_dir(&source_pv).join("data.txt"),
        "across namespaces",
    )
    .unwrap();
    let remote = json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "shared", "namespace": "data"}}});
    let clone = c.claim("copy", "fast", "1Gi", remote, false).await;
    c.wait_event(
        "copy",
        "ProvisioningFailed",
        "accessing data/shared of PersistentVolumeClaim dataSource from default/copy isn't allowed",
    )
    .await;
    assert!(c.pv_for(&clone).await.is_none());
    let grants: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "data",
        &ApiResource {
            group: "gateway.networking.k8s.io".into(),
            version: "v1beta1".into(),
            api_version: "gateway.networking.k8s.io/v1beta1".into(),
            kind: "ReferenceGrant".into(),
            plural: "referencegrants".into(),
        },
    );
    let grant: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "let-default-clone", "namespace": "data"},
        "spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "default"}],
            "to": [{"group": "", "kind": "PersistentVolumeClaim", "name": "shared"}],
        },
    }))
    .unwrap();
    grants.create(&PostParams::default(), &grant).await.unwrap();
    let pv = c.wait_pv(&clone, T).await;
    assert_eq!(
        std::fs::read_to_string(c.volume_dir(&pv).join("data.txt")).unwrap(),
        "across namespaces"
    );
}
