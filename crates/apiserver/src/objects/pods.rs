//! A Pod's graceful deletion, as kube-apiserver decides it.

use serde_json::{Value, json};

use super::rfc3339;

/// The grace period of a Pod's deletion, as kube-apiserver decides it: none for a Pod not
/// assigned to a node or already finished (nothing runs that could stop), else the request's
/// `gracePeriodSeconds`, else the Pod's `terminationGracePeriodSeconds`, else 30.
pub fn pod_grace_seconds(pod: &Value, requested: Option<i64>) -> i64 {
    let assigned = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !assigned || finished {
        return 0;
    }
    requested
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0)
}

/// A Pod being deleted gracefully: `deletionTimestamp` at now + `grace` and
/// `deletionGracePeriodSeconds`; the node (kubelet) deletes it for good once its containers
/// and volumes are gone. A repeated deletion only ever shortens the grace. None: no change.
pub fn graceful_deletion(pod: &Value, grace: i64) -> Option<Value> {
    let current = pod["metadata"]["deletionGracePeriodSeconds"].as_i64();
    if current.is_some_and(|c| c <= grace) {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut next = pod.clone();
    next["metadata"]["deletionTimestamp"] =
        json!(rfc3339(now.saturating_add(grace.unsigned_abs())));
    next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    Some(next)
}
