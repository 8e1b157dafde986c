//! Pure decisions of the node's part of an expansion (kubelet's): whether a volume a Pod uses
//! must be grown at the node (NodeExpandVolume), to which size, and the claim's status once it
//! is (or once the driver has no node part and the new size holds as it is).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::Value;

use crate::resizer::decide::{self as resize, resize_status};

/// The node's part of one volume's expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeExpansion {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim.
    pub claim: String,
    /// The size the volume grows to (the PV's capacity).
    pub to: i64,
}

/// The node's part a claim's volume needs, if any, as kubelet decides it: the PV is larger
/// than the claim's recorded capacity, the volume is not read-only, and, when the claim
/// carries the resize's state (`allocatedResources`, `allocatedResourceStatuses`), the
/// controller's part is done. The size is the PV's.
pub fn node_expansion(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    readonly: bool,
) -> Option<NodeExpansion> {
    let size = resize::volume_size(volume)?;
    if readonly || resize::claim_capacity(claim).is_some_and(|c| c >= size) {
        return None;
    }
    let status = claim.status.as_ref()?;
    let allocated = status
        .allocated_resources
        .as_ref()
        .and_then(|a| a.get("storage"))
        .and_then(|q| sidecar_kit::quantity::parse_bytes(&q.0).ok());
    let recovering = allocated.is_some() || resize::allocated_status(claim).is_some();
    let due = matches!(
        resize::allocated_status(claim),
        Some(resize_status::NODE_PENDING | resize_status::NODE_IN_PROGRESS)
    );
    if recovering && !due {
        return None;
    }
    // The PV's capacity, as kubelet records it (a driver may have rounded the allocated size
    // up; the claim then records what the volume has).
    let to = size;
    Some(NodeExpansion {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        claim: claim.metadata.name.clone()?,
        to,
    })
}

/// The claim's status patch as NodeExpandVolume starts.
pub fn started() -> Value {
    serde_json::json!({"status": {"allocatedResourceStatuses": {"storage": resize_status::NODE_IN_PROGRESS}}})
}

/// The claim's status patch once the volume is grown at the node: the new capacity, no
/// resize status, no resize condition.
pub fn finished(claim: &PersistentVolumeClaim, to: i64) -> Value {
    resize::finished(claim, to)
}

/// kubelet's error for a failed NodeExpandVolume (`error` as Go's gRPC prints it).
pub fn expander_error(code: Option<tonic::Code>, error: &str) -> String {
    match code {
        Some(code) if resize::infeasible(code) => {
            format!("Expander.NodeExpand failed to expand the volume {error}")
        }
        _ => format!("Expander.NodeExpand failed to expand the volume : {error}"),
    }
}

/// The claim's status patch after NodeExpandVolume failed with `code` (None: not called, the
/// node has no NodeExpandVolume): condition `NodeResizeError` (an earlier one is kept, with its
/// first message), and `NodeResizeInfeasible` when the driver refused the size for good
/// (kubelet then stops; it starts again when the size changes). Otherwise the node's part
/// stays in progress and is retried. None when there is nothing to write.
pub fn failed(
    claim: &PersistentVolumeClaim,
    code: Option<tonic::Code>,
    error: &str,
    now: &str,
) -> Option<Value> {
    let message = format!("failed to expand pvc with {error}");
    let already = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == resize::NODE_RESIZE_ERROR && c.status == "True")
        });
    let infeasible = code.is_some_and(resize::infeasible);
    let mut patch = match (already, infeasible) {
        (true, false) => return None,
        (true, true) => serde_json::json!({"status": {}}),
        (false, _) => resize::node_resize_failed(claim, &message, now),
    };
    if infeasible {
        patch["status"]["allocatedResourceStatuses"] =
            serde_json::json!({"storage": resize_status::NODE_INFEASIBLE});
    }
    Some(patch)
}

/// kubelet's event on the Pod for a failed NodeExpandVolume: `VolumeResizeFailed` for a
/// running Pod (online), `FailedMount` for one being set up; `message` is the expander's.
pub fn failure_event(online: bool, pv: &str, message: &str) -> (&'static str, String) {
    if online {
        (
            "VolumeResizeFailed",
            format!("NodeExpandVolume.NodeExpandVolume failed for volume {pv:?} : {message}"),
        )
    } else {
        (
            "FailedMount",
            format!(
                "MountVolume.Setup failed while expanding volume for volume {pv:?} : {message}"
            ),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(capacity: &str, status: Option<&str>) -> PersistentVolumeClaim {
        let mut c = json!({
            "metadata": {"name": "data", "namespace": "ns"},
            "spec": {"resources": {"requests": {"storage": "2Gi"}}, "volumeName": "pv-1"},
            "status": {"phase": "Bound", "capacity": {"storage": capacity},
                       "conditions": [{"type": "Resizing", "status": "True"}]},
        });
        if let Some(s) = status {
            c["status"]["allocatedResourceStatuses"] = json!({"storage": s});
        }
        serde_json::from_value(c).unwrap()
    }

    fn volume(capacity: &str) -> PersistentVolume {
        serde_json::from_value(
            json!({"metadata": {"name": "pv-1"}, "spec": {"capacity": {"storage": capacity}}}),
        )
        .unwrap()
    }

    #[test]
    fn the_node_grows_a_volume_once_the_controller_is_done() {
        let cases = [
            (
                claim("1Gi", Some("NodeResizePending")),
                "2Gi",
                Some(2i64 << 30),
            ),
            (
                claim("1Gi", Some("NodeResizeInProgress")),
                "2Gi",
                Some(2i64 << 30),
            ),
            // The controller's part still runs.
            (
                claim("1Gi", Some("ControllerResizeInProgress")),
                "2Gi",
                None,
            ),
            // Already recorded.
            (claim("2Gi", Some("NodeResizePending")), "2Gi", None),
        ];
        for (claim, size, want) in cases {
            let got = node_expansion(&claim, &volume(size), false).map(|e| e.to);
            assert_eq!(got, want, "{:?}", claim.status);
        }
        // Read-only: never grown at the node.
        let pending = claim("1Gi", Some("NodeResizePending"));
        assert_eq!(node_expansion(&pending, &volume("2Gi"), true), None);
        // The PV's size, not the allocated one, is what the node grows to and records.
        let mut allocated = pending.clone();
        allocated.status.as_mut().unwrap().allocated_resources = Some(
            [(
                "storage".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1536Mi".into()),
            )]
            .into(),
        );
        assert_eq!(
            node_expansion(&allocated, &volume("2Gi"), false).map(|e| e.to),
            Some(2 << 30)
        );
        // Written by an older resizer (no resize state): the capacities decide.
        assert_eq!(
            node_expansion(&claim("1Gi", None), &volume("2Gi"), false).map(|e| e.to),
            Some(2 << 30)
        );
    }

    #[test]
    fn the_claim_records_the_outcome() {
        let c = claim("1Gi", Some("NodeResizePending"));
        let done = finished(&c, 2 << 30);
        assert_eq!(done["status"]["capacity"], json!({"storage": "2Gi"}));
        assert_eq!(done["status"]["allocatedResourceStatuses"], Value::Null);
        assert_eq!(done["status"]["conditions"], Value::Null);
        let refused = failed(&c, Some(tonic::Code::OutOfRange), "too big", "T").unwrap();
        assert_eq!(
            refused["status"]["allocatedResourceStatuses"],
            json!({"storage": "NodeResizeInfeasible"})
        );
        let conditions = refused["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.last().unwrap()["type"], "NodeResizeError");
        assert_eq!(
            conditions.last().unwrap()["message"],
            "failed to expand pvc with too big"
        );
        let transient = failed(&c, Some(tonic::Code::Internal), "busy", "T").unwrap();
        assert!(
            transient["status"]
                .get("allocatedResourceStatuses")
                .is_none()
        );
        // A second failure keeps the first message.
        let mut again: PersistentVolumeClaim = c.clone();
        again.status.as_mut().unwrap().conditions = Some(vec![
            serde_json::from_value(
                json!({"type": "NodeResizeError", "status": "True", "message": "first"}),
            )
            .unwrap(),
        ]);
        assert_eq!(failed(&again, None, "second", "T"), None);
        assert_eq!(
            failure_event(true, "pv-1", "boom"),
            (
                "VolumeResizeFailed",
                "NodeExpandVolume.NodeExpandVolume failed for volume \"pv-1\" : boom".to_string()
            )
        );
        assert_eq!(failure_event(false, "pv-1", "boom").0, "FailedMount");
        assert_eq!(
            expander_error(
                Some(tonic::Code::Internal),
                "rpc error: code = Internal desc = x"
            ),
            "Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = x"
        );
    }
}
