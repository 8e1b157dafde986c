//! Changing volumes on `volstack up`, driven by kubectl as a user would: a claim in use grown
//! (ControllerExpandVolume, then NodeExpandVolume at the node), one in use by no Pod grown and
//! finished when a Pod mounts it, kube-apiserver's refusals (shrinking, a class that does not
//! allow expansion), and a claim moved to a VolumeAttributesClass (ControllerModifyVolume),
//! with a missing class and parameters the driver refuses.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::up::*;

const WAIT: Duration = Duration::from_secs(60);

/// kubectl that must fail; gives what it printed on stderr.
fn kubectl_refused(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg(format!(
            "--kubeconfig={}",
            dir.join("state/kubeconfig").display()
        ))
        .arg(cache_dir(dir))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "kubectl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn claim_and_pod(claim: &str, class: Option<&str>, pod: Option<&str>) -> String {
    let class = class.map_or(String::new(), |c| format!("  storageClassName: {c}\n"));
    let mut yaml = format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {claim}\nspec:\n  accessModes: [ReadWriteOnce]\n{class}  resources:\n    requests:\n      storage: 10Mi\n"
    );
    if let Some(pod) = pod {
        yaml.push_str(&pod_yaml(pod, claim));
    }
    yaml
}

fn pod_yaml(pod: &str, claim: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\nspec:\n  containers:\n    - name: app\n      image: busybox\n  volumes:\n    - name: data\n      persistentVolumeClaim:\n        claimName: {claim}\n"
    )
}

fn grow(dir: &Path, claim: &str, size: &str) {
    let patch =
        format!("{{\"spec\":{{\"resources\":{{\"requests\":{{\"storage\":\"{size}\"}}}}}}}}");
    kubectl(dir, &["patch", "pvc", claim, "-p", &patch], None);
}

fn events(dir: &Path, object: &str) -> String {
    let selector = format!("involvedObject.name={object}");
    kubectl(
        dir,
        &[
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        None,
    )
}

#[test]
fn claims_grow_online_and_offline_and_kube_apiservers_rules_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _up = up(dir);
    assert_eq!(
        get(
            dir,
            &["storageclass", "hostpath"],
            "{.allowVolumeExpansion}"
        ),
        "true"
    );
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&claim_and_pod("data", None, Some("app"))),
    );
    kubectl(
        dir,
        &["wait", "--for=condition=Ready", "pod/app", "--timeout=60s"],
        None,
    );
    // Online: the Pod runs while its volume grows.
    grow(dir, "data", "20Mi");
    wait_for("the claim's capacity 20Mi", WAIT, || {
        get(dir, &["pvc", "data"], "{.status.capacity.storage}") == "20Mi"
    });
    let pv = get(dir, &["pvc", "data"], "{.spec.volumeName}");
    assert_eq!(get(dir, &["pv", &pv], "{.spec.capacity.storage}"), "20Mi");
    // Done: no resize state left on the claim, and the PV's pre-resize capacity goes.
    assert_eq!(
        get(
            dir,
            &["pvc", "data"],
            "{.status.allocatedResourceStatuses}|{.status.conditions}|{.status.allocatedResources.storage}"
        ),
        "||20Mi"
    );
    wait_for("the PV's pre-resize capacity removed", WAIT, || {
        get(dir, &["pv", &pv], "{.metadata.annotations}")
            .find("pre-resize-capacity")
            .is_none()
    });
    for expected in [
        format!("Resizing: External resizer is resizing volume {pv}"),
        "FileSystemResizeRequired: Require file system resize of volume on node".to_string(),
        format!(
            "FileSystemResizeSuccessful: MountVolume.NodeExpandVolume succeeded for volume \"{pv}\" node-1"
        ),
    ] {
        // Events are sent after the writes they tell of: waited for.
        wait_for(&format!("event {expected}"), WAIT, || {
            events(dir, "data").contains(&expected)
        });
    }
    wait_for("the Pod's FileSystemResizeSuccessful", WAIT, || {
        events(dir, "app").contains("FileSystemResizeSuccessful")
    });

    // Offline: the controller's part now, the node's when a Pod mounts the volume.
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&claim_and_pod("cold", None, None)),
    );
    kubectl(
        dir,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Bound",
            "pvc/cold",
            "--timeout=60s",
        ],
        None,
    );
    grow(dir, "cold", "30Mi");
    wait_for("the node's part pending", WAIT, || {
        get(
            dir,
            &["pvc", "cold"],
            "{.status.allocatedResourceStatuses.storage} {.status.capacity.storage}",
        ) == "NodeResizePending 10Mi"
    });
    let cold = get(dir, &["pvc", "cold"], "{.spec.volumeName}");
    assert_eq!(get(dir, &["pv", &cold], "{.spec.capacity.storage}"), "30Mi");
    assert!(
        get(dir, &["pvc", "cold"], "{.status.conditions[*].message}").contains(
            "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
        )
    );
    kubectl(dir, &["apply", "-f", "-"], Some(&pod_yaml("warm", "cold")));
    wait_for("the offline claim's capacity 30Mi", WAIT, || {
        get(dir, &["pvc", "cold"], "{.status.capacity.storage}") == "30Mi"
    });

    // kube-apiserver's rules: never below the capacity, nothing else of the spec, and a
    // class must allow expansion.
    let shrink = kubectl_refused(
        dir,
        &[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"5Mi"}}}}"#,
        ],
    );
    assert!(
        shrink.contains(
            "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
        ),
        "{shrink}"
    );
    let modes = kubectl_refused(
        dir,
        &[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"accessModes":["ReadWriteMany"]}}"#,
        ],
    );
    assert!(
        modes.contains("spec is immutable after creation"),
        "{modes}"
    );
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: fixed\nprovisioner: hostpath.csi.volstack.dev\n---\n{}",
            claim_and_pod("small", Some("fixed"), None)
        )),
    );
    kubectl(
        dir,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Bound",
            "pvc/small",
            "--timeout=60s",
        ],
        None,
    );
    let fixed = kubectl_refused(
        dir,
        &[
            "patch",
            "pvc",
            "small",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"20Mi"}}}}"#,
        ],
    );
    assert!(
        fixed.contains("persistentvolumeclaims \"small\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{fixed}"
    );
}

#[test]
fn claims_move_to_another_volume_attributes_class() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _up = up(dir);
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---\napiVersion: storage.k8s.io/v1\nkind: VolumeAttributesClass\nmetadata:\n  name: gold\ndriverName: hostpath.csi.volstack.dev\nparameters:\n  tier: premium\n---\napiVersion: storage.k8s.io/v1\nkind: VolumeAttributesClass\nmetadata:\n  name: silly\ndriverName: hostpath.csi.volstack.dev\nparameters:\n  iops: \"0\"\n",
            claim_and_pod("data", None, None)
        )),
    );
    kubectl(
        dir,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Bound",
            "pvc/data",
            "--timeout=60s",
        ],
        None,
    );
    let name_class = |class: &str| {
        let patch = format!("{{\"spec\":{{\"volumeAttributesClassName\":\"{class}\"}}}}");
        kubectl(dir, &["patch", "pvc", "data", "-p", &patch], None);
    };
    name_class("gold");
    wait_for("the claim's current class gold", WAIT, || {
        get(
            dir,
            &["pvc", "data"],
            "{.status.currentVolumeAttributesClassName}|{.status.modifyVolumeStatus}",
        ) == "gold|"
    });
    let pv = get(dir, &["pvc", "data"], "{.spec.volumeName}");
    assert_eq!(
        get(dir, &["pv", &pv], "{.spec.volumeAttributesClassName}"),
        "gold"
    );
    wait_for("event VolumeModifySuccessful", WAIT, || {
        events(dir, "data").contains(
            "VolumeModifySuccessful: external resizer modified volume data with vac gold successfully",
        )
    });
    // A class that does not exist: Pending, and the volume keeps its class.
    name_class("platinum");
    wait_for("the change of class Pending", WAIT, || {
        get(dir, &["pvc", "data"], "{.status.modifyVolumeStatus.status}") == "Pending"
    });
    assert_eq!(
        get(
            dir,
            &["pvc", "data"],
            "{.status.currentVolumeAttributesClassName}"
        ),
        "gold"
    );
    wait_for("event VolumeModifyFailed", WAIT, || {
        events(dir, "data").contains("VolumeModifyFailed: VAC \"platinum\" does not exist.")
    });
    // Parameters the driver refuses (InvalidArgument): Infeasible, with the driver's reason.
    name_class("silly");
    wait_for("the change of class Infeasible", WAIT, || {
        get(dir, &["pvc", "data"], "{.status.modifyVolumeStatus.status}") == "Infeasible"
    });
    assert_eq!(
        get(
            dir,
            &["pvc", "data"],
            "{.status.conditions[?(@.type==\"ModifyVolumeError\")].reason}"
        ),
        "InvalidArgument"
    );
    // Back to a class it can have.
    name_class("gold");
    wait_for("the change of class settled on gold", WAIT, || {
        get(
            dir,
            &["pvc", "data"],
            "{.status.currentVolumeAttributesClassName}|{.status.modifyVolumeStatus}",
        ) == "gold|"
    });
}
