//! Which watch events can change the segments, so that the wanted items are worked out again.
//! The answer for a re-list is given at its end (`InitDone`): the reflector has swapped in
//! the listed objects by then, so the recomputation sees a node or CSINode deleted while the
//! watch was away as gone, and an empty re-list still counts.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::runtime::watcher::Event;

/// The labels of each node last seen, as a digest: a node's status heartbeats change nothing.
#[derive(Debug, Default)]
pub(crate) struct NodeLabels {
    digests: HashMap<String, u64>,
}

impl NodeLabels {
    /// Whether `event` may change a segment: a node came, went, or changed its labels, or a
    /// re-list ended. A re-list's objects are compared against nothing (it starts afresh).
    pub(crate) fn changes_topology(&mut self, event: &Event<Node>) -> bool {
        match event {
            Event::Init => {
                self.digests.clear();
                false
            }
            Event::InitDone => true,
            Event::Delete(node) => self.digests.remove(&name_of(node)).is_some(),
            Event::Apply(node) | Event::InitApply(node) => {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                node.metadata.labels.hash(&mut hasher);
                let digest = hasher.finish();
                self.digests.insert(name_of(node), digest) != Some(digest)
                    && matches!(event, Event::Apply(_))
            }
        }
    }
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// Whether a CSINode event may change a segment: one listing the driver changed, any was
/// deleted, or a re-list ended.
pub(crate) fn csinode_changes_topology(event: &Event<CSINode>, driver: &str) -> bool {
    match event {
        Event::Init | Event::InitApply(_) => false,
        Event::InitDone | Event::Delete(_) => true,
        Event::Apply(csinode) => csinode.spec.drivers.iter().any(|d| d.name == driver),
    }
}

/// Whether a StorageClass event may change the tracked classes: any change, or a re-list's
/// end.
pub(crate) fn class_changes_topology<K>(event: &Event<K>) -> bool {
    !matches!(event, Event::Init | Event::InitApply(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{CSINodeDriver, StorageClass};
    use std::collections::BTreeMap;

    fn node(name: &str, zone: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(BTreeMap::from([("zone".to_string(), zone.to_string())]));
        node
    }

    #[test]
    fn nodes_count_when_they_come_go_or_relabel_and_a_relist_counts_at_its_end() {
        let mut seen = NodeLabels::default();
        let rows: Vec<(Event<Node>, bool, &str)> = vec![
            (Event::Apply(node("a", "z1")), true, "a new node"),
            (
                Event::Apply(node("a", "z1")),
                false,
                "a heartbeat: same labels",
            ),
            (Event::Apply(node("a", "z2")), true, "relabelled"),
            (Event::Apply(node("b", "z1")), true, "another node"),
            // A re-list in which b is gone: nothing counts until its end.
            (Event::Init, false, "a re-list starts"),
            (Event::InitApply(node("a", "z2")), false, "listed"),
            (
                Event::InitDone,
                true,
                "the re-list ends: b's absence is seen then",
            ),
            (
                Event::Apply(node("a", "z2")),
                false,
                "unchanged since the re-list",
            ),
            (
                Event::Delete(node("b", "z1")),
                false,
                "b was not listed: already accounted for",
            ),
            (Event::Delete(node("a", "z2")), true, "a goes"),
            (Event::Init, false, "an empty re-list"),
            (Event::InitDone, true, "still counts"),
        ];
        for (i, (event, wanted, why)) in rows.into_iter().enumerate() {
            assert_eq!(seen.changes_topology(&event), wanted, "row {i}: {why}");
        }
    }

    #[test]
    fn csinodes_and_classes_count_on_change_and_at_a_relists_end() {
        let mut ours = CSINode::default();
        ours.spec.drivers = vec![CSINodeDriver {
            name: "d".into(),
            ..Default::default()
        }];
        let other = CSINode::default();
        assert!(csinode_changes_topology(&Event::Apply(ours.clone()), "d"));
        assert!(!csinode_changes_topology(&Event::Apply(other.clone()), "d"));
        assert!(csinode_changes_topology(&Event::Delete(other.clone()), "d"));
        assert!(!csinode_changes_topology(&Event::Init, "d"));
        assert!(!csinode_changes_topology(&Event::InitApply(ours), "d"));
        assert!(csinode_changes_topology(&Event::InitDone, "d"));
        let class = StorageClass::default();
        assert!(class_changes_topology(&Event::Apply(class.clone())));
        assert!(class_changes_topology(&Event::Delete(class.clone())));
        assert!(!class_changes_topology(&Event::InitApply(class)));
        assert!(class_changes_topology::<StorageClass>(&Event::InitDone));
    }
}
