//! Pure decisions of storage-capacity tracking (`--enable-capacity`, central mode): the
//! topology segments of the driver, the classes tracked, and what to do with the
//! CSIStorageCapacity objects so that there is exactly one per (segment, class) holding the
//! driver's latest GetCapacity answer. The I/O (GetCapacity, API writes) is not wired yet:
//! `--enable-capacity` is still refused with a message naming it.

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
    let mut out: BTreeSet<Segment> = BTreeSet::new();
    for csinode in csinodes {
        let Some(entry) = csinode.spec.drivers.iter().find(|d| d.name == driver) else {
            continue;
        };
        let keys = entry.topology_keys.clone().unwrap_or_default();
        if keys.is_empty() {
            out.insert(Segment::new());
            continue;
        }
        let Some(node) = nodes
            .iter()
            .find(|n| n.metadata.name == csinode.metadata.name)
        else {
            continue;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
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
    /// Segment.
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

fn key_of(object: &CSIStorageCapacity) -> (String, Segment) {
    let segment = object
        .node_topology
        .as_ref()
        .and_then(|t| t.match_labels.clone())
        .unwrap_or_default();
    (object.storage_class_name.clone(), segment)
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
                if !same {
                    actions.push(Action::Update {
                        name: object.metadata.name.clone().unwrap_or_default(),
                        capacity: quantity(w.capacity),
                        maximum: w.maximum.map(quantity),
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
