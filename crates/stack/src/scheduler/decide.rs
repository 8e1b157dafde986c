//! What kube-scheduler's volume binding and volume limits decide for a Pod, as pure functions:
//! which nodes fit its claims and why the others do not, which node to pick, and the
//! `FailedScheduling` message. The wording of the reasons and of the message is
//! kube-scheduler's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, CSIStorageCapacity, StorageClass};
use sidecar_kit::quantity::parse_bytes;
use sidecar_kit::selectors::{
    Labels, affinity_allows, allowed_topologies_admit, label_selector_matches,
};
pub use sidecar_kit::vocabulary::ANN_SELECTED_NODE;

/// Why a node does not fit (kube-scheduler's words).
pub const AFFINITY_CONFLICT: &str = "node(s) had volume node affinity conflict";
/// A class that does not admit the node, or a claim selected for another node.
pub const NO_VOLUMES: &str = "node(s) didn't find available persistent volumes to bind";
/// No CSIStorageCapacity of the node's segment holds the claim.
pub const NOT_ENOUGH_STORAGE: &str = "node(s) did not have enough free storage";
/// The Pod's `nodeSelector` does not select the node.
pub const NODE_SELECTOR: &str = "node(s) didn't match Pod's node affinity/selector";
/// The driver's volume limit on the node (CSINode allocatable count) would be exceeded.
pub const MAX_VOLUME_COUNT: &str = "node(s) exceed max volume count";

/// The world a decision reads: the caches.
pub struct World<'a> {
    /// Nodes.
    pub nodes: &'a [&'a Node],
    /// Claims by (namespace, name).
    pub claims: &'a BTreeMap<(String, String), &'a PersistentVolumeClaim>,
    /// PVs by name.
    pub volumes: &'a BTreeMap<String, &'a PersistentVolume>,
    /// Classes by name.
    pub classes: &'a BTreeMap<String, &'a StorageClass>,
    /// CSIStorageCapacity objects (any namespace).
    pub capacities: &'a [&'a CSIStorageCapacity],
    /// CSIDrivers by name.
    pub drivers: &'a BTreeMap<String, &'a CSIDriver>,
    /// CSINodes by name.
    pub csinodes: &'a BTreeMap<String, &'a CSINode>,
    /// Claims already used by Pods on each node (unique claims, by driver).
    pub in_use: &'a BTreeMap<String, BTreeMap<String, usize>>,
}

/// Objects by name (cluster-scoped kinds).
pub fn by_name<'a, K: kube::Resource + 'a>(
    items: impl IntoIterator<Item = &'a K>,
) -> BTreeMap<String, &'a K> {
    items
        .into_iter()
        .map(|o| (o.meta().name.clone().unwrap_or_default(), o))
        .collect()
}

/// Objects by (namespace, name).
pub fn by_namespaced_name<'a, K: kube::Resource + 'a>(
    items: impl IntoIterator<Item = &'a K>,
) -> BTreeMap<(String, String), &'a K> {
    items
        .into_iter()
        .map(|o| {
            let meta = o.meta();
            (
                (
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
                o,
            )
        })
        .collect()
}

/// Unique claims of the Pods assigned to each node, by driver (for the volume limit).
pub fn volumes_in_use<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    claims: &BTreeMap<(String, String), &PersistentVolumeClaim>,
    classes: &BTreeMap<String, &StorageClass>,
) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut seen: BTreeMap<String, BTreeMap<String, std::collections::BTreeSet<(String, String)>>> =
        BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        // Its claims, generic ephemeral volumes' included; an in-tree class counts for the CSI
        // driver that stands in for its plugin.
        for claim in sidecar_kit::vocabulary::pod_claim_names(pod) {
            let key = (namespace.clone(), claim);
            let driver = claims
                .get(&key)
                .and_then(|c| c.spec.as_ref()?.storage_class_name.clone())
                .and_then(|class| classes.get(&class).map(|c| c.provisioner.clone()))
                .map(|provisioner| sidecar_kit::migration::driver_of(&provisioner).to_string());
            if let Some(driver) = driver {
                seen.entry(node.clone())
                    .or_default()
                    .entry(driver)
                    .or_default()
                    .insert(key);
            }
        }
    }
    seen.into_iter()
        .map(|(node, drivers)| {
            (
                node,
                drivers.into_iter().map(|(d, c)| (d, c.len())).collect(),
            )
        })
        .collect()
}

/// What the scheduler does with a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing: assigned, being deleted, or another scheduler's.
    Skip,
    /// The Pod cannot be scheduled now; the message goes into a `FailedScheduling` event.
    Unschedulable(String),
    /// Put the node on these claims (late binding, not selected yet) and pre-bind the static
    /// volumes chosen for the others, then wait for them.
    Select {
        /// The node.
        node: String,
        /// Claim names to annotate.
        claims: Vec<String>,
        /// (claim, volume): static volumes on the node to pre-bind to claims (the PV
        /// controller completes the binding).
        bind: Vec<(String, String)>,
    },
    /// Claims are being provisioned for the node: wait.
    WaitForClaims(String),
    /// Every claim is bound: bind the Pod to the node.
    Bind(String),
}

/// A claim of the Pod, as the scheduler sees it.
struct Use<'a> {
    claim: &'a PersistentVolumeClaim,
    class: Option<&'a StorageClass>,
    bound: Option<&'a PersistentVolume>,
}

fn labels(node: &Node) -> Labels {
    node.metadata.labels.clone().unwrap_or_default()
}

fn late_binding(class: Option<&StorageClass>) -> bool {
    class.is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

fn selected(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_SELECTED_NODE)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The largest volume a CSIStorageCapacity promises: maximumVolumeSize, else capacity.
fn limit(capacity: &CSIStorageCapacity) -> Option<i64> {
    capacity
        .maximum_volume_size
        .as_ref()
        .or(capacity.capacity.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
}

/// Whether the node has room for a new volume of the claim: checked only when the class's
/// driver asks for it (CSIDriver `storageCapacity: true`); then some CSIStorageCapacity of
/// the class whose topology selects the node must promise at least the request.
fn has_capacity(
    world: &World,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &Labels,
) -> bool {
    let Some(size) = sidecar_kit::quantity::claim_request_bytes(claim) else {
        return true;
    };
    let checked = world
        .drivers
        .get(&class.provisioner)
        .and_then(|d| d.spec.storage_capacity)
        .unwrap_or(false);
    if !checked {
        return true;
    }
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    world.capacities.iter().any(|c| {
        c.storage_class_name == class_name
            && c.node_topology
                .as_ref()
                .is_some_and(|t| label_selector_matches(t, node))
            && limit(c).is_some_and(|l| l >= size)
    })
}

use sidecar_kit::vocabulary::NO_PROVISIONER;

/// Whether `pv` is pre-bound to `claim`: its claimRef names the claim's namespace and name, and
/// its UID when the claimRef has one (kube-scheduler's IsVolumeBoundToClaim: a claim re-made
/// under the name is another claim).
pub fn bound_to(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.namespace == claim.metadata.namespace
                && r.name == claim.metadata.name
                && r.uid
                    .as_deref()
                    .is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref())
        })
}

/// The volume pre-bound to the claim, as kube-scheduler's volume binding writes it (the claim's
/// reference and `pv.kubernetes.io/bound-by-controller`); `None` when it already is.
pub fn pre_bound(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> Option<PersistentVolume> {
    if bound_to(pv, claim) {
        return None;
    }
    let mut bound = pv.clone();
    bound.spec.get_or_insert_with(Default::default).claim_ref =
        Some(sidecar_kit::vocabulary::reference(claim));
    bound
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            sidecar_kit::vocabulary::ANN_BOUND_BY_CONTROLLER.into(),
            "yes".into(),
        );
    Some(bound)
}

/// A static volume for a late-binding claim on a node, as kube-scheduler's volume binding
/// finds one: the volume already pre-bound to the claim, else the smallest Available volume of
/// its class that holds it (size, access modes, volume mode, selector) and whose node affinity
/// admits the node, not `taken` by another claim of the Pod.
fn static_volume<'a>(
    world: &World<'a>,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &Labels,
    taken: &[&str],
) -> Option<&'a PersistentVolume> {
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    let want = sidecar_kit::quantity::claim_request_bytes(claim).unwrap_or(0);
    let claim_ref_is = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .map(|_| bound_to(pv, claim))
    };
    let fits = |pv: &&&'a PersistentVolume| {
        let Some(s) = pv.spec.as_ref() else {
            return false;
        };
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let free = match claim_ref_is(pv) {
            Some(mine) => mine,
            None => pv.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Available"),
        };
        free && !taken.contains(&name)
            && pv.metadata.deletion_timestamp.is_none()
            && s.storage_class_name.as_deref().unwrap_or_default() == class_name
            && s.capacity
                .as_ref()
                .and_then(|c| c.get("storage"))
                .and_then(|q| parse_bytes(&q.0).ok())
                .is_some_and(|have| have >= want)
            && spec
                .access_modes
                .iter()
                .flatten()
                .all(|m| s.access_modes.iter().flatten().any(|p| p == m))
            && spec.volume_mode.as_deref().unwrap_or("Filesystem")
                == s.volume_mode.as_deref().unwrap_or("Filesystem")
            && spec.selector.as_ref().is_none_or(|sel| {
                label_selector_matches(sel, &pv.metadata.labels.clone().unwrap_or_default())
            })
            && affinity_allows(s.node_affinity.as_ref(), node)
    };
    let size = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| parse_bytes(&q.0).ok())
            .unwrap_or(0)
    };
    let candidates: Vec<&&'a PersistentVolume> = world.volumes.values().filter(fits).collect();
    candidates
        .iter()
        .find(|pv| claim_ref_is(pv) == Some(true))
        .or_else(|| {
            candidates.iter().min_by(|a, b| {
                size(a)
                    .cmp(&size(b))
                    .then_with(|| a.metadata.name.cmp(&b.metadata.name))
            })
        })
        .map(|pv| **pv)
}

/// The static volumes the Pod's unbound claims take on `node`, by claim name.
fn static_volumes<'a>(
    world: &World<'a>,
    uses: &[Use],
    node: &Node,
) -> BTreeMap<String, &'a PersistentVolume> {
    let node_labels = labels(node);
    let mut chosen: BTreeMap<String, &'a PersistentVolume> = BTreeMap::new();
    // A claim that names its volume is not the scheduler's to give one.
    let names_none = |u: &&Use| {
        u.claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
    };
    for u in uses.iter().filter(|u| u.bound.is_none()).filter(names_none) {
        let Some(class) = u.class else { continue };
        let taken: Vec<&str> = chosen
            .values()
            .filter_map(|pv| pv.metadata.name.as_deref())
            .collect();
        if let Some(pv) = static_volume(world, u.claim, class, &node_labels, &taken) {
            chosen.insert(u.claim.metadata.name.clone().unwrap_or_default(), pv);
        }
    }
    chosen
}

/// Why `node` does not fit the Pod's claims, or None when it fits.
fn misfit(world: &World, uses: &[Use], node: &Node) -> Option<&'static str> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let node_labels = labels(node);
    let mut new_by_driver: BTreeMap<&str, usize> = BTreeMap::new();
    let statics = static_volumes(world, uses, node);
    for u in uses {
        if let Some(pv) = u.bound {
            let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
            if !affinity_allows(affinity, &node_labels) {
                return Some(AFFINITY_CONFLICT);
            }
            continue;
        }
        let Some(class) = u.class else {
            return Some(NO_VOLUMES);
        };
        if statics.contains_key(u.claim.metadata.name.as_deref().unwrap_or_default()) {
            continue;
        }
        if class.provisioner == NO_PROVISIONER {
            return Some(NO_VOLUMES);
        }
        if let Some(chosen) = selected(u.claim)
            && chosen != name
        {
            return Some(NO_VOLUMES);
        }
        let allowed = class.allowed_topologies.as_deref().unwrap_or_default();
        if !allowed_topologies_admit(allowed, &node_labels) {
            return Some(NO_VOLUMES);
        }
        if !has_capacity(world, u.claim, class, &node_labels) {
            return Some(NOT_ENOUGH_STORAGE);
        }
        // An in-tree class counts for the CSI driver that stands in for its plugin.
        let driver = sidecar_kit::migration::driver_of(&class.provisioner);
        *new_by_driver.entry(driver).or_default() += 1;
    }
    let csinode = world.csinodes.get(name);
    for (driver, new) in new_by_driver {
        let count = csinode
            .and_then(|c| c.spec.drivers.iter().find(|d| d.name == driver))
            .and_then(|d| d.allocatable.as_ref())
            .and_then(|a| a.count);
        let used = world
            .in_use
            .get(name)
            .and_then(|m| m.get(driver))
            .copied()
            .unwrap_or(0);
        if let Some(count) = count
            && used + new > usize::try_from(count).unwrap_or(0)
        {
            return Some(MAX_VOLUME_COUNT);
        }
    }
    None
}

/// kube-scheduler's message: `0/N nodes are available: ` and the counted reasons, sorted.
pub fn unschedulable_message(nodes: usize, reasons: &BTreeMap<&str, usize>) -> String {
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{nodes} nodes are available: {}.", parts.join(", "))
}

/// Decides what to do with a Pod.
pub fn plan(world: &World, pod: &Pod) -> Plan {
    let spec = pod.spec.as_ref();
    let assigned = spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let ours = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .is_none_or(|s| s.is_empty() || s == "default-scheduler");
    if assigned || !ours || pod.metadata.deletion_timestamp.is_some() {
        return Plan::Skip;
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut uses = Vec::new();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    for volume in spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default() {
        // A generic ephemeral volume is a claim like any other (`<pod>-<volume>`), once its
        // controller made it, and only if the Pod owns it.
        let (claim_name, ephemeral) = match (&volume.persistent_volume_claim, &volume.ephemeral) {
            (Some(source), _) => (source.claim_name.clone(), false),
            (None, Some(_)) => (format!("{pod_name}-{}", volume.name), true),
            (None, None) => continue,
        };
        let Some(claim) = world.claims.get(&(namespace.clone(), claim_name.clone())) else {
            return Plan::Unschedulable(format!(
                "persistentvolumeclaim \"{claim_name}\" not found"
            ));
        };
        if ephemeral && !sidecar_kit::vocabulary::claim_is_for_pod(claim, pod) {
            return Plan::Unschedulable(format!(
                "PVC {namespace}/{claim_name} was not created for pod {namespace}/{pod_name} (pod is not owner)"
            ));
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return Plan::Unschedulable(format!(
                "persistentvolumeclaim \"{claim_name}\" is being deleted"
            ));
        }
        let class_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone());
        let class = class_name
            .as_ref()
            .and_then(|n| world.classes.get(n).copied());
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        let bound = volume_name.and_then(|v| world.volumes.get(v).copied());
        if volume_name.is_none() && !late_binding(class) {
            return Plan::Unschedulable(format!(
                "0/{} nodes are available: pod has unbound immediate PersistentVolumeClaims.",
                world.nodes.len()
            ));
        }
        uses.push(Use {
            claim,
            class,
            bound,
        });
    }
    // Claims already selected for a node and being provisioned: wait for them, or bind.
    let chosen: Vec<&str> = uses
        .iter()
        .filter(|u| u.bound.is_none())
        .filter_map(|u| selected(u.claim))
        .collect();
    let waiting = uses.iter().any(|u| u.bound.is_none());
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    // Nodes in the order given (by name): the first that fits is chosen, so a Pod lands on
    // another node only when the first ones cannot hold it.
    let mut fits: Vec<&Node> = Vec::new();
    let node_selector = spec
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    for node in world.nodes {
        let node_labels = labels(node);
        if node_selector
            .iter()
            .any(|(k, v)| node_labels.get(k) != Some(v))
        {
            *reasons.entry(NODE_SELECTOR).or_default() += 1;
            continue;
        }
        match misfit(world, &uses, node) {
            Some(reason) => *reasons.entry(reason).or_default() += 1,
            None => fits.push(node),
        }
    }
    if let Some(first) = chosen.first()
        && chosen.iter().all(|c| c == first)
        && uses
            .iter()
            .filter(|u| u.bound.is_none())
            .all(|u| selected(u.claim).is_some())
    {
        return Plan::WaitForClaims(first.to_string());
    }
    if !waiting {
        // Every claim bound (or none): the node the claims were provisioned for, else any
        // node their volumes allow.
        let provisioned_for = uses.iter().find_map(|u| selected(u.claim));
        let pick = fits
            .iter()
            .find(|n| n.metadata.name.as_deref() == provisioned_for)
            .or(fits.first());
        return match pick {
            Some(node) => Plan::Bind(node.metadata.name.clone().unwrap_or_default()),
            None => Plan::Unschedulable(unschedulable_message(world.nodes.len(), &reasons)),
        };
    }
    match fits.first() {
        None => Plan::Unschedulable(unschedulable_message(world.nodes.len(), &reasons)),
        Some(node) => {
            let statics = static_volumes(world, &uses, node);
            Plan::Select {
                node: node.metadata.name.clone().unwrap_or_default(),
                claims: uses
                    .iter()
                    .filter(|u| u.bound.is_none() && selected(u.claim).is_none())
                    .filter_map(|u| u.claim.metadata.name.clone())
                    .filter(|c| !statics.contains_key(c))
                    .collect(),
                bind: statics
                    .into_iter()
                    .map(|(claim, pv)| (claim, pv.metadata.name.clone().unwrap_or_default()))
                    .collect(),
            }
        }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
