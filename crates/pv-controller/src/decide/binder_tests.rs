#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use super::*;

fn dc(
    c: &PersistentVolumeClaim,
    v: &[PersistentVolume],
    cl: &[StorageClass],
    d: Option<&StorageClass>,
) -> ClaimAction {
    decide_claim(c, v, cl, d)
}

fn dv(pv: &PersistentVolume, claims: &[PersistentVolumeClaim]) -> VolumeAction {
    decide_volume(pv, claims, ClaimSource::Server)
}

fn claim(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: class.map(str::to_string),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        }),
    }
}

fn pv(name: &str, class: &str, size: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            storage_class_name: Some(class.into()).filter(|c: &String| !c.is_empty()),
            access_modes: Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(size.into()),
            )])),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Available".into()),
            ..Default::default()
        }),
    }
}

fn bound_to(mut v: PersistentVolume, c: &PersistentVolumeClaim) -> PersistentVolume {
    v.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
        name: c.metadata.name.clone(),
        namespace: c.metadata.namespace.clone(),
        uid: c.metadata.uid.clone(),
        ..Default::default()
    });
    v
}

/// A volume reserved for the claim by name and namespace only (a claimRef without a UID).
fn reserved_for(v: PersistentVolume, c: &PersistentVolumeClaim) -> PersistentVolume {
    let mut v = bound_to(v, c);
    if let Some(r) = v.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = None;
    }
    v
}

fn with_phase(mut v: PersistentVolume, phase: &str) -> PersistentVolume {
    v.status = Some(PersistentVolumeStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    v
}

fn sc(name: &str, provisioner: &str, wffc: bool) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: Some(
            if wffc {
                "WaitForFirstConsumer"
            } else {
                "Immediate"
            }
            .into(),
        ),
        ..Default::default()
    }
}

#[test]
fn the_smallest_matching_available_volume_is_bound() {
    let c = claim("c", Some("gold"), "5Gi");
    let volumes = vec![
        pv("big", "gold", "100Gi"),
        pv("small", "gold", "10Gi"),
        pv("tiny", "gold", "1Gi"),
        pv("other-class", "silver", "5Gi"),
    ];
    assert_eq!(
        dc(&c, &volumes, &[], None),
        ClaimAction::Bind("small".into())
    );
}

#[test]
fn class_mode_access_and_selector_must_match() {
    let mut c = claim("c", Some(""), "1Gi");
    let mut block = pv("block", "", "1Gi");
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let labelled = {
        let mut v = pv("labelled", "", "2Gi");
        v.metadata.labels = Some(BTreeMap::from([("tier".to_string(), "fast".to_string())]));
        v
    };
    let volumes = vec![
        block,
        pv("classed", "gold", "1Gi"),
        labelled,
        pv("plain", "", "3Gi"),
    ];
    assert_eq!(
        dc(&c, &volumes, &[], None),
        ClaimAction::Bind("labelled".into()),
        "empty class matches class-less volumes"
    );
    c.spec.as_mut().unwrap().selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "In".into(),
            values: Some(vec!["fast".into()]),
        }]),
        match_labels: None,
    });
    assert_eq!(
        dc(&c, &volumes[3..], &[], None),
        ClaimAction::Pending {
            event: sidecar_kit::events::EventType::Normal,
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set"
                .into()
        }
    );
    c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    assert_eq!(
        mismatch(&c, &volumes[2]).as_deref(),
        Some("incompatible accessMode")
    );
}

#[test]
fn a_claim_without_class_gets_the_default_and_an_empty_class_does_not() {
    let default = sc("standard", "csi.example", false);
    assert_eq!(
        dc(
            &claim("c", None, "1Gi"),
            &[],
            std::slice::from_ref(&default),
            Some(&default)
        ),
        ClaimAction::AssignDefaultClass("standard".into())
    );
    assert!(matches!(
        dc(
            &claim("c", Some(""), "1Gi"),
            &[],
            std::slice::from_ref(&default),
            Some(&default)
        ),
        ClaimAction::Pending { .. }
    ));
}

#[test]
fn a_class_of_a_migrated_in_tree_plugin_is_provisioned_by_its_csi_driver() {
    // (class provisioner, the provisioner the claim is annotated for)
    let table = [
        ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
        ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
        ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
        ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
        // An external provisioner's name: asked as it is.
        ("rbd.csi.ceph.com", "rbd.csi.ceph.com"),
    ];
    for (in_tree, driver) in table {
        let classes = vec![sc("old", in_tree, false)];
        assert_eq!(
            dc(&claim("c", Some("old"), "1Gi"), &[], &classes, None),
            ClaimAction::Provision {
                provisioner: driver.into(),
                annotated: false
            },
            "{in_tree}"
        );
    }
}

#[test]
fn without_a_match_the_class_provisioner_is_asked() {
    let classes = vec![
        sc("fast", "csi.example", false),
        sc("late", "csi.example", true),
        sc("static", NO_PROVISIONER, false),
    ];
    assert_eq!(
        dc(&claim("c", Some("fast"), "1Gi"), &[], &classes, None),
        ClaimAction::Provision {
            provisioner: "csi.example".into(),
            annotated: false
        }
    );
    assert_eq!(
        dc(&claim("c", Some("late"), "1Gi"), &[], &classes, None),
        ClaimAction::WaitForFirstConsumer
    );
    let mut selected = claim("c", Some("late"), "1Gi");
    selected.metadata.annotations = Some(BTreeMap::from([(
        ANN_SELECTED_NODE.to_string(),
        "node-1".to_string(),
    )]));
    assert!(matches!(
        dc(&selected, &[], &classes, None),
        ClaimAction::Provision { .. }
    ));
    // kube-controller-manager's words for a class no in-tree plugin provisions (read on a
    // real control plane by cli/tests/real_cluster/binder_differential.rs).
    assert_eq!(
        dc(&claim("c", Some("static"), "1Gi"), &[], &classes, None),
        ClaimAction::Pending {
            event: sidecar_kit::events::EventType::Warning,
            reason: "ProvisioningFailed",
            message: "no volume plugin matched name: kubernetes.io/no-provisioner".into(),
        }
    );
    let mut in_tree = classes.clone();
    in_tree.push(sc("rbd", "kubernetes.io/rbd", false));
    assert!(matches!(
        dc(&claim("c", Some("rbd"), "1Gi"), &[], &in_tree, None),
        ClaimAction::Pending { reason: "ProvisioningFailed", message, .. } if message == "no volume plugin matched name: kubernetes.io/rbd"
    ));
    let missing = dc(&claim("c", Some("nope"), "1Gi"), &[], &classes, None);
    assert_eq!(
        missing,
        ClaimAction::Pending {
            event: sidecar_kit::events::EventType::Warning,
            reason: "ProvisioningFailed",
            message: "storageclass.storage.k8s.io \"nope\" not found".into()
        }
    );
}

#[test]
fn a_provisioned_volume_naming_the_claim_completes_the_binding() {
    let c = claim("c", Some("fast"), "1Gi");
    let made = with_phase(bound_to(pv("pvc-1", "fast", "1Gi"), &c), "Pending");
    assert_eq!(
        dc(&c, std::slice::from_ref(&made), &[], None),
        ClaimAction::CompleteBinding("pvc-1".into())
    );
    let mut bound = c.clone();
    bound.spec.as_mut().unwrap().volume_name = Some("pvc-1".into());
    bound.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        ..Default::default()
    });
    bound.metadata.annotations = Some(BTreeMap::from([(
        ANN_BIND_COMPLETED.to_string(),
        "yes".to_string(),
    )]));
    assert_eq!(
        dc(&bound, &[with_phase(made.clone(), "Bound")], &[], None),
        ClaimAction::Nothing
    );
    assert_eq!(
        dc(&bound, &[made], &[], None),
        ClaimAction::CompleteBinding("pvc-1".into())
    );
}

#[test]
fn pre_bound_claims_and_volumes_are_honoured() {
    let mut c = claim("c", Some(""), "1Gi");
    c.spec.as_mut().unwrap().volume_name = Some("chosen".into());
    let volumes = vec![pv("smaller", "", "1Gi"), pv("chosen", "", "50Gi")];
    assert_eq!(
        dc(&c, &volumes, &[], None),
        ClaimAction::Bind("chosen".into())
    );
    let taken = bound_to(
        pv("chosen", "", "50Gi"),
        &claim("someone-else", Some(""), "1Gi"),
    );
    assert_eq!(
        dc(&c, &[taken], &[], None),
        ClaimAction::Pending {
            event: sidecar_kit::events::EventType::Warning,
            reason: "FailedBinding",
            message: "volume \"chosen\" already bound to a different claim.".into(),
        }
    );
    // Not there (yet): no event, as kube-controller-manager.
    assert_eq!(
        dc(&c, &[] as &[PersistentVolume], &[], None),
        ClaimAction::Wait("volume \"chosen\" not found".into())
    );

    let d = claim("d", Some(""), "1Gi");
    let mut reserved = pv("reserved", "", "9Gi");
    reserved.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
        name: Some("d".into()),
        namespace: Some("default".into()),
        ..Default::default()
    });
    let volumes = vec![pv("smaller", "", "1Gi"), reserved];
    assert_eq!(
        dc(&d, &volumes, &[], None),
        ClaimAction::CompleteBinding("reserved".into()),
        "a volume pre-bound by name wins"
    );
    assert!(
        best_match(&claim("e", Some(""), "1Gi"), &volumes)
            .map(|v| v.metadata.name.as_deref() == Some("smaller"))
            .unwrap()
    );
}

#[test]
fn a_claim_whose_binding_completed_keeps_its_volume_or_is_lost_as_kube_controller_manager_says() {
    let completed = |volume: Option<&str>, phase: &str| {
        let mut c = claim("c", Some(""), "1Gi");
        c.spec.as_mut().unwrap().volume_name = volume.map(str::to_string);
        c.metadata.annotations = Some(BTreeMap::from([(
            ANN_BIND_COMPLETED.to_string(),
            "yes".to_string(),
        )]));
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        c
    };
    let mine = completed(Some("v"), "Bound");
    let other = claim("other", Some(""), "1Gi");
    let lost = |reason, message| ClaimAction::Lost { reason, message };
    // (claim, its volume if any, action)
    let table = [
        (
            completed(None, "Bound"),
            None,
            lost(
                "ClaimLost",
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            ),
        ),
        (
            completed(Some("v"), "Bound"),
            None,
            lost(
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            ),
        ),
        // Lost once: no second event.
        (completed(Some("v"), "Lost"), None, ClaimAction::Nothing),
        // The volume lost its claimRef: bound again.
        (
            completed(Some("v"), "Bound"),
            Some(pv("v", "", "1Gi")),
            ClaimAction::Bind("v".into()),
        ),
        (
            completed(Some("v"), "Bound"),
            Some(with_phase(bound_to(pv("v", "", "1Gi"), &mine), "Bound")),
            ClaimAction::Nothing,
        ),
        (
            completed(Some("v"), "Pending"),
            Some(with_phase(bound_to(pv("v", "", "1Gi"), &mine), "Bound")),
            ClaimAction::CompleteBinding("v".into()),
        ),
        (
            completed(Some("v"), "Bound"),
            Some(bound_to(pv("v", "", "1Gi"), &other)),
            lost(
                "ClaimMisbound",
                "Two claims are bound to the same volume, this one is bound incorrectly",
            ),
        ),
    ];
    for (c, volume, want) in table {
        let volumes: Vec<PersistentVolume> = volume.into_iter().collect();
        assert_eq!(dc(&c, &volumes, &[], None), want, "{:?}", c.spec);
    }
}

#[test]
fn late_binding_leaves_unbound_volumes_to_the_scheduler() {
    let classes = vec![
        sc("local", NO_PROVISIONER, true),
        sc("late", "csi.example", true),
    ];
    let local = pv("local-1", "local", "5Gi");
    // kube-controller-manager does not bind a WaitForFirstConsumer claim to an unbound volume.
    assert_eq!(
        dc(
            &claim("c", Some("local"), "1Gi"),
            std::slice::from_ref(&local),
            &classes,
            None
        ),
        ClaimAction::WaitForFirstConsumer
    );
    // The scheduler pre-binds one: the binding is completed.
    let c = claim("c", Some("local"), "1Gi");
    assert_eq!(
        dc(&c, &[bound_to(local.clone(), &c)], &classes, None),
        ClaimAction::CompleteBinding("local-1".into())
    );
    // A node chosen and nothing pre-bound: provisioned (or refused for no-provisioner).
    let mut selected = claim("c", Some("local"), "1Gi");
    selected.metadata.annotations = Some(BTreeMap::from([(
        ANN_SELECTED_NODE.to_string(),
        "node-1".to_string(),
    )]));
    assert!(matches!(
        dc(&selected, std::slice::from_ref(&local), &classes, None),
        ClaimAction::Pending {
            reason: "ProvisioningFailed",
            ..
        }
    ));
}

#[test]
fn a_class_less_claim_takes_a_class_less_volume_before_the_default_class() {
    let default = sc("standard", "csi.example", false);
    let plain = pv("plain", "", "1Gi");
    assert_eq!(
        dc(
            &claim("c", None, "1Gi"),
            std::slice::from_ref(&plain),
            std::slice::from_ref(&default),
            Some(&default)
        ),
        ClaimAction::Bind("plain".into())
    );
    assert_eq!(
        dc(
            &claim("c", None, "1Gi"),
            &[] as &[PersistentVolume],
            std::slice::from_ref(&default),
            Some(&default)
        ),
        ClaimAction::AssignDefaultClass("standard".into())
    );
}

#[test]
fn a_volume_whose_claim_bound_elsewhere_is_released_unbound_or_kept_reserved() {
    let mut c = claim("c", Some(""), "1Gi");
    c.spec.as_mut().unwrap().volume_name = Some("elsewhere".into());
    let annotated = |mut v: PersistentVolume, key: &str| {
        v.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), "yes".to_string());
        v
    };
    let delete = |mut v: PersistentVolume| {
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        v
    };
    let by_name = reserved_for(pv("v", "", "1Gi"), &c);
    // (volume, action)
    let table = [
        // Provisioned for it, policy Delete: Released, for the provisioner to delete.
        (
            with_phase(
                delete(annotated(
                    bound_to(pv("v", "", "1Gi"), &c),
                    ANN_PROVISIONED_BY,
                )),
                "Bound",
            ),
            VolumeAction::SetPhase("Released"),
        ),
        (
            with_phase(
                delete(annotated(
                    bound_to(pv("v", "", "1Gi"), &c),
                    ANN_PROVISIONED_BY,
                )),
                "Released",
            ),
            VolumeAction::Nothing,
        ),
        // Bound by this controller: unbound.
        (
            with_phase(
                annotated(bound_to(pv("v", "", "1Gi"), &c), ANN_BOUND_BY_CONTROLLER),
                "Bound",
            ),
            VolumeAction::Unbind,
        ),
        // Pre-bound by the user: the UID goes, the reservation stays.
        (
            with_phase(bound_to(pv("v", "", "1Gi"), &c), "Bound"),
            VolumeAction::ClearClaimUid,
        ),
        (
            with_phase(by_name.clone(), "Bound"),
            VolumeAction::SetPhase("Available"),
        ),
        (with_phase(by_name, "Available"), VolumeAction::Nothing),
    ];
    for (v, want) in table {
        assert_eq!(dv(&v, std::slice::from_ref(&c)), want, "{:?}", v.metadata);
    }
}

#[test]
fn volumes_move_through_their_phases() {
    let c = claim("c", Some(""), "1Gi");
    assert_eq!(
        dv(&with_phase(pv("v", "", "1Gi"), "Pending"), &[]),
        VolumeAction::SetPhase("Available")
    );
    assert_eq!(dv(&pv("v", "", "1Gi"), &[]), VolumeAction::Nothing);
    let mut bound_claim = c.clone();
    bound_claim.spec.as_mut().unwrap().volume_name = Some("v".into());
    let v = with_phase(bound_to(pv("v", "", "1Gi"), &c), "Available");
    assert_eq!(
        dv(&v, &[bound_claim.clone()]),
        VolumeAction::SetPhase("Bound")
    );
    let v = with_phase(v, "Bound");
    assert_eq!(dv(&v, &[bound_claim]), VolumeAction::Nothing);
    assert_eq!(
        dv(&v, &[]),
        VolumeAction::SetPhase("Released"),
        "claim deleted"
    );
    let mut replaced = c.clone();
    replaced.metadata.uid = Some("another-uid".into());
    assert_eq!(
        dv(&v, &[replaced.clone()]),
        VolumeAction::SetPhase("Released"),
        "same name, new claim"
    );
    // From the cache, neither releases: the claim is read from the server first.
    for cached in [vec![], vec![replaced]] {
        assert_eq!(
            decide_volume(&v, &cached, ClaimSource::Cache),
            VolumeAction::ReadClaimLive,
            "{cached:?}"
        );
    }
    let released = with_phase(v.clone(), "Released");
    assert_eq!(
        decide_volume(
            &released,
            &[] as &[PersistentVolumeClaim],
            ClaimSource::Cache
        ),
        VolumeAction::Nothing,
        "released already: nothing to read"
    );
}

#[test]
fn released_volumes_follow_their_reclaim_policy() {
    let c = claim("c", Some(""), "1Gi");
    let released = |policy: &str, provisioned: bool| {
        let mut v = with_phase(bound_to(pv("v", "", "1Gi"), &c), "Released");
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some(policy.into());
        if provisioned {
            v.metadata.annotations = Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                "csi.example".to_string(),
            )]));
        }
        v
    };
    assert_eq!(dv(&released("Retain", true), &[]), VolumeAction::Nothing);
    assert_eq!(
        dv(&released("Delete", true), &[]),
        VolumeAction::Nothing,
        "the provisioner deletes it"
    );
    assert_eq!(
        dv(&released("Delete", false), &[]),
        VolumeAction::Fail {
            reason: "VolumeFailedDelete",
            message: "error getting deleter volume plugin for volume \"v\": no deletable volume plugin matched".into(),
        },
        "no deleter for a hostPath volume"
    );
    let mut csi_delete = released("Delete", false);
    csi_delete.spec.as_mut().unwrap().csi = Some(Default::default());
    assert_eq!(
        dv(&csi_delete, &[]),
        VolumeAction::Nothing,
        "a CSI volume: external, silent"
    );
    let mut migrated = released("Delete", false);
    migrated.metadata.annotations = Some(BTreeMap::from([(
        "pv.kubernetes.io/migrated-to".to_string(),
        "ebs.csi.aws.com".to_string(),
    )]));
    assert_eq!(
        dv(&migrated, &[]),
        VolumeAction::Nothing,
        "migrated: the CSI provisioner's"
    );
    assert_eq!(
        dv(&released("Scrub", true), &[]),
        VolumeAction::Fail {
            reason: "VolumeUnknownReclaimPolicy",
            message: "Volume has unrecognized PersistentVolumeReclaimPolicy".into(),
        }
    );
    assert_eq!(dv(&released("Recycle", false), &[]), VolumeAction::Recycle);
    // With node agents (the embedded stack), CSI volumes are theirs to recycle.
    let mut csi = released("Recycle", false);
    csi.spec.get_or_insert_with(Default::default).csi = Some(Default::default());
    assert!(left_to_node_recyclers(&csi, true));
    assert!(!left_to_node_recyclers(&csi, false));
    assert!(
        !left_to_node_recyclers(&released("Recycle", false), true),
        "not CSI"
    );
}

#[test]
fn a_controller_binding_to_a_claim_that_bound_elsewhere_is_undone() {
    let mut c = claim("c", Some(""), "1Gi");
    c.spec.as_mut().unwrap().volume_name = Some("winner".into());
    let mut loser = bound_to(pv("loser", "", "1Gi"), &c);
    loser.metadata.annotations = Some(BTreeMap::from([(
        ANN_BOUND_BY_CONTROLLER.to_string(),
        "yes".to_string(),
    )]));
    assert_eq!(dv(&loser, &[c]), VolumeAction::Unbind);
}

#[test]
fn looking_volumes_up_by_name_decides_as_the_full_scan() {
    let class = sc("fast", "csi.example.com", false);
    let waiting = claim("c1", Some("fast"), "1Gi");
    let mut named = claim("c2", Some("fast"), "1Gi");
    named.spec.as_mut().unwrap().volume_name = Some("static-2".into());
    let mut named_gone = claim("c3", Some("fast"), "1Gi");
    named_gone.spec.as_mut().unwrap().volume_name = Some("nowhere".into());
    let other = claim("c4", Some("fast"), "1Gi");
    let volumes = vec![
        pv("spare", "fast", "1Gi"),
        bound_to(pv("pvc-uid-c1", "fast", "1Gi"), &waiting),
        pv("static-2", "fast", "1Gi"),
        // Named like c4's volume but made for another claim: not taken as c4's.
        bound_to(pv("pvc-uid-c4", "fast", "1Gi"), &waiting),
    ];
    let lookup = |name: &str| {
        volumes
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(name))
            .cloned()
    };
    // (claim, the volumes looked up by name: None = scan them all)
    let table: [(&PersistentVolumeClaim, Option<Vec<&str>>); 4] = [
        (&waiting, Some(vec!["pvc-uid-c1"])),
        (&named, Some(vec!["static-2"])),
        (&named_gone, Some(vec![])),
        (&other, None),
    ];
    for (c, want) in table {
        let got = named_volumes(c, &["pvc"], lookup);
        let names = got.as_ref().map(|vs| {
            vs.iter()
                .map(|v| v.metadata.name.as_deref().unwrap_or_default())
                .collect::<Vec<_>>()
        });
        assert_eq!(names, want, "{:?}", c.metadata.name);
        if let Some(subset) = got {
            assert_eq!(
                dc(c, &subset, std::slice::from_ref(&class), None),
                dc(c, &volumes, std::slice::from_ref(&class), None),
                "{:?}",
                c.metadata.name
            );
        }
    }
}

#[test]
fn a_named_volume_that_does_not_satisfy_its_claim_is_refused_in_kube_controller_managers_words() {
    let mut c = claim("c", Some("fast"), "2Gi");
    c.spec.as_mut().unwrap().volume_name = Some("v".into());
    let mut deleting = pv("v", "fast", "5Gi");
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-26T00:00:00Z".parse().unwrap(),
        ));
    let mut block = pv("v", "fast", "5Gi");
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let mut rox = pv("v", "fast", "5Gi");
    rox.spec.as_mut().unwrap().access_modes = Some(vec!["ReadOnlyMany".into()]);
    // (volume, why), checked in kube-controller-manager's order
    let table = [
        (deleting, "the volume is marked for deletion \"v\""),
        (pv("v", "fast", "1Gi"), "requested PV is too small"),
        (pv("v", "slow", "5Gi"), "storageClassName does not match"),
        (block, "incompatible volumeMode"),
        (rox, "incompatible accessMode"),
    ];
    for (volume, why) in table {
        assert_eq!(
            dc(&c, &[volume], &[], None),
            ClaimAction::Pending {
                event: sidecar_kit::events::EventType::Warning,
                reason: "VolumeMismatch",
                message: format!("Cannot bind to requested volume \"v\": {why}"),
            }
        );
    }
}

#[test]
fn volumes_an_in_tree_plugin_provisioned_are_marked_migrated_to_its_csi_driver() {
    let annotated = |pairs: &[(&str, &str)]| {
        let mut v = with_phase(pv("v", "", "1Gi"), "Available");
        v.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, val)| (k.to_string(), val.to_string()))
                .collect(),
        );
        v
    };
    const TO: &str = "pv.kubernetes.io/migrated-to";
    // (annotations, action)
    let table = [
        (
            vec![(ANN_PROVISIONED_BY, "kubernetes.io/aws-ebs")],
            VolumeAction::MigratedTo(Some("ebs.csi.aws.com".into())),
        ),
        (
            vec![
                (ANN_PROVISIONED_BY, "kubernetes.io/aws-ebs"),
                (TO, "ebs.csi.aws.com"),
            ],
            VolumeAction::Nothing,
        ),
        (
            vec![
                (ANN_PROVISIONED_BY, "kubernetes.io/gce-pd"),
                (TO, "ebs.csi.aws.com"),
            ],
            VolumeAction::MigratedTo(Some("pd.csi.storage.gke.io".into())),
        ),
        (
            vec![(ANN_PROVISIONED_BY, "csi.example"), (TO, "ebs.csi.aws.com")],
            VolumeAction::MigratedTo(None),
        ),
        (
            vec![(ANN_PROVISIONED_BY, "csi.example")],
            VolumeAction::Nothing,
        ),
        // Static: left alone.
        (vec![(TO, "ebs.csi.aws.com")], VolumeAction::Nothing),
    ];
    for (pairs, want) in table {
        assert_eq!(dv(&annotated(&pairs), &[]), want, "{pairs:?}");
    }
}

#[test]
fn a_failed_volume_without_a_claim_and_a_reserved_one_are_available() {
    assert_eq!(
        dv(&with_phase(pv("v", "", "1Gi"), "Failed"), &[]),
        VolumeAction::SetPhase("Available")
    );
    let c = claim("c", Some(""), "1Gi");
    let reserved = with_phase(reserved_for(pv("v", "", "1Gi"), &c), "Bound");
    assert_eq!(
        dv(&reserved, std::slice::from_ref(&c)),
        VolumeAction::SetPhase("Available")
    );
}

#[test]
fn claims_naming_a_migrated_in_tree_plugin_are_marked_migrated_to_its_csi_driver() {
    const TO: &str = "pv.kubernetes.io/migrated-to";
    let annotated = |pairs: &[(&str, &str)]| {
        let mut c = claim("c", Some("gp2"), "1Gi");
        c.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c
    };
    // (annotations, the migration action or None for "decided as usual")
    type Row<'a> = (Vec<(&'a str, &'a str)>, Option<ClaimAction>);
    let table: Vec<Row> = vec![
        (
            vec![(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs")],
            Some(ClaimAction::MigratedTo(Some("ebs.csi.aws.com".into()))),
        ),
        (
            vec![(ANN_BETA_STORAGE_PROVISIONER, "kubernetes.io/cinder")],
            Some(ClaimAction::MigratedTo(Some(
                "cinder.csi.openstack.org".into(),
            ))),
        ),
        (
            vec![
                (ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs"),
                (TO, "ebs.csi.aws.com"),
            ],
            None,
        ),
        // The CSI name (what the controller writes for a migrated class): no mark.
        (
            vec![
                (ANN_STORAGE_PROVISIONER, "ebs.csi.aws.com"),
                (TO, "ebs.csi.aws.com"),
            ],
            Some(ClaimAction::MigratedTo(None)),
        ),
        (vec![(ANN_STORAGE_PROVISIONER, "ebs.csi.aws.com")], None),
    ];
    for (pairs, want) in table {
        let got = dc(&annotated(&pairs), &[] as &[PersistentVolume], &[], None);
        match want {
            Some(want) => assert_eq!(got, want, "{pairs:?}"),
            None => assert!(
                !matches!(got, ClaimAction::MigratedTo(_)),
                "{pairs:?}: {got:?}"
            ),
        }
    }
}

#[test]
fn the_fewest_access_modes_come_before_the_smallest_size_and_only_available_volumes_match() {
    let mut narrow = with_phase(pv("narrow-big", "", "5Gi"), "Available");
    narrow.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOnce".into()]);
    let mut wide = with_phase(pv("wide-small", "", "1Gi"), "Available");
    wide.spec.as_mut().unwrap().access_modes = Some(vec![
        "ReadWriteOnce".into(),
        "ReadWriteMany".into(),
        "ReadOnlyMany".into(),
    ]);
    let c = claim("c", Some(""), "1Gi");
    assert_eq!(
        dc(&c, &[wide.clone(), narrow], &[], None),
        ClaimAction::Bind("narrow-big".into()),
        "kube-controller-manager's access-mode groups"
    );
    // A volume the controller has not made Available yet is not offered.
    let pending = with_phase(pv("fresh", "", "1Gi"), "Pending");
    assert!(matches!(
        dc(&c, &[pending], &[], None),
        ClaimAction::Pending {
            reason: "FailedBinding",
            ..
        }
    ));
    assert_eq!(
        dc(&c, &[wide], &[], None),
        ClaimAction::Bind("wide-small".into())
    );
}

#[test]
fn only_volumes_of_the_claims_attributes_class_match_pre_bound_ones_included() {
    let vac = |mut v: PersistentVolume, class: Option<&str>| {
        v.spec.as_mut().unwrap().volume_attributes_class_name = class.map(str::to_string);
        v
    };
    let mut gold = claim("c", Some("fast"), "1Gi");
    gold.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
    let plain = claim("p", Some("fast"), "1Gi");
    // (case, claim, volumes, expected best match): none and "" are alike.
    let volumes = [
        vac(pv("small-none", "fast", "1Gi"), None),
        vac(pv("mid-silver", "fast", "2Gi"), Some("silver")),
        vac(pv("big-gold", "fast", "5Gi"), Some("gold")),
    ];
    let rows: [(
        &str,
        &PersistentVolumeClaim,
        &[PersistentVolume],
        Option<&str>,
    ); 4] = [
        (
            "gold claim: the gold volume, though larger",
            &gold,
            &volumes,
            Some("big-gold"),
        ),
        (
            "plain claim: the volume without a class",
            &plain,
            &volumes,
            Some("small-none"),
        ),
        (
            "an empty class is none",
            &plain,
            &[vac(pv("empty", "fast", "1Gi"), Some(""))],
            Some("empty"),
        ),
        ("gold claim, no gold volume", &gold, &volumes[..2], None),
    ];
    for (case, c, volumes, want) in rows {
        let got = best_match(c, volumes).and_then(|v| v.metadata.name.as_deref());
        assert_eq!(got, want, "{case}");
    }
    // A volume pre-bound to the claim with another attributes class is not taken: the claim
    // goes on to the best match (kube-controller-manager checks the class before the
    // pre-binding).
    let reserved = vac(
        bound_to(pv("reserved", "fast", "1Gi"), &gold),
        Some("silver"),
    );
    let matching = vac(pv("gold", "fast", "1Gi"), Some("gold"));
    assert_eq!(
        dc(
            &gold,
            &[reserved, matching],
            &[sc("fast", "x", false)],
            None
        ),
        ClaimAction::Bind("gold".into())
    );
    // A named volume of another attributes class is refused in kube-controller-manager's
    // words, after the class check and before the volume mode.
    assert_eq!(
        mismatch(&gold, &vac(pv("named", "fast", "1Gi"), Some("silver"))),
        Some("volumeAttributesClassName does not match".into())
    );
    assert_eq!(
        mismatch(&gold, &vac(pv("named", "other", "1Gi"), Some("silver"))),
        Some("storageClassName does not match".into())
    );
}

#[test]
fn a_claim_left_unbound_is_marked_pending_as_kube_controller_manager_marks_it() {
    let pending = |reason| ClaimAction::Pending {
        event: sidecar_kit::events::EventType::Warning,
        reason,
        message: String::new(),
    };
    let rows = [
        (ClaimAction::WaitForFirstConsumer, true),
        (ClaimAction::Wait("volume \"v\" not found".into()), true),
        (pending("VolumeMismatch"), true),
        (pending("FailedBinding"), true),
        (pending("ProvisioningFailed"), false),
        (
            ClaimAction::Provision {
                provisioner: "x".into(),
                annotated: true,
            },
            false,
        ),
        (ClaimAction::Bind("v".into()), false),
        (ClaimAction::Nothing, false),
    ];
    for (action, want) in rows {
        assert_eq!(leaves_claim_pending(&action), want, "{action:?}");
    }
    // The write: only when the phase, access modes or capacity say otherwise.
    let c = claim("c", Some("fast"), "1Gi");
    assert_eq!(pending_status(&c), None, "Pending already");
    let mut lost = c.clone();
    lost.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Lost".into()),
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        capacity: Some(BTreeMap::from([(
            "storage".to_string(),
            Quantity("1Gi".into()),
        )])),
        current_volume_attributes_class_name: Some("gold".into()),
        ..Default::default()
    });
    assert_eq!(
        pending_status(&lost),
        Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        })
    );
    let mut empty = c.clone();
    empty.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Pending".into()),
        access_modes: Some(vec![]),
        capacity: Some(BTreeMap::new()),
        ..Default::default()
    });
    assert_eq!(pending_status(&empty), None, "empty lists are none");
    let mut no_status = c;
    no_status.status = None;
    assert_eq!(
        pending_status(&no_status).and_then(|s| s.phase),
        Some("Pending".into())
    );
}
