//! The volume side of the binder's table: phases, release, reclaim policies, unbinding and
//! the migration mark (helpers from the claim side's tests).

use super::*;
use crate::decide::reasons::Reason;

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
    let provisioned_by = |mut v: PersistentVolume, by: &str| {
        v.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANN_PROVISIONED_BY.to_string(), by.to_string());
        v
    };
    let host_path = |mut v: PersistentVolume, path: &str| {
        let spec = v.spec.as_mut().unwrap();
        spec.csi = None;
        spec.host_path = Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
            path: path.into(),
            type_: None,
        });
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
        // Then reclaimed as any Released volume: the hostPath deleter's own is removed.
        (
            with_phase(
                delete(host_path(
                    provisioned_by(bound_to(pv("v", "", "1Gi"), &c), "kubernetes.io/host-path"),
                    "/tmp/v",
                )),
                "Released",
            ),
            VolumeAction::DeleteHostPath("/tmp/v".into()),
        ),
        (
            with_phase(
                delete(host_path(
                    provisioned_by(bound_to(pv("v", "", "1Gi"), &c), "kubernetes.io/host-path"),
                    "/tmp/v",
                )),
                "Bound",
            ),
            VolumeAction::SetPhase("Released"),
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
fn a_volume_bound_to_an_unbound_claim_of_another_volume_mode_says_so() {
    let c = claim("c", Some(""), "1Gi");
    let v = with_phase(bound_to(pv("v", "", "1Gi"), &c), "Available");
    // The claim not bound yet, same mode (none is Filesystem): its sync binds it.
    assert_eq!(dv(&v, std::slice::from_ref(&c)), VolumeAction::Nothing);
    let mut block = c.clone();
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_eq!(
        dv(&v, &[block.clone()]),
        VolumeAction::VolumeModeMismatch {
            namespace: "default".into(),
            name: "c".into()
        }
    );
    // Both Block: nothing to say.
    let mut block_volume = v.clone();
    block_volume.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_eq!(dv(&block_volume, &[block]), VolumeAction::Nothing);
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
    // No deleter: in kube-controller-manager's words, by the in-tree plugin that provisioned
    // the volume, else by its source. (provisioned-by, source, message)
    let failed = |message: &str| VolumeAction::Fail {
        reason: Reason::VolumeFailedDelete,
        message: message.into(),
    };
    let no_plugin =
        "error getting deleter volume plugin for volume \"v\": no volume plugin matched";
    let no_deleter =
        "error getting deleter volume plugin for volume \"v\": no deletable volume plugin matched";
    let table: [(Option<&str>, &str, VolumeAction); 9] = [
        (None, "none", failed(no_plugin)),
        (Some(""), "none", failed(no_plugin)),
        (None, "nfs", failed(no_deleter)),
        (None, "local", failed(no_deleter)),
        (None, "iscsi", failed(no_plugin)),
        (
            Some("kubernetes.io/nfs"),
            "nfs",
            failed("no deletable volume plugin matched"),
        ),
        (
            Some("kubernetes.io/csi"),
            "csi",
            failed("no deletable volume plugin matched"),
        ),
        (
            Some("kubernetes.io/rbd"),
            "none",
            failed("no volume plugin matched name: kubernetes.io/rbd"),
        ),
        (Some("csi.example"), "none", VolumeAction::Nothing),
    ];
    for (by, source, want) in table {
        let mut v = released("Delete", false);
        if let Some(by) = by {
            v.metadata.annotations = Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                by.to_string(),
            )]));
        }
        let spec = v.spec.as_mut().unwrap();
        match source {
            "nfs" => {
                spec.nfs = Some(k8s_openapi::api::core::v1::NFSVolumeSource {
                    server: "nfs.example".into(),
                    path: "/export".into(),
                    read_only: None,
                })
            }
            "local" => {
                spec.local = Some(k8s_openapi::api::core::v1::LocalVolumeSource {
                    path: "/mnt/disk".into(),
                    fs_type: None,
                })
            }
            "iscsi" => spec.iscsi = Some(Default::default()),
            "csi" => spec.csi = Some(Default::default()),
            _ => {}
        }
        assert_eq!(dv(&v, &[]), want, "{by:?} {source}");
    }
    // kube-controller-manager's hostPath deleter (`/tmp/.+`), anchored and without `..`.
    let host_path = |path: &str| {
        let mut v = released("Delete", false);
        v.spec.as_mut().unwrap().host_path =
            Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: path.into(),
                type_: None,
            });
        v
    };
    for path in ["/tmp/v", "/tmp/a/b", "/tmp/./v"] {
        assert_eq!(
            dv(&host_path(path), &[]),
            VolumeAction::DeleteHostPath(path.into()),
            "{path}"
        );
    }
    // Read again before the removal: still Released, Delete, the same path, not being deleted.
    let stands = host_path("/tmp/v");
    assert!(host_path_deletion_stands(&stands, "/tmp/v"));
    assert!(!host_path_deletion_stands(&stands, "/tmp/other"));
    let mut retained = stands.clone();
    retained
        .spec
        .as_mut()
        .unwrap()
        .persistent_volume_reclaim_policy = Some("Retain".into());
    assert!(!host_path_deletion_stands(&retained, "/tmp/v"));
    assert!(!host_path_deletion_stands(
        &with_phase(stands.clone(), "Bound"),
        "/tmp/v"
    ));
    assert!(host_path_deletion_stands(
        &with_phase(stands.clone(), "Failed"),
        "/tmp/v"
    ));
    let mut moved = stands.clone();
    moved
        .spec
        .as_mut()
        .unwrap()
        .host_path
        .as_mut()
        .unwrap()
        .path = "/srv/v".into();
    assert!(!host_path_deletion_stands(&moved, "/srv/v"));
    for path in [
        "/data/v",
        "/tmp/",
        "/tmp",
        "/tmp/.",
        "/var/tmp/v",
        "/home/me/tmp/v",
        "/tmp/../home/me",
        "/tmp/v/../../etc",
    ] {
        assert_eq!(
            dv(&host_path(path), &[]),
            VolumeAction::Fail {
                reason: Reason::VolumeFailedDelete,
                message: format!(
                    "host_path deleter only supports /tmp/.+ but received provided {path}"
                ),
            },
            "{path}"
        );
    }
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
    for policy in ["Recycle", "Scrub"] {
        let mut migrated = migrated.clone();
        migrated
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some(policy.into());
        assert_eq!(
            dv(&migrated, &[]),
            VolumeAction::Nothing,
            "migrated, {policy}"
        );
    }
    assert_eq!(
        dv(&released("Scrub", true), &[]),
        VolumeAction::Fail {
            reason: Reason::VolumeUnknownReclaimPolicy,
            message: "Volume has unrecognized PersistentVolumeReclaimPolicy".into(),
        }
    );
    assert_eq!(dv(&released("Recycle", false), &[]), VolumeAction::Recycle);
    // Failed (a recycle or deletion that failed): the policy is carried out again.
    let failed = |policy| with_phase(released(policy, false), "Failed");
    assert_eq!(dv(&failed("Recycle"), &[]), VolumeAction::Recycle);
    assert_eq!(dv(&failed("Retain"), &[]), VolumeAction::Nothing);
    let mut failed_host_path = host_path("/tmp/v");
    failed_host_path = with_phase(failed_host_path, "Failed");
    assert_eq!(
        dv(&failed_host_path, &[]),
        VolumeAction::DeleteHostPath("/tmp/v".into())
    );
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
