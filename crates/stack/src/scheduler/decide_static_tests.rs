//! The scheduler's plan for late-binding claims of static volumes (which volume is offered
//! and pre-bound, which is not) and for a Pod's node selector. The fixtures are
//! `decide_tests.rs`'.

use super::*;

/// The plan that puts the Pod on `node` with its claim `claim` pre-bound to `volume`.
fn on_with_volume(node: &str, claim: &str, volume: &str) -> Plan {
    Plan::Select {
        node: node.into(),
        claims: Vec::new(),
        bind: vec![(claim.into(), volume.into())],
    }
}

/// An Available ReadWriteOnce volume of `class` and `size` on `node`.
fn available(name: &str, node: &str, class: &str, size: &str) -> PersistentVolume {
    let mut v = pv(name, node);
    let spec = v.spec.as_mut().unwrap();
    spec.storage_class_name = Some(class.into());
    spec.capacity = Some([("storage".to_string(), Quantity(size.into()))].into());
    spec.access_modes = Some(vec!["ReadWriteOnce".into()]);
    v.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
        phase: Some("Available".into()),
        ..Default::default()
    });
    v
}

#[test]
fn late_binding_claims_of_static_volumes_get_one_on_the_chosen_node_pre_bound() {
    let mut local = class("local", true);
    local.provisioner = "kubernetes.io/no-provisioner".into();
    let static_pv = |name: &str, node: &str, size: &str| available(name, node, "local", size);
    let mut f = Fixture::new();
    f.classes.push(local);
    f.claims = vec![claim("data", "local", "2Gi")];
    // No volume anywhere: unschedulable, with kube-scheduler's reason.
    assert_eq!(
        f.plan(&pod(&["data"])),
        Plan::Unschedulable(
            "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind."
                .into()
        )
    );
    // One too small on node-1, two on node-2: node-2, its smaller volume that holds the claim.
    f.volumes = vec![
        static_pv("small", "node-1", "1Gi"),
        static_pv("big", "node-2", "10Gi"),
        static_pv("fit", "node-2", "3Gi"),
    ];
    assert_eq!(
        f.plan(&pod(&["data"])),
        on_with_volume("node-2", "data", "fit")
    );
    // Pre-bound already: the same volume again (the PV controller completes the binding).
    let mut prebound = static_pv("fit", "node-2", "3Gi");
    prebound.spec.as_mut().unwrap().claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
        namespace: Some("default".into()),
        name: Some("data".into()),
        ..Default::default()
    });
    prebound.status = None;
    f.volumes = vec![static_pv("big", "node-2", "10Gi"), prebound];
    assert_eq!(
        f.plan(&pod(&["data"])),
        on_with_volume("node-2", "data", "fit")
    );
}

#[test]
fn a_pods_node_selector_chooses_among_the_nodes() {
    let f = Fixture::new();
    let mut p = pod(&[]);
    p.spec.as_mut().unwrap().node_selector = Some([(KEY.to_string(), "node-2".to_string())].into());
    assert_eq!(f.plan(&p), Plan::Bind("node-2".into()));
    p.spec.as_mut().unwrap().node_selector =
        Some([(KEY.to_string(), "nowhere".to_string())].into());
    assert_eq!(
        f.plan(&p),
        Plan::Unschedulable(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.".into()
        )
    );
}

#[test]
fn a_static_volume_pre_bound_to_an_earlier_claim_of_the_name_or_a_claim_naming_its_volume_is_not_offered()
 {
    let mut local = class("local", true);
    local.provisioner = "kubernetes.io/no-provisioner".into();
    let mut f = Fixture::new();
    f.classes.push(local);
    let mut data = claim("data", "local", "1Gi");
    data.metadata.uid = Some("new-uid".into());
    f.claims = vec![data.clone()];
    let mut old = available("old", "node-1", "local", "1Gi");
    old.spec.as_mut().unwrap().claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
        namespace: Some("default".into()),
        name: Some("data".into()),
        uid: Some("old-uid".into()),
        ..Default::default()
    });
    old.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
        phase: Some("Released".into()),
        ..Default::default()
    });
    f.volumes = vec![old];
    assert!(
        matches!(f.plan(&pod(&["data"])), Plan::Unschedulable(_)),
        "the Released volume of the earlier claim is not this claim's"
    );
    // A claim naming a volume that is not there: waits for it, gets no other.
    let mut named = data;
    named.spec.as_mut().unwrap().volume_name = Some("missing".into());
    f.claims = vec![named];
    f.volumes = vec![available("free", "node-1", "local", "1Gi")];
    assert!(
        !matches!(f.plan(&pod(&["data"])), Plan::Select { ref bind, .. } if !bind.is_empty()),
        "never pre-binds for a claim that names its volume"
    );
}

#[test]
fn a_volume_is_pre_bound_once_and_only_to_the_claim_of_its_uid() {
    let mut c = claim("data", "local", "1Gi");
    c.metadata.uid = Some("uid-1".into());
    let free = pv("v", "node-1");
    let bound = pre_bound(&free, &c).unwrap();
    let r = bound.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
    assert_eq!(
        (r.name.as_deref(), r.uid.as_deref()),
        (Some("data"), Some("uid-1"))
    );
    assert_eq!(
        bound.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    assert_eq!(
        pre_bound(&bound, &c),
        None,
        "already pre-bound: nothing to write"
    );
    let mut again = c.clone();
    again.metadata.uid = Some("uid-2".into());
    assert!(
        !super::super::bound_to(&bound, &again),
        "a claim re-made under the name is another claim"
    );
}

#[test]
fn a_pool_volume_whose_node_affinity_excludes_the_pods_node_is_not_offered() {
    // A class with a provisioner whose pool (a PersistentVolumeSet's Available volumes) is on
    // node-1: a Pod held to node-3 gets its claim provisioned there, not the pool's volume;
    // a Pod that may go anywhere takes the pool's volume on its node.
    let mut f = Fixture::new();
    f.claims = vec![claim("data", "late", "1Gi")];
    f.volumes = vec![available("pool-a", "node-1", "late", "1Gi")];
    let mut held = pod(&["data"]);
    held.spec.as_mut().unwrap().node_selector =
        Some([(KEY.to_string(), "node-3".to_string())].into());
    assert_eq!(f.plan(&held), select("node-3", &["data"]));
    assert_eq!(
        f.plan(&pod(&["data"])),
        on_with_volume("node-1", "data", "pool-a")
    );
}
