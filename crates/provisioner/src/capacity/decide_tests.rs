#![allow(clippy::unwrap_used)]

use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};

use super::*;

const DRIVER: &str = "hostpath.csi.volstack.dev";
const KEY: &str = "topology.hostpath.csi.volstack.dev/node";

fn csinode(name: &str, keys: Option<Vec<&str>>) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: DRIVER.into(),
                node_id: name.into(),
                topology_keys: keys.map(|k| k.into_iter().map(str::to_string).collect()),
                allocatable: None,
            }],
        },
    }
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn seg(value: &str) -> Segment {
    Segment::from([(KEY.to_string(), value.to_string())])
}

#[test]
fn segments_pair_each_nodes_keys_with_its_labels_once() {
    let csinodes = [
        csinode("a", Some(vec![KEY])),
        csinode("b", Some(vec![KEY])),
        csinode("c", Some(vec![KEY])),
        csinode("unlabelled", Some(vec![KEY])),
        csinode("unknown", Some(vec![KEY])),
    ];
    let mut other = csinode("d", Some(vec![KEY]));
    other.spec.drivers[0].name = "other.csi".into();
    let nodes = [
        node("a", &[(KEY, "zone-1")]),
        node("b", &[(KEY, "zone-2")]),
        node("c", &[(KEY, "zone-1")]),
        node("d", &[(KEY, "zone-9")]),
        node("unlabelled", &[]),
    ];
    let csinode_refs: Vec<&CSINode> = csinodes.iter().chain([&other]).collect();
    let node_refs: Vec<&Node> = nodes.iter().collect();
    assert_eq!(
        segments(DRIVER, &csinode_refs, &node_refs),
        vec![seg("zone-1"), seg("zone-2")]
    );
    let flat = [csinode("a", None), csinode("b", Some(vec![]))];
    let flat_refs: Vec<&CSINode> = flat.iter().collect();
    assert_eq!(
        segments(DRIVER, &flat_refs, &node_refs),
        vec![Segment::new()]
    );
    assert!(segments(DRIVER, &[], &node_refs).is_empty());
}

fn class(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: mode.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn late_binding_classes_of_ours_are_tracked() {
    let classes = [
        class("late", DRIVER, Some("WaitForFirstConsumer")),
        class("now", DRIVER, Some("Immediate")),
        class("default-mode", DRIVER, None),
        class("theirs", "other.csi", Some("WaitForFirstConsumer")),
    ];
    let refs: Vec<&StorageClass> = classes.iter().collect();
    let names = |v: Vec<&StorageClass>| -> Vec<String> {
        v.into_iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    };
    assert_eq!(names(tracked_classes(DRIVER, &refs, false)), vec!["late"]);
    assert_eq!(
        names(tracked_classes(DRIVER, &refs, true)),
        vec!["late", "now", "default-mode"]
    );
}

fn template() -> Template {
    Template {
        namespace: "kube-system".into(),
        driver: DRIVER.into(),
        managed_by: "external-provisioner".into(),
        owner: None,
    }
}

fn wanted(class: &str, zone: &str, capacity: i64, maximum: Option<i64>) -> Wanted {
    Wanted {
        class: class.into(),
        segment: seg(zone),
        capacity,
        maximum,
    }
}

fn existing(name: &str, w: &Wanted) -> CSIStorageCapacity {
    let mut o = capacity_object(&template(), w);
    o.metadata.name = Some(name.into());
    o.metadata.generate_name = None;
    o
}

#[test]
fn objects_are_created_updated_on_change_and_deleted_when_obsolete() {
    let t = template();
    let w1 = wanted("late", "zone-1", 10 << 30, Some(4 << 30));
    let w2 = wanted("late", "zone-2", 5 << 30, None);
    // Nothing yet: one object per (segment, class).
    let actions = reconcile(&t, &[], &[w1.clone(), w2.clone()]);
    assert_eq!(actions.len(), 2);
    let Action::Create(created) = &actions[0] else {
        panic!("{actions:?}")
    };
    assert_eq!(created.metadata.generate_name.as_deref(), Some("csisc-"));
    assert_eq!(created.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(created.storage_class_name, "late");
    assert_eq!(created.capacity, Some(Quantity("10Gi".into())));
    assert_eq!(created.maximum_volume_size, Some(Quantity("4Gi".into())));
    let labels = created.metadata.labels.clone().unwrap();
    assert_eq!(labels[LABEL_DRIVER], DRIVER);
    assert_eq!(labels[LABEL_MANAGED_BY], "external-provisioner");
    // Up to date: nothing. A value changed: one update.
    let a = existing("csisc-a", &w1);
    let b = existing("csisc-b", &w2);
    assert!(reconcile(&t, &[&a, &b], &[w1.clone(), w2.clone()]).is_empty());
    let fuller = wanted("late", "zone-1", 9 << 30, Some(4 << 30));
    assert_eq!(
        reconcile(&t, &[&a, &b], &[fuller, w2.clone()]),
        vec![Action::Update {
            name: "csisc-a".into(),
            capacity: Quantity("9Gi".into()),
            maximum: Some(Quantity("4Gi".into())),
            owners: None,
        }]
    );
    // The same value written differently is no change.
    let mut spelled = a.clone();
    spelled.capacity = Some(Quantity("10737418240".into()));
    assert!(reconcile(&t, &[&spelled, &b], &[w1.clone(), w2.clone()]).is_empty());
    // A segment gone: its object goes; someone deleted one: it comes back; a second object for
    // the same key goes; others' objects stay.
    let twin = existing("csisc-z", &w1);
    let mut foreign = existing("someone-elses", &w2);
    foreign.metadata.labels.as_mut().unwrap().insert(
        LABEL_MANAGED_BY.into(),
        "external-provisioner-node-7".into(),
    );
    let actions = reconcile(&t, &[&a, &twin, &b, &foreign], std::slice::from_ref(&w1));
    assert_eq!(
        actions,
        vec![
            Action::Delete("csisc-z".into()),
            Action::Delete("csisc-b".into())
        ]
    );
    let actions = reconcile(&t, &[&b], &[w1, w2]);
    assert!(
        matches!(actions.as_slice(), [Action::Create(c)] if c.node_topology == Some(LabelSelector { match_labels: Some(seg("zone-1")), match_expressions: None }))
    );
}

#[test]
fn an_owner_is_set_on_create_and_added_to_objects_that_lack_it() {
    let owner = crate::capacity::owner::reference("apps/v1", "StatefulSet", "prov", "uid-1");
    let t = Template {
        owner: Some(owner.clone()),
        ..template()
    };
    let w = wanted("late", "zone-1", 1 << 30, None);
    let actions = reconcile(&t, &[], std::slice::from_ref(&w));
    let [Action::Create(created)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(created.metadata.owner_references, Some(vec![owner.clone()]));
    // An object made before the owner was configured gets ours appended, others' kept.
    let mut old = existing("csisc-a", &w);
    let other = crate::capacity::owner::reference("v1", "Pod", "x", "uid-x");
    let mut other = other;
    other.controller = Some(false);
    old.metadata.owner_references = Some(vec![other.clone()]);
    assert_eq!(
        reconcile(&t, &[&old], std::slice::from_ref(&w)),
        vec![Action::Update {
            name: "csisc-a".into(),
            capacity: Quantity("1Gi".into()),
            maximum: None,
            owners: Some(vec![other, owner.clone()]),
        }]
    );
    old.metadata.owner_references = Some(vec![owner]);
    assert!(reconcile(&t, &[&old], &[w]).is_empty());
}

#[test]
fn items_are_classes_times_segments() {
    let a = class("a", DRIVER, Some("WaitForFirstConsumer"));
    let b = class("b", DRIVER, Some("WaitForFirstConsumer"));
    let got = items(&[&a, &b], &[seg("zone-1"), seg("zone-2")]);
    assert_eq!(got.len(), 4);
    assert!(got.contains(&Item {
        class: "b".into(),
        segment: seg("zone-2")
    }));
    assert!(items(&[&a], &[]).is_empty());
    assert_eq!(
        Item {
            class: "a".into(),
            segment: seg("zone-1")
        }
        .to_string(),
        format!("a:{KEY}=zone-1")
    );
}

fn affinity(terms: &[&[(&str, &str, &[&str])]]) -> k8s_openapi::api::core::v1::VolumeNodeAffinity {
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
    };
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms
                .iter()
                .map(|exprs| NodeSelectorTerm {
                    match_expressions: Some(
                        exprs
                            .iter()
                            .map(|(key, op, values)| NodeSelectorRequirement {
                                key: key.to_string(),
                                operator: op.to_string(),
                                values: Some(values.iter().map(|v| v.to_string()).collect()),
                            })
                            .collect(),
                    ),
                    match_fields: None,
                })
                .collect(),
        }),
    }
}

#[test]
fn a_volumes_affinity_names_the_segments_to_refresh() {
    const ZONE: &str = KEY;
    let cases: Vec<(
        Option<k8s_openapi::api::core::v1::VolumeNodeAffinity>,
        Vec<Segment>,
    )> = vec![
        (None, vec![]),
        (
            Some(affinity(&[&[(ZONE, "In", &["zone-1"])]])),
            vec![seg("zone-1")],
        ),
        (
            Some(affinity(&[
                &[(ZONE, "In", &["zone-1"])],
                &[(ZONE, "In", &["zone-2"])],
            ])),
            vec![seg("zone-1"), seg("zone-2")],
        ),
        // Not a segment: two values, another operator.
        (
            Some(affinity(&[&[(ZONE, "In", &["zone-1", "zone-2"])]])),
            vec![],
        ),
        (Some(affinity(&[&[(ZONE, "NotIn", &["zone-1"])]])), vec![]),
    ];
    for (affinity, want) in cases {
        assert_eq!(affinity_segments(affinity.as_ref()), want, "{affinity:?}");
    }
    let wanted = [
        Item {
            class: "late".into(),
            segment: seg("zone-1"),
        },
        Item {
            class: "late".into(),
            segment: seg("zone-2"),
        },
        Item {
            class: "other".into(),
            segment: seg("zone-1"),
        },
    ];
    assert_eq!(
        stale_items(&wanted, "late", &[seg("zone-2")]),
        vec![wanted[1].clone()]
    );
    assert_eq!(
        stale_items(&wanted, "late", &[]),
        wanted[..2].to_vec(),
        "no affinity: the class"
    );
    assert!(stale_items(&wanted, "gone", &[]).is_empty());
}

#[test]
fn polls_are_spread_over_the_interval_and_never_right_after_a_refresh() {
    use std::time::Duration;
    let interval = Duration::from_secs(60);
    let mut phases = std::collections::BTreeSet::new();
    for n in 0..200 {
        let item = Item {
            class: format!("c{n}"),
            segment: seg("zone-1"),
        };
        for now in [0u64, 1_000, 29_999, 59_999, 61_234, 3_600_000] {
            let now = Duration::from_millis(now);
            let delay = next_poll(&item, now, interval);
            assert!(delay >= interval / 2, "{delay:?} too soon");
            assert!(delay < interval + interval / 2, "{delay:?} too late");
            // The phase is the item's own: the same at any time.
            phases.insert((now + delay).as_millis() % interval.as_millis());
        }
    }
    // 200 items land on many different phases, not one burst.
    assert!(phases.len() > 150, "{} phases", phases.len());
}
