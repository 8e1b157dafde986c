//! `volstack up --driver-endpoint` (issue 35): the stack around a CSI driver someone else runs,
//! here the reference driver started as a separate process under a name of its own. Its name,
//! capabilities and topology come from the driver: the CSIDriver says attach (it serves
//! PUBLISH_UNPUBLISH_VOLUME), the default class carries `--class-parameter`, a claim is
//! provisioned, a Pod gets it attached and published, and the volume goes with the claim.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::up::*;

const WAIT: Duration = Duration::from_secs(60);

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Driver {
    /// The reference driver as a separate process on `sock`, node `node-1`, attach on.
    fn start(dir: &std::path::Path, sock: &std::path::Path, extra: &[&str]) -> Driver {
        let log = std::fs::File::create(dir.join("driver.log")).unwrap();
        Driver(
            Command::new(BIN)
                .args([
                    "driver",
                    &format!("--endpoint=unix://{}", sock.display()),
                    &format!("--state-dir={}", dir.join("driver-state").display()),
                    "--nodeid=node-1",
                    "--enable-attach",
                ])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }
}

#[test]
fn the_stack_runs_around_a_driver_it_did_not_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sock = dir.join("byod.sock");
    let _driver = Driver::start(
        dir,
        &sock,
        &["--drivername=byod.csi.example.com", "--capacity=1Gi"],
    );
    let _up = up_with(
        dir,
        &[
            &format!("--driver-endpoint=unix://{}", sock.display()),
            "--class-parameter=kind=",
        ],
    );
    // What the driver said it is.
    assert_eq!(
        kubectl(
            dir,
            &[
                "get",
                "csidriver",
                "-o",
                "jsonpath={.items[*].metadata.name} {.items[0].spec.attachRequired} {.items[0].spec.storageCapacity}"
            ],
            None
        ),
        "byod.csi.example.com true true"
    );
    assert_eq!(
        kubectl(
            dir,
            &[
                "get",
                "storageclass",
                "hostpath",
                "-o",
                "jsonpath={.provisioner} {.parameters}"
            ],
            None
        ),
        "byod.csi.example.com {\"kind\":\"\"}"
    );
    assert_eq!(
        kubectl(
            dir,
            &[
                "get",
                "csinode",
                "node-1",
                "-o",
                "jsonpath={.spec.drivers[0].name}"
            ],
            None
        ),
        "byod.csi.example.com"
    );
    let pod = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Mi\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: app\nspec:\n  containers:\n    - name: app\n      image: busybox\n  volumes:\n    - name: data\n      persistentVolumeClaim:\n        claimName: data\n";
    kubectl(dir, &["apply", "-f", "-"], Some(pod));
    kubectl(
        dir,
        &["wait", "--for=condition=Ready", "pod/app", "--timeout=60s"],
        None,
    );
    assert_eq!(
        kubectl(
            dir,
            &[
                "get",
                "volumeattachments",
                "-o",
                "jsonpath={.items[0].spec.attacher} {.items[0].status.attached}"
            ],
            None
        ),
        "byod.csi.example.com true",
        "attached through the driver's ControllerPublishVolume"
    );
    kubectl(dir, &["delete", "pod", "app", "--timeout=60s"], None);
    kubectl(dir, &["delete", "pvc", "data", "--timeout=60s"], None);
    wait_for("the driver's volume deleted", WAIT, || {
        let out = Command::new(BIN)
            .args([
                "csi",
                &format!("--endpoint=unix://{}", sock.display()),
                "list",
            ])
            .output()
            .unwrap();
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        listed["entries"].as_array().is_some_and(|e| e.is_empty())
    });
}

#[test]
fn conformance_passes_every_capability_of_the_reference_driver_run_as_a_separate_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sock = dir.join("ref.sock");
    // With capacity, so that GET_CAPACITY is advertised and `capacity` runs.
    let _driver = Driver::start(dir, &sock, &["--capacity=1Gi"]);
    let report_dir = dir.join("report");
    // Read-only publishing is a read-only bind mount, which needs root; without root the
    // driver symlinks and the volume stays writable (the check would rightly fail).
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        eprintln!("not root: read-only is not checked");
    }
    let out = Command::new(BIN)
        .args([
            "conformance",
            &format!("--driver-endpoint=unix://{}", sock.display()),
            &format!("--report-dir={}", report_dir.display()),
            "--modify-parameter=tier=premium",
        ])
        .args((!root).then_some("--skip=read-only"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("report.json")).unwrap()).unwrap();
    let outcomes: Vec<(String, String)> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["capability"].as_str().unwrap().to_string(),
                c["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let every = [
        "provision",
        "access-modes",
        "block",
        "late-binding",
        "capacity",
        "attach",
        "publish",
        "read-only",
        "stats",
        "republish",
        "snapshot",
        "clone",
        "expansion",
        "modify",
        "idempotency",
        "restart",
        "delete",
    ];
    for capability in every.into_iter().filter(|c| root || *c != "read-only") {
        assert!(
            outcomes.contains(&(capability.to_string(), "passed".to_string())),
            "{capability}: {outcomes:?}\n{stdout}"
        );
    }
    let html = std::fs::read_to_string(report_dir.join("report.html")).unwrap();
    assert!(html.contains("hostpath.csi.volstack.dev") && html.contains("<tr class=\"pass\">"));
    // Asked for one, the others are skipped and said so.
    let out = Command::new(BIN)
        .args([
            "conformance",
            &format!("--driver-endpoint=unix://{}", sock.display()),
            &format!("--report-dir={}", report_dir.display()),
            "--only=provision,delete",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(report_dir.join("report.txt")).unwrap();
    assert!(table.contains("2 passed, 0 failed, 15 skipped"), "{table}");
    let bad = Command::new(BIN)
        .args([
            "conformance",
            &format!("--driver-endpoint=unix://{}", sock.display()),
            "--only=teleport",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown capability \"teleport\""));
}
