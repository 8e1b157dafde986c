//! Matching claims and volumes: the best Available volume, the checks of a named volume, the
//! attributes class, and looking volumes up by name (helpers from the claim side's tests).

use super::*;
use crate::decide::reasons::Reason;

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
            reason: Reason::FailedBinding,
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
fn looking_volumes_up_by_name_decides_as_the_full_scan() {
    let class = sc("fast", "csi.example.com", false);
    let waiting = claim("c1", Some("fast"), "1Gi");
    let mut named = claim("c2", Some("fast"), "1Gi");
    named.spec.as_mut().unwrap().volume_name = Some("static-2".into());
    let mut named_gone = claim("c3", Some("fast"), "1Gi");
    named_gone.spec.as_mut().unwrap().volume_name = Some("nowhere".into());
    let other = claim("c4", Some("fast"), "1Gi");
    // Made for c5 with more access modes than it asks for: a volume of fewer could win.
    let more_modes = claim("c5", Some("fast"), "1Gi");
    // Made for c6 without the mode it asks for: an Available volume with it is bound.
    let other_mode = claim("c6", Some("fast"), "1Gi");
    let volumes = vec![
        pv("spare", "fast", "1Gi"),
        with_modes(
            bound_to(pv("pvc-uid-c1", "fast", "1Gi"), &waiting),
            &["ReadWriteOnce"],
        ),
        pv("static-2", "fast", "1Gi"),
        // Named like c4's volume but made for another claim: not taken as c4's.
        bound_to(pv("pvc-uid-c4", "fast", "1Gi"), &waiting),
        bound_to(pv("pvc-uid-c5", "fast", "1Gi"), &more_modes),
        with_modes(
            bound_to(pv("pvc-uid-c6", "fast", "1Gi"), &other_mode),
            &["ReadOnlyMany"],
        ),
        with_modes(pv("single", "fast", "1Gi"), &["ReadWriteOnce"]),
    ];
    let lookup = |name: &str| {
        volumes
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(name))
            .cloned()
    };
    // (claim, the volumes looked up by name: None = scan them all)
    let table: [(&PersistentVolumeClaim, Option<Vec<&str>>); 6] = [
        (&waiting, Some(vec!["pvc-uid-c1"])),
        (&named, Some(vec!["static-2"])),
        (&named_gone, Some(vec![])),
        (&other, None),
        (&more_modes, None),
        (&other_mode, None),
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

/// `pv` offering exactly `modes`.
fn with_modes(mut pv: PersistentVolume, modes: &[&str]) -> PersistentVolume {
    pv.spec.as_mut().unwrap().access_modes = Some(modes.iter().map(|m| m.to_string()).collect());
    pv
}

#[test]
fn volumes_are_searched_by_access_mode_groups_the_fewest_first_as_kube_controller_manager() {
    let c = claim("c", Some("fast"), "1Gi");
    let immediate = sc("fast", "csi.example.com", false);
    let late = sc("fast", "csi.example.com", true);
    // Pre-bound to c, two modes; fits c (class is not looked at for a pre-bound volume).
    let reserved = bound_to(pv("reserved", "other", "9Gi"), &c);
    let single =
        |name: &str, class: &str, size: &str| with_modes(pv(name, class, size), &["ReadWriteOnce"]);
    let rwx = with_modes(pv("rwx", "fast", "1Gi"), &["ReadWriteMany"]);
    // (case, volumes, the claim's class, expected action)
    let rows: Vec<(&str, Vec<PersistentVolume>, &StorageClass, ClaimAction)> = vec![
        (
            "an Available volume of fewer modes wins over the pre-bound one, though larger",
            vec![reserved.clone(), single("single", "fast", "5Gi")],
            &immediate,
            ClaimAction::Bind("single".into()),
        ),
        (
            "a mode listed twice counts once",
            vec![
                reserved.clone(),
                with_modes(
                    pv("twice", "fast", "5Gi"),
                    &["ReadWriteOnce", "ReadWriteOnce"],
                ),
            ],
            &immediate,
            ClaimAction::Bind("twice".into()),
        ),
        (
            "in the same group the pre-bound volume wins over a smaller one",
            vec![reserved.clone(), pv("small", "fast", "1Gi")],
            &immediate,
            ClaimAction::CompleteBinding("reserved".into()),
        ),
        (
            "a group of fewer modes with no match is passed over",
            vec![reserved.clone(), single("single", "silver", "5Gi")],
            &immediate,
            ClaimAction::CompleteBinding("reserved".into()),
        ),
        (
            "a volume without a mode the claim asks for is never taken",
            vec![rwx.clone(), pv("two", "fast", "2Gi")],
            &immediate,
            ClaimAction::Bind("two".into()),
        ),
        (
            "late binding: Available volumes are the scheduler's, the pre-bound one is taken",
            vec![reserved.clone(), single("single", "fast", "5Gi")],
            &late,
            ClaimAction::CompleteBinding("reserved".into()),
        ),
    ];
    for (case, volumes, class, want) in rows {
        assert_eq!(
            dc(&c, &volumes, std::slice::from_ref(class), None),
            want,
            "{case}"
        );
    }
    // A pre-bound volume lacking a mode the claim asks for is not taken.
    let mut wants_two = claim("w", Some("fast"), "1Gi");
    wants_two.spec.as_mut().unwrap().access_modes =
        Some(vec!["ReadWriteOnce".into(), "ReadWriteMany".into()]);
    let short = single("short", "fast", "1Gi");
    assert_eq!(
        volume_for_claim(&wants_two, &[bound_to(short, &wants_two)], false),
        None
    );
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
                reason: Reason::VolumeMismatch,
                message: format!("Cannot bind to requested volume \"v\": {why}"),
            }
        );
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
            reason: Reason::FailedBinding,
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
        let got = match volume_for_claim(c, volumes, false) {
            Some(Found::Available(v)) => v.metadata.name.as_deref(),
            _ => None,
        };
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
            reason: Reason::FailedBinding,
            message: "volume \"chosen\" already bound to a different claim.".into(),
        }
    );
    // Named by this controller (bound-by-controller) yet held by another claim: the event and
    // an error, the status left as it is (kube-controller-manager's "should never happen").
    let mut named_by_us = c.clone();
    named_by_us.metadata.annotations = Some(BTreeMap::from([(
        ANN_BOUND_BY_CONTROLLER.to_string(),
        "yes".to_string(),
    )]));
    let taken = bound_to(
        pv("chosen", "", "50Gi"),
        &claim("someone-else", Some(""), "1Gi"),
    );
    let misbound = dc(&named_by_us, std::slice::from_ref(&taken), &[], None);
    assert_eq!(
        misbound,
        ClaimAction::Failed {
            reason: Reason::FailedBinding,
            message: "volume \"chosen\" already bound to a different claim.".into(),
            error: "invalid binding of claim \"default/c\" to volume \"chosen\": volume already claimed by \"default/someone-else\"".into(),
        }
    );
    assert!(!leaves_claim_pending(&misbound));
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
    assert_eq!(
        volume_for_claim(&claim("e", Some(""), "1Gi"), &volumes, false),
        Some(Found::Available(&volumes[0]))
    );
}
