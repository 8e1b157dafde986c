//! Which watch events can change the segments, so that the wanted items are worked out again.
//! The answer for a re-list is given at its end (`InitDone`): the reflector has swapped in
//! the listed objects by then, so the recomputation sees a node or CSINode deleted while the
//! watch was away as gone, and an empty re-list still counts.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Resource;
use kube::runtime::watcher::Event;

/// What was last seen of each object of one kind, by name (`None`: nothing that counts), so
/// that a watch event is said to change the topology only when that part came, went or
/// changed, or a re-list ended. A re-list's objects are compared against nothing (it starts
/// afresh, and its end counts).
#[derive(Debug)]
struct LastSeen<V> {
    seen: HashMap<String, V>,
}

impl<V: PartialEq> LastSeen<V> {
    fn new() -> Self {
        LastSeen {
            seen: HashMap::new(),
        }
    }

    fn changes<K: Resource>(&mut self, event: &Event<K>, part: impl Fn(&K) -> Option<V>) -> bool {
        match event {
            Event::Init => {
                self.seen.clear();
                false
            }
            Event::InitDone => true,
            Event::Delete(object) => self.seen.remove(&name_of(object)).is_some(),
            Event::Apply(object) | Event::InitApply(object) => {
                let name = name_of(object);
                let changed = match part(object) {
                    Some(now) => {
                        let changed = self.seen.get(&name) != Some(&now);
                        self.seen.insert(name, now);
                        changed
                    }
                    None => self.seen.remove(&name).is_some(),
                };
                changed && matches!(event, Event::Apply(_))
            }
        }
    }
}

fn name_of<K: Resource>(object: &K) -> String {
    object.meta().name.clone().unwrap_or_default()
}

/// The labels of each node last seen, as a digest: a node's status heartbeats change nothing.
#[derive(Debug)]
pub(crate) struct NodeLabels(LastSeen<u64>);

impl Default for NodeLabels {
    fn default() -> Self {
        NodeLabels(LastSeen::new())
    }
}

impl NodeLabels {
    /// Whether `event` may change a segment: a node came, went, or changed its labels, or a
    /// re-list ended.
    pub(crate) fn changes_topology(&mut self, event: &Event<Node>) -> bool {
        self.0.changes(event, |node| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            node.metadata.labels.hash(&mut hasher);
            Some(hasher.finish())
        })
    }
}

/// The driver's topology keys in each CSINode last seen (none: not listed there), as Go's
/// capacity controller compares them: a CSINode that stops listing the driver counts, one
/// whose other drivers or allocatable count change does not.
#[derive(Debug)]
pub(crate) struct CsiNodeKeys {
    driver: String,
    keys: LastSeen<Vec<String>>,
}

impl CsiNodeKeys {
    pub(crate) fn new(driver: &str) -> Self {
        CsiNodeKeys {
            driver: driver.to_string(),
            keys: LastSeen::new(),
        }
    }

    /// Whether `event` may change a segment: the driver's keys in a CSINode came, went or
    /// changed, or a re-list ended.
    pub(crate) fn changes_topology(&mut self, event: &Event<CSINode>) -> bool {
        let driver = &self.driver;
        self.keys.changes(event, |csinode| {
            crate::decide::topology::driver_topology_keys(csinode, driver)
        })
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
        ours.metadata.name = Some("n1".into());
        let mut other = CSINode::default();
        other.metadata.name = Some("n2".into());
        let mut dropped = ours.clone();
        dropped.spec.drivers.clear();
        let mut keyed = ours.clone();
        keyed.spec.drivers[0].topology_keys = Some(vec!["zone".into()]);
        let mut counted = keyed.clone();
        counted.spec.drivers[0].allocatable = Some(Default::default());
        let mut seen = CsiNodeKeys::new("d");
        let rows: Vec<(Event<CSINode>, bool, &str)> = vec![
            (Event::Apply(ours.clone()), true, "the driver registers"),
            (Event::Apply(ours.clone()), false, "nothing of ours changed"),
            (
                Event::Apply(other.clone()),
                false,
                "a node without the driver",
            ),
            (
                Event::Apply(keyed.clone()),
                true,
                "its topology keys changed",
            ),
            (Event::Apply(counted), false, "only its allocatable count"),
            (
                Event::Apply(dropped.clone()),
                true,
                "the driver is no longer listed",
            ),
            (Event::Apply(dropped), false, "still not listed"),
            (Event::Delete(other), false, "never listed the driver"),
            (Event::Apply(keyed.clone()), true, "listed again"),
            (Event::Delete(keyed.clone()), true, "its CSINode goes"),
            (Event::Init, false, "a re-list starts"),
            (Event::InitApply(keyed.clone()), false, "listed"),
            (Event::InitDone, true, "the re-list ends"),
            (Event::Apply(keyed), false, "unchanged since the re-list"),
        ];
        for (i, (event, wanted, why)) in rows.into_iter().enumerate() {
            assert_eq!(seen.changes_topology(&event), wanted, "row {i}: {why}");
        }
        let class = StorageClass::default();
        assert!(class_changes_topology(&Event::Apply(class.clone())));
        assert!(class_changes_topology(&Event::Delete(class.clone())));
        assert!(!class_changes_topology(&Event::InitApply(class)));
        assert!(class_changes_topology::<StorageClass>(&Event::InitDone));
    }
}
