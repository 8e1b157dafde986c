//! Pods that get their volumes on `volstack up`, driven by kubectl: attach, publish into the
//! Pod's volume directory, Running; files outlive the Pod; a claim in use is not deleted
//! under its Pod; the node's state survives a restart.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::up::*;

const WAIT: Duration = Duration::from_secs(60);

fn exists(dir: &Path, kind: &str, name: &str) -> bool {
    !kubectl(
        dir,
        &["get", kind, name, "--ignore-not-found", "-o", "name"],
        None,
    )
    .trim()
    .is_empty()
}

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n    - name: app\n      image: busybox\n      volumeMounts:\n        - name: data\n          mountPath: /data\n  volumes:\n    - name: data\n      persistentVolumeClaim:\n        claimName: data\n"
    )
}

/// Where the node published the Pod's volume.
fn mount(dir: &Path, pod: &str) -> PathBuf {
    let uid = get(dir, &["pod", pod], "{.metadata.uid}");
    let pv = get(dir, &["pvc", "data"], "{.spec.volumeName}");
    dir.join("state/kubelet/node-1/pods")
        .join(uid)
        .join("volumes/kubernetes.io~csi")
        .join(pv)
        .join("mount")
}

fn wait_ready(dir: &Path, pod: &str) {
    kubectl(
        dir,
        &[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            "--timeout=60s",
        ],
        None,
    );
}

#[test]
fn a_pod_gets_its_volume_its_files_outlive_it_and_its_claim_waits_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let up1 = up(dir);
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pod.yaml"),
    )
    .unwrap();
    kubectl(dir, &["apply", "-f", "-"], Some(&example));
    wait_ready(dir, "app");
    assert_eq!(get(dir, &["pod", "app"], "{.status.phase}"), "Running");

    // Attached through csi-attacher, under kube-controller-manager's name.
    let handle = get(dir, &["pv"], "{.items[0].spec.csi.volumeHandle}");
    let attachment = get(dir, &["volumeattachments"], "{.items[0].metadata.name}");
    assert_eq!(
        attachment,
        sidecar_kit::pv_csi::attachment_name(&handle, "hostpath.csi.volstack.dev", "node-1")
    );
    assert_eq!(
        get(
            dir,
            &["volumeattachment", &attachment],
            "{.status.attached}"
        ),
        "true"
    );
    assert_eq!(
        get(dir, &["node", "node-1"], "{.status.volumesInUse[0]}"),
        format!("kubernetes.io/csi/hostpath.csi.volstack.dev^{handle}")
    );

    let first = mount(dir, "app");
    std::fs::write(first.join("hello.txt"), "written by a person\n").unwrap();

    // A restart after a reboot: the mounts are gone (the tests run as root, so the driver
    // bind-mounts) and the records still say "published"; the node finds the lost mounts and
    // mounts them again, and the Pod sees its file instead of a plain directory.
    stop(up1);
    unmount_under(&dir.join("state"));
    assert!(
        !first.join("hello.txt").exists(),
        "the volume was a mount, gone with the reboot"
    );
    let up2 = up(dir);
    wait_ready(dir, "app");
    wait_for("the volume mounted again after the reboot", WAIT, || {
        first.join("hello.txt").exists()
    });
    assert!(sidecar_kit::mounts::is_mount_point(&first));

    kubectl(dir, &["delete", "pod", "app", "--timeout=60s"], None);
    assert!(!first.exists(), "unpublished before the Pod went");
    wait_for("the VolumeAttachment deleted", WAIT, || {
        get(dir, &["volumeattachments"], "{.items[*].metadata.name}").is_empty()
    });

    kubectl(dir, &["apply", "-f", "-"], Some(&pod("app2")));
    wait_ready(dir, "app2");
    let second = mount(dir, "app2");
    assert_eq!(
        std::fs::read_to_string(second.join("hello.txt")).unwrap(),
        "written by a person\n"
    );

    // The claim is in use: its deletion waits for the Pod.
    kubectl(dir, &["delete", "pvc", "data", "--wait=false"], None);
    wait_for("the claim marked for deletion", WAIT, || {
        !get(dir, &["pvc", "data"], "{.metadata.deletionTimestamp}").is_empty()
    });
    assert_eq!(
        get(dir, &["pvc", "data"], "{.metadata.finalizers[*]}"),
        "kubernetes.io/pvc-protection"
    );
    assert_eq!(get(dir, &["pvc", "data"], "{.status.phase}"), "Bound");
    assert_eq!(get(dir, &["pod", "app2"], "{.status.phase}"), "Running");
    assert!(second.join("hello.txt").exists(), "still published");

    kubectl(dir, &["delete", "pod", "app2", "--timeout=60s"], None);
    wait_for("the claim gone", WAIT, || !exists(dir, "pvc", "data"));
    wait_for("the volume gone", WAIT, || {
        get(dir, &["pv"], "{.items[*].metadata.name}").is_empty() && driver_volumes(dir) == 0
    });
    assert!(get(dir, &["volumeattachments"], "{.items[*].metadata.name}").is_empty());
    stop(up2);
}

#[test]
fn a_pods_ephemeral_volume_is_its_own_claim_made_with_it_and_deleted_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _up = up(dir);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: scratch\nspec:\n  containers:\n    - name: app\n      image: busybox\n      volumeMounts:\n        - name: work\n          mountPath: /work\n  volumes:\n    - name: work\n      ephemeral:\n        volumeClaimTemplate:\n          metadata:\n            labels:\n              team: a\n          spec:\n            accessModes: [ReadWriteOnce]\n            resources:\n              requests:\n                storage: 1Mi\n";
    kubectl(dir, &["apply", "-f", "-"], Some(pod));
    wait_ready(dir, "scratch");
    // The claim <pod>-<volume>, owned by the Pod, with the template's labels, Bound.
    let owner = get(
        dir,
        &["pvc", "scratch-work"],
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    );
    assert_eq!(owner, "Pod/scratch");
    assert_eq!(
        get(dir, &["pvc", "scratch-work"], "{.metadata.labels.team}"),
        "a"
    );
    assert_eq!(
        get(dir, &["pvc", "scratch-work"], "{.status.phase}"),
        "Bound"
    );
    let pv = get(dir, &["pvc", "scratch-work"], "{.spec.volumeName}");

    // A claim of another Pod's name that the Pod does not own is never taken: it waits, told why.
    let squatter = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: other-work\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Mi\n";
    kubectl(dir, &["apply", "-f", "-"], Some(squatter));
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&pod.replace("name: scratch", "name: other")),
    );
    wait_for("the event saying the claim is not the Pod's", WAIT, || {
        kubectl(
            dir,
            &[
                "get",
                "events",
                "--field-selector=involvedObject.name=other",
            ],
            None,
        )
        .contains("PVC other-work was not created for the pod")
    });
    assert_ne!(get(dir, &["pod", "other"], "{.status.phase}"), "Running");

    // The Pod goes: its claim goes with it, and the volume after it.
    kubectl(dir, &["delete", "pod", "scratch", "--timeout=60s"], None);
    wait_for("the Pod's claim deleted", WAIT, || {
        !exists(dir, "pvc", "scratch-work")
    });
    wait_for("its volume deleted", WAIT, || !exists(dir, "pv", &pv));
    assert!(
        exists(dir, "pvc", "other-work"),
        "a claim no Pod owns stays"
    );
}

#[test]
fn an_inline_csi_volume_is_made_at_publish_and_removed_with_its_pod() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _up = up(dir);
    assert_eq!(
        get(dir, &["csidriver"], "{.items[0].spec.volumeLifecycleModes}"),
        "[\"Persistent\",\"Ephemeral\"]"
    );
    let before = driver_volumes(dir);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: inline\nspec:\n  containers:\n    - name: app\n      image: busybox\n      volumeMounts:\n        - name: cache\n          mountPath: /cache\n  volumes:\n    - name: cache\n      csi:\n        driver: hostpath.csi.volstack.dev\n        volumeAttributes:\n          size: 2Mi\n";
    kubectl(dir, &["apply", "-f", "-"], Some(pod));
    wait_ready(dir, "inline");
    let uid = get(dir, &["pod", "inline"], "{.metadata.uid}");
    let target = dir
        .join("state/kubelet/node-1/pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi/cache/mount");
    std::fs::write(target.join("f"), b"inline").unwrap();
    assert_eq!(
        driver_volumes(dir),
        before + 1,
        "one volume, made by the publish"
    );
    assert!(
        !exists(dir, "pvc", "inline-cache"),
        "no claim: an inline volume is the Pod's own"
    );
    kubectl(dir, &["delete", "pod", "inline", "--timeout=60s"], None);
    wait_for("the inline volume removed at the driver", WAIT, || {
        driver_volumes(dir) == before
    });
    assert!(!target.exists(), "its directory went with the Pod");
}
