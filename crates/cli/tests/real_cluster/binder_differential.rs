//! The binder, differentially (issue 33): the same claims and volumes on two real control
//! planes, one with kube-controller-manager's binder and one with `volstack pv-controller` in
//! its place, end in the same state: claims, volumes, the annotations the binder writes and
//! the events it records, compared after normalising generated names.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use serde_json::{Value, json};

use crate::bed::{Bed, Setup};

const WAIT: Duration = Duration::from_secs(90);
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// The annotations a binder writes or reads on claims and volumes.
const BINDER_ANNOTATIONS: [&str; 6] = [
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
    "pv.kubernetes.io/provisioned-by",
    "volume.kubernetes.io/selected-node",
];

fn static_volume(name: &str, class: &str, size: &str, extra: Value) -> Value {
    let mut pv = json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                 "hostPath": {"path": format!("/tmp/{name}")}},
    });
    crate::bed::merge(&mut pv, &extra);
    pv
}

/// A CSI source (kube-apiserver wants one on a volume with an attributes class) and the class.
fn attributes_class(name: &str, class: &str) -> Value {
    json!({"spec": {"hostPath": null, "volumeAttributesClassName": class,
                    "csi": {"driver": "static.example.com", "volumeHandle": name}}})
}

/// The scenarios: what is made, in order.
async fn make_scenarios(bed: &Bed) {
    for class in [
        "named",
        "sel",
        "big",
        "modes",
        "block",
        "retain",
        "vac",
        "going",
        "groups",
        "nodeleter",
        "resized",
    ] {
        bed.create_cluster::<StorageClass>(
            json!({"metadata": {"name": class}, "provisioner": NO_PROVISIONER}),
        )
        .await;
    }
    bed.create_cluster::<StorageClass>(json!({"metadata": {"name": "local"},
        "provisioner": NO_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    // In-tree plugins kube-controller-manager registers: hostPath (its provisioning off by
    // default) and NFS (no provisioner).
    for (class, plugin) in [
        ("host", "kubernetes.io/host-path"),
        ("nfs", "kubernetes.io/nfs"),
    ] {
        bed.create_cluster::<StorageClass>(
            json!({"metadata": {"name": class}, "provisioner": plugin}),
        )
        .await;
    }
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let volumes = [
        // Pre-bound by name (no UID) to a claim made after it.
        static_volume(
            "pv-prebound",
            "",
            "1Gi",
            json!({"spec": {"claimRef": {"namespace": "default", "name": "c-prebound"}}}),
        ),
        // Named by its claim's volumeName.
        static_volume("pv-named", "named", "1Gi", json!({})),
        // A class-less claim's only match.
        static_volume("pv-plain", "", "2Gi", json!({})),
        // A selector picks one of two.
        static_volume(
            "pv-sel-gold",
            "sel",
            "1Gi",
            json!({"metadata": {"labels": {"tier": "gold"}}}),
        ),
        static_volume(
            "pv-sel-silver",
            "sel",
            "1Gi",
            json!({"metadata": {"labels": {"tier": "silver"}}}),
        ),
        // Too small for its claim.
        static_volume("pv-small", "big", "1Gi", json!({})),
        // Read-only many only: a ReadWriteOnce claim does not fit.
        static_volume(
            "pv-rox",
            "modes",
            "1Gi",
            json!({"spec": {"accessModes": ["ReadOnlyMany"]}}),
        ),
        // A block volume for a block claim.
        static_volume(
            "pv-block",
            "block",
            "1Gi",
            json!({"spec": {"volumeMode": "Block"}}),
        ),
        // Retained when its claim goes.
        static_volume("pv-retain", "retain", "1Gi", json!({})),
        // Named by a claim of another class.
        static_volume("pv-other-class", "named", "1Gi", json!({})),
        // Volume attributes classes: a claim of class gold takes only a gold volume (a larger
        // one than the smallest fit), a claim of none refuses a named silver one.
        static_volume("pv-vac-none", "vac", "1Gi", json!({})),
        static_volume(
            "pv-vac-gold",
            "vac",
            "2Gi",
            attributes_class("pv-vac-gold", "gold"),
        ),
        static_volume(
            "pv-vac-silver",
            "vac",
            "1Gi",
            attributes_class("pv-vac-silver", "silver"),
        ),
        // Access-mode groups, the fewest modes first: an Available volume of one mode wins
        // over a smaller volume of two modes pre-bound to the claim.
        static_volume(
            "pv-groups-reserved",
            "groups",
            "1Gi",
            json!({"spec": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                            "claimRef": {"namespace": "default", "name": "c-groups"}}}),
        ),
        static_volume("pv-groups-single", "groups", "5Gi", json!({})),
        // Policy Delete and no deleter in kube-controller-manager: an NFS source (a plugin
        // without one) and an iSCSI source (no plugin there).
        static_volume(
            "pv-nfs-delete",
            "nodeleter",
            "1Gi",
            json!({"spec": {"hostPath": null, "persistentVolumeReclaimPolicy": "Delete",
                            "nfs": {"server": "nfs.example.com", "path": "/export"}}}),
        ),
        static_volume(
            "pv-iscsi-delete",
            "nodeleter",
            "1Gi",
            json!({"spec": {"hostPath": null, "persistentVolumeReclaimPolicy": "Delete",
                            "iscsi": {"targetPortal": "10.0.0.1:3260",
                                      "iqn": "iqn.2001-04.com.example:storage", "lun": 0}}}),
        ),
        // Expanded before its filesystem: its claim records the size before.
        static_volume(
            "pv-resized",
            "resized",
            "2Gi",
            json!({"metadata": {"annotations": {"volume.alpha.kubernetes.io/pre-resize-capacity": "1Gi"}}}),
        ),
        // A local volume on node-1, for a late-binding claim: the scheduler picks it.
        static_volume(
            "pv-local",
            "local",
            "1Gi",
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}]}]}}}}),
        ),
    ];
    let count = volumes.len();
    for pv in volumes {
        bed.create_cluster::<PersistentVolume>(pv).await;
    }
    // The binder has seen every volume (it marks each Available) before any claim comes:
    // a claim synced before its volume is in the binder's cache would get other events.
    let pvs: Api<PersistentVolume> = Api::all(bed.admin.clone());
    bed.until("every volume Available", WAIT, || async {
        let all = pvs.list(&Default::default()).await.unwrap().items;
        all.len() == count
            && all
                .iter()
                .all(|pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
    })
    .await;
    bed.claim("c-prebound", "", "1Gi", json!({})).await;
    bed.claim(
        "c-named",
        "named",
        "1Gi",
        json!({"spec": {"volumeName": "pv-named"}}),
    )
    .await;
    bed.claim("c-plain", "", "1Gi", json!({})).await;
    bed.claim(
        "c-sel",
        "sel",
        "1Gi",
        json!({"spec": {"selector": {"matchLabels": {"tier": "silver"}}}}),
    )
    .await;
    bed.claim("c-big", "big", "100Gi", json!({})).await;
    bed.claim("c-rox", "modes", "1Gi", json!({})).await;
    bed.claim(
        "c-block",
        "block",
        "1Gi",
        json!({"spec": {"volumeMode": "Block"}}),
    )
    .await;
    bed.claim("c-retain", "retain", "1Gi", json!({})).await;
    for (claim, volume) in [
        ("c-nfs-delete", "pv-nfs-delete"),
        ("c-iscsi-delete", "pv-iscsi-delete"),
    ] {
        bed.claim(
            claim,
            "nodeleter",
            "1Gi",
            json!({"spec": {"volumeName": volume}}),
        )
        .await;
    }
    bed.claim("c-resized", "resized", "1Gi", json!({})).await;
    bed.claim("c-host", "host", "1Gi", json!({})).await;
    bed.claim("c-nfs", "nfs", "1Gi", json!({})).await;
    bed.claim("c-groups", "groups", "1Gi", json!({})).await;
    bed.claim("c-dyn", "fast", "1Gi", json!({})).await;
    bed.claim(
        "c-vac",
        "vac",
        "1Gi",
        json!({"spec": {"volumeAttributesClassName": "gold"}}),
    )
    .await;
    bed.claim(
        "c-vac-named",
        "vac",
        "1Gi",
        json!({"spec": {"volumeName": "pv-vac-silver"}}),
    )
    .await;
    // A claim being deleted (a finalizer holds it) whose volume comes after: bound all the same
    // (it names the volume: neither binder says anything of a volume not there yet).
    bed.claim(
        "c-going",
        "going",
        "1Gi",
        json!({"metadata": {"finalizers": ["volstack.test/hold"]},
               "spec": {"volumeName": "pv-going"}}),
    )
    .await;
    bed.delete_claim_only("c-going").await;
    bed.create_cluster::<PersistentVolume>(static_volume("pv-going", "going", "1Gi", json!({})))
        .await;
    bed.claim(
        "c-mismatch",
        "sel",
        "1Gi",
        json!({"spec": {"volumeName": "pv-other-class"}}),
    )
    .await;
    // Late binding: kube-scheduler picks the node for the Pod's claim.
    bed.claim("c-late", "late", "1Gi", json!({})).await;
    bed.claim("c-local", "local", "1Gi", json!({})).await;
    // A late claim whose Pod no node can take: it waits for that Pod to be scheduled.
    bed.claim("c-stuck", "late", "1Gi", json!({})).await;
    // The binder says it waits (before the Pod, so that it always has the time to).
    let events: Api<Event> = Api::namespaced(bed.admin.clone(), "default");
    bed.until(
        "the late claims' WaitForFirstConsumer events",
        WAIT,
        || async {
            let items = events.list(&Default::default()).await.unwrap().items;
            ["c-late", "c-local", "c-stuck"].iter().all(|c| {
                items.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some(*c)
                        && e.reason.as_deref() == Some("WaitForFirstConsumer")
                })
            })
        },
    )
    .await;
    bed.create::<k8s_openapi::api::core::v1::Pod>(
        "default",
        json!({"metadata": {"name": "consumer"},
               "spec": {"containers": [{"name": "app", "image": "busybox"}],
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c-late"}},
                                    {"name": "local", "persistentVolumeClaim": {"claimName": "c-local"}}]}}),
    )
    .await;
    bed.create::<k8s_openapi::api::core::v1::Pod>(
        "default",
        json!({"metadata": {"name": "stuck"},
               "spec": {"containers": [{"name": "app", "image": "busybox"}],
                        "nodeSelector": {"volstack.test/no-such-node": "true"},
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c-stuck"}}]}}),
    )
    .await;
    // kube-controller-manager says so at its next resync of the claim (15 s), ours when the
    // Pod appears.
    bed.until_event(
        "c-stuck's WaitForPodScheduled event",
        "c-stuck",
        WAIT,
        |e| e.reason.as_deref() == Some("WaitForPodScheduled"),
    )
    .await;
    for bound in [
        "c-prebound",
        "c-named",
        "c-plain",
        "c-sel",
        "c-block",
        "c-retain",
        "c-dyn",
        "c-late",
        "c-local",
        "c-vac",
        "c-going",
        "c-groups",
        "c-nfs-delete",
        "c-iscsi-delete",
        "c-resized",
    ] {
        bed.bound(bound, WAIT).await;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.admin.clone(), "default");
    let groups = claims.get("c-groups").await.unwrap();
    assert_eq!(
        groups.spec.and_then(|s| s.volume_name).as_deref(),
        Some("pv-groups-single"),
        "the volume of fewer access modes, not the pre-bound one"
    );
    // A claim naming a volume not there whose status someone set to Lost with access modes:
    // the binder marks it Pending again, without them.
    bed.claim(
        "c-relost",
        "named",
        "1Gi",
        json!({"spec": {"volumeName": "pv-absent"}}),
    )
    .await;
    let mut relost = claims.get("c-relost").await.unwrap();
    relost.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
        phase: Some("Lost".into()),
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        ..Default::default()
    });
    claims
        .replace_status("c-relost", &Default::default(), &relost)
        .await
        .unwrap();
    bed.until("c-relost Pending again", WAIT, || async {
        let status = claims
            .get("c-relost")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        status.phase.as_deref() == Some("Pending") && status.access_modes.is_none()
    })
    .await;
    // A claim naming a volume another claim holds.
    bed.claim(
        "c-steal",
        "",
        "1Gi",
        json!({"spec": {"volumeName": "pv-plain"}}),
    )
    .await;
    bed.delete_claim_only("c-retain").await;
    bed.delete_claim_only("c-nfs-delete").await;
    bed.delete_claim_only("c-iscsi-delete").await;
    let pvs: Api<PersistentVolume> = Api::all(bed.admin.clone());
    bed.until("the volumes without a deleter Failed", WAIT, || async {
        let mut failed = 0;
        for name in ["pv-nfs-delete", "pv-iscsi-delete"] {
            let phase = pvs.get(name).await.unwrap().status.and_then(|s| s.phase);
            failed += usize::from(phase.as_deref() == Some("Failed"));
        }
        failed == 2
    })
    .await;
    bed.until("pv-retain Released", WAIT, || async {
        pvs.get("pv-retain")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Released")
    })
    .await;
    // The binder has said why the others cannot bind, who provisions the dynamic one, and why
    // the volumes without a deleter failed (its events are written after the phase it waits
    // on above, so they are waited for too).
    let events: Api<Event> = Api::namespaced(bed.admin.clone(), "default");
    bed.until(
        "the binder's events on the unbindable claims and the failed volumes",
        WAIT,
        || async {
            let all = events.list(&Default::default()).await.unwrap().items;
            [
                "c-big",
                "c-rox",
                "c-dyn",
                "c-mismatch",
                "c-steal",
                "c-vac-named",
                "c-host",
                "c-nfs",
                "pv-nfs-delete",
                "pv-iscsi-delete",
            ]
            .iter()
            .all(|claim| {
                all.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some(*claim)
                        && e.source.as_ref().and_then(|s| s.component.as_deref())
                            == Some("persistentvolume-controller")
                })
            })
        },
    )
    .await;
}

/// The end state each control plane is compared by.
#[path = "binder_end_state.rs"]
mod end_state;

use end_state::end_state;

#[tokio::test]
async fn our_binder_ends_where_kube_controller_managers_does() {
    let mut theirs = Bed::start(Setup::default()).await;
    theirs.provisioner("csi-provisioner", &[], &[]).await;
    make_scenarios(&theirs).await;
    let expected = end_state(&theirs).await;
    theirs.finish().await;

    let mut ours = Bed::start(Setup::our_binder()).await;
    ours.pv_controller("pv-controller", &[]).await;
    ours.provisioner("csi-provisioner", &[], &[]).await;
    make_scenarios(&ours).await;
    let got = end_state(&ours).await;
    let our_log = ours.log("pv-controller");
    ours.finish().await;

    let mut differences = Vec::new();
    for key in expected.keys().chain(got.keys()) {
        let (want, have) = (expected.get(key), got.get(key));
        if want != have
            && !differences
                .iter()
                .any(|(k, _, _): &(String, _, _)| k == key)
        {
            differences.push((key.clone(), want.cloned(), have.cloned()));
        }
    }
    assert!(
        differences.is_empty(),
        "end states differ (kube-controller-manager's, then ours):\n{}\n--- our pv-controller\n{our_log}",
        differences
            .iter()
            .map(|(k, want, have)| format!(
                "{k}:\n  kcm:  {}\n  ours: {}",
                want.as_ref().map_or("absent".into(), |v| v.to_string()),
                have.as_ref().map_or("absent".into(), |v| v.to_string())
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
