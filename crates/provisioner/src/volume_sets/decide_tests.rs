#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;

use super::decide::{
    DeletionEnd, being_made, candidates, deletable_by, deletion_end, invalid, leftovers,
    member_token, members, plan, unfinished,
};
use super::types::{
    LABEL_SET, PersistentVolumeSet, PersistentVolumeSetSpec, PersistentVolumeTemplate,
    template_source,
};
use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use std::collections::BTreeMap;

fn set(min: i32, max: i32) -> PersistentVolumeSet {
    let pool = BTreeMap::from([("pool".to_string(), "fast".to_string())]);
    PersistentVolumeSet {
        metadata: ObjectMeta {
            name: Some("pool".into()),
            generation: Some(3),
            ..ObjectMeta::default()
        },
        spec: PersistentVolumeSetSpec {
            minimum_replicas: min,
            maximum_replicas: max,
            selector: LabelSelector {
                match_labels: Some(pool.clone()),
                ..LabelSelector::default()
            },
            template: PersistentVolumeTemplate {
                metadata: ObjectMeta {
                    labels: Some(pool),
                    ..ObjectMeta::default()
                },
                spec: PersistentVolumeSpec {
                    storage_class_name: Some("hostpath".into()),
                    capacity: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    ..PersistentVolumeSpec::default()
                },
            },
        },
        ..PersistentVolumeSet::default()
    }
}

/// A set of static NFS volumes: no class, the source given whole.
fn static_set(min: i32, max: i32) -> PersistentVolumeSet {
    let mut s = set(min, max);
    s.spec.template.spec.storage_class_name = None;
    s.spec.template.spec.nfs = Some(k8s_openapi::api::core::v1::NFSVolumeSource {
        server: "nfs.example".into(),
        path: "/exports/pool".into(),
        read_only: None,
    });
    s
}

fn any(_: &PersistentVolume) -> bool {
    true
}

fn pv(name: &str, size: &str, phase: &str, pool: &str) -> PersistentVolume {
    let v = sidecar_kit::testing::volume(name)
        .label("pool", pool)
        .capacity(size)
        .phase(phase);
    if phase == "Bound" || phase == "Released" {
        return v.claim_ref("default", &format!("c-{name}"), None).build();
    }
    v.build()
}

#[test]
fn a_set_fills_to_its_minimum_one_at_a_time_and_never_past_its_maximum() {
    // (min, max, volumes as (size, phase), creating) → (create, delete, bound, unbound, ready)
    type Case = (
        i32,
        i32,
        Vec<(&'static str, &'static str)>,
        usize,
        (usize, Vec<&'static str>, i32, i32, bool),
    );
    let cases: Vec<Case> = vec![
        // Empty pool: make one.
        (5, 10, vec![], 0, (1, vec![], 0, 0, false)),
        // One in flight: wait for it (one at a time).
        (5, 10, vec![], 1, (0, vec![], 0, 0, false)),
        // Five available: full.
        (
            5,
            10,
            vec![("1Gi", "Available"); 5],
            0,
            (0, vec![], 0, 5, true),
        ),
        // Claims bound three: refill.
        (
            5,
            10,
            [vec![("1Gi", "Bound"); 3], vec![("1Gi", "Available"); 2]].concat(),
            0,
            (1, vec![], 3, 2, false),
        ),
        // At the maximum with few available: no more.
        (
            5,
            10,
            [vec![("1Gi", "Bound"); 8], vec![("1Gi", "Available"); 2]].concat(),
            0,
            (0, vec![], 8, 2, false),
        ),
        // One below the maximum: the last one may be made.
        (
            5,
            10,
            [vec![("1Gi", "Bound"); 8], vec![("1Gi", "Available"); 1]].concat(),
            0,
            (1, vec![], 8, 1, false),
        ),
        // Scaled down below what exists: the largest Available goes first, Bound never.
        (
            1,
            3,
            vec![
                ("1Gi", "Bound"),
                ("2Gi", "Available"),
                ("5Gi", "Available"),
                ("1Gi", "Available"),
                ("3Gi", "Released"),
            ],
            0,
            (0, vec!["pv-2", "pv-1"], 1, 3, true),
        ),
        // Above the maximum with nothing Available: nothing can go.
        (
            0,
            1,
            vec![("1Gi", "Bound"), ("1Gi", "Released")],
            0,
            (0, vec![], 1, 0, true),
        ),
        // A new volume not yet marked Available counts as one: no second one for it.
        (
            5,
            10,
            [vec![("1Gi", "Available"); 4], vec![("1Gi", "")]].concat(),
            0,
            (0, vec![], 0, 4, false),
        ),
        // Minimum 0: nothing made.
        (0, 10, vec![], 0, (0, vec![], 0, 0, true)),
        // At the maximum with one more being made: nothing is deleted for a volume that may
        // not exist (it was one of these, counted twice, on a loaded machine).
        (
            3,
            3,
            vec![("1Gi", "Available"); 3],
            1,
            (0, vec![], 0, 3, true),
        ),
        // Over the maximum by existing volumes, one more being made: only the existing surplus.
        (
            1,
            2,
            vec![("1Gi", "Available"); 3],
            1,
            (0, vec!["pv-0"], 0, 3, true),
        ),
    ];
    for (i, (min, max, volumes, creating, want)) in cases.into_iter().enumerate() {
        let s = set(min, max);
        let pvs: Vec<PersistentVolume> = volumes
            .iter()
            .enumerate()
            .map(|(n, (size, phase))| pv(&format!("pv-{n}"), size, phase, "fast"))
            .collect();
        let refs: Vec<&PersistentVolume> = pvs.iter().collect();
        let p = plan(&s, &refs, creating, 1, any);
        let got = (
            p.create,
            p.delete.clone(),
            p.status.bound_replicas,
            p.status.unbound_replicas,
            p.ready,
        );
        let want = (
            want.0,
            want.1.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            want.2,
            want.3,
            want.4,
        );
        assert_eq!(got, want, "case {i}");
        assert_eq!(p.status.observed_generation, Some(3));
        assert!(p.invalid.is_none());
    }
}

#[test]
fn volumes_made_by_hand_that_match_are_members_and_others_are_not() {
    let s = set(2, 4);
    let pvs = [
        pv("made-by-hand", "10Gi", "Available", "fast"),
        pv("other-pool", "1Gi", "Available", "slow"),
        pv("from-old-template", "2Gi", "Available", "fast"),
    ];
    let m = members(&s, pvs.iter());
    let names: Vec<&str> = m
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, vec!["made-by-hand", "from-old-template"]);
    let p = plan(&s, &m, 0, 1, any);
    assert!(
        p.create == 0 && p.delete.is_empty() && p.ready,
        "two adopted volumes meet the minimum"
    );
    // A template change (a larger size) leaves existing volumes alone; scaling to 1 deletes
    // the largest (the hand-made 10Gi) first.
    let mut smaller = set(1, 1);
    smaller
        .spec
        .template
        .spec
        .capacity
        .get_or_insert_default()
        .insert(
            "storage".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("20Gi".into()),
        );
    assert_eq!(
        plan(&smaller, &m, 0, 1, any).delete,
        vec!["made-by-hand".to_string()]
    );
    // Only deletable volumes are chosen: without the hand-made one, the next largest goes.
    let not_hand_made = |pv: &PersistentVolume| pv.metadata.name.as_deref() != Some("made-by-hand");
    assert_eq!(
        plan(&smaller, &m, 0, 1, not_hand_made).delete,
        vec!["from-old-template".to_string()]
    );
    let mut deleting = pvs[0].clone();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-23T00:00:00Z".parse().unwrap(),
        ));
    let m2 = vec![&deleting, &pvs[2]];
    let p = plan(&smaller, &m2, 0, 1, any);
    assert_eq!(
        (p.delete.len(), p.status.replicas),
        (0, 1),
        "a volume being deleted is not chosen again and no longer counts"
    );
}

#[test]
fn specs_that_cannot_be_served_change_nothing_and_say_why() {
    let mut cases: Vec<(PersistentVolumeSet, &str)> = Vec::new();
    cases.push((set(-1, 3), "must not be negative"));
    cases.push((
        set(4, 3),
        "spec.minimumReplicas (4) must not exceed spec.maximumReplicas (3)",
    ));
    let mut s = set(1, 3);
    s.spec.selector = Default::default();
    cases.push((s, "spec.selector must not be empty"));
    let mut s = set(1, 3);
    s.spec.template.metadata.labels = Some([("pool".to_string(), "slow".to_string())].into());
    cases.push((s, "spec.template.metadata.labels must match spec.selector"));
    let mut s = set(1, 3);
    s.spec.template.spec.storage_class_name = None;
    cases.push((
        s,
        "storageClassName is required (or a volume source, for static volumes)",
    ));
    let mut s = set(1, 3);
    s.spec.template.spec.csi = Some(Default::default());
    cases.push((s, "a CSI volume is made through its class"));
    let mut s = static_set(1, 3);
    s.spec.template.spec.claim_ref = Some(Default::default());
    cases.push((s, "claimRef: a set's volumes are not bound in advance"));
    let mut s = set(1, 3);
    s.spec.template.spec.capacity = None;
    cases.push((s, "capacity.storage is required"));
    let mut s = set(1, 3);
    s.spec
        .template
        .spec
        .capacity
        .get_or_insert_default()
        .insert(
            "storage".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
        );
    cases.push((s, "capacity.storage:"));
    let mut s = set(1, 3);
    s.spec.template.spec.access_modes = None;
    cases.push((s, "at least one access mode"));
    for (s, words) in cases {
        let why = invalid(&s).unwrap_or_default();
        assert!(why.contains(words), "{why:?} should say {words:?}");
        let p = plan(&s, &[], 0, 1, any);
        assert!(p.create == 0 && p.delete.is_empty() && !p.ready);
        assert_eq!(p.invalid.as_deref(), Some(why.as_str()));
    }
    assert_eq!(invalid(&set(0, 0)), None, "an empty pool is a valid pool");
}

#[test]
fn up_to_the_in_flight_bound_is_made_at_once_never_past_the_maximum() {
    // (min, max, Bound, Available, creating, in flight) → create
    let table = [
        (100, 200, 0, 0, 0, 10, 10),
        (100, 200, 0, 0, 4, 10, 6),
        (100, 200, 0, 95, 0, 10, 5),
        // Room for 3 below the maximum.
        (10, 13, 10, 0, 0, 10, 3),
        (5, 10, 0, 0, 0, 1, 1),
        (5, 10, 0, 0, 1, 1, 0),
        (5, 10, 0, 0, 0, 0, 1),
    ];
    for (min, max, bound, available, creating, in_flight, want) in table {
        let s = set(min, max);
        let pvs: Vec<PersistentVolume> = (0..bound)
            .map(|n| pv(&format!("b-{n}"), "1Gi", "Bound", "fast"))
            .chain((0..available).map(|n| pv(&format!("pv-{n}"), "1Gi", "Available", "fast")))
            .collect();
        let refs: Vec<&PersistentVolume> = pvs.iter().collect();
        let p = plan(&s, &refs, creating, in_flight, any);
        assert_eq!(
            p.create, want,
            "min {min} max {max} available {available} creating {creating} in flight {in_flight}"
        );
    }
}

#[test]
fn deletions_go_through_the_driver_and_end_by_what_happened_meanwhile() {
    let with = |name: &str, phase: &str, extra: serde_json::Value| {
        let mut v = serde_json::to_value(pv(name, "1Gi", phase, "fast")).unwrap();
        json_patch::merge(&mut v, &extra);
        serde_json::from_value::<PersistentVolume>(v).unwrap()
    };
    let csi = |driver: &str| json!({"spec": {"csi": {"driver": driver, "volumeHandle": "h"}}});
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-23T00:00:00Z",
        "finalizers": ["storage.volstack.dev/persistentvolumeset"]}});
    let delete_policy = json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}});

    let made_by = |set: &str| json!({"metadata": {"labels": {LABEL_SET: set}}});
    let nfs = json!({"spec": {"nfs": {"server": "nfs.example", "path": "/x"}}});
    let both = |a: &serde_json::Value, b: &serde_json::Value| {
        let mut v = a.clone();
        json_patch::merge(&mut v, b);
        v
    };
    let provisioned =
        json!({"metadata": {"annotations": {"pv.kubernetes.io/provisioned-by": "nfs.io"}}});
    // (volume, the set asking, deletable)
    let table = [
        (with("a", "Available", csi("d")), "pool", true),
        (with("b", "Available", csi("other")), "pool", false),
        (with("c", "Available", nfs.clone()), "pool", false),
        (
            with("d", "Available", both(&nfs, &made_by("pool"))),
            "pool",
            true,
        ),
        (
            with("e", "Available", both(&nfs, &made_by("other"))),
            "pool",
            false,
        ),
        (
            with(
                "f",
                "Available",
                both(&both(&nfs, &made_by("pool")), &provisioned),
            ),
            "pool",
            false,
        ),
        (
            with("g", "Available", both(&csi("other"), &made_by("pool"))),
            "pool",
            false,
        ),
    ];
    for (volume, set, want) in &table {
        assert_eq!(
            deletable_by(volume, "d", set),
            *want,
            "{:?} for set {set}",
            volume.metadata.name
        );
    }

    // (volume, end)
    let table = [
        (
            with("unused", "Available", csi("d")),
            DeletionEnd::Delete(Some("h".into())),
        ),
        (
            with("fresh", "", csi("d")),
            DeletionEnd::Delete(Some("h".into())),
        ),
        (
            with("foreign", "Available", csi("other")),
            DeletionEnd::Delete(None),
        ),
        (with("claimed", "Bound", csi("d")), DeletionEnd::Claimed),
        (with("released", "Released", csi("d")), DeletionEnd::Claimed),
    ];
    for (v, want) in table {
        assert_eq!(deletion_end(&v, "d"), want, "{:?}", v.metadata.name);
    }

    let a = with("a", "Available", delete_policy.clone());
    let b = with(
        "b",
        "Available",
        json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}),
    );
    let c = with("c", "Bound", delete_policy.clone());
    let d = with("d", "Available", deleting.clone());
    let e = with(
        "e",
        "Available",
        json!({"metadata": {"deletionTimestamp": "2026-11-23T00:00:00Z"}}),
    );
    let all = [&a, &b, &c, &d, &e];
    let names = |v: Vec<&PersistentVolume>| -> Vec<String> {
        v.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    };
    assert_eq!(names(leftovers(&all)), vec!["a"], "unused and Delete only");
    assert_eq!(
        names(unfinished(&all)),
        vec!["d"],
        "being deleted and held by the set"
    );
}

#[test]
fn a_pass_reads_the_volumes_its_selector_or_its_label_names_and_all_when_unlabelled_ones_match() {
    let labels = |pairs: &[(&str, &str)]| -> sidecar_kit::selectors::Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let labelled: Vec<(String, sidecar_kit::selectors::Labels)> = vec![
        ("fast-1".into(), labels(&[("pool", "fast")])),
        ("slow-1".into(), labels(&[("pool", "slow")])),
        ("made".into(), labels(&[(LABEL_SET, "pool")])),
        ("other".into(), labels(&[(LABEL_SET, "other")])),
    ];
    let read = |set: Option<&PersistentVolumeSet>| {
        candidates("pool", set, labelled.iter().map(|(n, l)| (n, l))).map(|mut names| {
            names.sort();
            names
        })
    };
    let s = set(1, 2);
    assert_eq!(read(Some(&s)), Some(vec!["fast-1".into(), "made".into()]));
    // The set is gone: what it made.
    assert_eq!(read(None), Some(vec!["made".to_string()]));
    // Selectors that match a volume without labels: every volume is read.
    let mut empty = s.clone();
    empty.spec.selector = Default::default();
    assert_eq!(read(Some(&empty)), None);
    let mut not_in = s.clone();
    not_in.spec.selector = serde_json::from_value(
        json!({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["slow"]}]}),
    )
    .unwrap();
    assert_eq!(read(Some(&not_in)), None);
}

#[test]
fn a_volume_seen_in_flight_made_and_as_a_member_is_counted_once() {
    let member = pv("fast-1", "1Gi", "Available", "fast");
    let other = pv("fast-9", "1Gi", "Available", "fast");
    let members = [&member, &other];
    // (in flight, made but unseen) → being made
    let cases: Vec<(Vec<&str>, Vec<&str>, usize)> = vec![
        (vec![], vec![], 0),
        (vec!["fast-2"], vec![], 1),
        (vec![], vec!["fast-2"], 1),
        // In flight and noted as made: one volume.
        (vec!["fast-2"], vec!["fast-2"], 1),
        // Already a member: not being made any more, wherever else it shows.
        (vec!["fast-1"], vec!["fast-1"], 0),
        (vec!["fast-1", "fast-2"], vec!["fast-3"], 2),
    ];
    for (i, (in_flight, unseen, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            being_made(in_flight.iter().copied(), unseen.iter().copied(), &members),
            want,
            "case {i}"
        );
    }
}

#[test]
fn a_member_is_made_only_from_a_whole_record_of_a_set_that_exists() {
    let uid = "6f1c1a52-0c55-4c4e-9a8e-2f1b2c3d4e5f";
    let token = uuid::Uuid::parse_str(uid).ok();
    // (set exists, listed, token) → made under
    let rows = [
        ((true, false, uid), token),
        ((false, false, uid), None),
        ((true, true, uid), None),
        ((true, false, "not-a-uuid"), None),
        ((true, false, ""), None),
    ];
    for ((exists, listed, text), want) in rows {
        assert_eq!(
            member_token(exists, listed, text),
            want,
            "{exists} {listed} {text:?}"
        );
    }
}

#[test]
fn a_template_with_a_volume_source_makes_static_volumes() {
    assert_eq!(template_source(&set(1, 2).spec.template.spec), None);
    let s = static_set(1, 2);
    assert_eq!(
        template_source(&s.spec.template.spec).as_deref(),
        Some("nfs")
    );
    assert_eq!(invalid(&s), None, "no class is needed");
    let mut local = set(1, 2);
    local.spec.template.spec.local = Some(k8s_openapi::api::core::v1::LocalVolumeSource {
        path: "/mnt/disks/a".into(),
        fs_type: None,
    });
    assert_eq!(
        template_source(&local.spec.template.spec).as_deref(),
        Some("local"),
        "a class may be named beside the source (for binding)"
    );
    assert_eq!(invalid(&local), None);
    let p = plan(&s, &[], 0, 10, any);
    assert_eq!(p.create, 1, "made like any other set's volumes");
    assert!(p.objects_only, "as objects only");
    assert!(!plan(&set(1, 2), &[], 0, 10, any).objects_only);
}
