//! The embedded stack as a newcomer uses it: `volstack up` as a process, driven by kubectl.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;

use common::up::*;

#[test]
fn fifty_claims_bind_delete_and_the_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let stack = up(dir.path());
    // The state directory holds the kubeconfig (with the token) and the driver's socket.
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&dir.path().join("state")), 0o700);
    assert_eq!(mode(&dir.path().join("state/kubeconfig")), 0o600);
    kubectl(
        dir.path(),
        &["apply", "-f", "-"],
        Some(&claims_yaml("c", 50)),
    );
    let took = wait_for("50 claims Bound", Duration::from_secs(60), || {
        let p = phases(dir.path(), "pvc");
        p.len() == 50 && p.iter().all(|x| x == "Bound")
    });
    println!(
        "50 claims Bound {:.2}s after kubectl apply",
        took.as_secs_f64()
    );
    assert_eq!(driver_volumes(dir.path()), 50);
    kubectl(
        dir.path(),
        &["delete", "pvc", "--all", "--wait=false"],
        None,
    );
    wait_for("every PV gone", Duration::from_secs(60), || {
        phases(dir.path(), "pv").is_empty()
    });
    assert_eq!(driver_volumes(dir.path()), 0, "every driver volume deleted");

    kubectl(
        dir.path(),
        &["apply", "-f", "-"],
        Some(&claims_yaml("kept", 5)),
    );
    wait_for("5 claims Bound", Duration::from_secs(30), || {
        let p = phases(dir.path(), "pvc");
        p.len() == 5 && p.iter().all(|x| x == "Bound")
    });
    stop(stack);
    let stack = up(dir.path());
    let p = phases(dir.path(), "pvc");
    assert_eq!(p, vec!["Bound"; 5], "claims survive the restart");
    assert_eq!(phases(dir.path(), "pv").len(), 5);
    assert_eq!(driver_volumes(dir.path()), 5);
    // And the restarted stack keeps working.
    kubectl(dir.path(), &["delete", "pvc", "kept-0"], None);
    wait_for(
        "the deleted claim's volume to go",
        Duration::from_secs(30),
        || driver_volumes(dir.path()) == 4,
    );
    stop(stack);
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    path.display().to_string()
}

fn csi(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("csi")
        .arg(format!(
            "--endpoint=unix://{}",
            dir.join("state/csi.sock").display()
        ))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "volstack csi {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bound_handle(dir: &Path, claim: &str) -> String {
    wait_for_in(
        dir,
        &format!("{claim} Bound"),
        Duration::from_secs(60),
        || {
            kubectl(
                dir,
                &["get", "pvc", claim, "-o", "jsonpath={.status.phase}"],
                None,
            ) == "Bound"
        },
    );
    let pv = kubectl(
        dir,
        &["get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}"],
        None,
    );
    kubectl(
        dir,
        &["get", "pv", &pv, "-o", "jsonpath={.spec.csi.volumeHandle}"],
        None,
    )
}

#[test]
fn a_file_written_through_the_node_comes_back_from_a_restore_and_a_clone() {
    let dir = tempfile::tempdir().unwrap();
    let stack = up(dir.path());
    let d = dir.path();
    kubectl(d, &["apply", "-f", &example("claim.yaml")], None);
    let source = bound_handle(d, "my-claim");
    // Written through NodeStage + NodePublish, as a pod would write it.
    let mount = d.join("pods/writer/volume");
    csi(
        d,
        &["mount", &source, "--target", &mount.display().to_string()],
    );
    std::fs::write(mount.join("hello.txt"), "written by a pod").unwrap();

    kubectl(d, &["apply", "-f", &example("snapshot.yaml")], None);
    wait_for("the snapshot ready", Duration::from_secs(60), || {
        kubectl(
            d,
            &[
                "get",
                "volumesnapshot",
                "my-snapshot",
                "-o",
                "jsonpath={.status.readyToUse}",
            ],
            None,
        ) == "true"
    });
    // kubectl shows the definition's printer columns, as on a real cluster.
    let listed = kubectl(d, &["get", "volumesnapshots"], None);
    let header = listed.lines().next().unwrap_or_default();
    assert!(
        header.contains("READYTOUSE")
            && header.contains("SOURCEPVC")
            && header.contains("RESTORESIZE"),
        "{listed}"
    );
    let row = listed
        .lines()
        .find(|l| l.starts_with("my-snapshot"))
        .unwrap_or_default();
    assert!(
        row.contains("true") && row.contains("my-claim") && row.contains("1Gi"),
        "{listed}"
    );
    kubectl(d, &["apply", "-f", &example("restore.yaml")], None);
    kubectl(d, &["apply", "-f", &example("clone.yaml")], None);
    for claim in ["my-restore", "my-clone"] {
        let handle = bound_handle(d, claim);
        let target = d.join(format!("pods/{claim}/volume"));
        csi(
            d,
            &["mount", &handle, "--target", &target.display().to_string()],
        );
        assert_eq!(
            std::fs::read_to_string(target.join("hello.txt")).unwrap(),
            "written by a pod",
            "{claim}"
        );
    }
    // The driver's part of expansion, online: the controller, then the node.
    let grown = csi(d, &["expand", &source, "--size=3Gi"]);
    assert_eq!(grown["node_expansion_required"], true);
    csi(
        d,
        &[
            "node-expand",
            &source,
            "--path",
            &mount.display().to_string(),
        ],
    );
    let stats = csi(
        d,
        &["stats", &source, "--path", &mount.display().to_string()],
    );
    assert_eq!(stats["usage"][0]["total"], 3i64 << 30);
    assert_eq!(stats["condition"]["abnormal"], false);

    csi(
        d,
        &["unmount", &source, "--target", &mount.display().to_string()],
    );
    kubectl(d, &["delete", "volumesnapshot", "my-snapshot"], None);
    wait_for(
        "the driver's snapshot deleted",
        Duration::from_secs(60),
        || {
            csi(d, &["snapshot", "list"])["entries"]
                .as_array()
                .unwrap()
                .is_empty()
        },
    );
    stop(stack);
    // The restore and the clone stay mounted through the test (as root, bind mounts).
    unmount_under(d);
}

fn pod_yaml(name: &str, size: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n  storageClassName: hostpath-late\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: {size}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: app, image: busybox}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {name}}}}}]\n"
    )
}

fn node_of(dir: &Path, pod: &str) -> String {
    kubectl(
        dir,
        &["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"],
        None,
    )
}

#[test]
fn pods_land_on_the_first_node_with_room_and_one_too_large_for_all_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _up = up_with(d, &["--nodes=3", "--capacity=10Gi"]);
    let nodes = kubectl(d, &["get", "csinodes", "-o", "name"], None);
    assert_eq!(nodes.lines().count(), 3, "{nodes}");
    // The example's class first: a Pod is placed as soon as some node's capacity is known, so
    // the test waits until every node's is.
    let example_text = std::fs::read_to_string(example("late-binding.yaml")).unwrap();
    let class = example_text.split("\n---\n").next().unwrap();
    kubectl(d, &["apply", "-f", "-"], Some(class));
    wait_for("capacity of every node", Duration::from_secs(60), || {
        kubectl(
            d,
            &["get", "csistoragecapacities", "-A", "-o", "name"],
            None,
        )
        .lines()
        .count()
            == 3
    });
    // The example: a 4Gi claim on node-1 (6Gi left there).
    kubectl(d, &["apply", "-f", &example("late-binding.yaml")], None);
    let placed = |pod: &str, node: &str| {
        wait_for(&format!("{pod} on {node}"), Duration::from_secs(60), || {
            node_of(d, pod) == node
        });
    };
    placed("late-app", "node-1");
    // 7Gi: more than node-1 has left: node-2 (3Gi left there).
    kubectl(d, &["apply", "-f", "-"], Some(&pod_yaml("seven", "7Gi")));
    placed("seven", "node-2");
    // 8Gi: larger than node-1's and node-2's free capacity: the third node.
    kubectl(d, &["apply", "-f", "-"], Some(&pod_yaml("eight", "8Gi")));
    placed("eight", "node-3");
    // Its node's agent publishes the volume there (through node-3's socket) and the Pod runs.
    kubectl(
        d,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/eight",
            "--timeout=60s",
        ],
        None,
    );
    let uid = kubectl(
        d,
        &["get", "pod", "eight", "-o", "jsonpath={.metadata.uid}"],
        None,
    );
    let pods_dir = d.join("state/kubelet/node-3/pods").join(uid);
    assert!(
        pods_dir.join("volumes/kubernetes.io~csi").is_dir(),
        "published on node-3"
    );
    let bound = kubectl(
        d,
        &["get", "pvc", "eight", "-o", "jsonpath={.status.phase}"],
        None,
    );
    assert_eq!(bound, "Bound");
    // 11Gi fits nowhere: FailedScheduling, naming why; the Pod stays unassigned.
    kubectl(d, &["apply", "-f", "-"], Some(&pod_yaml("huge", "11Gi")));
    let mut events = String::new();
    wait_for("FailedScheduling", Duration::from_secs(60), || {
        events = kubectl(
            d,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=huge,reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        !events.is_empty()
    });
    assert_eq!(
        events,
        "0/3 nodes are available: 3 node(s) did not have enough free storage."
    );
    assert_eq!(node_of(d, "huge"), "");
    // The published capacity follows the volumes, per node.
    let published = || {
        let text = kubectl(
            d,
            &[
                "get",
                "csistoragecapacities",
                "-n",
                "kube-system",
                "-o",
                "jsonpath={range .items[*]}{.nodeTopology.matchLabels.topology\\.hostpath\\.csi\\.volstack\\.dev/node}={.capacity} {end}",
            ],
            None,
        );
        let mut items: Vec<String> = text.split_whitespace().map(String::from).collect();
        items.sort();
        items
    };
    let want = ["node-1=6Gi", "node-2=3Gi", "node-3=2Gi"];
    wait_for("capacity per node", Duration::from_secs(60), || {
        published() == want
    });
    // Deleting the Pods takes their volumes off every node.
    kubectl(d, &["delete", "pod", "--all", "--timeout=60s"], None);
    assert!(!pods_dir.exists(), "unpublished from node-3");
}

#[test]
fn a_warm_pool_from_the_example_serves_claims_and_scales_with_kubectl() {
    let dir = tempfile::tempdir().unwrap();
    let stack = up(dir.path());
    let d = dir.path();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    kubectl(
        d,
        &[
            "apply",
            "-f",
            &example.join("pool.yaml").display().to_string(),
        ],
        None,
    );
    let available = || {
        kubectl(
            d,
            &[
                "get",
                "pv",
                "-l",
                "pool=warm",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
            None,
        )
        .split_whitespace()
        .filter(|p| *p == "Available")
        .count()
    };
    wait_for_in(
        d,
        "3 Available pool volumes",
        Duration::from_secs(30),
        || available() == 3,
    );
    wait_for_in(d, "the set Ready", Duration::from_secs(15), || {
        kubectl(
            d,
            &[
                "get",
                "pvset",
                "warm",
                "-o",
                "jsonpath={.status.conditions[0].status}",
            ],
            None,
        ) == "True"
    });
    let table = kubectl(d, &["get", "pvset"], None);
    assert!(
        table.contains("MIN") && table.contains("AVAILABLE") && table.contains("hostpath"),
        "{table}"
    );
    kubectl(
        d,
        &[
            "apply",
            "-f",
            &example.join("claim.yaml").display().to_string(),
        ],
        None,
    );
    wait_for_in(d, "my-claim Bound", Duration::from_secs(30), || {
        phases(d, "pvc") == vec!["Bound"]
    });
    let volume = kubectl(
        d,
        &[
            "get",
            "pvc",
            "my-claim",
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
        None,
    );
    assert!(
        volume.starts_with("warm-"),
        "bound to {volume}, not a pool volume"
    );
    wait_for_in(d, "the pool refilled", Duration::from_secs(30), || {
        available() == 3
    });
    // The maximum through the scale subresource: 4 = 1 Bound + 3 Available, nothing to delete.
    kubectl(d, &["scale", "pvset", "warm", "--replicas=4"], None);
    assert_eq!(
        kubectl(
            d,
            &[
                "get",
                "pvset",
                "warm",
                "-o",
                "jsonpath={.spec.maximumReplicas}"
            ],
            None
        ),
        "4"
    );
    // Below the minimum: refused with the reason in the condition, nothing deleted.
    kubectl(d, &["scale", "pvset", "warm", "--replicas=2"], None);
    wait_for_in(
        d,
        "the set says why it cannot be served",
        Duration::from_secs(15),
        || {
            kubectl(
                d,
                &[
                    "get",
                    "pvset",
                    "warm",
                    "-o",
                    "jsonpath={.status.conditions[0].reason}",
                ],
                None,
            ) == "InvalidSpec"
        },
    );
    assert_eq!(available(), 3);
    kubectl(d, &["delete", "pvc", "my-claim"], None);
    kubectl(d, &["delete", "pvset", "warm"], None);
    wait_for_in(d, "every volume gone", Duration::from_secs(30), || {
        phases(d, "pv").is_empty() && driver_volumes(d) == 0
    });
    stop(stack);
}
