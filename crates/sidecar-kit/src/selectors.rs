//! Matching a node's labels against the three selector shapes of the storage API: a label
//! selector (CSIStorageCapacity `nodeTopology`), node selector terms (a PV's node affinity)
//! and topology selector terms (a StorageClass's `allowedTopologies`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, TopologySelectorTerm, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Node labels.
pub type Labels = BTreeMap<String, String>;

/// Whether a label selector selects `labels`: every `matchLabels` pair and every expression
/// (In, NotIn, Exists, DoesNotExist) holds; an empty selector selects everything. An unknown
/// operator selects nothing.
pub fn label_selector_matches(selector: &LabelSelector, labels: &Labels) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs && expressions
}

fn requirement_matches(r: &NodeSelectorRequirement, labels: &Labels) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [want]) = (value.and_then(|v| number(v)), values) else {
                return false;
            };
            let Some(want) = number(want) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

/// Whether one node selector term holds for `labels` (field matches never hold: a node's
/// fields are not labels). A term without requirements matches nothing, as in Kubernetes.
pub fn term_matches(term: &NodeSelectorTerm, labels: &Labels) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if !fields.is_empty() || expressions.is_empty() {
        return false;
    }
    expressions.iter().all(|r| requirement_matches(r, labels))
}

/// Whether a volume with this node affinity is usable on a node with `labels`: no affinity,
/// or one of its terms holds.
pub fn affinity_allows(affinity: Option<&VolumeNodeAffinity>, labels: &Labels) -> bool {
    match affinity.and_then(|a| a.required.as_ref()) {
        None => true,
        Some(selector) => selector
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels)),
    }
}

/// Whether a class's `allowedTopologies` admit a node with `labels`: none given, or one term
/// whose every expression has the node's value among its values.
pub fn allowed_topologies_admit(allowed: &[TopologySelectorTerm], labels: &Labels) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|term| {
            term.match_label_expressions
                .iter()
                .flatten()
                .all(|e| labels.get(&e.key).is_some_and(|v| e.values.contains(v)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSelector, TopologySelectorLabelRequirement};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors() {
        let node = labels(&[("zone", "a"), ("disk", "ssd")]);
        let by_labels = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        };
        let by_expr = |op: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
        };
        let cases = [
            (LabelSelector::default(), true),
            (by_labels(&[]), true),
            (by_labels(&[("zone", "a")]), true),
            (by_labels(&[("zone", "a"), ("disk", "hdd")]), false),
            (by_labels(&[("rack", "1")]), false),
            (by_expr("In", &["a", "b"]), true),
            (by_expr("NotIn", &["a"]), false),
            (by_expr("Exists", &[]), true),
            (by_expr("DoesNotExist", &[]), false),
            (by_expr("Bogus", &[]), false),
        ];
        for (selector, want) in cases {
            assert_eq!(
                label_selector_matches(&selector, &node),
                want,
                "{selector:?}"
            );
        }
    }

    #[test]
    fn node_affinity() {
        let node = labels(&[("zone", "a"), ("cpus", "8")]);
        let term = |key: &str, op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_fields: None,
        };
        let affinity = |terms: Vec<NodeSelectorTerm>| VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms,
            }),
        };
        let cases = [
            (None, true),
            (Some(affinity(vec![term("zone", "In", &["a"])])), true),
            (Some(affinity(vec![term("zone", "In", &["b"])])), false),
            (
                Some(affinity(vec![
                    term("zone", "In", &["b"]),
                    term("zone", "In", &["a"]),
                ])),
                true,
            ),
            (Some(affinity(vec![term("cpus", "Gt", &["4"])])), true),
            (Some(affinity(vec![term("cpus", "Lt", &["4"])])), false),
            (Some(affinity(vec![term("cpus", "Gt", &["x"])])), false),
            (
                Some(affinity(vec![term("rack", "DoesNotExist", &[])])),
                true,
            ),
            (Some(affinity(vec![NodeSelectorTerm::default()])), false),
        ];
        for (affinity, want) in cases {
            assert_eq!(
                affinity_allows(affinity.as_ref(), &node),
                want,
                "{affinity:?}"
            );
        }
    }

    #[test]
    fn allowed_topologies() {
        let node = labels(&[("zone", "a")]);
        let term = |values: &[&str]| TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: "zone".into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }]),
        };
        assert!(allowed_topologies_admit(&[], &node));
        assert!(allowed_topologies_admit(&[term(&["a", "b"])], &node));
        assert!(!allowed_topologies_admit(&[term(&["b"])], &node));
        assert!(allowed_topologies_admit(
            &[term(&["b"]), term(&["a"])],
            &node
        ));
        assert!(!allowed_topologies_admit(&[term(&["a"])], &Labels::new()));
    }
}
