//! Table responses for `kubectl get`: the columns kube-apiserver shows for the resources we
//! serve.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::objects;
use crate::registry::{PrinterColumn, ResourceType};

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

/// One column: its name and how a cell is read from an object.
type Column = (&'static str, fn(&Value) -> String);

fn name(o: &Value) -> String {
    s(&o["metadata"]["name"])
}

fn phase(o: &Value) -> String {
    s(&o["status"]["phase"])
}

/// The columns kube-apiserver shows for a resource (priority 0), each with its cell.
fn columns(group: &str, plural: &str) -> Vec<Column> {
    match (group, plural) {
        ("", "persistentvolumeclaims") => vec![
            ("Name", name),
            ("Status", phase),
            ("Volume", |o| s(&o["spec"]["volumeName"])),
            ("Capacity", |o| s(&o["status"]["capacity"]["storage"])),
            ("Access Modes", |o| modes(&o["status"]["accessModes"])),
            ("StorageClass", |o| s(&o["spec"]["storageClassName"])),
            ("Age", age),
        ],
        ("", "persistentvolumes") => vec![
            ("Name", name),
            ("Capacity", |o| s(&o["spec"]["capacity"]["storage"])),
            ("Access Modes", |o| modes(&o["spec"]["accessModes"])),
            ("Reclaim Policy", |o| {
                s(&o["spec"]["persistentVolumeReclaimPolicy"])
            }),
            ("Status", phase),
            ("Claim", |o| {
                let claim = &o["spec"]["claimRef"];
                if claim.is_null() {
                    String::new()
                } else {
                    format!("{}/{}", s(&claim["namespace"]), s(&claim["name"]))
                }
            }),
            ("StorageClass", |o| s(&o["spec"]["storageClassName"])),
            ("Age", age),
        ],
        ("storage.k8s.io", "storageclasses") => vec![
            ("Name", name),
            ("Provisioner", |o| s(&o["provisioner"])),
            ("ReclaimPolicy", |o| s(&o["reclaimPolicy"])),
            ("VolumeBindingMode", |o| s(&o["volumeBindingMode"])),
            ("Age", age),
        ],
        // kube-apiserver's event columns of priority 0, as `kubectl get events` shows them.
        ("", "events") => vec![
            ("Last Seen", |o| {
                let last = [
                    &o["lastTimestamp"],
                    &o["eventTime"],
                    &o["metadata"]["creationTimestamp"],
                ]
                .into_iter()
                .find(|t| t.is_string())
                .unwrap_or(&Value::Null);
                since(last)
            }),
            ("Type", |o| s(&o["type"])),
            ("Reason", |o| s(&o["reason"])),
            ("Object", |o| {
                let object = &o["involvedObject"];
                format!(
                    "{}/{}",
                    s(&object["kind"]).to_lowercase(),
                    s(&object["name"])
                )
            }),
            ("Message", |o| s(&o["message"])),
        ],
        ("storage.k8s.io", "volumeattachments") => vec![
            ("Name", name),
            ("Attacher", |o| s(&o["spec"]["attacher"])),
            ("PV", |o| s(&o["spec"]["source"]["persistentVolumeName"])),
            ("Node", |o| s(&o["spec"]["nodeName"])),
            ("Attached", |o| flag(&o["status"]["attached"])),
            ("Age", age),
        ],
        ("storage.k8s.io", "csidrivers") => vec![
            ("Name", name),
            ("AttachRequired", |o| flag(&o["spec"]["attachRequired"])),
            ("PodInfoOnMount", |o| flag(&o["spec"]["podInfoOnMount"])),
            ("StorageCapacity", |o| flag(&o["spec"]["storageCapacity"])),
            ("TokenRequests", |o| {
                joined(&o["spec"]["tokenRequests"], |t| s(&t["audience"]))
                    .unwrap_or_else(|| "<unset>".into())
            }),
            ("RequiresRepublish", |o| {
                flag(&o["spec"]["requiresRepublish"])
            }),
            ("Modes", |o| {
                joined(&o["spec"]["volumeLifecycleModes"], s).unwrap_or_else(|| "<none>".into())
            }),
            ("Age", age),
        ],
        ("storage.k8s.io", "csinodes") => vec![
            ("Name", name),
            ("Drivers", |o| {
                o["spec"]["drivers"]
                    .as_array()
                    .map_or(0, Vec::len)
                    .to_string()
            }),
            ("Age", age),
        ],
        ("storage.k8s.io", "csistoragecapacities") => vec![
            ("Name", name),
            ("StorageClassName", |o| s(&o["storageClassName"])),
            ("Capacity", |o| {
                o["capacity"].as_str().unwrap_or("<unset>").to_string()
            }),
        ],
        ("storage.k8s.io", "volumeattributesclasses") => vec![
            ("Name", name),
            ("DriverName", |o| s(&o["driverName"])),
            ("Age", age),
        ],
        ("coordination.k8s.io", "leases") => vec![
            ("Name", name),
            ("Holder", |o| s(&o["spec"]["holderIdentity"])),
            ("Age", age),
        ],
        ("", "namespaces") => vec![("Name", name), ("Status", phase), ("Age", age)],
        // Ready counts the container statuses that say so (the node agent reports them once the
        // Pod's volumes are ready). The node is shown without `-o wide` (kube-apiserver gives it
        // priority 1): where a Pod went is what matters here.
        ("", "pods") => vec![
            ("Name", name),
            ("Ready", |o| {
                let containers = o["spec"]["containers"].as_array().map_or(0, Vec::len);
                let ready = o["status"]["containerStatuses"]
                    .as_array()
                    .map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
                format!("{ready}/{containers}")
            }),
            ("Status", |o| {
                o["status"]["phase"]
                    .as_str()
                    .unwrap_or("Pending")
                    .to_string()
            }),
            ("Restarts", |_| "0".to_string()),
            ("Age", age),
            ("Node", |o| {
                o["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or("<none>")
                    .to_string()
            }),
        ],
        _ => vec![("Name", name), ("Age", age)],
    }
}

/// A printer column's cell: the value at its JSONPath (`.a.b.c`; keys only), dates as ages.
fn printer_cell(object: &Value, column: &PrinterColumn) -> String {
    let mut value = object;
    for key in column.json_path.split('.').filter(|k| !k.is_empty()) {
        value = &value[key];
    }
    match value {
        Value::Null => String::new(),
        Value::String(_) if column.kind == "date" => since(value),
        Value::String(text) => text.clone(),
        Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => value.to_string(),
    }
}

/// A Table answer: column (name, type) headers and each item's cells.
fn render(
    headers: &[(&str, &str)],
    items: &[Arc<Value>],
    cells: impl Fn(&Value) -> Vec<String>,
    rv: u64,
) -> Value {
    let column_definitions: Vec<Value> = headers
        .iter()
        .map(|(name, kind)| json!({"name": name, "type": kind, "format": if *name == "Name" { "name" } else { "" }, "description": "", "priority": 0}))
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()}, "columnDefinitions": column_definitions, "rows": rows})
}

/// The table of `items`: a custom resource's name and the columns its definition declares,
/// or kube-apiserver's columns for a built-in kind.
pub(crate) fn table(rt: &ResourceType, items: &[Arc<Value>], rv: u64) -> Value {
    if !rt.printer_columns.is_empty() {
        let headers: Vec<(&str, &str)> = std::iter::once(("Name", "string"))
            .chain(
                rt.printer_columns
                    .iter()
                    .map(|c| (c.name.as_str(), c.kind.as_str())),
            )
            .collect();
        let cells = |o: &Value| {
            std::iter::once(name(o))
                .chain(rt.printer_columns.iter().map(|c| printer_cell(o, c)))
                .collect()
        };
        return render(&headers, items, cells, rv);
    }
    let columns = columns(&rt.group, &rt.plural);
    let headers: Vec<(&str, &str)> = columns.iter().map(|(c, _)| (*c, "string")).collect();
    render(
        &headers,
        items,
        |o| columns.iter().map(|(_, cell)| cell(o)).collect(),
        rv,
    )
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
        // A Pod shows where it went (or <none> while it waits for a node).
        let (columns, cells) = render(
            "",
            "pods",
            json!({"metadata": {"name": "web"}, "spec": {"nodeName": "node-3", "containers": [{"name": "a"}]}}),
        );
        assert_eq!(
            columns,
            ["Name", "Ready", "Status", "Restarts", "Age", "Node"]
        );
        assert_eq!(
            [&cells[..4], &cells[5..]].concat(),
            ["web", "0/1", "Pending", "0", "node-3"]
        );
        let (_, cells) = render("", "pods", json!({"metadata": {"name": "w"}, "spec": {}}));
        assert_eq!(cells[5], "<none>");
        let (columns, cells) = render("", "configmaps", json!({"metadata": {"name": "c"}}));
        assert_eq!(
            (columns, cells[0].as_str()),
            (vec!["Name".to_string(), "Age".to_string()], "c")
        );
    }

    #[test]
    fn custom_resources_show_their_declared_columns() {
        let column = |name: &str, kind: &str, path: &str| PrinterColumn {
            name: name.into(),
            kind: kind.into(),
            json_path: path.into(),
        };
        let rt = ResourceType {
            group: "snapshot.storage.k8s.io".into(),
            version: "v1".into(),
            plural: "volumesnapshots".into(),
            singular: "volumesnapshot".into(),
            kind: "VolumeSnapshot".into(),
            namespaced: true,
            status: true,
            short_names: Vec::new(),
            schema: None,
            scale: None,
            printer_columns: vec![
                column("ReadyToUse", "boolean", ".status.readyToUse"),
                column(
                    "SourcePVC",
                    "string",
                    ".spec.source.persistentVolumeClaimName",
                ),
                column("RestoreSize", "integer", ".status.size"),
                column("SnapshotClass", "string", ".spec.volumeSnapshotClassName"),
                column("Age", "date", ".metadata.creationTimestamp"),
            ],
        };
        let created = objects::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                - 300,
        );
        let object = json!({
            "metadata": {"name": "snap", "creationTimestamp": created},
            "spec": {"source": {"persistentVolumeClaimName": "data"}},
            "status": {"readyToUse": true, "size": 1073741824},
        });
        let t = table(&rt, &[Arc::new(object)], 3);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![
                "Name",
                "ReadyToUse",
                "SourcePVC",
                "RestoreSize",
                "SnapshotClass",
                "Age"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["snap", "true", "data", "1073741824", "", "5m"])
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
