//! The cells of Nodes' and Pods' columns (kubectl's STATUS, ROLES, addresses, READY,
//! RESTARTS, readiness gates), read from the object as kube-apiserver's printers read them.

use serde_json::Value;

use super::columns::s;

/// A Node's status: Ready, NotReady or Unknown, and SchedulingDisabled when cordoned.
pub(super) fn node_status(o: &Value) -> Value {
    let ready = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| match c["status"].as_str() {
            Some("True") => "Ready",
            Some("False") => "NotReady",
            _ => "Unknown",
        })
        .unwrap_or("Unknown");
    let mut status = ready.to_string();
    if o["spec"]["unschedulable"].as_bool() == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    Value::String(status)
}

/// A Node's roles from its `node-role.kubernetes.io/<role>` and `kubernetes.io/role` labels.
pub(super) fn node_roles(o: &Value) -> Value {
    let mut roles: Vec<String> = o["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) if !role.is_empty() => Some(role.to_string()),
            _ if k == "kubernetes.io/role" => v.as_str().map(str::to_string),
            _ => None,
        })
        .collect();
    roles.sort();
    roles.dedup();
    Value::String(if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    })
}

pub(super) fn node_address(o: &Value, kind: &str) -> Value {
    let address = o["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == kind)
        .map(|a| s(&a["address"]));
    Value::String(address.unwrap_or_else(|| "<none>".into()))
}

/// A Pod's status as kubectl shows it: its phase or reason, a container's waiting or
/// terminated reason, `Terminating` while it is deleted.
pub(super) fn pod_status(o: &Value) -> Value {
    let status = &o["status"];
    let mut reason = status["reason"]
        .as_str()
        .or(status["phase"].as_str())
        .unwrap_or("Pending")
        .to_string();
    let mut running = false;
    let statuses = status["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in statuses.iter().rev() {
        let state = &c["state"];
        if let Some(waiting) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = waiting.to_string();
        } else if !state["terminated"].is_null() {
            let terminated = &state["terminated"];
            reason = match terminated["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(r) => r.to_string(),
                None if terminated["signal"].as_i64().unwrap_or(0) != 0 => {
                    format!("Signal:{}", terminated["signal"])
                }
                None => format!("ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
            };
        } else if c["ready"] == true && !state["running"].is_null() {
            running = true;
        }
    }
    if reason == "Completed" && running {
        reason = "Running".into();
    }
    if !o["metadata"]["deletionTimestamp"].is_null() {
        reason = if status["reason"] == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    Value::String(reason)
}

pub(super) fn pod_ready(o: &Value) -> Value {
    let containers = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = o["status"]["containerStatuses"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
    Value::String(format!("{ready}/{containers}"))
}

pub(super) fn pod_restarts(o: &Value) -> Value {
    let restarts: i64 = o["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
        .sum();
    Value::String(restarts.to_string())
}

pub(super) fn readiness_gates(o: &Value) -> Value {
    let gates = o["spec"]["readinessGates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if gates.is_empty() {
        return Value::String("<none>".into());
    }
    let conditions = o["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let met = gates
        .iter()
        .filter(|g| {
            conditions
                .iter()
                .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
        })
        .count();
    Value::String(format!("{met}/{}", gates.len()))
}
