//! The Recycle hand-off (issue 33): Released hostPath, NFS and CSI volumes with policy
//! `Recycle`, on two real control planes, one with kube-controller-manager's binder and one with
//! `volstack pv-controller` in its place. The test plays kubelet (no node runs Pods here).
//!
//! Both binders must make the same recycler Pods, pass on the same Pod events and fail the CSI
//! volume alike. What follows is ours alone: kube-controller-manager's recycler opens its Pod
//! watch with no resourceVersion, which this kube-apiserver refuses on etcd 3.4.23 (500, "the
//! required storage feature RequestWatchProgress is disabled"; its events' watch, not served
//! from the watch cache, works), so it does not see its Pod end (until its events watch ends,
//! kube-apiserver's 30 to 60 minutes, its source says). Ours watches from a list's version:
//! one Pod succeeds (the volume is Available), one fails (Failed) and succeeds when tried
//! again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::bed::{Bed, Setup};

const WAIT: Duration = Duration::from_secs(90);

fn volume(name: &str, source: Value) -> Value {
    let mut pv = json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "3Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Recycle", "storageClassName": ""},
    });
    crate::bed::merge(&mut pv, &json!({"spec": source}));
    pv
}

/// A recycler Pod as compared: the server's own additions (its node, its service account
/// token's volume, names and times) left out.
fn normal_pod(pod: &Pod) -> Value {
    let mut spec = serde_json::to_value(pod.spec.clone().unwrap_or_default()).unwrap();
    let token = |v: &Value| {
        v["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kube-api-access-"))
    };
    spec["nodeName"] = Value::Null;
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.retain(|v| !token(v));
    }
    if let Some(containers) = spec["containers"].as_array_mut() {
        for c in containers {
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.retain(|m| !token(m));
            }
        }
    }
    json!({
        "name": pod.metadata.name,
        "namespace": pod.metadata.namespace,
        "generateName": pod.metadata.generate_name,
        "labels": pod.metadata.labels,
        "annotations": pod.metadata.annotations,
        "ownerReferences": pod.metadata.owner_references,
        "spec": spec,
    })
}

/// The recycler Pod of `pv` not seen before, once kube-scheduler has placed it and the binder
/// has passed the scheduler's event on to the volume.
async fn recycler_started(bed: &Bed, pv: &str, seen: &mut BTreeSet<String>) -> Pod {
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    let name = format!("recycler-for-{pv}");
    let pod = bed
        .until_some(&format!("a new pod {name} on its node"), WAIT, || async {
            let pod = pods.get_opt(&name).await.unwrap()?;
            let uid = pod.metadata.uid.clone()?;
            let placed = pod.spec.as_ref()?.node_name.is_some();
            (placed && pod.metadata.deletion_timestamp.is_none() && !seen.contains(&uid))
                .then_some(pod)
        })
        .await;
    seen.insert(pod.metadata.uid.clone().unwrap_or_default());
    let scheduled = format!("Recycler pod: Successfully assigned default/{name} to node-1");
    volume_event(bed, pv, "Normal", "RecyclerPod", &scheduled).await;
    pod
}

/// Plays kubelet at the Pod's end: its `status`, then, once the binder has deleted it, its
/// removal (kubelet's, when the containers are gone).
async fn end_pod(bed: &Bed, pod: &Pod, status: Value) {
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
    bed.until(&format!("{name} deleted by the binder"), WAIT, || async {
        match pods.get_opt(&name).await.unwrap() {
            Some(p) if p.metadata.uid.as_deref() == Some(uid.as_str()) => {
                p.metadata.deletion_timestamp.is_some()
            }
            _ => true,
        }
    })
    .await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    match pods.delete(&name, &now).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => panic!("delete {name}: {error}"),
    }
}

async fn phase_is(bed: &Bed, pv: &str, phase: &str) {
    let pvs: Api<PersistentVolume> = Api::all(bed.admin.clone());
    bed.until(&format!("{pv} {phase}"), WAIT, || async {
        pvs.get(pv)
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some(phase)
    })
    .await;
}

/// The volumes to recycle, bound.
async fn bound_volumes(bed: &Bed) {
    for pv in [
        volume(
            "pv-hp",
            json!({"hostPath": {"path": "/data/pv-hp", "type": "DirectoryOrCreate"}}),
        ),
        volume(
            "pv-nfs",
            json!({"nfs": {"server": "10.0.0.2", "path": "/exports/a"}}),
        ),
        volume(
            "pv-csi",
            json!({"csi": {"driver": "static.example.com", "volumeHandle": "h"}}),
        ),
    ] {
        bed.create_cluster::<PersistentVolume>(pv).await;
    }
    for (claim, pv) in [("c-hp", "pv-hp"), ("c-nfs", "pv-nfs"), ("c-csi", "pv-csi")] {
        bed.claim(claim, "", "1Gi", json!({"spec": {"volumeName": pv}}))
            .await;
    }
    for claim in ["c-hp", "c-nfs", "c-csi"] {
        bed.bound(claim, WAIT).await;
    }
}

/// What both binders do: the claims go, the recycler Pods are made (and placed) and the CSI
/// volume is Failed. Returns the Pods as made and that state: the Pods as compared, the
/// volumes, and the events on them (type, reason, message, source).
async fn recycling_started(
    bed: &Bed,
    seen: &mut BTreeSet<String>,
) -> (Vec<Pod>, BTreeMap<String, Value>) {
    bound_volumes(bed).await;
    let mut made = Vec::new();
    let mut state = BTreeMap::new();
    for (claim, pv) in [("c-hp", "pv-hp"), ("c-nfs", "pv-nfs")] {
        bed.delete_claim_only(claim).await;
        let pod = recycler_started(bed, pv, seen).await;
        state.insert(format!("pod {pv}"), normal_pod(&pod));
        made.push(pod);
    }
    bed.delete_claim_only("c-csi").await;
    phase_is(bed, "pv-csi", "Failed").await;
    volume_event(
        bed,
        "pv-csi",
        "Warning",
        "VolumeFailedRecycle",
        "No recycler plugin found for the volume!",
    )
    .await;
    let pvs = Api::<PersistentVolume>::all(bed.admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    for pv in &pvs {
        let status = pv.status.clone().unwrap_or_default();
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        state.insert(
            format!("volume {}", pv.metadata.name.clone().unwrap_or_default()),
            json!({
                "phase": status.phase,
                "message": status.message,
                "claimRef": claim_ref.map(|r| (r.name.clone(), r.uid.is_some())),
                "annotations": pv.metadata.annotations,
            }),
        );
    }
    let events = Api::<Event>::all(bed.admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let recorded: BTreeSet<String> = events
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("PersistentVolume"))
        .map(|e| {
            let source = e.source.clone().unwrap_or_default();
            format!(
                "{} {}: {} {} {} (from {:?})",
                e.involved_object.kind.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default(),
                source.component,
            )
        })
        .collect();
    state.insert("events".into(), json!(recorded));
    (made, state)
}

/// The event of `reason` on volume `pv` with `message`.
async fn volume_event(bed: &Bed, pv: &str, kind: &str, reason: &str, message: &str) {
    let what = format!("{pv}'s {kind} {reason} {message:?}");
    bed.until_event(&what, pv, WAIT, |e| {
        e.type_.as_deref() == Some(kind)
            && e.reason.as_deref() == Some(reason)
            && e.message.as_deref() == Some(message)
    })
    .await;
}

#[tokio::test]
async fn our_recycler_makes_kube_controller_managers_pods_and_sees_them_end() {
    let theirs = Bed::start(Setup::default()).await;
    let (_, expected) = recycling_started(&theirs, &mut BTreeSet::new()).await;
    theirs.finish().await;

    let mut ours = Bed::start(Setup::our_binder()).await;
    ours.pv_controller("pv-controller", &[]).await;
    let mut seen = BTreeSet::new();
    let (made, got) = recycling_started(&ours, &mut seen).await;
    let keys: BTreeSet<&String> = expected.keys().chain(got.keys()).collect();
    let differences: Vec<String> = keys
        .into_iter()
        .filter(|k| expected.get(*k) != got.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("absent".into(), Value::to_string);
            format!(
                "{k}:\n  kcm:  {}\n  ours: {}",
                show(expected.get(k)),
                show(got.get(k))
            )
        })
        .collect();
    assert!(
        differences.is_empty(),
        "recycling differs (kube-controller-manager's, then ours):\n{}\n--- our pv-controller\n{}",
        differences.join("\n"),
        ours.log("pv-controller")
    );

    // Ours alone from here (see the module's words).
    let pvs: Api<PersistentVolume> = Api::all(ours.admin.clone());
    end_pod(&ours, &made[0], json!({"phase": "Succeeded"})).await;
    phase_is(&ours, "pv-hp", "Available").await;
    let hp = pvs.get("pv-hp").await.unwrap();
    assert!(hp.spec.and_then(|s| s.claim_ref).is_none(), "unbound");
    volume_event(
        &ours,
        "pv-hp",
        "Normal",
        "VolumeRecycled",
        "Volume recycled",
    )
    .await;

    let failed = json!({"phase": "Failed", "message": "scrub failed"});
    end_pod(&ours, &made[1], failed).await;
    phase_is(&ours, "pv-nfs", "Failed").await;
    let message = "Recycle failed: failed to recycle volume: scrub failed";
    volume_event(&ours, "pv-nfs", "Warning", "VolumeFailedRecycle", message).await;
    // Tried again at a resync: a new Pod, which succeeds.
    let again = recycler_started(&ours, "pv-nfs", &mut seen).await;
    end_pod(&ours, &again, json!({"phase": "Succeeded"})).await;
    phase_is(&ours, "pv-nfs", "Available").await;
    ours.finish().await;
}
