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
