//! CreateVolume accessibility requirements, following the upstream table:
//!
//! | binding   | strict | allowedTopologies | requisite                | preferred                        |
//! |-----------|--------|-------------------|--------------------------|----------------------------------|
//! | late      | yes    | any               | selected node's segment  | same                             |
//! | late      | no     | no                | cluster aggregate        | requisite, selected segment first |
//! | late      | no     | yes               | allowed, flattened       | requisite, selected segment first |
//! | immediate | -      | no                | cluster aggregate (only with --immediate-topology) | requisite rotated by claim-name hash |
//! | immediate | -      | yes               | allowed, flattened       | requisite rotated by claim-name hash |
//!
//! The cluster aggregate is the segments of the nodes whose CSINode lists the driver (the
//! design's "nodes that contain a node ID from the driver"; upstream's code takes every node
//! with the labels). Terms are sorted (shorter first) and de-duplicated; the errors are
//! upstream's, word for word (but [`TopologyError::EmptyValues`], ours for a class
//! kube-apiserver refuses); StatefulSet claims (`<claim>-<set>-<N>`) hash the set
//! name and add N so that replicas spread over segments.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TopologySelectorTerm;

/// One topology segment: key to value.
pub type Segment = BTreeMap<String, String>;

/// What the provisioner knows about one node: its CSINode topology keys for our driver and
/// its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTopology {
    /// Node name.
    pub name: String,
    /// `CSINode.spec.drivers[ours].topologyKeys`; None when the CSINode does not list the driver.
    pub keys: Option<Vec<String>>,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeTopology {
    /// The node's segment for the given keys, if it has a label for every key.
    fn segment_for(&self, keys: &[String]) -> Option<Segment> {
        keys.iter()
            .map(|k| self.labels.get(k).map(|v| (k.clone(), v.clone())))
            .collect()
    }
}

/// Why no requirement can be computed. The claim is retried; the reason goes into an event,
/// worded as upstream's (Go's `%v` of its maps, lists and terms: [`go_map`], [`go_terms`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node's CSINode does not list the driver, or lists no topology keys for it.
    #[error("no topology key found for node {0}")]
    NoTopologyKeys(String),
    /// The selected node lacks a label for one of the keys (a Node not known has no labels).
    #[error(
        "topology labels from selected node {} does not match topology keys from CSINode [{}]",
        go_map(labels),
        keys.join(" ")
    )]
    MissingLabel {
        /// The selected node's labels, all of them.
        labels: BTreeMap<String, String>,
        /// The topology keys its CSINode lists for the driver.
        keys: Vec<String>,
    },
    /// `--strict-topology`: the selected node's segment is outside the class's
    /// allowedTopologies.
    #[error(
        "selected node '\"{node}\"' topology '{}' is not in allowed topologies: {}",
        go_term(topology),
        go_terms(allowed)
    )]
    NotAllowed {
        /// The node the scheduler selected.
        node: String,
        /// Its segment.
        topology: Segment,
        /// allowedTopologies flattened, in upstream's order.
        allowed: Vec<Segment>,
    },
    /// No requisite segment fits the selected node's (allowedTopologies that leave it out).
    #[error(
        "topology {} from selected node \"{node}\" is not in requisite: {}",
        go_term(topology),
        go_terms(requisite)
    )]
    NotInRequisite {
        /// The node the scheduler selected.
        node: String,
        /// Its segment.
        topology: Segment,
        /// The requisite, sorted.
        requisite: Vec<Segment>,
    },
    /// Immediate binding with `--immediate-topology` and no allowedTopologies, and no node's
    /// CSINode lists topology keys for the driver (it runs on no node yet).
    #[error("no available topology found")]
    NoAvailableTopology,
    /// As above, keys were found but no node has a label for each of them.
    #[error("topologyKeys [{}] were not found on any nodes", .0.join(" "))]
    KeysOnNoNode(Vec<String>),
    /// An allowedTopologies expression without values (kube-apiserver refuses such a class).
    #[error("StorageClass allowedTopologies has an expression for {0:?} without values")]
    EmptyValues(String),
}

/// The topology keys `csinode` lists for `driver` (none given is none); None when it does not
/// list the driver.
pub fn driver_topology_keys(
    csinode: &k8s_openapi::api::storage::v1::CSINode,
    driver: &str,
) -> Option<Vec<String>> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.topology_keys.clone().unwrap_or_default())
}

/// Go's `%v` of a `map[string]string`: `map[k1:v1 k2:v2]`, keys sorted.
pub fn go_map(map: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", pairs.join(" "))
}

/// Go's `%v` of upstream's topology term (a list of key/value structs sorted by key):
/// `[{k1 v1} {k2 v2}]`.
pub fn go_term(segment: &Segment) -> String {
    let pairs: Vec<String> = segment
        .iter()
        .map(|(k, v)| format!("{{{k} {v}}}"))
        .collect();
    format!("[{}]", pairs.join(" "))
}

/// Go's `%v` of a list of terms: `[[{k v}] [{k v2}]]`.
pub fn go_terms(segments: &[Segment]) -> String {
    let terms: Vec<String> = segments.iter().map(go_term).collect();
    format!("[{}]", terms.join(" "))
}

/// The inputs of [`accessibility_requirements`].
#[derive(Debug, Clone, Copy)]
pub struct TopologyInput<'a> {
    /// WaitForFirstConsumer with a selected node.
    pub selected: Option<&'a NodeTopology>,
    /// `--strict-topology`.
    pub strict: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// The class's allowedTopologies.
    pub allowed: &'a [TopologySelectorTerm],
    /// Every node (for the aggregate).
    pub cluster: &'a [NodeTopology],
    /// Claim name (for the immediate-binding hash).
    pub claim_name: &'a str,
}

/// `(requisite, preferred)`.
pub type Requirement = (Vec<Segment>, Vec<Segment>);

/// Flattens allowedTopologies in upstream's order (not sorted, repeats kept: see
/// [`sort_terms`]): each term is the cartesian product of its expressions' values, the values
/// of a later expression outermost.
pub fn flatten_allowed(terms: &[TopologySelectorTerm]) -> Result<Vec<Segment>, TopologyError> {
    let mut out = Vec::new();
    for term in terms {
        let mut segments: Vec<Segment> = Vec::new();
        for expr in term.match_label_expressions.iter().flatten() {
            if expr.values.is_empty() {
                return Err(TopologyError::EmptyValues(expr.key.clone()));
            }
            segments = match segments.is_empty() {
                true => expr
                    .values
                    .iter()
                    .map(|v| Segment::from([(expr.key.clone(), v.clone())]))
                    .collect(),
                false => expr
                    .values
                    .iter()
                    .flat_map(|v| {
                        segments.iter().map(move |seg| {
                            let mut s = seg.clone();
                            s.insert(expr.key.clone(), v.clone());
                            s
                        })
                    })
                    .collect(),
            };
        }
        out.extend(segments);
    }
    Ok(out)
}

/// Sorts and de-duplicates terms as upstream does: shorter terms first, then key by key and
/// value by value. Empty terms are dropped (upstream leaves them out of the request).
pub fn sort_terms(mut terms: Vec<Segment>) -> Vec<Segment> {
    terms.retain(|t| !t.is_empty());
    terms.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.iter().cmp(b.iter())));
    terms.dedup();
    terms
}

/// The segments of every node whose CSINode lists the driver and that has all `keys`.
pub fn aggregate(cluster: &[NodeTopology], keys: &[String]) -> Vec<Segment> {
    let segments = cluster
        .iter()
        .filter(|n| n.keys.is_some())
        .filter_map(|n| n.segment_for(keys))
        .collect();
    sort_terms(segments)
}

/// The selected node's topology keys and its segment for them.
fn selected_segment(node: &NodeTopology) -> Result<(Vec<String>, Segment), TopologyError> {
    let keys = match &node.keys {
        Some(keys) if !keys.is_empty() => keys.clone(),
        _ => return Err(TopologyError::NoTopologyKeys(node.name.clone())),
    };
    match node.segment_for(&keys) {
        Some(segment) => Ok((keys, segment)),
        None => Err(TopologyError::MissingLabel {
            labels: node.labels.clone(),
            keys,
        }),
    }
}

fn is_subset(term: &Segment, of: &Segment) -> bool {
    term.iter().all(|(k, v)| of.get(k) == Some(v))
}

/// 32-bit FNV-1 (Go's `hash/fnv.New32`, which upstream uses): multiply, then XOR.
pub fn fnv1_32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash = hash.wrapping_mul(0x0100_0193);
        hash ^= u32::from(*b);
    }
    hash
}

/// The rotation for immediate binding, as upstream (and in-tree) computes it: a name ending in
/// `-<N>` (N a base-10 u32) hashes what precedes that dash, narrowed to the part after the
/// dash before it (`<claim>-<set>-<N>` hashes `<set>`), and adds N, so the replicas of a
/// StatefulSet land on consecutive segments; other names hash the whole name.
pub fn claim_rotation(claim_name: &str) -> u32 {
    let indexed = claim_name.rfind('-').and_then(|dash| {
        let suffix = &claim_name[dash + 1..];
        let digits = !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit());
        let index = if digits {
            suffix.parse::<u32>().ok()
        } else {
            None
        }?;
        let prefix = &claim_name[..dash];
        let base = prefix.rfind('-').map_or(prefix, |d| &prefix[d + 1..]);
        Some((base, index))
    });
    match indexed {
        Some((base, index)) => fnv1_32(base.as_bytes()).wrapping_add(index),
        None => fnv1_32(claim_name.as_bytes()),
    }
}

fn rotate(mut terms: Vec<Segment>, by: usize) -> Vec<Segment> {
    if !terms.is_empty() {
        let n = by % terms.len();
        terms.rotate_left(n);
    }
    terms
}

/// Computes `(requisite, preferred)`, or None when the request carries no topology.
pub fn accessibility_requirements(
    input: &TopologyInput<'_>,
) -> Result<Option<Requirement>, TopologyError> {
    // As upstream, a class that names allowedTopologies uses them, even when its terms
    // flatten to nothing (terms without expressions, which kube-apiserver accepts): then no
    // segment fits a strict selected node, and the request carries no topology otherwise.
    let names_allowed = !input.allowed.is_empty();
    let allowed = flatten_allowed(input.allowed)?;
    match input.selected {
        Some(node) => {
            let (keys, selected) = selected_segment(node)?;
            if input.strict {
                if names_allowed && !allowed.iter().any(|t| is_subset(t, &selected)) {
                    return Err(TopologyError::NotAllowed {
                        node: node.name.clone(),
                        topology: selected,
                        allowed,
                    });
                }
                return Ok(Some((vec![selected.clone()], vec![selected])));
            }
            let requisite = match names_allowed {
                false => {
                    // No node with the keys (the selected one left the cache meanwhile):
                    // upstream's error, never a volume without a requirement.
                    let all = aggregate(input.cluster, &keys);
                    if all.is_empty() {
                        return Err(TopologyError::KeysOnNoNode(keys));
                    }
                    all
                }
                true => sort_terms(allowed),
            };
            if requisite.is_empty() {
                return Ok(None);
            }
            let first = requisite.iter().position(|t| is_subset(t, &selected));
            let Some(first) = first else {
                return Err(TopologyError::NotInRequisite {
                    node: node.name.clone(),
                    topology: selected,
                    requisite,
                });
            };
            let preferred = rotate(requisite.clone(), first);
            Ok(Some((requisite, preferred)))
        }
        None => {
            let requisite = if names_allowed {
                sort_terms(allowed)
            } else if input.immediate_topology {
                // Upstream waits (an error, retried) until the driver runs on a node with
                // its topology: a volume made without it might be reachable from nowhere.
                let keys: Vec<String> = input
                    .cluster
                    .iter()
                    .filter_map(|n| n.keys.clone())
                    .find(|k| !k.is_empty())
                    .ok_or(TopologyError::NoAvailableTopology)?;
                let all = aggregate(input.cluster, &keys);
                if all.is_empty() {
                    return Err(TopologyError::KeysOnNoNode(keys));
                }
                all
            } else {
                Vec::new()
            };
            if requisite.is_empty() {
                return Ok(None);
            }
            let shift = claim_rotation(input.claim_name) as usize;
            let preferred = rotate(requisite.clone(), shift);
            Ok(Some((requisite, preferred)))
        }
    }
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
