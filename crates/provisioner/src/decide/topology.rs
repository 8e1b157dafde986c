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
//! Terms are sorted and de-duplicated; StatefulSet claims (`<claim>-<set>-<N>`) hash the set
//! name and add N so that replicas spread over segments.

use std::collections::{BTreeMap, BTreeSet};

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

/// Why no requirement can be computed. The claim is retried; the reason goes into an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node has no CSINode entry for the driver.
    #[error(
        "selected node {0:?} has no CSINode entry for this driver yet (is the driver running there?)"
    )]
    NoCsiNode(String),
    /// The selected node lacks a topology label.
    #[error("selected node {node:?} has no label {key:?}, a topology key of this driver")]
    MissingLabel {
        /// The node the scheduler selected.
        node: String,
        /// The topology key the node lacks.
        key: String,
    },
    /// The selected node is outside the class's allowedTopologies.
    #[error("selected node {0:?} is not in the StorageClass allowedTopologies")]
    NotAllowed(String),
    /// An allowedTopologies expression without values.
    #[error("StorageClass allowedTopologies has an expression for {0:?} without values")]
    EmptyValues(String),
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

/// Flattens allowedTopologies: each term is the cartesian product of its expressions' values.
pub fn flatten_allowed(terms: &[TopologySelectorTerm]) -> Result<Vec<Segment>, TopologyError> {
    let mut out = BTreeSet::new();
    for term in terms {
        let mut segments = vec![Segment::new()];
        for expr in term.match_label_expressions.iter().flatten() {
            if expr.values.is_empty() {
                return Err(TopologyError::EmptyValues(expr.key.clone()));
            }
            segments = segments
                .into_iter()
                .flat_map(|seg| {
                    expr.values.iter().map(move |v| {
                        let mut s = seg.clone();
                        s.insert(expr.key.clone(), v.clone());
                        s
                    })
                })
                .collect();
        }
        out.extend(segments.into_iter().filter(|s| !s.is_empty()));
    }
    Ok(out.into_iter().collect())
}

/// The segments of every node whose CSINode lists the driver and that has all `keys`.
pub fn aggregate(cluster: &[NodeTopology], keys: &[String]) -> Vec<Segment> {
    let set: BTreeSet<Segment> = cluster
        .iter()
        .filter(|n| n.keys.is_some())
        .filter_map(|n| n.segment_for(keys))
        .filter(|s| !s.is_empty())
        .collect();
    set.into_iter().collect()
}

fn selected_segment(node: &NodeTopology) -> Result<Segment, TopologyError> {
    let keys = node
        .keys
        .as_ref()
        .ok_or_else(|| TopologyError::NoCsiNode(node.name.clone()))?;
    let mut seg = Segment::new();
    for key in keys {
        let value = node
            .labels
            .get(key)
            .ok_or_else(|| TopologyError::MissingLabel {
                node: node.name.clone(),
                key: key.clone(),
            })?;
        seg.insert(key.clone(), value.clone());
    }
    Ok(seg)
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
    let allowed = flatten_allowed(input.allowed)?;
    match input.selected {
        Some(node) => {
            let selected = selected_segment(node)?;
            if input.strict {
                if !allowed.is_empty() && !allowed.iter().any(|t| is_subset(t, &selected)) {
                    return Err(TopologyError::NotAllowed(node.name.clone()));
                }
                return Ok(Some((vec![selected.clone()], vec![selected])));
            }
            let requisite = if allowed.is_empty() {
                let keys: Vec<String> = selected.keys().cloned().collect();
                let mut all = aggregate(input.cluster, &keys);
                if !all.contains(&selected) {
                    all.push(selected.clone());
                    all.sort();
                }
                all
            } else {
                allowed
            };
            let first = requisite.iter().position(|t| is_subset(t, &selected));
            let Some(first) = first else {
                return Err(TopologyError::NotAllowed(node.name.clone()));
            };
            let preferred = rotate(requisite.clone(), first);
            Ok(Some((requisite, preferred)))
        }
        None => {
            let requisite = if !allowed.is_empty() {
                allowed
            } else if input.immediate_topology {
                let keys: Vec<String> = input
                    .cluster
                    .iter()
                    .filter_map(|n| n.keys.clone())
                    .find(|k| !k.is_empty())
                    .unwrap_or_default();
                aggregate(input.cluster, &keys)
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
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;

    use super::*;

    const ZONE: &str = "topology.kubernetes.io/zone";
    const HOST: &str = "example.com/host";

    fn node(name: &str, zone: &str, keys: Option<&[&str]>) -> NodeTopology {
        NodeTopology {
            name: name.into(),
            keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
            labels: BTreeMap::from([
                (ZONE.to_string(), zone.to_string()),
                (HOST.to_string(), name.to_string()),
            ]),
        }
    }

    fn seg(pairs: &[(&str, &str)]) -> Segment {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn allowed(zones: &[&str]) -> Vec<TopologySelectorTerm> {
        vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: ZONE.into(),
                values: zones.iter().map(|z| z.to_string()).collect(),
            }]),
        }]
    }

    fn cluster() -> Vec<NodeTopology> {
        vec![
            node("n1", "a", Some(&[ZONE])),
            node("n2", "b", Some(&[ZONE])),
            node("n3", "c", Some(&[ZONE])),
            node("n4", "b", Some(&[ZONE])),
            node("no-driver", "z", None),
        ]
    }

    fn input<'a>(
        selected: Option<&'a NodeTopology>,
        strict: bool,
        allowed: &'a [TopologySelectorTerm],
        cluster: &'a [NodeTopology],
    ) -> TopologyInput<'a> {
        TopologyInput {
            selected,
            strict,
            immediate_topology: true,
            allowed,
            cluster,
            claim_name: "data",
        }
    }

    #[test]
    fn late_binding_strict_uses_only_the_selected_segment() {
        let c = cluster();
        let (req, pref) = accessibility_requirements(&input(Some(&c[1]), true, &[], &c))
            .unwrap()
            .unwrap();
        assert_eq!(req, vec![seg(&[(ZONE, "b")])]);
        assert_eq!(pref, req);
        let not_allowed = allowed(&["a"]);
        let err =
            accessibility_requirements(&input(Some(&c[1]), true, &not_allowed, &c)).unwrap_err();
        assert_eq!(err, TopologyError::NotAllowed("n2".into()));
    }

    #[test]
    fn late_binding_aggregates_the_cluster_and_puts_the_selected_segment_first() {
        let c = cluster();
        let (req, pref) = accessibility_requirements(&input(Some(&c[2]), false, &[], &c))
            .unwrap()
            .unwrap();
        assert_eq!(
            req,
            vec![
                seg(&[(ZONE, "a")]),
                seg(&[(ZONE, "b")]),
                seg(&[(ZONE, "c")])
            ],
            "sorted, deduplicated, no driverless node"
        );
        assert_eq!(
            pref,
            vec![
                seg(&[(ZONE, "c")]),
                seg(&[(ZONE, "a")]),
                seg(&[(ZONE, "b")])
            ]
        );
    }

    #[test]
    fn late_binding_with_allowed_topologies_uses_them() {
        let c = cluster();
        let terms = allowed(&["c", "b"]);
        let (req, pref) = accessibility_requirements(&input(Some(&c[1]), false, &terms, &c))
            .unwrap()
            .unwrap();
        assert_eq!(req, vec![seg(&[(ZONE, "b")]), seg(&[(ZONE, "c")])]);
        assert_eq!(pref[0], seg(&[(ZONE, "b")]));
    }

    #[test]
    fn selected_nodes_without_csinode_or_labels_are_errors() {
        let bare = node("bare", "a", None);
        let c = cluster();
        assert_eq!(
            accessibility_requirements(&input(Some(&bare), false, &[], &c)).unwrap_err(),
            TopologyError::NoCsiNode("bare".into())
        );
        let unlabeled = node("u", "a", Some(&["example.com/rack"]));
        assert!(matches!(
            accessibility_requirements(&input(Some(&unlabeled), false, &[], &c)).unwrap_err(),
            TopologyError::MissingLabel { .. }
        ));
    }

    #[test]
    fn immediate_binding_rotates_by_claim_name_and_spreads_statefulset_replicas() {
        let c = cluster();
        let mut firsts = Vec::new();
        for i in 0..3 {
            let name = format!("data-web-{i}");
            let mut inp = input(None, false, &[], &c);
            inp.claim_name = &name;
            let (req, pref) = accessibility_requirements(&inp).unwrap().unwrap();
            assert_eq!(req.len(), 3);
            firsts.push(pref[0].clone());
        }
        firsts.sort();
        firsts.dedup();
        assert_eq!(
            firsts.len(),
            3,
            "three replicas start on three different segments"
        );
        // The same claim always gets the same preferred order.
        let a = accessibility_requirements(&input(None, false, &[], &c)).unwrap();
        let b = accessibility_requirements(&input(None, false, &[], &c)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn immediate_binding_without_immediate_topology_or_nodes_has_no_requirement() {
        let c = cluster();
        let mut inp = input(None, false, &[], &c);
        inp.immediate_topology = false;
        assert_eq!(accessibility_requirements(&inp).unwrap(), None);
        let terms = allowed(&["a"]);
        inp.allowed = &terms;
        assert_eq!(
            accessibility_requirements(&inp).unwrap().unwrap().0,
            vec![seg(&[(ZONE, "a")])]
        );
        let empty: Vec<NodeTopology> = Vec::new();
        assert_eq!(
            accessibility_requirements(&input(None, false, &[], &empty)).unwrap(),
            None
        );
    }

    #[test]
    fn allowed_topologies_flatten_to_the_cartesian_product() {
        let terms = vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![
                TopologySelectorLabelRequirement {
                    key: ZONE.into(),
                    values: vec!["a".into(), "b".into()],
                },
                TopologySelectorLabelRequirement {
                    key: HOST.into(),
                    values: vec!["h1".into(), "h2".into()],
                },
            ]),
        }];
        let flat = flatten_allowed(&terms).unwrap();
        assert_eq!(flat.len(), 4);
        assert!(flat.contains(&seg(&[(ZONE, "b"), (HOST, "h1")])));
        let empty = vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: ZONE.into(),
                values: vec![],
            }]),
        }];
        assert_eq!(
            flatten_allowed(&empty).unwrap_err(),
            TopologyError::EmptyValues(ZONE.into())
        );
    }

    #[test]
    fn fnv1_matches_the_reference_vectors() {
        assert_eq!(fnv1_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
        assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
    }

    #[test]
    fn rotation_hashes_the_names_upstream_hashes() {
        // (claim name, what is hashed, index added)
        let cases = [
            ("data-web-2", "web", 2),
            ("www-my-set-0", "set", 0),
            ("name-7", "name", 7),
            ("plain", "plain", 0),
            ("ends-with-", "ends-with-", 0),
            ("signed-+1", "signed-+1", 0),
            ("big-99999999999", "big-99999999999", 0),
            ("-3", "", 3),
        ];
        for (name, hashed, index) in cases {
            assert_eq!(
                claim_rotation(name),
                fnv1_32(hashed.as_bytes()).wrapping_add(index),
                "{name}"
            );
        }
    }
}
