//! What completing a binding writes, both sides (helpers from the binder's tests).

use super::*;
use crate::decide::binding::{
    ANN_PRE_RESIZE_CAPACITY, bound_status, claim_bound_to, lost_status, volume_bound_to,
    volume_in_phase, volume_marked_bound, volume_unbound,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[test]
fn the_volumes_side_of_a_binding_is_written_only_where_it_is_missing() {
    let c = claim("c", Some("fast"), "1Gi");
    let phase = |v: &PersistentVolume| v.status.as_ref().and_then(|s| s.phase.clone());
    let uid_of = |v: &PersistentVolume| {
        v.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.clone())
    };
    // (volume, whether its reference is written, whether its phase is)
    let table = [
        // Provisioned for the claim: the reference has its UID; the phase is still to come.
        (bound_to(pv("v", "fast", "1Gi"), &c), false, true),
        // Pre-bound by name only: the whole reference is written, then the phase.
        (reserved_for(pv("v", "fast", "1Gi"), &c), true, true),
        // A reference with an empty UID counts as none.
        (
            {
                let mut v = bound_to(pv("v", "fast", "1Gi"), &c);
                v.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some(String::new());
                v
            },
            true,
            true,
        ),
        // Done already: nothing.
        (
            with_phase(bound_to(pv("v", "fast", "1Gi"), &c), "Bound"),
            false,
            false,
        ),
        // Pre-bound by name and Bound already: only the reference is written; the phase is read
        // from the volume that write returns.
        (
            with_phase(reserved_for(pv("v", "fast", "1Gi"), &c), "Bound"),
            true,
            false,
        ),
        // No reference at all (callers pass volumes naming the claim): the whole reference.
        (pv("v", "fast", "1Gi"), true, true),
        // No status at all: the phase is written.
        (
            {
                let mut v = bound_to(pv("v", "fast", "1Gi"), &c);
                v.status = None;
                v
            },
            false,
            true,
        ),
    ];
    for (i, (volume, reference_written, phase_written)) in table.into_iter().enumerate() {
        let bound = volume_bound_to(&volume, &c);
        assert_eq!(bound.is_some(), reference_written, "row {i}");
        if let Some(bound) = &bound {
            assert_eq!(uid_of(bound), c.metadata.uid.clone(), "row {i}");
            let r = bound.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
            assert_eq!(r.name, c.metadata.name, "row {i}");
            assert_eq!(r.namespace, c.metadata.namespace, "row {i}");
            assert_eq!(
                bound.metadata.annotations, volume.metadata.annotations,
                "row {i}: no bound-by-controller"
            );
            assert_eq!(
                bound.status, volume.status,
                "row {i}: the status is not written here"
            );
        }
        let marked = volume_marked_bound(bound.as_ref().unwrap_or(&volume));
        assert_eq!(marked.is_some(), phase_written, "row {i}");
        if let Some(marked) = marked {
            assert_eq!(phase(&marked).as_deref(), Some("Bound"), "row {i}");
            assert_eq!(
                marked.spec,
                bound.as_ref().unwrap_or(&volume).spec,
                "row {i}"
            );
        }
    }
}

#[test]
fn the_claims_side_of_a_binding_is_written_as_kube_controller_manager_writes_it() {
    let annotations = |c: &PersistentVolumeClaim| {
        let a = c.metadata.annotations.clone().unwrap_or_default();
        (
            a.contains_key(ANN_BIND_COMPLETED),
            a.contains_key(ANN_BOUND_BY_CONTROLLER),
        )
    };
    // Named by the controller: both annotations; named by the user: bind-completed only.
    let chosen = claim_bound_to(&claim("c", Some("fast"), "1Gi"), "pv-1").unwrap();
    assert_eq!(
        chosen.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("pv-1")
    );
    assert_eq!(annotations(&chosen), (true, true));
    let mut named = claim("n", Some("fast"), "1Gi");
    named.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
    assert_eq!(
        annotations(&claim_bound_to(&named, "pv-1").unwrap()),
        (true, false)
    );
    assert_eq!(claim_bound_to(&chosen, "pv-1"), None, "written already");

    // The status: from Pending the volume's attributes class comes along; Bound is left.
    let mut pv = pv("pv-1", "fast", "2Gi");
    pv.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
    let status = bound_status(&chosen, &pv).unwrap();
    assert_eq!(status.phase.as_deref(), Some("Bound"));
    assert_eq!(
        status.current_volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    assert_eq!(status.access_modes, pv.spec.as_ref().unwrap().access_modes);
    assert_eq!(status.capacity, pv.spec.as_ref().unwrap().capacity);
    let mut lost = chosen.clone();
    lost.status.as_mut().unwrap().phase = Some("Lost".into());
    assert_eq!(
        bound_status(&lost, &pv).and_then(|s| s.current_volume_attributes_class_name),
        None,
        "only a Pending claim takes the class"
    );
    // A volume expanded before its filesystem: the claim records the size before (a size
    // that does not parse: the volume's), its other capacities kept.
    let storage = |status: &k8s_openapi::api::core::v1::PersistentVolumeClaimStatus| {
        status
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone())
    };
    for (annotation, want) in [("1Gi", "1Gi"), ("a lot", "2Gi"), ("", "2Gi")] {
        let mut resized = pv.clone();
        resized.metadata.annotations =
            Some([(ANN_PRE_RESIZE_CAPACITY.to_string(), annotation.to_string())].into());
        let mut pending = chosen.clone();
        pending.status.get_or_insert_default().capacity =
            Some([("other".to_string(), Quantity("5".into()))].into());
        let status = bound_status(&pending, &resized).unwrap();
        assert_eq!(storage(&status).as_deref(), Some(want), "{annotation:?}");
        assert!(
            status.capacity.as_ref().unwrap().contains_key("other"),
            "{annotation:?}"
        );
    }
    let mut bound = chosen;
    bound.status = Some(status);
    assert_eq!(bound_status(&bound, &pv), None);

    // Bound already: only access modes that are not the volume's are written (updateClaimStatus
    // from syncBoundClaim's bind); the capacity stays as it is.
    let mut changed = pv.clone();
    changed.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    changed.spec.as_mut().unwrap().capacity = None;
    let refreshed = bound_status(&bound, &changed).unwrap();
    assert_eq!(
        refreshed.access_modes,
        Some(vec!["ReadWriteMany".to_string()])
    );
    assert_eq!(refreshed.capacity, bound.status.as_ref().unwrap().capacity);
    assert_eq!(refreshed.phase.as_deref(), Some("Bound"));

    // Lost: phase Lost, neither access modes nor capacity (updateClaimStatus without a volume).
    let lost = lost_status(&bound);
    assert_eq!(lost.phase.as_deref(), Some("Lost"));
    assert_eq!((lost.access_modes, lost.capacity), (None, None));
    assert_eq!(
        lost.current_volume_attributes_class_name.as_deref(),
        Some("gold"),
        "the rest of the status is kept"
    );
}

#[test]
fn a_volume_phase_other_than_failed_is_written_without_a_message() {
    let mut failed = pv("v", "fast", "1Gi");
    let status = failed.status.as_mut().unwrap();
    status.phase = Some("Failed".into());
    status.message = Some("error getting deleter volume plugin for volume \"v\"".into());
    for phase in ["Available", "Bound", "Released"] {
        let updated = volume_in_phase(&failed, phase);
        let status = updated.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some(phase));
        assert_eq!(status.message, None, "{phase}");
        assert_eq!(updated.spec, failed.spec);
    }
    let marked = volume_marked_bound(&failed).unwrap();
    assert_eq!(marked.status.unwrap().message, None);
}

#[test]
fn unbinding_removes_the_controllers_claim_ref_and_keeps_the_users_reservation() {
    let c = claim("c", Some(""), "1Gi");
    let by_us = {
        let mut v = bound_to(pv("v", "", "1Gi"), &c);
        v.metadata.annotations = Some(BTreeMap::from([(
            ANN_BOUND_BY_CONTROLLER.to_string(),
            "yes".to_string(),
        )]));
        v
    };
    let unbound = volume_unbound(&by_us);
    assert!(unbound.spec.as_ref().unwrap().claim_ref.is_none());
    assert_eq!(
        unbound.metadata.annotations, None,
        "no annotation left: none"
    );
    let mut kept = by_us.clone();
    kept.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("owner".into(), "me".into());
    assert_eq!(
        volume_unbound(&kept).metadata.annotations,
        Some(BTreeMap::from([("owner".to_string(), "me".to_string())]))
    );
    let by_user = bound_to(pv("v", "", "1Gi"), &c);
    let reserved = volume_unbound(&by_user);
    let claim_ref = reserved.spec.unwrap().claim_ref.unwrap();
    assert_eq!(
        (claim_ref.name.as_deref(), claim_ref.uid),
        (Some("c"), None)
    );
}
