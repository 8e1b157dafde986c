//! CSI ephemeral inline volumes (`Ephemeral` in the CSIDriver's `volumeLifecycleModes`):
//! kubelet publishes them without CreateVolume, with `csi.storage.k8s.io/ephemeral: "true"` in
//! the volume context (when the CSIDriver asks for the Pod's info) and a volume id of its own.
//! The driver makes the volume on this node at NodePublishVolume (its size from the `size`
//! attribute, its other attributes as CreateVolume parameters) and removes it at
//! NodeUnpublishVolume.

use std::collections::HashMap;

use csi_proto::v1 as csi;

use crate::error::{Error, Result};

/// The volume context key kubelet sets on ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// The attribute giving an ephemeral volume's size (a quantity: `1Gi`, `500M`, bytes).
pub const SIZE_KEY: &str = "size";
/// Prefix of the keys kubelet adds (the Pod's info); never CreateVolume parameters.
const KUBERNETES_PREFIX: &str = "csi.storage.k8s.io/";
/// The longest volume id accepted (it names a directory).
const MAX_ID: usize = 128;

/// Whether a NodePublishVolume is for an ephemeral inline volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).map(String::as_str) == Some("true")
}

/// The CreateVolume an ephemeral volume is made with: named after its id (so a repeated
/// publish finds it), on this node (`segment`: the topology key and this node's value, when
/// the driver has topology), the size from `size`, the other attributes as parameters.
pub fn create_request(
    req: &csi::NodePublishVolumeRequest,
    segment: Option<(&str, &str)>,
) -> Result<csi::CreateVolumeRequest> {
    let id = &req.volume_id;
    let valid = !id.is_empty()
        && id.len() <= MAX_ID
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(Error::Ephemeral(format!(
            "volume_id {id:?} must be 1 to {MAX_ID} letters, digits, '-', '_' or '.' and not start with '.'"
        )));
    }
    let required_bytes = match req.volume_context.get(SIZE_KEY) {
        None => 0,
        Some(size) => match sidecar_kit::quantity::parse_bytes(size) {
            Ok(bytes) if bytes >= 0 => bytes,
            Ok(_) => {
                return Err(Error::Ephemeral(format!(
                    "size {size:?} must not be negative"
                )));
            }
            Err(error) => return Err(Error::Ephemeral(format!("size {size:?}: {error}"))),
        },
    };
    let parameters = req
        .volume_context
        .iter()
        .filter(|(key, _)| !key.starts_with(KUBERNETES_PREFIX) && key.as_str() != SIZE_KEY)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let accessibility_requirements = segment.map(|(key, value)| {
        let here = csi::Topology {
            segments: [(key.to_string(), value.to_string())].into_iter().collect(),
        };
        csi::TopologyRequirement {
            requisite: vec![here.clone()],
            preferred: vec![here],
        }
    });
    Ok(csi::CreateVolumeRequest {
        name: id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: req.volume_capability.iter().cloned().collect(),
        parameters,
        accessibility_requirements,
        ..Default::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn publish(id: &str, context: &[(&str, &str)]) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: "/t".into(),
            volume_context: context
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_ephemeral_publish_becomes_a_create_on_this_node() {
        let req = publish(
            "csi-0a1b",
            &[
                (EPHEMERAL_KEY, "true"),
                ("csi.storage.k8s.io/pod.name", "web"),
                ("size", "2Mi"),
                ("kind", "fast"),
            ],
        );
        assert!(is_ephemeral(&req.volume_context));
        let create = create_request(&req, Some(("topology.hostpath.csi/node", "n1"))).unwrap();
        assert_eq!(create.name, "csi-0a1b");
        assert_eq!(create.capacity_range.unwrap().required_bytes, 2 << 20);
        assert_eq!(
            create.parameters,
            [("kind".to_string(), "fast".to_string())]
                .into_iter()
                .collect(),
            "only the driver's own attributes are parameters"
        );
        let topology = create.accessibility_requirements.unwrap();
        assert_eq!(
            topology.requisite[0].segments["topology.hostpath.csi/node"],
            "n1"
        );
        let no_topology = create_request(&req, None).unwrap();
        assert!(no_topology.accessibility_requirements.is_none());
        assert!(!is_ephemeral(
            &publish("v", &[(EPHEMERAL_KEY, "false")]).volume_context
        ));
        assert!(!is_ephemeral(&publish("v", &[]).volume_context));
    }

    #[test]
    fn bad_ids_and_sizes_are_refused_with_the_reason() {
        // (volume id, context, words in the error)
        type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let table: [Row; 5] = [
            ("../etc", &[], "volume_id"),
            (".hidden", &[], "volume_id"),
            ("", &[], "volume_id"),
            ("ok", &[("size", "lots")], "size \"lots\""),
            ("ok", &[("size", "-1")], "size"),
        ];
        for (id, context, words) in table {
            let error = create_request(&publish(id, context), None).unwrap_err();
            assert!(error.to_string().contains(words), "{id}: {error}");
            assert_eq!(error.code(), tonic::Code::InvalidArgument);
        }
        let long = "a".repeat(129);
        assert!(create_request(&publish(&long, &[]), None).is_err());
    }
}
