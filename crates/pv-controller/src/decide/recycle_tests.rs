#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::*;

fn pv(source: Value, size: &str, policy: &str) -> PersistentVolume {
    let mut spec = json!({"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": policy,
        "claimRef": {"namespace": "ns", "name": "data", "uid": "u1"}});
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": spec})).unwrap()
}

fn host_path(size: &str) -> PersistentVolume {
    pv(
        json!({"hostPath": {"path": "/data/pv-1", "type": "DirectoryOrCreate"}}),
        size,
        "Recycle",
    )
}

fn claim(uid: &str, volume: &str) -> PersistentVolumeClaim {
    serde_json::from_value(
        json!({"metadata": {"namespace": "ns", "name": "data", "uid": uid},
        "spec": {"volumeName": volume}}),
    )
    .unwrap()
}

fn pod(name: &str, phase: &str, claims: &[&str]) -> Pod {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": name},
        "spec": {"containers": [], "volumes": volumes}, "status": {"phase": phase}}))
    .unwrap()
}

#[test]
fn the_deadline_is_the_increment_per_whole_gib_and_at_least_the_minimum() {
    let config = RecyclerConfig::default();
    let rows = [
        ("1Mi", 60),
        ("1Gi", 60),
        ("2Gi", 60),
        ("3Gi", 90),
        ("3.5Gi", 90),
        ("10G", 270),
        ("1Ti", 30_720),
        ("", 60),
    ];
    for (size, want) in rows {
        assert_eq!(
            timeout_for(&host_path(size), &config.host_path),
            want,
            "{size}"
        );
    }
    let nfs = pv(
        json!({"nfs": {"server": "n", "path": "/e"}}),
        "20Gi",
        "Recycle",
    );
    assert_eq!(timeout_for(&nfs, &config.nfs), 600);
    assert_eq!(timeout_for(&host_path("20Gi"), &config.nfs), 600);
    assert_eq!(timeout_for(&host_path("5Gi"), &config.nfs), 300);
    let pod = recycler_pod(&host_path("4Gi"), &config).unwrap();
    assert_eq!(
        wait_limit(&pod, config.past_deadline),
        std::time::Duration::from_secs(120 + 300)
    );
    assert_eq!(wait_limit(&Pod::default(), PAST_DEADLINE), PAST_DEADLINE);
    let soon = std::time::Duration::from_secs(2);
    assert_eq!(
        wait_limit(&pod, soon),
        std::time::Duration::from_secs(120 + 2)
    );
}

#[test]
fn the_recycler_pod_is_the_template_with_the_volumes_name_deadline_and_source() {
    let config = RecyclerConfig::default();
    let made = recycler_pod(&host_path("4Gi"), &config).unwrap();
    let want = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "recycler-for-pv-1", "namespace": "default"},
        "spec": {
            "activeDeadlineSeconds": 120,
            "restartPolicy": "Never",
            "volumes": [{"name": "vol", "hostPath": {"path": "/data/pv-1"}}],
            "containers": [{
                "name": "pv-recycler",
                "image": RECYCLER_IMAGE,
                "command": ["/bin/sh"],
                "args": ["-c", SCRUB_SCRIPT],
                "volumeMounts": [{"name": "vol", "mountPath": "/scrub"}],
            }],
        },
    });
    assert_eq!(serde_json::to_value(&made).unwrap(), want);

    let nfs = pv(
        json!({"nfs": {"server": "10.0.0.2", "path": "/exports/a", "readOnly": true}}),
        "1Gi",
        "Recycle",
    );
    let made = recycler_pod(&nfs, &config).unwrap();
    let spec = serde_json::to_value(made.spec.unwrap()).unwrap();
    assert_eq!(spec["activeDeadlineSeconds"], 300);
    assert_eq!(
        spec["volumes"],
        json!([{"name": "vol", "nfs": {"server": "10.0.0.2", "path": "/exports/a"}}])
    );

    for source in [
        json!({"csi": {"driver": "d", "volumeHandle": "h"}}),
        json!({"local": {"path": "/mnt"}}),
    ] {
        assert_eq!(
            recycler_pod(&pv(source.clone(), "1Gi", "Recycle"), &config),
            None,
            "{source}"
        );
    }
}

#[test]
fn a_template_files_first_volume_is_replaced_and_its_namespace_kept_or_defaulted() {
    let template: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "scrub-", "namespace": "ops", "labels": {"app": "scrub"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "target", "emptyDir": {}}, {"name": "tools", "emptyDir": {}}]},
    }))
    .unwrap();
    let mut config = RecyclerConfig::default();
    config.host_path.template = template.clone();
    let made = recycler_pod(&host_path("1Gi"), &config).unwrap();
    let made = serde_json::to_value(&made).unwrap();
    assert_eq!(
        made["metadata"],
        json!({"name": "recycler-for-pv-1", "namespace": "ops", "labels": {"app": "scrub"}})
    );
    assert_eq!(
        made["spec"]["volumes"],
        json!([{"name": "target", "hostPath": {"path": "/data/pv-1"}},
               {"name": "tools", "emptyDir": {}}])
    );
    let mut no_namespace = template;
    no_namespace.metadata.namespace = None;
    config.host_path.template = no_namespace;
    let made = recycler_pod(&host_path("1Gi"), &config).unwrap();
    assert_eq!(made.metadata.namespace.as_deref(), Some("default"));

    assert_eq!(validate_template(&default_template()), Ok(()));
    let empty: Pod = serde_json::from_value(json!({"spec": {"containers": []}})).unwrap();
    assert_eq!(
        validate_template(&empty),
        Err("does not contain any volume(s)".to_string())
    );
}

#[test]
fn the_pods_phase_decides_the_outcome() {
    let with_status = |status: Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    };
    let rows = [
        (json!({"phase": "Pending"}), None),
        (json!({"phase": "Running"}), None),
        (json!({}), None),
        (json!({"phase": "Succeeded"}), Some(Ok(()))),
        (
            json!({"phase": "Failed", "message": "Pod was active on the node longer than the specified deadline"}),
            Some(Err(
                "Pod was active on the node longer than the specified deadline".to_string(),
            )),
        ),
        (
            json!({"phase": "Failed"}),
            Some(Err("pod failed, pod.Status.Message unknown".to_string())),
        ),
        (
            json!({"phase": "Failed", "message": ""}),
            Some(Err("pod failed, pod.Status.Message unknown".to_string())),
        ),
    ];
    for (status, want) in rows {
        assert_eq!(pod_outcome(&with_status(status.clone())), want, "{status}");
    }
    let no_status: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
    assert_eq!(pod_outcome(&no_status), None);
}

#[test]
fn a_volume_is_recycled_only_while_its_claim_is_gone_or_bound_elsewhere() {
    let retained = pv(json!({"hostPath": {"path": "/d"}}), "1Gi", "Retain");
    let mut deleting = host_path("1Gi");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    let mut pre_bound = host_path("1Gi");
    if let Some(r) = pre_bound.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = None;
    }
    let rows: [(&PersistentVolume, Option<PersistentVolumeClaim>, bool, &str); 8] = [
        (&host_path("1Gi"), None, true, "claim gone"),
        (
            &host_path("1Gi"),
            Some(claim("u2", "")),
            true,
            "claim replaced",
        ),
        (
            &host_path("1Gi"),
            Some(claim("u1", "pv-1")),
            false,
            "still bound",
        ),
        (&host_path("1Gi"), Some(claim("u1", "")), false, "binding"),
        (
            &host_path("1Gi"),
            Some(claim("u1", "pv-2")),
            true,
            "bound elsewhere",
        ),
        (&retained, None, false, "policy changed"),
        (&deleting, None, false, "being deleted"),
        (&pre_bound, None, false, "pre-bound by name"),
    ];
    for (volume, claim, want, what) in rows {
        assert_eq!(recycle_stands(volume, claim.as_ref()), want, "{what}");
    }
}

#[test]
fn the_users_are_the_running_pods_naming_the_claim_sorted() {
    let mut elsewhere = pod("other-ns", "Running", &["data"]);
    elsewhere.metadata.namespace = Some("ns2".into());
    let pods = [
        pod("web-b", "Running", &["data"]),
        pod("web-a", "Pending", &["logs", "data"]),
        pod("done", "Succeeded", &["data"]),
        pod("failed", "Failed", &["data"]),
        pod("unrelated", "Running", &["logs"]),
        elsewhere,
    ];
    let users = users_of(&host_path("1Gi"), None, &pods);
    let renewed = claim("u2", "");
    assert!(
        users_of(&host_path("1Gi"), Some(&renewed), &pods).is_empty(),
        "a new claim of that name: its Pods"
    );
    assert_eq!(users, ["ns/web-a", "ns/web-b"]);
    assert_eq!(
        used_by_message(&users),
        "Volume is used by pods: ns/web-a,ns/web-b"
    );
    let mut unbound = host_path("1Gi");
    unbound.spec.as_mut().unwrap().claim_ref = None;
    assert!(users_of(&unbound, None, &pods).is_empty());
}

#[test]
fn the_messages_are_kube_controller_managers() {
    assert_eq!(
        failed_message(&format!("failed to recycle volume: {POD_DELETED}")),
        "Recycle failed: failed to recycle volume: recycler pod was deleted"
    );
    assert_eq!(
        failed_message(OLD_POD_FOUND),
        "Recycle failed: old recycler pod found, will retry later"
    );
    assert_eq!(
        forwarded_message("Successfully assigned default/recycler-for-pv-1 to node-1"),
        "Recycler pod: Successfully assigned default/recycler-for-pv-1 to node-1"
    );
    assert_eq!(pod_name("pv-1"), "recycler-for-pv-1");
}
