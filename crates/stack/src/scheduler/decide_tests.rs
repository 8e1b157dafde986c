#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PodSpec,
    TopologySelectorLabelRequirement, TopologySelectorTerm, Volume, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{
    CSIDriverSpec, CSINodeDriver, CSINodeSpec, VolumeNodeResources,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::*;

const DRIVER: &str = "hostpath.csi.volstack.dev";
const KEY: &str = "topology.hostpath.csi.volstack.dev/node";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    }
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(KEY.to_string(), name.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn class(name: &str, late: bool) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        volume_binding_mode: Some(
            if late {
                "WaitForFirstConsumer"
            } else {
                "Immediate"
            }
            .into(),
        ),
        ..Default::default()
    }
}

fn claim(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(name),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity(size.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn selected_for(mut c: PersistentVolumeClaim, node: &str) -> PersistentVolumeClaim {
    c.metadata
        .annotations
        .get_or_insert_default()
        .insert(ANN_SELECTED_NODE.into(), node.into());
    c
}

fn bound_to(mut c: PersistentVolumeClaim, pv: &str) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().volume_name = Some(pv.into());
    c
}

fn pv(name: &str, node: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: KEY.into(),
                            operator: "In".into(),
                            values: Some(vec![node.into()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn capacity(class: &str, node: &str, free: &str, max: Option<&str>) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: meta(&format!("csisc-{class}-{node}")),
        storage_class_name: class.into(),
        node_topology: Some(LabelSelector {
            match_labels: Some([(KEY.to_string(), node.to_string())].into()),
            match_expressions: None,
        }),
        capacity: Some(Quantity(free.into())),
        maximum_volume_size: max.map(|m| Quantity(m.into())),
    }
}

fn pod(claims: &[&str]) -> Pod {
    Pod {
        metadata: meta("web"),
        spec: Some(PodSpec {
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: c.to_string(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: c.to_string(),
                            read_only: None,
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Fixture {
    nodes: Vec<Node>,
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    classes: Vec<StorageClass>,
    capacities: Vec<CSIStorageCapacity>,
    storage_capacity: bool,
    limit: Option<i32>,
    in_use: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            nodes: vec![node("node-1"), node("node-2"), node("node-3")],
            claims: Vec::new(),
            volumes: Vec::new(),
            classes: vec![class("late", true), class("fast", false)],
            capacities: vec![
                capacity("late", "node-1", "1Gi", None),
                capacity("late", "node-2", "2Gi", None),
                capacity("late", "node-3", "10Gi", Some("8Gi")),
            ],
            storage_capacity: true,
            limit: None,
            in_use: BTreeMap::new(),
        }
    }

    fn plan(&self, pod: &Pod) -> Plan {
        let nodes: Vec<&Node> = self.nodes.iter().collect();
        let claims = by_namespaced_name(&self.claims);
        let volumes = by_name(&self.volumes);
        let classes = by_name(&self.classes);
        let capacities: Vec<&CSIStorageCapacity> = self.capacities.iter().collect();
        let driver = CSIDriver {
            metadata: ObjectMeta {
                name: Some(DRIVER.into()),
                ..Default::default()
            },
            spec: CSIDriverSpec {
                storage_capacity: Some(self.storage_capacity),
                ..Default::default()
            },
        };
        let drivers = [(DRIVER.to_string(), &driver)].into();
        let csinodes_owned: Vec<CSINode> = self
            .nodes
            .iter()
            .map(|n| CSINode {
                metadata: ObjectMeta {
                    name: n.metadata.name.clone(),
                    ..Default::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: DRIVER.into(),
                        node_id: n.metadata.name.clone().unwrap(),
                        topology_keys: Some(vec![KEY.into()]),
                        allocatable: self
                            .limit
                            .map(|count| VolumeNodeResources { count: Some(count) }),
                    }],
                },
            })
            .collect();
        let csinodes = by_name(&csinodes_owned);
        plan(
            &World {
                nodes: &nodes,
                claims: &claims,
                volumes: &volumes,
                classes: &classes,
                capacities: &capacities,
                drivers: &drivers,
                csinodes: &csinodes,
                in_use: &self.in_use,
            },
            pod,
        )
    }
}

fn select(node: &str, claims: &[&str]) -> Plan {
    Plan::Select {
        node: node.into(),
        claims: claims.iter().map(|c| c.to_string()).collect(),
        bind: Vec::new(),
    }
}

#[test]
fn a_claim_goes_to_a_node_with_room_and_one_too_large_for_all_is_unschedulable() {
    let cases: &[(&str, Plan)] = &[
        // Fits everywhere: the first node.
        ("512Mi", select("node-1", &["data"])),
        // Larger than node-1's and node-2's free capacity: node-3.
        ("3Gi", select("node-3", &["data"])),
        // Above node-3's maximum volume size (which wins over its capacity) and the others' room.
        (
            "9Gi",
            Plan::Unschedulable(
                "0/3 nodes are available: 3 node(s) did not have enough free storage.".into(),
            ),
        ),
    ];
    for (size, want) in cases {
        let mut f = Fixture::new();
        f.claims.push(claim("data", "late", size));
        assert_eq!(&f.plan(&pod(&["data"])), want, "{size}");
    }
    // No capacity objects for a driver that asks for the check: nowhere fits.
    let mut f = Fixture::new();
    f.capacities.clear();
    f.claims.push(claim("data", "late", "1Mi"));
    assert!(matches!(f.plan(&pod(&["data"])), Plan::Unschedulable(_)));
    // A driver that does not ask for it (storageCapacity false): capacity is not looked at.
    f.storage_capacity = false;
    assert_eq!(f.plan(&pod(&["data"])), select("node-1", &["data"]));
}

#[test]
fn selected_claims_are_waited_for_and_the_pod_is_bound_where_they_were_provisioned() {
    let mut f = Fixture::new();
    f.claims
        .push(selected_for(claim("data", "late", "1Gi"), "node-2"));
    assert_eq!(
        f.plan(&pod(&["data"])),
        Plan::WaitForClaims("node-2".into())
    );
    f.claims = vec![bound_to(
        selected_for(claim("data", "late", "1Gi"), "node-2"),
        "pv-1",
    )];
    f.volumes.push(pv("pv-1", "node-2"));
    assert_eq!(f.plan(&pod(&["data"])), Plan::Bind("node-2".into()));
    // A bound volume's affinity decides the node even without the annotation.
    f.claims = vec![bound_to(claim("data", "late", "1Gi"), "pv-1")];
    assert_eq!(f.plan(&pod(&["data"])), Plan::Bind("node-2".into()));
    // A Pod without claims goes to the first node.
    assert_eq!(f.plan(&pod(&[])), Plan::Bind("node-1".into()));
}

#[test]
fn pods_that_cannot_be_placed_say_why() {
    let mut f = Fixture::new();
    assert_eq!(
        f.plan(&pod(&["missing"])),
        Plan::Unschedulable("persistentvolumeclaim \"missing\" not found".into())
    );
    f.claims.push(claim("now", "fast", "1Gi"));
    assert_eq!(
        f.plan(&pod(&["now"])),
        Plan::Unschedulable(
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.".into()
        )
    );
    // allowedTopologies admit only node-1, which has too little room: two reasons, counted.
    let mut limited = class("zoned", true);
    limited.allowed_topologies = Some(vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: KEY.into(),
            values: vec!["node-1".into()],
        }]),
    }]);
    f.classes.push(limited);
    f.capacities.push(capacity("zoned", "node-1", "1Gi", None));
    f.claims.push(claim("z", "zoned", "2Gi"));
    assert_eq!(
        f.plan(&pod(&["z"])),
        Plan::Unschedulable(
            "0/3 nodes are available: 1 node(s) did not have enough free storage, 2 node(s) didn't find available persistent volumes to bind.".into()
        )
    );
    // A bound volume on a node that is gone from the list: affinity conflict everywhere else.
    let mut f = Fixture::new();
    f.claims
        .push(bound_to(claim("data", "late", "1Gi"), "pv-9"));
    f.volumes.push(pv("pv-9", "node-9"));
    assert_eq!(
        f.plan(&pod(&["data"])),
        Plan::Unschedulable(
            "0/3 nodes are available: 3 node(s) had volume node affinity conflict.".into()
        )
    );
}

#[test]
fn the_drivers_volume_limit_per_node_is_respected() {
    let mut f = Fixture::new();
    f.limit = Some(1);
    f.in_use
        .insert("node-1".into(), [(DRIVER.to_string(), 1)].into());
    f.claims.push(claim("data", "late", "1Gi"));
    // node-1 has room but its volume limit is reached: node-2 next.
    assert_eq!(f.plan(&pod(&["data"])), select("node-2", &["data"]));
    f.claims.push(claim("logs", "late", "1Gi"));
    assert_eq!(
        f.plan(&pod(&["data", "logs"])),
        Plan::Unschedulable("0/3 nodes are available: 3 node(s) exceed max volume count.".into())
    );
}

#[test]
fn assigned_deleted_and_foreign_pods_are_skipped() {
    let f = Fixture::new();
    let mut p = pod(&[]);
    p.spec.as_mut().unwrap().node_name = Some("node-1".into());
    assert_eq!(f.plan(&p), Plan::Skip);
    let mut p = pod(&[]);
    p.spec.as_mut().unwrap().scheduler_name = Some("other".into());
    assert_eq!(f.plan(&p), Plan::Skip);
}

#[test]
fn volumes_in_use_count_each_claim_once_per_node_and_driver() {
    let f = Fixture::new();
    let mut claims = vec![claim("a", "late", "1Gi"), claim("b", "late", "1Gi")];
    claims.push(claim("other", "foreign", "1Gi"));
    claims.push(claim("gp2", "in-tree", "1Gi"));
    // A generic ephemeral volume's claim, `<pod>-<volume>` (the Pods here are named web).
    claims.push(claim("web-scratch", "late", "1Gi"));
    let mut foreign = class("foreign", true);
    foreign.provisioner = "other.csi".into();
    let mut in_tree = class("in-tree", false);
    in_tree.provisioner = "kubernetes.io/aws-ebs".into();
    let classes_owned = [f.classes.clone(), vec![foreign, in_tree]].concat();
    let on = |node: Option<&str>, names: &[&str]| {
        let mut p = pod(names);
        p.spec.as_mut().unwrap().node_name = node.map(String::from);
        p
    };
    let mut ephemeral = on(Some("node-1"), &["gp2"]);
    ephemeral.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
        serde_json::from_value(serde_json::json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"storageClassName": "late", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}))
        .unwrap(),
    );
    let pods = [
        ephemeral,
        on(Some("node-1"), &["a", "b"]),
        // The same claim in a second Pod on the node counts once.
        on(Some("node-1"), &["a", "other"]),
        // Unassigned Pods and missing claims count nothing.
        on(None, &["b"]),
        on(Some("node-2"), &["missing"]),
    ];
    let used = volumes_in_use(
        &pods,
        &by_namespaced_name(&claims),
        &by_name(&classes_owned),
    );
    assert_eq!(used.len(), 1);
    assert_eq!(
        used["node-1"][DRIVER], 3,
        "a, b and the ephemeral volume's claim"
    );
    assert_eq!(used["node-1"]["other.csi"], 1);
    assert_eq!(
        used["node-1"]["ebs.csi.aws.com"], 1,
        "an in-tree class counts for the CSI driver of its plugin"
    );
}

#[test]
fn a_generic_ephemeral_volume_is_its_pods_claim_and_only_if_the_pod_owns_it() {
    let mut p = pod(&[]);
    p.metadata.uid = Some("pod-uid".into());
    p.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "work", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"storageClassName": "late", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "3Gi"}}}}}}))
        .unwrap(),
    ]);
    let owned = |uid: &str| {
        let mut c = claim("web-work", "late", "3Gi");
        c.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "web".into(),
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        c
    };
    let mut f = Fixture::new();
    // Not made yet: waits for it.
    assert_eq!(
        f.plan(&p),
        Plan::Unschedulable("persistentvolumeclaim \"web-work\" not found".into())
    );
    // Someone else's claim of that name: never used.
    f.claims = vec![owned("another-uid")];
    assert_eq!(
        f.plan(&p),
        Plan::Unschedulable(
            "PVC default/web-work was not created for pod default/web (pod is not owner)".into()
        )
    );
    // The Pod's own: checked like any claim (3Gi fits only node-3's capacity).
    f.claims = vec![owned("pod-uid")];
    assert_eq!(f.plan(&p), select("node-3", &["web-work"]));
}

/// Static volumes offered to late-binding claims, and node selectors.
#[path = "decide_static_tests.rs"]
mod static_volumes;
