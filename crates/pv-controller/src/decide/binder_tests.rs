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
use crate::decide::reasons::Reason;

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

#[path = "binder_volume_tests.rs"]
mod volumes;

#[path = "binder_matching_tests.rs"]
mod matching;

#[path = "binding_tests.rs"]
mod binding;

#[path = "in_tree_tests.rs"]
mod in_tree;

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
    // Annotated with the GA name: annotated, whatever the beta one says (setClaimProvisioner).
    for beta in [None, Some("csi.example"), Some("other")] {
        let mut c = claim("c", Some("fast"), "1Gi");
        let mut annotations = BTreeMap::from([(
            ANN_STORAGE_PROVISIONER.to_string(),
            "csi.example".to_string(),
        )]);
        if let Some(beta) = beta {
            annotations.insert(ANN_BETA_STORAGE_PROVISIONER.to_string(), beta.to_string());
        }
        c.metadata.annotations = Some(annotations);
        assert_eq!(
            dc(&c, &[], &classes, None),
            ClaimAction::Provision {
                provisioner: "csi.example".into(),
                annotated: true
            },
            "{beta:?}"
        );
    }
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
        ClaimAction::provisioning_failed(
            "no volume plugin matched name: kubernetes.io/no-provisioner".into()
        )
    );
    let mut in_tree = classes.clone();
    in_tree.push(sc("rbd", "kubernetes.io/rbd", false));
    assert!(matches!(
        dc(&claim("c", Some("rbd"), "1Gi"), &[], &in_tree, None),
        ClaimAction::Failed { reason: Reason::ProvisioningFailed, message, .. } if message == "no volume plugin matched name: kubernetes.io/rbd"
    ));
    let missing = dc(&claim("c", Some("nope"), "1Gi"), &[], &classes, None);
    assert_eq!(
        missing,
        ClaimAction::provisioning_failed("storageclass.storage.k8s.io \"nope\" not found".into())
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
        access_modes: made.spec.as_ref().unwrap().access_modes.clone(),
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
            access_modes: Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]),
            ..Default::default()
        });
        c
    };
    let mine = completed(Some("v"), "Bound");
    // Bound, but the volume's access modes changed since: its status gets them.
    let stale_modes = {
        let mut c = completed(Some("v"), "Bound");
        c.status.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOnce".into()]);
        c
    };
    let other = claim("other", Some(""), "1Gi");
    let lost = |reason, message| ClaimAction::Lost { reason, message };
    // (claim, its volume if any, action)
    let table = [
        (
            completed(None, "Bound"),
            None,
            lost(
                Reason::ClaimLost,
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            ),
        ),
        (
            completed(Some("v"), "Bound"),
            None,
            lost(
                Reason::ClaimLost,
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
            stale_modes,
            Some(with_phase(bound_to(pv("v", "", "1Gi"), &mine), "Bound")),
            ClaimAction::CompleteBinding("v".into()),
        ),
        (
            completed(Some("v"), "Bound"),
            Some(bound_to(pv("v", "", "1Gi"), &other)),
            lost(
                Reason::ClaimMisbound,
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
        ClaimAction::Failed {
            reason: Reason::ProvisioningFailed,
            ..
        }
    ));
    // The annotation's presence is the signal, whatever its value (IsDelayBindingProvisioning):
    // an empty one is handed to the provisioner too.
    let mut empty = claim("c", Some("late"), "1Gi");
    empty.metadata.annotations = Some(BTreeMap::from([(
        ANN_SELECTED_NODE.to_string(),
        String::new(),
    )]));
    assert_ne!(
        dc(&empty, &[], &classes, None),
        ClaimAction::WaitForFirstConsumer
    );
    assert_eq!(
        dc(&claim("c", Some("late"), "1Gi"), &[], &classes, None),
        ClaimAction::WaitForFirstConsumer
    );
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
fn a_claim_left_unbound_is_marked_pending_as_kube_controller_manager_marks_it() {
    let pending = |reason| ClaimAction::Pending {
        event: sidecar_kit::events::EventType::Warning,
        reason,
        message: String::new(),
    };
    let rows = [
        (ClaimAction::WaitForFirstConsumer, true),
        (ClaimAction::Wait("volume \"v\" not found".into()), true),
        (pending(Reason::VolumeMismatch), true),
        (pending(Reason::FailedBinding), true),
        (
            ClaimAction::provisioning_failed("no volume plugin".into()),
            false,
        ),
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

#[test]
fn the_resync_queues_unbound_claims_of_a_class_an_unbound_volume_has() {
    let classes: std::collections::HashSet<String> = ["fast".to_string(), String::new()].into();
    let mut named = claim("c", Some("fast"), "1Gi");
    named.spec.as_mut().unwrap().volume_name = Some("v".into());
    let mut beta = claim("c", None, "1Gi");
    beta.metadata.annotations = Some(BTreeMap::from([(
        ANN_BETA_STORAGE_CLASS.to_string(),
        "fast".to_string(),
    )]));
    // (claim, queued)
    let rows = [
        (claim("c", Some("fast"), "1Gi"), true),
        (claim("c", Some("slow"), "1Gi"), false),
        (claim("c", None, "1Gi"), true),
        (claim("c", Some(""), "1Gi"), true),
        (beta, true),
        (named, false),
    ];
    for (c, want) in rows {
        assert_eq!(may_take_unbound_volume(&c, &classes), want, "{:?}", c.spec);
    }
}
