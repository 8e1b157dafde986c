#![allow(clippy::unwrap_used)]

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
    let err = accessibility_requirements(&input(Some(&c[1]), true, &not_allowed, &c)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "selected node '\"n2\"' topology '[{topology.kubernetes.io/zone b}]' is not in allowed topologies: [[{topology.kubernetes.io/zone a}]]"
    );
}

#[test]
fn late_binding_outside_allowed_topologies_is_not_in_requisite() {
    let c = cluster();
    let terms = allowed(&["c", "a"]);
    let err = accessibility_requirements(&input(Some(&c[1]), false, &terms, &c)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "topology [{topology.kubernetes.io/zone b}] from selected node \"n2\" is not in requisite: [[{topology.kubernetes.io/zone a}] [{topology.kubernetes.io/zone c}]]"
    );
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
fn selected_nodes_without_keys_or_labels_are_errors_worded_as_upstream() {
    let c = cluster();
    // (selected node, the error's text)
    let cases = [
        (
            node("bare", "a", None),
            "no topology key found for node bare",
        ),
        (
            node("keyless", "a", Some(&[])),
            "no topology key found for node keyless",
        ),
        (
            node("u", "a", Some(&["example.com/rack", ZONE])),
            "topology labels from selected node map[example.com/host:u topology.kubernetes.io/zone:a] does not match topology keys from CSINode [example.com/rack topology.kubernetes.io/zone]",
        ),
        (
            NodeTopology {
                name: "gone".into(),
                keys: Some(vec![ZONE.into()]),
                labels: BTreeMap::new(),
            },
            "topology labels from selected node map[] does not match topology keys from CSINode [topology.kubernetes.io/zone]",
        ),
    ];
    for (selected, text) in cases {
        for strict in [false, true] {
            let err =
                accessibility_requirements(&input(Some(&selected), strict, &[], &c)).unwrap_err();
            assert_eq!(err.to_string(), text, "{} strict={strict}", selected.name);
        }
    }
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
fn immediate_binding_without_immediate_topology_has_no_requirement() {
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
}

#[test]
fn immediate_topology_waits_for_a_node_with_the_driver_and_its_labels() {
    let empty: Vec<NodeTopology> = Vec::new();
    let no_keys = vec![node("n1", "a", None), node("n2", "b", Some(&[]))];
    for cluster in [&empty, &no_keys] {
        let err = accessibility_requirements(&input(None, false, &[], cluster)).unwrap_err();
        assert_eq!(err, TopologyError::NoAvailableTopology);
        assert_eq!(err.to_string(), "no available topology found");
    }
    let unlabeled = vec![node("n1", "a", Some(&["example.com/rack"]))];
    let err = accessibility_requirements(&input(None, false, &[], &unlabeled)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "topologyKeys [example.com/rack] were not found on any nodes"
    );
    // allowedTopologies decide without the nodes.
    let terms = allowed(&["a"]);
    assert!(
        accessibility_requirements(&input(None, false, &terms, &empty))
            .unwrap()
            .is_some()
    );
}

#[test]
fn terms_sort_shorter_first_then_by_key_and_value() {
    let terms = vec![
        seg(&[(ZONE, "b")]),
        seg(&[(HOST, "h1"), (ZONE, "a")]),
        seg(&[(ZONE, "a")]),
        seg(&[]),
        seg(&[(ZONE, "b")]),
        seg(&[(HOST, "h0"), (ZONE, "b")]),
    ];
    assert_eq!(
        sort_terms(terms),
        vec![
            seg(&[(ZONE, "a")]),
            seg(&[(ZONE, "b")]),
            seg(&[(HOST, "h0"), (ZONE, "b")]),
            seg(&[(HOST, "h1"), (ZONE, "a")]),
        ]
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
    // Upstream's order: the later expression's values outermost.
    assert_eq!(
        flatten_allowed(&terms).unwrap(),
        vec![
            seg(&[(ZONE, "a"), (HOST, "h1")]),
            seg(&[(ZONE, "b"), (HOST, "h1")]),
            seg(&[(ZONE, "a"), (HOST, "h2")]),
            seg(&[(ZONE, "b"), (HOST, "h2")]),
        ]
    );
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

#[test]
fn late_binding_without_a_node_having_the_keys_is_an_error_not_a_bare_request() {
    // The selected node left the cache between its lookup and the aggregate.
    let selected = node("n1", "a", Some(&[ZONE]));
    let err = accessibility_requirements(&input(Some(&selected), false, &[], &[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "topologyKeys [topology.kubernetes.io/zone] were not found on any nodes"
    );
}

/// allowedTopologies whose terms have no expressions (kube-apiserver accepts them) are used
/// as upstream uses them: no requirement, no aggregate; nothing fits a strict selected node.
#[test]
fn allowed_topologies_that_flatten_to_nothing_are_used_as_upstream() {
    let c = cluster();
    let bare = vec![TopologySelectorTerm {
        match_label_expressions: None,
    }];
    let selected = node("n1", "a", Some(&[ZONE]));
    assert_eq!(
        accessibility_requirements(&input(Some(&selected), false, &bare, &[])).unwrap(),
        None
    );
    assert_eq!(
        accessibility_requirements(&input(None, false, &bare, &c)).unwrap(),
        None,
        "not the cluster aggregate"
    );
    assert_eq!(
        accessibility_requirements(&input(Some(&selected), true, &bare, &c))
            .unwrap_err()
            .to_string(),
        "selected node '\"n1\"' topology '[{topology.kubernetes.io/zone a}]' is not in allowed topologies: []"
    );
}
