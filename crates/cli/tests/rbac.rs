//! `volstack up` runs every component under its own identity with the RBAC of
//! `deploy/kubernetes`: a rule taken away is a 403 for the component that needs it (and its
//! work waits), and given back, the work is done.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::up::{kubectl, up_with, wait_for_in};

/// `apiserver_request_total` for a client, verb, resource and code, from the server's metrics.
fn requests(dir: &std::path::Path, client: &str, verb: &str, resource: &str, code: u16) -> u64 {
    let metrics = kubectl(dir, &["get", "--raw", "/metrics"], None);
    let wanted = format!(
        "apiserver_request_total{{client=\"{client}\",code=\"{code}\",resource=\"{resource}\",verb=\"{verb}\"}} "
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_rule_taken_away_is_a_403_for_the_component_and_given_back_its_work_is_done() {
    let dir = tempfile::tempdir().unwrap();
    // Retries stay quick, so the claim is seen Bound soon after the rule is back.
    let _up = up_with(dir.path(), &["--provisioner-arg=--retry-interval-max=2s"]);
    let wait = Duration::from_secs(60);
    // The provisioner runs as its ServiceAccount.
    let who = kubectl(
        dir.path(),
        &[
            "auth",
            "can-i",
            "create",
            "persistentvolumes",
            "--as=system:serviceaccount:kube-system:csi-provisioner",
        ],
        None,
    );
    assert_eq!(who.trim(), "yes");
    let role = kubectl(
        dir.path(),
        &[
            "get",
            "clusterrole",
            "external-provisioner-runner",
            "-o",
            "json",
        ],
        None,
    );
    let mut role: serde_json::Value = serde_json::from_str(&role).unwrap();
    let original = role.clone();
    for rule in role["rules"].as_array_mut().unwrap() {
        if rule["resources"] == serde_json::json!(["persistentvolumes"]) {
            rule["verbs"]
                .as_array_mut()
                .unwrap()
                .retain(|v| v != "create");
        }
    }
    kubectl(dir.path(), &["replace", "-f", "-"], Some(&role.to_string()));

    let claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n";
    kubectl(dir.path(), &["apply", "-f", "-"], Some(claim));
    wait_for_in(
        dir.path(),
        "the provisioner's PV create refused",
        wait,
        || {
            requests(
                dir.path(),
                "csi-provisioner",
                "CREATE",
                "persistentvolumes",
                403,
            ) > 0
        },
    );

    let mut restored = original;
    if let Some(meta) = restored["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    kubectl(
        dir.path(),
        &["replace", "-f", "-"],
        Some(&restored.to_string()),
    );
    wait_for_in(
        dir.path(),
        "the claim Bound once the rule is back",
        wait,
        || {
            kubectl(
                dir.path(),
                &["get", "pvc", "data", "-o", "jsonpath={.status.phase}"],
                None,
            ) == "Bound"
        },
    );
    // Nothing but that one rule was missing: no other request of any component was refused.
    let metrics = kubectl(dir.path(), &["get", "--raw", "/metrics"], None);
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.contains("code=\"403\"")
                && !l.contains("resource=\"persistentvolumes\",verb=\"CREATE\"")
        })
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}
