//! Pure decisions of storage-capacity tracking (`--enable-capacity`, central mode): the
//! topology segments of the driver, the classes tracked, and what to do with the
//! CSIStorageCapacity objects so that there is exactly one per (segment, class) holding the
//! driver's latest GetCapacity answer; when to poll again; which objects a provisioned or
//! deleted volume makes stale. The controller around them is `capacity::controller`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

/// Label naming the driver on every CSIStorageCapacity the provisioner manages.
pub const LABEL_DRIVER: &str = "csi.storage.k8s.io/drivername";
/// Label naming the manager (`external-provisioner`, or `external-provisioner-<node>`).
pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";

/// A topology segment: key → value.
pub type Segment = BTreeMap<String, String>;

/// The driver's segments: for each CSINode that lists the driver, its topology keys paired with
/// the values of the Node's labels, without repeats. A driver without topology keys has one
/// empty segment. A node lacking one of the labels gives no segment (it is not registered yet).
pub fn segments(driver: &str, csinodes: &[&CSINode], nodes: &[&Node]) -> Vec<Segment> {
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, *n)))
        .collect();
    let mut out: BTreeSet<Segment> = BTreeSet::new();
    for csinode in csinodes {
        let Some(keys) = crate::decide::topology::driver_topology_keys(csinode, driver) else {
            continue;
        };
        if keys.is_empty() {
            out.insert(Segment::new());
            continue;
        }
        let Some(node) = csinode
            .metadata
            .name
            .as_deref()
            .and_then(|name| by_name.get(name))
        else {
            continue;
        };
        let Some(labels) = node.metadata.labels.as_ref() else {
            continue;
        };
        let segment: Option<Segment> = keys
            .iter()
            .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
            .collect();
        if let Some(segment) = segment {
            out.insert(segment);
        }
    }
    out.into_iter().collect()
}

/// The classes capacity is published for: ours, and WaitForFirstConsumer unless
/// `--capacity-for-immediate-binding`.
pub fn tracked_classes<'a>(
    driver: &str,
    classes: &[&'a StorageClass],
    immediate_binding: bool,
) -> Vec<&'a StorageClass> {
    classes
        .iter()
        .copied()
        .filter(|c| c.provisioner == driver)
        .filter(|c| {
            immediate_binding || c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        })
        .collect()
}

/// What one (segment, class) should hold: the driver's answer to GetCapacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Class name.
    pub class: String,
    /// The topology segment the capacity is for (empty: the driver has no topology).
    pub segment: Segment,
    /// `available_capacity` in bytes.
    pub capacity: i64,
    /// `maximum_volume_size` in bytes, when the driver gave one.
    pub maximum: Option<i64>,
}

/// Where and how the provisioner's objects are made.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The provisioner's namespace (`NAMESPACE`).
    pub namespace: String,
    /// The driver.
    pub driver: String,
    /// `external-provisioner` (central) or `external-provisioner-<node>`.
    pub managed_by: String,
    /// Owner per `--capacity-ownerref-level` (none with -1).
    pub owner: Option<OwnerReference>,
}

/// A change to the CSIStorageCapacity objects.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create this object (generateName `csisc-`).
    Create(Box<CSIStorageCapacity>),
    /// Set the values of the object of this name.
    Update {
        /// Object name.
        name: String,
        /// New capacity.
        capacity: Quantity,
        /// New maximum volume size.
        maximum: Option<Quantity>,
        /// The object's owner references with ours added, when ours was missing.
        owners: Option<Vec<OwnerReference>>,
    },
    /// Delete the object of this name (obsolete, or a second one for the same key).
    Delete(String),
}

fn quantity(bytes: i64) -> Quantity {
    Quantity(sidecar_kit::quantity::format_binary_si(bytes))
}

fn bytes(q: Option<&Quantity>) -> Option<i64> {
    q.and_then(|q| sidecar_kit::quantity::parse_bytes(&q.0).ok())
}

/// Whether an object is one of ours: both labels set as the template says.
pub fn ours(object: &CSIStorageCapacity, template: &Template) -> bool {
    let labels = object.metadata.labels.clone().unwrap_or_default();
    labels.get(LABEL_DRIVER) == Some(&template.driver)
        && labels.get(LABEL_MANAGED_BY) == Some(&template.managed_by)
}

/// One (class, segment) pair: a work item of the controller, one object in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// Class name.
    pub class: String,
    /// The topology segment (empty: the driver has no topology).
    pub segment: Segment,
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:", self.class)?;
        for (i, (k, v)) in self.segment.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

/// The (class, segment) an object stands for.
pub fn item_of(object: &CSIStorageCapacity) -> Item {
    let segment = object
        .node_topology
        .as_ref()
        .and_then(|t| t.match_labels.clone())
        .unwrap_or_default();
    Item {
        class: object.storage_class_name.clone(),
        segment,
    }
}

fn key_of(object: &CSIStorageCapacity) -> (String, Segment) {
    let item = item_of(object);
    (item.class, item.segment)
}

/// Every (class, segment) wanted: the product of the tracked classes and the segments.
pub fn items(classes: &[&StorageClass], segments: &[Segment]) -> BTreeSet<Item> {
    classes
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .flat_map(|class| {
            segments.iter().map(move |segment| Item {
                class: class.clone(),
                segment: segment.clone(),
            })
        })
        .collect()
}

/// The segments a volume's node affinity names, as upstream reads them: each term whose
/// expressions are all `In` with one value (and no field matches) is a segment. A volume
/// without affinity names none (every segment of its class may have changed).
pub fn affinity_segments(
    affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>,
) -> Vec<Segment> {
    let terms = affinity
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    terms
        .iter()
        .filter(|t| t.match_fields.as_ref().is_none_or(Vec::is_empty))
        .filter_map(|t| {
            t.match_expressions
                .as_ref()?
                .iter()
                .map(|e| match e.values.as_deref() {
                    Some([value]) if e.operator == "In" => Some((e.key.clone(), value.clone())),
                    _ => None,
                })
                .collect::<Option<Segment>>()
        })
        .collect()
}

/// The items a provisioned or deleted volume of `class` makes stale: those of its segments,
/// of every class (classes often share the driver's pool there), or every item of its class
/// when the volume names no segment; as upstream.
pub fn stale_items<'a>(
    wanted: impl IntoIterator<Item = &'a Item>,
    class: &str,
    segments: &[Segment],
) -> Vec<Item> {
    wanted
        .into_iter()
        .filter(|i| {
            if segments.is_empty() {
                i.class == class
            } else {
                segments.contains(&i.segment)
            }
        })
        .cloned()
        .collect()
}

/// How long until an item is polled again. Every item has a fixed phase in the poll cycle (a
/// hash of the item), so polls are spread evenly over the interval instead of coming in a
/// burst; the next poll is the next time the cycle reaches the phase at least half an interval
/// from now (a refresh just made is not followed at once by a poll).
pub fn next_poll(
    item: &Item,
    since_start: std::time::Duration,
    interval: std::time::Duration,
) -> std::time::Duration {
    use std::hash::{Hash, Hasher};
    let period = interval.as_millis().max(1);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    item.hash(&mut hasher);
    let phase = u128::from(hasher.finish()) % period;
    let now = since_start.as_millis();
    let earliest = now + period / 2;
    let cycle = earliest / period;
    let mut at = cycle * period + phase;
    if at < earliest {
        at += period;
    }
    std::time::Duration::from_millis(u64::try_from(at - now).unwrap_or(u64::MAX))
}

/// The object for a (segment, class).
pub fn capacity_object(template: &Template, wanted: &Wanted) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            generate_name: Some("csisc-".into()),
            namespace: Some(template.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_DRIVER.to_string(), template.driver.clone()),
                (LABEL_MANAGED_BY.to_string(), template.managed_by.clone()),
            ])),
            owner_references: template.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        storage_class_name: wanted.class.clone(),
        node_topology: Some(LabelSelector {
            match_labels: Some(wanted.segment.clone()),
            match_expressions: None,
        }),
        capacity: Some(quantity(wanted.capacity)),
        maximum_volume_size: wanted.maximum.map(quantity),
    }
}

/// Decides the changes that leave exactly one object per wanted (segment, class) with its
/// values: objects are created when missing (also when someone else deleted them), updated
/// only when a value changed, deleted when obsolete or repeated. Objects that are not ours are
/// left alone.
pub fn reconcile(
    template: &Template,
    existing: &[&CSIStorageCapacity],
    wanted: &[Wanted],
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut seen: BTreeMap<(String, Segment), &CSIStorageCapacity> = BTreeMap::new();
    let mut sorted: Vec<&&CSIStorageCapacity> =
        existing.iter().filter(|o| ours(o, template)).collect();
    sorted.sort_by_key(|o| o.metadata.name.clone());
    for object in sorted {
        let name = object.metadata.name.clone().unwrap_or_default();
        match seen.entry(key_of(object)) {
            std::collections::btree_map::Entry::Occupied(_) => actions.push(Action::Delete(name)),
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(object);
            }
        }
    }
    let wanted_keys: BTreeSet<(String, Segment)> = wanted
        .iter()
        .map(|w| (w.class.clone(), w.segment.clone()))
        .collect();
    for (key, object) in &seen {
        if !wanted_keys.contains(key) {
            actions.push(Action::Delete(
                object.metadata.name.clone().unwrap_or_default(),
            ));
        }
    }
    for w in wanted {
        match seen.get(&(w.class.clone(), w.segment.clone())) {
            None => actions.push(Action::Create(Box::new(capacity_object(template, w)))),
            Some(object) => {
                let same = bytes(object.capacity.as_ref()) == Some(w.capacity)
                    && bytes(object.maximum_volume_size.as_ref()) == w.maximum;
                let owners = template.owner.as_ref().and_then(|owner| {
                    let refs = object.metadata.owner_references.clone().unwrap_or_default();
                    let owned = refs
                        .iter()
                        .any(|r| r.controller == Some(true) && r.uid == owner.uid);
                    (!owned).then(|| {
                        let mut refs = refs;
                        refs.push(owner.clone());
                        refs
                    })
                });
                if !same || owners.is_some() {
                    actions.push(Action::Update {
                        name: object.metadata.name.clone().unwrap_or_default(),
                        capacity: quantity(w.capacity),
                        maximum: w.maximum.map(quantity),
                        owners,
                    });
                }
            }
        }
    }
    actions
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
