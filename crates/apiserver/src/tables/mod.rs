//! Table responses for `kubectl get`: the columns kube-apiserver shows for the resources we
//! serve.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::objects;
use crate::registry::{PrinterColumn, ResourceType};

/// Time since an RFC 3339 timestamp, as kubectl shows ages (`45s`, `12m`, `3h`, `2d`).
pub(crate) fn since(timestamp: &Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let created = timestamp
        .as_str()
        .and_then(objects::parse_rfc3339)
        .unwrap_or(now);
    human_duration(now.saturating_sub(created))
}

/// A duration in seconds as kubectl prints ages (apimachinery's `HumanDuration`): one unit
/// for long spans and round values, two (`2m16s`, `3h5m`, `2d4h`, `2y30d`) where the second
/// still says something.
fn human_duration(s: u64) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    const YEAR: u64 = 365 * DAY;
    // (below this, the larger unit and the smaller one it shows with the remainder, or none)
    let two_units = |big: u64, big_name: &str, small: u64, small_name: &str| {
        let rest = (s % big) / small;
        if rest == 0 {
            format!("{}{big_name}", s / big)
        } else {
            format!("{}{big_name}{rest}{small_name}", s / big)
        }
    };
    match s {
        0..120 => format!("{s}s"),
        120..600 => two_units(MINUTE, "m", 1, "s"),
        600..10_800 => format!("{}m", s / MINUTE),
        10_800..28_800 => two_units(HOUR, "h", MINUTE, "m"),
        28_800..172_800 => format!("{}h", s / HOUR),
        172_800..691_200 => two_units(DAY, "d", HOUR, "h"),
        691_200..63_072_000 => format!("{}d", s / DAY),
        63_072_000..252_288_000 => two_units(YEAR, "y", DAY, "d"),
        _ => format!("{}y", s / YEAR),
    }
}

mod columns;
mod nodes_and_pods;

use columns::{Column, columns};

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

/// A Table answer: column (name, type, priority) headers and each item's cells.
fn render(
    headers: &[(&str, &str, u8)],
    items: &[Arc<Value>],
    cells: impl Fn(&Value) -> Vec<Value>,
    rv: u64,
) -> Value {
    let column_definitions: Vec<Value> = headers
        .iter()
        .map(|(name, kind, priority)| json!({"name": name, "type": kind, "format": if *name == "Name" { "name" } else { "" }, "description": "", "priority": priority}))
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
        let headers: Vec<(&str, &str, u8)> = std::iter::once(("Name", "string", 0))
            .chain(
                rt.printer_columns
                    .iter()
                    .map(|c| (c.name.as_str(), c.kind.as_str(), 0)),
            )
            .collect();
        let cells = |o: &Value| {
            std::iter::once(columns::name(o))
                .chain(rt.printer_columns.iter().map(|c| printer_cell(o, c)))
                .map(Value::String)
                .collect()
        };
        return render(&headers, items, cells, rv);
    }
    let columns: Vec<Column> = columns(&rt.group, &rt.plural);
    let headers: Vec<(&str, &str, u8)> = columns
        .iter()
        .map(|c| (c.name, c.kind, c.priority))
        .collect();
    render(
        &headers,
        items,
        |o| columns.iter().map(|c| (c.cell)(o)).collect(),
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
            .map(|c| match c {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
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
                "VolumeAttributesClass",
                "Age",
                "VolumeMode"
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
        // A Pod's node is a wide column (or <none> while it waits for one).
        let (columns, cells) = render(
            "",
            "pods",
            json!({"metadata": {"name": "web"}, "spec": {"nodeName": "node-3", "containers": [{"name": "a"}]}}),
        );
        assert_eq!(
            columns,
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        assert_eq!(
            [&cells[..4], &cells[5..]].concat(),
            [
                "web", "0/1", "Pending", "0", "<none>", "node-3", "<none>", "<none>"
            ]
        );
        let (_, cells) = render("", "pods", json!({"metadata": {"name": "w"}, "spec": {}}));
        assert_eq!(cells[6], "<none>");
        let (columns, cells) = render(
            "",
            "configmaps",
            json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
        );
        assert_eq!(columns, ["Name", "Data", "Age"]);
        assert_eq!(&cells[..2], ["c", "1"]);
        // A kind without a printer of its own: the name and when it was made.
        let (columns, cells) = render(
            "rbac.authorization.k8s.io",
            "clusterroles",
            json!({"metadata": {"name": "r", "creationTimestamp": "2026-11-20T10:00:00Z"}}),
        );
        assert_eq!(columns, ["Name", "Created At"]);
        assert_eq!(cells, ["r", "2026-11-20T10:00:00Z"]);
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
            custom: true,
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

    #[test]
    fn durations_read_as_apimachinery_prints_them() {
        let rows = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (136, "2m16s"),
            (599, "9m59s"),
            (600, "10m"),
            (10_799, "179m"),
            (10_800, "3h"),
            (11_100, "3h5m"),
            (28_799, "7h59m"),
            (28_800, "8h"),
            (172_799, "47h"),
            (172_800, "2d"),
            (187_200, "2d4h"),
            (691_199, "7d23h"),
            (691_200, "8d"),
            (63_071_999, "729d"),
            (63_072_000, "2y"),
            (65_664_000, "2y30d"),
            (252_288_000, "8y"),
        ];
        for (seconds, want) in rows {
            assert_eq!(human_duration(seconds), want, "{seconds} s");
        }
    }
}
