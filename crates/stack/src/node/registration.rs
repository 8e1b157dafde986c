//! Registering a CSI driver on a node, as the CSI-in-Kubernetes design has kubelet do it:
//! NodeGetInfo's answer completely overwrites the driver's entry in the node's CSINode (node
//! id, topology keys, volume limit) and its id in the Node's `csi.volume.kubernetes.io/nodeid`
//! annotation, and labels the Node with its topology segment; a failed NodeGetInfo removes the
//! driver's entry and id. Other drivers' entries are left as they are.
//!
//! [`register`] does it against the API; [`register_on_node`] and [`register_on_csinode`]
//! decide what each object becomes.

use std::collections::BTreeMap;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::update::{Updated, update_live};
use tonic::transport::Channel;

pub use sidecar_kit::vocabulary::ANN_NODE_IDS;

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

/// Why a node could not be registered.
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
    /// GetPluginInfo or NodeGetInfo failed (after NodeGetInfo's failure, the driver's entry
    /// and id were removed).
    #[error("{0}")]
    Driver(#[source] CallError),
    /// The Node or the CSINode could not be read or written.
    #[error("failed to register the driver in {kind} {node:?}: {source}")]
    Api {
        /// `Node` or `CSINode`.
        kind: &'static str,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// How long each of the two driver calls may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Registers the driver behind `channel` on node `node`: NodeGetInfo, then the Node (created
/// if missing, labelled `kubernetes.io/hostname`) and its CSINode (owned by the Node), each
/// written only where it changes. Returns the driver's name.
pub async fn register(
    client: &kube::Client,
    channel: Channel,
    node: &str,
) -> Result<String, RegistrationError> {
    let calls = Caller::new("", CALL_TIMEOUT, None);
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let driver = calls
        .call(
            "/csi.v1.Identity/GetPluginInfo",
            identity.get_plugin_info(calls.request(csi::GetPluginInfoRequest {})),
        )
        .await
        .map_err(RegistrationError::Driver)?
        .name;
    let mut node_client = csi::node_client::NodeClient::new(channel);
    let answer = calls
        .call(
            "/csi.v1.Node/NodeGetInfo",
            node_client.node_get_info(calls.request(csi::NodeGetInfoRequest {})),
        )
        .await;
    let info = answer.as_ref().ok().map(|answer| NodeInfo {
        node_id: answer.node_id.clone(),
        segments: answer
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.clone().into_iter().collect())
            .unwrap_or_default(),
        max_volumes: answer.max_volumes_per_node,
    });
    let api_error = |kind| {
        move |source| RegistrationError::Api {
            kind,
            node: node.to_string(),
            source,
        }
    };
    // A new Node or CSINode is made only for a driver that answered.
    let fresh_node = info.is_some().then(|| Node {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            labels: Some([("kubernetes.io/hostname".to_string(), node.to_string())].into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    });
    let mut refused = None;
    let nodes = Api::<Node>::all(client.clone());
    let registered = create_or_edit(&nodes, node, fresh_node, |object| {
        register_on_node(object, &driver, info.as_ref()).unwrap_or_else(|error| {
            refused = Some(error);
            false
        })
    })
    .await
    .map_err(api_error("Node"))?;
    if let Some(error) = refused {
        return Err(error);
    }
    let owner = registered.and_then(|object| object.metadata.uid);
    let fresh_csinode = info.as_ref().zip(owner).map(|(_, uid)| CSINode {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid,
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec::default(),
    });
    let csinodes = Api::<CSINode>::all(client.clone());
    // The API server keeps a listed driver's node ID and topology keys: an entry that must
    // change them goes first, in a write of its own, and comes back in the next (as kubelet
    // removes a driver that went away and adds it when it returns).
    create_or_edit(&csinodes, node, None, |object| {
        entry_must_go_first(object, &driver, info.as_ref())
            && register_on_csinode(object, &driver, None)
    })
    .await
    .map_err(api_error("CSINode"))?;
    create_or_edit(&csinodes, node, fresh_csinode, |object| {
        register_on_csinode(object, &driver, info.as_ref())
    })
    .await
    .map_err(api_error("CSINode"))?;
    answer.map_err(RegistrationError::Driver)?;
    Ok(driver)
}

/// Creates `fresh` with `edit` applied, or, when it exists already (or there is no `fresh`),
/// applies `edit` to the stored object and writes it back if it changed. The object as stored,
/// if there is one.
async fn create_or_edit<K>(
    api: &Api<K>,
    name: &str,
    fresh: Option<K>,
    mut edit: impl FnMut(&mut K) -> bool,
) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    if let Some(mut fresh) = fresh {
        edit(&mut fresh);
        match api.create(&PostParams::default(), &fresh).await {
            Ok(made) => return Ok(Some(made)),
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(match update_live(api, name, edit).await? {
        Updated::Written(object) | Updated::Unchanged(object) => Some(object),
        Updated::Gone => None,
    })
}

/// Writes the driver's node id into the Node's annotation and its topology segment into the
/// Node's labels (`info`), or removes its id (`None`: NodeGetInfo failed). Returns whether the
/// Node changed.
pub fn register_on_node(
    node: &mut Node,
    driver: &str,
    info: Option<&NodeInfo>,
) -> Result<bool, RegistrationError> {
    let mut ids = sidecar_kit::vocabulary::node_ids(&node.metadata).map_err(|source| {
        RegistrationError::Annotation {
            node: node.metadata.name.clone().unwrap_or_default(),
            source,
        }
    })?;
    let mut changed = match info {
        Some(info) => {
            ids.insert(driver.to_string(), info.node_id.clone())
                .as_ref()
                != Some(&info.node_id)
        }
        None => ids.remove(driver).is_some(),
    };
    if changed {
        let annotations = node.metadata.annotations.get_or_insert_default();
        if ids.is_empty() {
            annotations.remove(ANN_NODE_IDS);
        } else {
            // Serialising a map of strings cannot fail.
            let text = serde_json::to_string(&ids).unwrap_or_default();
            annotations.insert(ANN_NODE_IDS.to_string(), text);
        }
    }
    for (key, value) in info.iter().flat_map(|info| &info.segments) {
        let labels = node.metadata.labels.get_or_insert_default();
        changed |= labels.insert(key.clone(), value.clone()).as_ref() != Some(value);
    }
    Ok(changed)
}

/// Whether the driver's entry in the CSINode names another node ID or other topology keys
/// than `info`: the API server refuses to change those in place (kube-apiserver's
/// `field is immutable` on `spec.drivers`), so the entry is removed before it is written again.
pub fn entry_must_go_first(csinode: &CSINode, driver: &str, info: Option<&NodeInfo>) -> bool {
    let (Some(info), Some(entry)) = (info, csinode.spec.drivers.iter().find(|d| d.name == driver))
    else {
        return false;
    };
    let keys: Vec<&String> = info.segments.keys().collect();
    let listed: Vec<&String> = entry.topology_keys.iter().flatten().collect();
    entry.node_id != info.node_id || keys != listed
}

/// Overwrites the driver's entry in the CSINode with `info`, or removes it (`None`). Returns
/// whether the CSINode changed.
pub fn register_on_csinode(csinode: &mut CSINode, driver: &str, info: Option<&NodeInfo>) -> bool {
    let wanted = info.map(|info| {
        let keys: Vec<String> = info.segments.keys().cloned().collect();
        CSINodeDriver {
            name: driver.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: (!keys.is_empty()).then_some(keys),
            // A limit beyond what the field holds is as good as none.
            allocatable: (info.max_volumes > 0).then(|| VolumeNodeResources {
                count: Some(i32::try_from(info.max_volumes).unwrap_or(i32::MAX)),
            }),
        }
    });
    let drivers = &mut csinode.spec.drivers;
    let at = drivers.iter().position(|d| d.name == driver);
    match (at, wanted) {
        (Some(at), Some(wanted)) if drivers[at] == wanted => false,
        (Some(at), Some(wanted)) => {
            drivers[at] = wanted;
            true
        }
        (Some(at), None) => {
            drivers.remove(at);
            true
        }
        (None, Some(wanted)) => {
            drivers.push(wanted);
            true
        }
        (None, None) => false,
    }
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
    fn an_entry_whose_node_id_or_topology_keys_change_is_removed_before_it_is_written_again() {
        let mut csinode = CSINode::default();
        register_on_csinode(&mut csinode, DRIVER, Some(&info("a", Some("z1"), 8)));
        let rows = [
            (Some(info("a", Some("z1"), 8)), false),
            // Only its limit changes: written in place.
            (Some(info("a", Some("z2"), 3)), false),
            (Some(info("b", Some("z1"), 8)), true),
            (Some(info("a", None, 8)), true),
            // NodeGetInfo failed: the entry is removed in one write anyway.
            (None, false),
        ];
        for (answer, first) in rows {
            assert_eq!(
                entry_must_go_first(&csinode, DRIVER, answer.as_ref()),
                first,
                "{answer:?}"
            );
        }
        // No entry yet: nothing to remove.
        assert!(!entry_must_go_first(
            &CSINode::default(),
            DRIVER,
            Some(&info("b", None, 0))
        ));
        // The two writes: the entry goes, then the new one comes.
        let answer = info("b", Some("z1"), 8);
        assert!(register_on_csinode(&mut csinode, DRIVER, None));
        assert!(!entry_must_go_first(&csinode, DRIVER, Some(&answer)));
        assert!(register_on_csinode(&mut csinode, DRIVER, Some(&answer)));
        assert_eq!(ours_in(&csinode).node_id, "b");
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
