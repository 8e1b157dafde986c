#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeClaimStatus, TypedLocalObjectReference, TypedObjectReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::decide::cloning::{CloningProtection, cloned_claim, clones_pending, cloning_protection};
use crate::decide::testing::{claim, pv};

const DRIVER: &str = "hostpath.csi.volstack.dev";

#[path = "data_source_restore_tests.rs"]
mod restore;

fn with_source(
    mut c: PersistentVolumeClaim,
    kind: &str,
    name: &str,
    group: Option<&str>,
) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: group.map(str::to_string),
        kind: kind.into(),
        name: name.into(),
    });
    c
}

fn with_ref(
    mut c: PersistentVolumeClaim,
    kind: &str,
    name: &str,
    ns: Option<&str>,
) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
        api_group: Some(SNAPSHOT_GROUP.into()),
        kind: kind.into(),
        name: name.into(),
        namespace: ns.map(str::to_string),
    });
    c
}

fn bound(mut c: PersistentVolumeClaim, volume: &str) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().volume_name = Some(volume.into());
    c.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        ..Default::default()
    });
    c
}

#[test]
fn the_source_is_data_source_first_then_data_source_ref() {
    let plain = claim("c").build();
    assert_eq!(source_of(&plain, false).unwrap(), None);
    let both = with_ref(
        with_source(claim("c").build(), "PersistentVolumeClaim", "a", None),
        "VolumeSnapshot",
        "b",
        None,
    );
    assert_eq!(source_of(&both, false).unwrap().unwrap().name, "a");
    let local_ref = with_ref(claim("c").build(), "VolumeSnapshot", "s", None);
    let r = source_of(&local_ref, false).unwrap().unwrap();
    assert_eq!(
        (r.kind.as_str(), r.namespace.as_str()),
        ("VolumeSnapshot", "default")
    );
    let remote = with_ref(claim("c").build(), "VolumeSnapshot", "s", Some("other"));
    assert_eq!(
        source_of(&remote, false).unwrap_err(),
        DataSourceError::NamespaceWithoutGate
    );
    assert_eq!(
        source_of(&remote, true).unwrap().unwrap().namespace,
        "other"
    );
}

#[test]
fn kinds_and_capabilities() {
    let c = claim("c").build();
    let r = |kind: &str, name: &str, group: Option<&str>| SourceRef {
        kind: kind.into(),
        name: name.into(),
        namespace: "default".into(),
        api_group: group.map(str::to_string),
    };
    // (source, can clone, can restore, expected)
    let cases: Vec<(SourceRef, bool, bool, Result<SourceKind, String>)> = vec![
        (
            r("PersistentVolumeClaim", "a", None),
            true,
            true,
            Ok(SourceKind::Clone),
        ),
        (
            r("VolumeSnapshot", "s", Some(SNAPSHOT_GROUP)),
            true,
            true,
            Ok(SourceKind::Snapshot),
        ),
        (
            r("Dataset", "d", Some("example.com")),
            false,
            false,
            Ok(SourceKind::Populator),
        ),
        (
            r("PersistentVolumeClaim", "a", None),
            false,
            true,
            Err("CLONE_VOLUME capability is not reported".into()),
        ),
        (
            r("VolumeSnapshot", "s", Some(SNAPSHOT_GROUP)),
            true,
            false,
            Err("CREATE_DELETE_SNAPSHOT capability is not reported".into()),
        ),
        (
            r("VolumeSnapshot", "s", None),
            true,
            true,
            Err("Expected snapshot.storage.k8s.io, Got ".into()),
        ),
        (
            r("PersistentVolumeClaim", "", None),
            true,
            true,
            Err("the PVC source not found for PVC c".into()),
        ),
    ];
    for (source, clone, restore, expected) in cases {
        match (kind_of(&c, &source, clone, restore), expected) {
            (Ok(kind), Ok(want)) => assert_eq!(kind, want, "{source:?}"),
            (Err(error), Err(text)) => {
                assert!(error.to_string().contains(&text), "{source:?}: {error}")
            }
            (got, want) => panic!("{source:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn reference_grants_match_namespace_from_and_to() {
    let source = SourceRef {
        kind: "VolumeSnapshot".into(),
        name: "s".into(),
        namespace: "data".into(),
        api_group: Some(SNAPSHOT_GROUP.into()),
    };
    let grant = |ns: &str, from_ns: &str, from_kind: &str, to_kind: &str, to_name: Option<&str>| {
        let mut to = json!({"group": SNAPSHOT_GROUP, "kind": to_kind});
        if let Some(name) = to_name {
            to["name"] = json!(name);
        }
        json!({
            "metadata": {"name": "g", "namespace": ns},
            "spec": {
                "from": [{"group": "", "kind": from_kind, "namespace": from_ns}],
                "to": [to],
            }
        })
    };
    let cases = [
        (
            grant(
                "data",
                "apps",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                None,
            ),
            true,
        ),
        (
            grant(
                "data",
                "apps",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                Some("s"),
            ),
            true,
        ),
        (
            grant(
                "data",
                "apps",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                Some(""),
            ),
            true,
        ),
        (
            grant(
                "data",
                "apps",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                Some("t"),
            ),
            false,
        ),
        (
            grant(
                "data",
                "other",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                None,
            ),
            false,
        ),
        (grant("data", "apps", "Pod", "VolumeSnapshot", None), false),
        (
            grant(
                "data",
                "apps",
                "PersistentVolumeClaim",
                "PersistentVolumeClaim",
                None,
            ),
            false,
        ),
        (
            grant(
                "apps",
                "apps",
                "PersistentVolumeClaim",
                "VolumeSnapshot",
                None,
            ),
            false,
        ),
    ];
    for (g, expected) in cases {
        assert_eq!(
            granted(std::slice::from_ref(&g), "apps", &source),
            expected,
            "{g}"
        );
    }
    assert!(!granted(&[], "apps", &source));
}

fn clone_ref() -> SourceRef {
    SourceRef {
        kind: "PersistentVolumeClaim".into(),
        name: "src".into(),
        namespace: "default".into(),
        api_group: None,
    }
}

fn source_claim() -> PersistentVolumeClaim {
    let mut c = bound(claim("src").class("fast").size("1Gi").build(), "pv-src");
    c.metadata.uid = Some("src-uid".into());
    c
}

fn source_volume(driver: &str, mode: Option<&str>) -> PersistentVolume {
    let mut v = pv("pv-src").csi_driver(driver).phase("Bound").build();
    let spec = v.spec.as_mut().unwrap();
    spec.claim_ref = Some(ObjectReference {
        name: Some("src".into()),
        namespace: Some("default".into()),
        uid: Some("src-uid".into()),
        ..Default::default()
    });
    spec.volume_mode = mode.map(str::to_string);
    v
}

#[test]
fn clone_checks_in_upstream_order() {
    let new = claim("new").class("other-class").size("2Gi").build();
    let ok = clone_source(
        &new,
        &clone_ref(),
        Some(&source_claim()),
        Some(&source_volume(DRIVER, None)),
        DRIVER,
        false,
    )
    .unwrap();
    assert!(matches!(
        ok.r#type,
        Some(csi::volume_content_source::Type::Volume(v)) if v.volume_id == "handle-pv-src"
    ));
    let pending = {
        let mut c = source_claim();
        c.status = None;
        c
    };
    let deleting = {
        let mut c = source_claim();
        c.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        c
    };
    // A clone already sent to the driver goes on while its (protected) source is deleted.
    assert!(
        clone_source(
            &new,
            &clone_ref(),
            Some(&deleting),
            Some(&source_volume(DRIVER, None)),
            DRIVER,
            true
        )
        .is_ok()
    );
    let classless = {
        let mut c = source_claim();
        c.spec.as_mut().unwrap().storage_class_name = None;
        c
    };
    let unnamed = {
        let mut c = source_claim();
        c.spec.as_mut().unwrap().volume_name = Some(String::new());
        c
    };
    let other_claim_volume = {
        let mut v = source_volume(DRIVER, None);
        v.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("someone-else".into());
        v
    };
    let small = claim("new").class("fast").size("512Mi").build();
    let no_class = claim("new").size("2Gi").build();
    let block = claim("new").class("fast").size("2Gi").block().build();
    // (new claim, source claim, source volume, expected message fragment)
    let cases: Vec<(
        PersistentVolumeClaim,
        Option<PersistentVolumeClaim>,
        Option<PersistentVolume>,
        &str,
    )> = vec![
        (
            new.clone(),
            None,
            None,
            "error getting PVC src (namespace \"default\") from api server",
        ),
        (
            new.clone(),
            Some(pending),
            None,
            "must have a status of Bound.  Got ",
        ),
        (
            new.clone(),
            Some(deleting),
            None,
            "is currently being deleted",
        ),
        (
            new.clone(),
            Some(classless),
            None,
            "the source PVC (src) storageclass cannot be empty",
        ),
        (
            no_class,
            Some(source_claim()),
            None,
            "the requested PVC (new) storageclass cannot be empty",
        ),
        (
            small,
            Some(source_claim()),
            None,
            "requested 536870912 but source is 1073741824",
        ),
        (
            new.clone(),
            Some(unnamed),
            None,
            "volume name is empty in source PVC src",
        ),
        (
            new.clone(),
            Some(source_claim()),
            None,
            "claim in dataSource not bound or invalid",
        ),
        (
            new.clone(),
            Some(source_claim()),
            Some(source_volume("other.csi", None)),
            "not bound or invalid",
        ),
        (
            new.clone(),
            Some(source_claim()),
            Some(other_claim_volume),
            "not bound or invalid",
        ),
        (
            block,
            Some(source_claim()),
            Some(source_volume(DRIVER, Some("Filesystem"))),
            "Source is Filesystem, but new PVC requested Block",
        ),
        (
            new.clone(),
            Some(source_claim()),
            Some(source_volume(DRIVER, Some("Block"))),
            "Source is Block, but new PVC requested Filesystem",
        ),
    ];
    for (c, src, vol, fragment) in cases {
        let error =
            clone_source(&c, &clone_ref(), src.as_ref(), vol.as_ref(), DRIVER, false).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(
                "error getting handle for DataSource Type PersistentVolumeClaim by Name src: "
            ),
            "{text}"
        );
        assert!(text.contains(fragment), "{text} lacks {fragment:?}");
    }
}

/// (claim, snapshot, content, prevent conversion, expected: Ok or a message fragment)
type RestoreCase = (
    PersistentVolumeClaim,
    Option<Value>,
    Option<Value>,
    bool,
    Option<&'static str>,
);

#[test]
fn the_cloning_finalizer_is_released_when_no_clone_is_pending() {
    use sidecar_kit::vocabulary::CLONING_PROTECTION_FINALIZER as F;
    let mut source = source_claim();
    source.metadata.finalizers = Some(vec!["other".into(), F.into()]);
    let pending = with_source(claim("clone").build(), "PersistentVolumeClaim", "src", None);
    let bound_clone = bound(
        with_source(claim("done").build(), "PersistentVolumeClaim", "src", None),
        "pv-done",
    );
    let elsewhere = {
        let mut c = pending.clone();
        c.metadata.namespace = Some("other".into());
        c
    };
    let of_another = with_source(claim("x").build(), "PersistentVolumeClaim", "someone", None);
    // Not being deleted: nothing to do, whatever is pending.
    assert_eq!(
        cloning_protection(&source, |ns, n| clones_pending(n, ns, [&pending])),
        CloningProtection::Nothing
    );
    source.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert_eq!(
        cloning_protection(&source, |ns, n| clones_pending(
            n,
            ns,
            [&pending, &bound_clone]
        )),
        CloningProtection::Wait
    );
    // A clone claim being deleted still counts while Pending; so does a copy in flight whose
    // claim is gone.
    let mut leaving = pending.clone();
    leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert_eq!(
        cloning_protection(&source, |ns, n| clones_pending(n, ns, [&leaving])),
        CloningProtection::Wait
    );
    assert_eq!(
        // A copy in flight (the intent log) holds it even with no Pending clone.
        cloning_protection(&source, |_, _| true),
        CloningProtection::Wait
    );
    assert_eq!(
        cloning_protection(&source, |ns, n| clones_pending(
            n,
            ns,
            [&bound_clone, &elsewhere, &of_another]
        )),
        CloningProtection::Release
    );
    source.metadata.finalizers = Some(vec!["other".into()]);
    assert_eq!(
        cloning_protection(&source, |ns, n| clones_pending(n, ns, [])),
        CloningProtection::Nothing
    );
}

#[test]
fn a_clone_names_its_source_claim_in_its_own_namespace() {
    let c = with_source(claim("copy").build(), "PersistentVolumeClaim", "src", None);
    assert_eq!(cloned_claim(&c), Some(("default".into(), "src".into())));
    let restore = with_source(
        claim("r").build(),
        "VolumeSnapshot",
        "s",
        Some(SNAPSHOT_GROUP),
    );
    assert_eq!(cloned_claim(&restore), None);
    assert_eq!(cloned_claim(&claim("plain").build()), None);
}
