//! Registering a CSI driver on a node, as the CSI-in-Kubernetes design has kubelet do it:
//! NodeGetInfo's answer completely overwrites the driver's entry in the node's CSINode (node
//! id, topology keys, volume limit) and its id in the Node's `csi.volume.kubernetes.io/nodeid`
//! annotation, and labels the Node with its topology segment; a failed NodeGetInfo removes the
//! driver's entry and id. Other drivers' entries are left as they are.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, VolumeNodeResources};

/// The Node annotation holding each driver's node id, as a JSON object.
pub const ANN_NODE_IDS: &str = "csi.volume.kubernetes.io/nodeid";

/// What NodeGetInfo said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `node_id`.
    pub node_id: String,
    /// `accessible_topology.segments`.
    pub segments: BTreeMap<String, String>,
    /// `max_volumes_per_node` (0: no limit).
    pub max_volumes: i64,
}

/// Why the Node's annotation could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The annotation is there but is not a JSON object of strings.
    #[error("the {ANN_NODE_IDS} annotation of Node {node:?} does not parse: {source}")]
    Annotation {
        /// The Node.
        node: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// Writes the driver's node id into the Node's annotation and its topology segment into the
/// Node's labels (`info`), or removes its id (`None`: NodeGetInfo failed). Returns whether the
/// Node changed.
pub fn register_on_node(
    node: &mut Node,
    driver: &str,
    info: Option<&NodeInfo>,
) -> Result<bool, RegistrationError> {
    let annotations = node.metadata.annotations.get_or_insert_default();
    let mut ids: BTreeMap<String, String> = match annotations.get(ANN_NODE_IDS) {
        Some(text) => {
            serde_json::from_str(text).map_err(|source| RegistrationError::Annotation {
                node: node.metadata.name.clone().unwrap_or_default(),
                source,
            })?
        }
        None => BTreeMap::new(),
    };
    let mut changed = match info {
        Some(info) => {
            ids.insert(driver.to_string(), info.node_id.clone())
                .as_ref()
                != Some(&info.node_id)
        }
        None => ids.remove(driver).is_some(),
    };
    if changed {
        if ids.is_empty() {
            annotations.remove(ANN_NODE_IDS);
        } else {
            // Serialising a map of strings cannot fail.
            let text = serde_json::to_string(&ids).unwrap_or_default();
            annotations.insert(ANN_NODE_IDS.to_string(), text);
        }
    }
    if let Some(info) = info {
        let labels = node.metadata.labels.get_or_insert_default();
        for (key, value) in &info.segments {
            changed |= labels.insert(key.clone(), value.clone()).as_ref() != Some(value);
        }
    }
    Ok(changed)
}

/// Overwrites the driver's entry in the CSINode with `info`, or removes it (`None`). Returns
/// whether the CSINode changed.
pub fn register_on_csinode(csinode: &mut CSINode, driver: &str, info: Option<&NodeInfo>) -> bool {
    let before = csinode.spec.drivers.clone();
    csinode.spec.drivers.retain(|d| d.name != driver);
    if let Some(info) = info {
        let keys: Vec<String> = info.segments.keys().cloned().collect();
        csinode.spec.drivers.push(CSINodeDriver {
            name: driver.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: (!keys.is_empty()).then_some(keys),
            allocatable: (info.max_volumes > 0).then(|| VolumeNodeResources {
                count: i32::try_from(info.max_volumes).ok(),
            }),
        });
    }
    // The same entries in another order are no change.
    let key = |d: &CSINodeDriver| d.name.clone();
    let (mut a, mut b) = (before, csinode.spec.drivers.clone());
    a.sort_by_key(key);
    b.sort_by_key(key);
    a != b
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const DRIVER: &str = "hostpath.csi.volstack.dev";

    fn info(id: &str, zone: Option<&str>, max: i64) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            segments: zone
                .map(|z| {
                    BTreeMap::from([("topology.volstack.dev/zone".to_string(), z.to_string())])
                })
                .unwrap_or_default(),
            max_volumes: max,
        }
    }

    fn node(ids: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: ids.map(|ids| BTreeMap::from([(ANN_NODE_IDS.into(), ids.into())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn ids_of(node: &Node) -> Option<serde_json::Value> {
        let text = node.metadata.annotations.as_ref()?.get(ANN_NODE_IDS)?;
        Some(serde_json::from_str(text).unwrap())
    }

    #[test]
    fn the_nodes_annotation_and_labels_follow_node_get_info() {
        let other = r#"{"other.csi":"x"}"#;
        let ours_old = format!(r#"{{"other.csi":"x","{DRIVER}":"old"}}"#);
        // (annotation before, NodeGetInfo, changed, annotation after)
        type Row<'a> = (
            Option<&'a str>,
            Option<NodeInfo>,
            bool,
            Option<serde_json::Value>,
        );
        let rows: Vec<Row> = vec![
            (
                None,
                Some(info("a", None, 0)),
                true,
                Some(serde_json::json!({DRIVER: "a"})),
            ),
            (
                Some(other),
                Some(info("a", None, 0)),
                true,
                Some(serde_json::json!({DRIVER: "a", "other.csi": "x"})),
            ),
            (
                Some(&ours_old),
                Some(info("new", None, 0)),
                true,
                Some(serde_json::json!({DRIVER: "new", "other.csi": "x"})),
            ),
            (
                Some(&ours_old),
                Some(info("old", None, 0)),
                false,
                Some(serde_json::json!({DRIVER: "old", "other.csi": "x"})),
            ),
            // NodeGetInfo failed: our id goes, the others' stay; nothing of ours, nothing changes.
            (
                Some(&ours_old),
                None,
                true,
                Some(serde_json::json!({"other.csi": "x"})),
            ),
            (
                Some(other),
                None,
                false,
                Some(serde_json::json!({"other.csi": "x"})),
            ),
            (None, None, false, None),
        ];
        for (i, (before, info, changed, after)) in rows.into_iter().enumerate() {
            let mut n = node(before);
            assert_eq!(
                register_on_node(&mut n, DRIVER, info.as_ref()).unwrap(),
                changed,
                "row {i}"
            );
            assert_eq!(ids_of(&n), after, "row {i}");
        }
        // The only id removed: the annotation goes with it.
        let mut n = node(Some(&format!(r#"{{"{DRIVER}":"a"}}"#)));
        assert!(register_on_node(&mut n, DRIVER, None).unwrap());
        assert_eq!(ids_of(&n), None);
        // Topology becomes labels, and a changed segment is written over.
        let mut n = node(None);
        assert!(register_on_node(&mut n, DRIVER, Some(&info("a", Some("z1"), 0))).unwrap());
        assert!(
            register_on_node(&mut n, DRIVER, Some(&info("a", Some("z2"), 0))).unwrap(),
            "the zone changed"
        );
        assert!(!register_on_node(&mut n, DRIVER, Some(&info("a", Some("z2"), 0))).unwrap());
        assert_eq!(
            n.metadata.labels.unwrap()["topology.volstack.dev/zone"],
            "z2"
        );
        // A broken annotation is an error naming it, never overwritten blindly.
        let error = register_on_node(&mut node(Some("not json")), DRIVER, None).unwrap_err();
        assert!(error.to_string().contains(ANN_NODE_IDS), "{error}");
    }

    fn ours_in(csinode: &CSINode) -> CSINodeDriver {
        let entry = csinode.spec.drivers.iter().find(|d| d.name == DRIVER);
        entry.cloned().unwrap()
    }

    #[test]
    fn the_csinode_entry_is_overwritten_whole_or_removed() {
        let entry = |name: &str, id: &str| CSINodeDriver {
            name: name.into(),
            node_id: id.into(),
            ..Default::default()
        };
        let mut csinode = CSINode::default();
        csinode.spec.drivers = vec![entry("other.csi", "x"), entry(DRIVER, "old")];
        assert!(register_on_csinode(
            &mut csinode,
            DRIVER,
            Some(&info("new", Some("z1"), 8))
        ));
        let ours = ours_in(&csinode);
        assert_eq!(ours.node_id, "new");
        assert_eq!(
            ours.topology_keys.as_deref(),
            Some(&["topology.volstack.dev/zone".to_string()][..])
        );
        assert_eq!(ours.allocatable.as_ref().and_then(|a| a.count), Some(8));
        assert!(
            !register_on_csinode(&mut csinode, DRIVER, Some(&info("new", Some("z1"), 8))),
            "the same answer changes nothing"
        );
        assert!(
            register_on_csinode(&mut csinode, DRIVER, Some(&info("new", None, 0))),
            "topology and limit gone"
        );
        let ours = ours_in(&csinode);
        assert_eq!(
            (ours.topology_keys.clone(), ours.allocatable.clone()),
            (None, None)
        );
        // NodeGetInfo failed: the entry goes, the other driver's stays.
        assert!(register_on_csinode(&mut csinode, DRIVER, None));
        assert_eq!(csinode.spec.drivers, vec![entry("other.csi", "x")]);
        assert!(!register_on_csinode(&mut csinode, DRIVER, None));
    }
}
