//! The columns kube-apiserver's table printers show for each kind we serve (priority 1: only
//! with `kubectl get -o wide`), each with how its cell is read from an object. Kinds without a
//! printer of their own get kube-apiserver's default: the name and the creation time.

use serde_json::{Value, json};

use super::nodes_and_pods::{
    node_address, node_roles, node_status, pod_ready, pod_restarts, pod_status, readiness_gates,
};
use super::since;

/// One column.
pub(crate) struct Column {
    /// Its header.
    pub name: &'static str,
    /// Its OpenAPI type (`string`, `integer`, `date`).
    pub kind: &'static str,
    /// 0: always shown; 1: with `-o wide`.
    pub priority: u8,
    /// Its cell.
    pub cell: fn(&Value) -> Value,
}

const fn col(name: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        kind: "string",
        priority: 0,
        cell,
    }
}

const fn wide(name: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        kind: "string",
        priority: 1,
        cell,
    }
}

const fn int(name: &'static str, priority: u8, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        kind: "integer",
        priority,
        cell,
    }
}

pub(crate) fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn text(v: &Value) -> Value {
    Value::String(s(v))
}

/// A string, or `fallback` when missing or empty.
fn or(v: &Value, fallback: &str) -> Value {
    Value::String(
        v.as_str()
            .filter(|t| !t.is_empty())
            .unwrap_or(fallback)
            .to_string(),
    )
}

/// An integer (0 when missing).
fn count(v: &Value) -> Value {
    json!(v.as_i64().unwrap_or(0))
}

/// A boolean cell as Go prints it (`true`/`false`; unset is false).
fn flag(v: &Value) -> Value {
    Value::String(v.as_bool().unwrap_or(false).to_string())
}

/// The items of a list joined by commas, or None for an empty or missing list.
fn joined(v: &Value, each: impl Fn(&Value) -> String) -> Option<String> {
    let items: Vec<String> = v.as_array()?.iter().map(each).collect();
    (!items.is_empty()).then(|| items.join(","))
}

pub(crate) fn name(o: &Value) -> String {
    s(&o["metadata"]["name"])
}

fn name_cell(o: &Value) -> Value {
    Value::String(name(o))
}

fn phase(o: &Value) -> Value {
    text(&o["status"]["phase"])
}

fn age(o: &Value) -> Value {
    Value::String(since(&o["metadata"]["creationTimestamp"]))
}

fn modes(v: &Value) -> Value {
    let modes = v
        .as_array()
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
        .unwrap_or_default();
    Value::String(modes)
}

/// A pod template's container names and images.
fn containers(template: &Value) -> Value {
    Value::String(joined(&template["spec"]["containers"], |c| s(&c["name"])).unwrap_or_default())
}

fn images(template: &Value) -> Value {
    Value::String(joined(&template["spec"]["containers"], |c| s(&c["image"])).unwrap_or_default())
}

/// A label selector as kubectl prints one (`a=b,c in (d,e)`), `<none>` when empty.
fn selector(selector: &Value) -> Value {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
        .unwrap_or_default();
    for e in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let values = joined(&e["values"], s).unwrap_or_default();
        let key = s(&e["key"]);
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key,
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({values})"),
        });
    }
    Value::String(if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    })
}

/// A ratio `ready/wanted`.
fn ratio(ready: &Value, wanted: &Value) -> Value {
    Value::String(format!(
        "{}/{}",
        ready.as_i64().unwrap_or(0),
        wanted.as_i64().unwrap_or(0)
    ))
}

/// A binding's subjects of one kind, joined (`<ns>/<name>` for ServiceAccounts).
fn subjects(o: &Value, kind: &str) -> Value {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|sub| sub["kind"] == kind)
        .map(|sub| match kind {
            "ServiceAccount" => format!("{}/{}", s(&sub["namespace"]), s(&sub["name"])),
            _ => s(&sub["name"]),
        })
        .collect();
    Value::String(names.join(", "))
}

fn event_last_seen(o: &Value) -> Value {
    let last = [
        &o["lastTimestamp"],
        &o["eventTime"],
        &o["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .find(|t| t.is_string())
    .unwrap_or(&Value::Null);
    Value::String(since(last))
}

/// The columns kube-apiserver shows for a resource, each with its cell.
pub(crate) fn columns(group: &str, plural: &str) -> Vec<Column> {
    match (group, plural) {
        ("", "nodes") => vec![
            col("Name", name_cell),
            col("Status", node_status),
            col("Roles", node_roles),
            col("Age", age),
            col("Version", |o| {
                text(&o["status"]["nodeInfo"]["kubeletVersion"])
            }),
            wide("Internal-IP", |o| node_address(o, "InternalIP")),
            wide("External-IP", |o| node_address(o, "ExternalIP")),
            wide("OS-Image", |o| {
                or(&o["status"]["nodeInfo"]["osImage"], "<unknown>")
            }),
            wide("Kernel-Version", |o| {
                let info = &o["status"]["nodeInfo"];
                let kernel = or(&info["kernelVersion"], "<unknown>");
                match info["architecture"].as_str().filter(|a| !a.is_empty()) {
                    Some(arch) => Value::String(format!("{} ({arch})", s(&kernel))),
                    None => kernel,
                }
            }),
            wide("Container-Runtime", |o| {
                or(
                    &o["status"]["nodeInfo"]["containerRuntimeVersion"],
                    "<unknown>",
                )
            }),
        ],
        ("", "pods") => vec![
            col("Name", name_cell),
            col("Ready", pod_ready),
            col("Status", pod_status),
            col("Restarts", pod_restarts),
            col("Age", age),
            wide("IP", |o| or(&o["status"]["podIP"], "<none>")),
            wide("Node", |o| or(&o["spec"]["nodeName"], "<none>")),
            wide("Nominated Node", |o| {
                or(&o["status"]["nominatedNodeName"], "<none>")
            }),
            wide("Readiness Gates", readiness_gates),
        ],
        ("", "persistentvolumeclaims") => vec![
            col("Name", name_cell),
            col("Status", phase),
            col("Volume", |o| text(&o["spec"]["volumeName"])),
            col("Capacity", |o| text(&o["status"]["capacity"]["storage"])),
            col("Access Modes", |o| modes(&o["status"]["accessModes"])),
            col("StorageClass", |o| text(&o["spec"]["storageClassName"])),
            col("VolumeAttributesClass", |o| {
                or(&o["status"]["currentVolumeAttributesClassName"], "<unset>")
            }),
            col("Age", age),
            wide("VolumeMode", |o| text(&o["spec"]["volumeMode"])),
        ],
        ("", "persistentvolumes") => vec![
            col("Name", name_cell),
            col("Capacity", |o| text(&o["spec"]["capacity"]["storage"])),
            col("Access Modes", |o| modes(&o["spec"]["accessModes"])),
            col("Reclaim Policy", |o| {
                text(&o["spec"]["persistentVolumeReclaimPolicy"])
            }),
            col("Status", phase),
            col("Claim", |o| {
                let claim = &o["spec"]["claimRef"];
                Value::String(if claim.is_null() {
                    String::new()
                } else {
                    format!("{}/{}", s(&claim["namespace"]), s(&claim["name"]))
                })
            }),
            col("StorageClass", |o| text(&o["spec"]["storageClassName"])),
            col("VolumeAttributesClass", |o| {
                or(&o["spec"]["volumeAttributesClassName"], "<unset>")
            }),
            col("Reason", |o| text(&o["status"]["reason"])),
            col("Age", age),
            wide("VolumeMode", |o| text(&o["spec"]["volumeMode"])),
        ],
        ("storage.k8s.io", "storageclasses") => vec![
            // kubectl marks the default class, as kube-apiserver's table does.
            col("Name", |o| {
                let name = name(o);
                Value::String(if crate::admission::is_default(o) {
                    format!("{name} (default)")
                } else {
                    name
                })
            }),
            col("Provisioner", |o| text(&o["provisioner"])),
            col("ReclaimPolicy", |o| text(&o["reclaimPolicy"])),
            col("VolumeBindingMode", |o| text(&o["volumeBindingMode"])),
            col("AllowVolumeExpansion", |o| flag(&o["allowVolumeExpansion"])),
            col("Age", age),
        ],
        // Both versions' tables are drawn from the stored core/v1 form.
        ("", "events") | ("events.k8s.io", "events") => vec![
            col("Last Seen", event_last_seen),
            col("Type", |o| text(&o["type"])),
            col("Reason", |o| text(&o["reason"])),
            col("Object", |o| {
                let object = &o["involvedObject"];
                Value::String(format!(
                    "{}/{}",
                    s(&object["kind"]).to_lowercase(),
                    s(&object["name"])
                ))
            }),
            wide("Subobject", |o| text(&o["involvedObject"]["fieldPath"])),
            wide("Source", |o| {
                let source = &o["source"];
                let (component, host) = (s(&source["component"]), s(&source["host"]));
                Value::String(if host.is_empty() {
                    component
                } else {
                    format!("{component}, {host}")
                })
            }),
            col("Message", |o| text(&o["message"])),
            wide("First Seen", |o| Value::String(since(&o["firstTimestamp"]))),
            int("Count", 1, |o| count(&o["count"])),
            wide("Name", name_cell),
        ],
        ("storage.k8s.io", "volumeattachments") => vec![
            col("Name", name_cell),
            col("Attacher", |o| text(&o["spec"]["attacher"])),
            col("PV", |o| text(&o["spec"]["source"]["persistentVolumeName"])),
            col("Node", |o| text(&o["spec"]["nodeName"])),
            col("Attached", |o| flag(&o["status"]["attached"])),
            col("Age", age),
        ],
        ("storage.k8s.io", "csidrivers") => vec![
            col("Name", name_cell),
            col("AttachRequired", |o| flag(&o["spec"]["attachRequired"])),
            col("PodInfoOnMount", |o| flag(&o["spec"]["podInfoOnMount"])),
            col("StorageCapacity", |o| flag(&o["spec"]["storageCapacity"])),
            col("TokenRequests", |o| {
                Value::String(
                    joined(&o["spec"]["tokenRequests"], |t| s(&t["audience"]))
                        .unwrap_or_else(|| "<unset>".into()),
                )
            }),
            col("RequiresRepublish", |o| {
                flag(&o["spec"]["requiresRepublish"])
            }),
            col("Modes", |o| {
                Value::String(
                    joined(&o["spec"]["volumeLifecycleModes"], s)
                        .unwrap_or_else(|| "<none>".into()),
                )
            }),
            col("Age", age),
        ],
        ("storage.k8s.io", "csinodes") => vec![
            col("Name", name_cell),
            int("Drivers", 0, |o| {
                json!(o["spec"]["drivers"].as_array().map_or(0, Vec::len))
            }),
            col("Age", age),
        ],
        ("storage.k8s.io", "volumeattributesclasses") => vec![
            col("Name", name_cell),
            col("DriverName", |o| text(&o["driverName"])),
            col("Age", age),
        ],
        ("coordination.k8s.io", "leases") => vec![
            col("Name", name_cell),
            col("Holder", |o| text(&o["spec"]["holderIdentity"])),
            col("Age", age),
        ],
        ("", "namespaces") => vec![
            col("Name", name_cell),
            col("Status", phase),
            col("Age", age),
        ],
        ("", "configmaps") => vec![
            col("Name", name_cell),
            int("Data", 0, |o| {
                let n = |k: &str| o[k].as_object().map_or(0, serde_json::Map::len);
                json!(n("data") + n("binaryData"))
            }),
            col("Age", age),
        ],
        ("", "secrets") => vec![
            col("Name", name_cell),
            col("Type", |o| text(&o["type"])),
            int("Data", 0, |o| {
                json!(o["data"].as_object().map_or(0, serde_json::Map::len))
            }),
            col("Age", age),
        ],
        ("", "serviceaccounts") => vec![col("Name", name_cell), col("Age", age)],
        ("apps", "deployments") => vec![
            col("Name", name_cell),
            col("Ready", |o| {
                ratio(&o["status"]["readyReplicas"], &o["spec"]["replicas"])
            }),
            int("Up-to-date", 0, |o| count(&o["status"]["updatedReplicas"])),
            int("Available", 0, |o| count(&o["status"]["availableReplicas"])),
            col("Age", age),
            wide("Containers", |o| containers(&o["spec"]["template"])),
            wide("Images", |o| images(&o["spec"]["template"])),
            wide("Selector", |o| selector(&o["spec"]["selector"])),
        ],
        ("apps", "statefulsets") => vec![
            col("Name", name_cell),
            col("Ready", |o| {
                ratio(&o["status"]["readyReplicas"], &o["spec"]["replicas"])
            }),
            col("Age", age),
            wide("Containers", |o| containers(&o["spec"]["template"])),
            wide("Images", |o| images(&o["spec"]["template"])),
        ],
        ("apps", "daemonsets") => vec![
            col("Name", name_cell),
            int("Desired", 0, |o| {
                count(&o["status"]["desiredNumberScheduled"])
            }),
            int("Current", 0, |o| {
                count(&o["status"]["currentNumberScheduled"])
            }),
            int("Ready", 0, |o| count(&o["status"]["numberReady"])),
            int("Up-to-date", 0, |o| {
                count(&o["status"]["updatedNumberScheduled"])
            }),
            int("Available", 0, |o| count(&o["status"]["numberAvailable"])),
            col("Node Selector", |o| {
                let labels = &o["spec"]["template"]["spec"]["nodeSelector"];
                selector(&json!({"matchLabels": labels}))
            }),
            col("Age", age),
            wide("Containers", |o| containers(&o["spec"]["template"])),
            wide("Images", |o| images(&o["spec"]["template"])),
            wide("Selector", |o| selector(&o["spec"]["selector"])),
        ],
        ("apps", "replicasets") => vec![
            col("Name", name_cell),
            int("Desired", 0, |o| count(&o["spec"]["replicas"])),
            int("Current", 0, |o| count(&o["status"]["replicas"])),
            int("Ready", 0, |o| count(&o["status"]["readyReplicas"])),
            col("Age", age),
            wide("Containers", |o| containers(&o["spec"]["template"])),
            wide("Images", |o| images(&o["spec"]["template"])),
            wide("Selector", |o| selector(&o["spec"]["selector"])),
        ],
        ("rbac.authorization.k8s.io", "clusterrolebindings" | "rolebindings") => vec![
            col("Name", name_cell),
            col("Role", |o| {
                Value::String(format!(
                    "{}/{}",
                    s(&o["roleRef"]["kind"]),
                    s(&o["roleRef"]["name"])
                ))
            }),
            col("Age", age),
            wide("Users", |o| subjects(o, "User")),
            wide("Groups", |o| subjects(o, "Group")),
            wide("ServiceAccounts", |o| subjects(o, "ServiceAccount")),
        ],
        // kube-apiserver's default table: the name and when the object was made.
        _ => vec![
            col("Name", name_cell),
            Column {
                name: "Created At",
                kind: "date",
                priority: 0,
                cell: |o| text(&o["metadata"]["creationTimestamp"]),
            },
        ],
    }
}
