//! Our RBAC grants nothing the Go sidecars' RBAC does not, but what our own features need:
//! every (API group, resource, verb) of `deploy/kubernetes/rbac.yaml` and
//! `attacher-rbac.yaml`, optional rules included, is granted by upstream's manifests (written
//! from `../shared/COMPATIBILITY.md` into `tests/real_cluster/fixtures`, optional rules
//! included), or is on the short list of extras below.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use cli::manifests::{ATTACHER_RBAC, PROVISIONER_RBAC, parse, with_optional_rules};
use serde_json::Value;

type Grant = (String, String, String, String);

/// (role kind, API group, resource, verb) of every rule of the Roles and ClusterRoles.
fn grants(text: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for object in parse(&with_optional_rules(text)).unwrap() {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        for rule in object["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            };
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        out.insert((kind.clone(), group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    out
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/real_cluster/fixtures")
            .join(name),
    )
    .unwrap()
}

fn beyond(ours: &str, upstream: &str) -> Vec<Grant> {
    let upstream = grants(upstream);
    grants(ours)
        .into_iter()
        .filter(|g| !upstream.contains(g))
        .collect()
}

fn grant(kind: &str, group: &str, resource: &str, verb: &str) -> Grant {
    (kind.into(), group.into(), resource.into(), verb.into())
}

#[test]
fn the_provisioners_rules_are_upstreams_but_for_volume_attributes_classes() {
    let extra = beyond(PROVISIONER_RBAC, &fixture("upstream-provisioner-rbac.yaml"));
    // Upstream's code reads a claim's VolumeAttributesClass too; its manifest lacks the rule.
    assert_eq!(
        extra,
        [grant(
            "ClusterRole",
            "storage.k8s.io",
            "volumeattributesclasses",
            "get"
        )]
    );
}

#[test]
fn the_attachers_rules_are_upstreams_but_for_events_and_nodes() {
    let extra = beyond(ATTACHER_RBAC, &fixture("upstream-attacher-rbac.yaml"));
    // A Warning on a VolumeAttachment whose attach or detach fails (upstream only logs) and
    // its count when it fails again, and, optional, the node id in a Node's annotation when
    // its CSINode lacks the driver.
    assert_eq!(
        extra,
        [
            grant("ClusterRole", "", "events", "create"),
            grant("ClusterRole", "", "events", "patch"),
            grant("ClusterRole", "", "nodes", "get"),
        ]
    );
}

#[test]
fn the_grants_are_read_whole() {
    // The check above compares something: upstream's manifests grant what they should.
    let upstream = grants(&fixture("upstream-provisioner-rbac.yaml"));
    for g in [
        grant("ClusterRole", "", "persistentvolumeclaims", "update"),
        grant("ClusterRole", "", "secrets", "get"),
        grant("Role", "storage.k8s.io", "csistoragecapacities", "update"),
        grant("Role", "apps", "replicasets", "get"),
    ] {
        assert!(upstream.contains(&g), "{g:?}");
    }
    assert!(!upstream.contains(&grant("ClusterRole", "", "persistentvolumeclaims", "patch")));
}
