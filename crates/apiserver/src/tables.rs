//! Table responses for `kubectl get`: the columns kube-apiserver shows for the resources we
//! serve.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::objects;
use crate::registry::ResourceType;

fn age(obj: &Value) -> String {
    since(&obj["metadata"]["creationTimestamp"])
}

/// Time since an RFC 3339 timestamp, as kubectl shows ages (`45s`, `12m`, `3h`, `2d`).
fn since(timestamp: &Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let created = timestamp
        .as_str()
        .and_then(objects::parse_rfc3339)
        .unwrap_or(now);
    let s = now.saturating_sub(created);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn modes(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    other => other,
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// A boolean cell as Go prints it (`true`/`false`; unset is false).
fn flag(v: &Value) -> String {
    v.as_bool().unwrap_or(false).to_string()
}

/// The items of a list joined by commas, or None for an empty or missing list.
fn joined(v: &Value, each: impl Fn(&Value) -> String) -> Option<String> {
    let items: Vec<String> = v.as_array()?.iter().map(each).collect();
    (!items.is_empty()).then(|| items.join(","))
}

/// Renders one table row's cells.
type CellFn = Box<dyn Fn(&Value) -> Vec<String>>;

pub(crate) fn table(rt: &ResourceType, items: &[Arc<Value>], rv: u64) -> Value {
    let (columns, cells): (Vec<&str>, CellFn) = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumeclaims") => (
            vec![
                "Name",
                "Status",
                "Volume",
                "Capacity",
                "Access Modes",
                "StorageClass",
                "Age",
            ],
            Box::new(|o: &Value| {
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["status"]["phase"]),
                    s(&o["spec"]["volumeName"]),
                    s(&o["status"]["capacity"]["storage"]),
                    modes(&o["status"]["accessModes"]),
                    s(&o["spec"]["storageClassName"]),
                    age(o),
                ]
            }),
        ),
        ("", "persistentvolumes") => (
            vec![
                "Name",
                "Capacity",
                "Access Modes",
                "Reclaim Policy",
                "Status",
                "Claim",
                "StorageClass",
                "Age",
            ],
            Box::new(|o: &Value| {
                let claim = if o["spec"]["claimRef"].is_null() {
                    String::new()
                } else {
                    format!(
                        "{}/{}",
                        s(&o["spec"]["claimRef"]["namespace"]),
                        s(&o["spec"]["claimRef"]["name"])
                    )
                };
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["spec"]["capacity"]["storage"]),
                    modes(&o["spec"]["accessModes"]),
                    s(&o["spec"]["persistentVolumeReclaimPolicy"]),
                    s(&o["status"]["phase"]),
                    claim,
                    s(&o["spec"]["storageClassName"]),
                    age(o),
                ]
            }),
        ),
        ("storage.k8s.io", "storageclasses") => (
            vec![
                "Name",
                "Provisioner",
                "ReclaimPolicy",
                "VolumeBindingMode",
                "Age",
            ],
            Box::new(|o: &Value| {
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["provisioner"]),
                    s(&o["reclaimPolicy"]),
                    s(&o["volumeBindingMode"]),
                    age(o),
                ]
            }),
        ),
        // kube-apiserver's event columns of priority 0, as `kubectl get events` shows them.
        ("", "events") => (
            vec!["Last Seen", "Type", "Reason", "Object", "Message"],
            Box::new(|o: &Value| {
                let last = [
                    &o["lastTimestamp"],
                    &o["eventTime"],
                    &o["metadata"]["creationTimestamp"],
                ]
                .into_iter()
                .find(|t| t.is_string())
                .unwrap_or(&Value::Null);
                let object = &o["involvedObject"];
                vec![
                    since(last),
                    s(&o["type"]),
                    s(&o["reason"]),
                    format!(
                        "{}/{}",
                        s(&object["kind"]).to_lowercase(),
                        s(&object["name"])
                    ),
                    s(&o["message"]),
                ]
            }),
        ),
        ("storage.k8s.io", "volumeattachments") => (
            vec!["Name", "Attacher", "PV", "Node", "Attached", "Age"],
            Box::new(|o: &Value| {
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["spec"]["attacher"]),
                    s(&o["spec"]["source"]["persistentVolumeName"]),
                    s(&o["spec"]["nodeName"]),
                    flag(&o["status"]["attached"]),
                    age(o),
                ]
            }),
        ),
        ("storage.k8s.io", "csidrivers") => (
            vec![
                "Name",
                "AttachRequired",
                "PodInfoOnMount",
                "StorageCapacity",
                "TokenRequests",
                "RequiresRepublish",
                "Modes",
                "Age",
            ],
            Box::new(|o: &Value| {
                let spec = &o["spec"];
                let audiences = joined(&spec["tokenRequests"], |t| s(&t["audience"]));
                let modes = joined(&spec["volumeLifecycleModes"], s);
                vec![
                    s(&o["metadata"]["name"]),
                    flag(&spec["attachRequired"]),
                    flag(&spec["podInfoOnMount"]),
                    flag(&spec["storageCapacity"]),
                    audiences.unwrap_or_else(|| "<unset>".into()),
                    flag(&spec["requiresRepublish"]),
                    modes.unwrap_or_else(|| "<none>".into()),
                    age(o),
                ]
            }),
        ),
        ("storage.k8s.io", "csinodes") => (
            vec!["Name", "Drivers", "Age"],
            Box::new(|o: &Value| {
                let drivers = o["spec"]["drivers"].as_array().map_or(0, Vec::len);
                vec![s(&o["metadata"]["name"]), drivers.to_string(), age(o)]
            }),
        ),
        ("storage.k8s.io", "csistoragecapacities") => (
            vec!["Name", "StorageClassName", "Capacity"],
            Box::new(|o: &Value| {
                let capacity = o["capacity"].as_str().unwrap_or("<unset>").to_string();
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["storageClassName"]),
                    capacity,
                ]
            }),
        ),
        ("storage.k8s.io", "volumeattributesclasses") => (
            vec!["Name", "DriverName", "Age"],
            Box::new(|o: &Value| vec![s(&o["metadata"]["name"]), s(&o["driverName"]), age(o)]),
        ),
        ("coordination.k8s.io", "leases") => (
            vec!["Name", "Holder", "Age"],
            Box::new(|o: &Value| {
                vec![
                    s(&o["metadata"]["name"]),
                    s(&o["spec"]["holderIdentity"]),
                    age(o),
                ]
            }),
        ),
        ("", "namespaces") => (
            vec!["Name", "Status", "Age"],
            Box::new(|o: &Value| vec![s(&o["metadata"]["name"]), s(&o["status"]["phase"]), age(o)]),
        ),
        _ => (
            vec!["Name", "Age"],
            Box::new(|o: &Value| vec![s(&o["metadata"]["name"]), age(o)]),
        ),
    };
    let column_definitions: Vec<Value> = columns
        .iter()
        .map(|c| json!({"name": c, "type": "string", "format": if *c == "Name" { "name" } else { "" }, "description": "", "priority": 0}))
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()}, "columnDefinitions": column_definitions, "rows": rows})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn render(group: &str, plural: &str, object: Value) -> (Vec<String>, Vec<String>) {
        let rt = Registry::default().find(group, "v1", plural).unwrap();
        let t = table(&rt, &[Arc::new(object)], 7);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        let columns = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        let cells = t["rows"][0]["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        (columns, cells)
    }

    #[test]
    fn each_resource_gets_kubectls_columns() {
        let (columns, cells) = render(
            "",
            "persistentvolumeclaims",
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv1", "storageClassName": "fast"},
                   "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}}),
        );
        assert_eq!(
            columns,
            [
                "Name",
                "Status",
                "Volume",
                "Capacity",
                "Access Modes",
                "StorageClass",
                "Age"
            ]
        );
        assert_eq!(
            &cells[..6],
            ["data", "Bound", "pv1", "1Gi", "RWO,ROX", "fast"]
        );
        let (columns, _) = render(
            "storage.k8s.io",
            "storageclasses",
            json!({"metadata": {"name": "fast"}, "provisioner": "p"}),
        );
        assert_eq!(columns[0], "Name");
        assert!(columns.iter().any(|c| c == "Provisioner"), "{columns:?}");
        let (columns, cells) = render(
            "storage.k8s.io",
            "volumeattachments",
            json!({"metadata": {"name": "va"}, "spec": {"attacher": "d", "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}},
                   "status": {"attached": true}}),
        );
        assert_eq!(
            columns,
            ["Name", "Attacher", "PV", "Node", "Attached", "Age"]
        );
        assert_eq!(&cells[..5], ["va", "d", "pv1", "n1", "true"]);
        let (_, cells) = render(
            "storage.k8s.io",
            "csidrivers",
            json!({"metadata": {"name": "d"}, "spec": {"attachRequired": false, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                   "tokenRequests": [{"audience": "a"}, {"audience": "b"}]}}),
        );
        assert_eq!(
            &cells[..7],
            [
                "d",
                "false",
                "false",
                "false",
                "a,b",
                "false",
                "Persistent,Ephemeral"
            ]
        );
        let (_, cells) = render(
            "storage.k8s.io",
            "csinodes",
            json!({"metadata": {"name": "n"}, "spec": {"drivers": [{"name": "d"}]}}),
        );
        assert_eq!(&cells[..2], ["n", "1"]);
        let (columns, cells) = render("", "configmaps", json!({"metadata": {"name": "c"}}));
        assert_eq!(
            (columns, cells[0].as_str()),
            (vec!["Name".to_string(), "Age".to_string()], "c")
        );
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let ago = |secs: u64| json!(objects::rfc3339(now - secs));
        // A slow machine may take a second between the two clocks: compare prefixes of units.
        assert!(since(&ago(30)).ends_with('s'));
        assert_eq!(since(&ago(600)), "10m");
        assert_eq!(since(&ago(3 * 3600 + 5)), "3h");
        assert_eq!(since(&ago(5 * 86_400)), "5d");
    }
}
