#![allow(clippy::unwrap_used)]

use super::*;

const GI: i64 = 1 << 30;
const NOW: &str = "2026-11-26T00:00:00Z";

/// A claim bound to `pv-1`, requesting `request`, with `capacity` recorded, and the given
/// allocated size, resize status and condition.
fn claim(
    request: &str,
    capacity: &str,
    allocated: Option<&str>,
    status: Option<&str>,
    condition: Option<&str>,
) -> PersistentVolumeClaim {
    let mut c = json!({
        "metadata": {"name": "data", "namespace": "ns", "uid": "u-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1", "storageClassName": "fast",
                 "resources": {"requests": {"storage": request}}},
        "status": {"phase": "Bound", "capacity": {"storage": capacity}},
    });
    if let Some(a) = allocated {
        c["status"]["allocatedResources"] = json!({"storage": a});
    }
    if let Some(s) = status {
        c["status"]["allocatedResourceStatuses"] = json!({"storage": s});
    }
    if let Some(kind) = condition {
        c["status"]["conditions"] = json!([{"type": kind, "status": "True"}]);
    }
    serde_json::from_value(c).unwrap()
}

fn volume(capacity: &str, driver: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv-1"},
        "spec": {
            "capacity": {"storage": capacity}, "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "ns", "name": "data", "uid": "u-1"},
            "csi": {"driver": driver, "volumeHandle": "h-1", "fsType": "ext4",
                    "controllerExpandSecretRef": {"name": "s", "namespace": "secrets"}},
        },
    }))
    .unwrap()
}

const DRIVER: Driver<'static> = Driver {
    name: "d.example.com",
    expands: true,
    node_expands: true,
    modifies: true,
};

#[test]
fn expansion_asks_for_the_size_recovery_rules_pick() {
    use resize_status::*;
    let cases: [(&str, PersistentVolumeClaim, &str, Option<i64>); 12] = [
        (
            "grown request",
            claim("2Gi", "1Gi", None, None, None),
            "1Gi",
            Some(2 * GI),
        ),
        (
            "nothing to do",
            claim("1Gi", "1Gi", None, None, None),
            "1Gi",
            None,
        ),
        (
            "capacity already there",
            claim("2Gi", "2Gi", None, None, None),
            "1Gi",
            None,
        ),
        (
            "in progress keeps its allocated size",
            claim(
                "3Gi",
                "1Gi",
                Some("2Gi"),
                Some(CONTROLLER_IN_PROGRESS),
                None,
            ),
            "1Gi",
            Some(2 * GI),
        ),
        (
            "in progress after the PV grew: asked again",
            claim(
                "2Gi",
                "1Gi",
                Some("2Gi"),
                Some(CONTROLLER_IN_PROGRESS),
                None,
            ),
            "2Gi",
            Some(2 * GI),
        ),
        (
            "the node's part is due",
            claim("2Gi", "1Gi", Some("2Gi"), Some(NODE_PENDING), None),
            "2Gi",
            None,
        ),
        (
            "the node's part is due, the request grew again: the allocated size first",
            claim("3Gi", "1Gi", Some("2Gi"), Some(NODE_PENDING), None),
            "1Gi",
            Some(2 * GI),
        ),
        (
            "infeasible and unchanged",
            claim("2Gi", "1Gi", Some("2Gi"), Some(CONTROLLER_INFEASIBLE), None),
            "1Gi",
            None,
        ),
        (
            "infeasible, then a smaller request",
            claim(
                "1536Mi",
                "1Gi",
                Some("2Gi"),
                Some(CONTROLLER_INFEASIBLE),
                None,
            ),
            "1Gi",
            Some(1536 << 20),
        ),
        (
            "node pending without a status (older writer)",
            claim("2Gi", "1Gi", None, None, Some(FS_RESIZE_PENDING)),
            "2Gi",
            None,
        ),
        (
            "trivial: the PV grew, the claim did not",
            claim("2Gi", "1Gi", Some("2Gi"), None, None),
            "2Gi",
            Some(2 * GI),
        ),
        (
            "node infeasible: the allocated size again",
            claim("3Gi", "1Gi", Some("2Gi"), Some(NODE_INFEASIBLE), None),
            "1Gi",
            Some(2 * GI),
        ),
    ];
    for (what, claim, pv_size, want) in cases {
        let pv = volume(pv_size, "d.example.com");
        let got = expansion(&claim, Some(&pv), DRIVER).map(|e| e.to);
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn expansion_request_names_the_volume_its_capability_and_secret() {
    let pv = volume("1Gi", "d.example.com");
    let e = expansion(&claim("2Gi", "1Gi", None, None, None), Some(&pv), DRIVER).unwrap();
    assert_eq!(e.pv, "pv-1");
    let request = e.request.unwrap();
    assert_eq!(request.volume_id, "h-1");
    assert_eq!(
        request.capacity_range,
        Some(csi::CapacityRange {
            required_bytes: 2 * GI,
            limit_bytes: 0
        })
    );
    let capability = request.volume_capability.unwrap();
    assert!(matches!(
        capability.access_type,
        Some(csi::volume_capability::AccessType::Mount(ref m)) if m.fs_type == "ext4"
    ));
    assert_eq!(
        e.secret,
        Some(SecretRef {
            name: "s".into(),
            namespace: "secrets".into()
        })
    );
    // Without a controller part: no call, the node grows the volume.
    let trivial = Driver {
        expands: false,
        ..DRIVER
    };
    let e = expansion(&claim("2Gi", "1Gi", None, None, None), Some(&pv), trivial).unwrap();
    assert_eq!((e.request, e.to), (None, 2 * GI));
    // Neither the controller nor the node grows volumes: no claim is grown.
    let neither = Driver {
        expands: false,
        node_expands: false,
        ..DRIVER
    };
    assert_eq!(
        expansion(&claim("2Gi", "1Gi", None, None, None), Some(&pv), neither),
        None
    );
    // Refused at the node for this very size, the PV already grown: not again.
    let refused = claim(
        "2Gi",
        "1Gi",
        Some("2Gi"),
        Some(resize_status::NODE_INFEASIBLE),
        None,
    );
    assert_eq!(
        expansion(&refused, Some(&volume("2Gi", "d.example.com")), DRIVER),
        None
    );
}

#[test]
fn only_what_the_resizer_decides_from_brings_a_claim_back() {
    let c = claim("2Gi", "1Gi", None, None, None);
    let mut conditions_only = c.clone();
    conditions_only.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(
            json!({"type": "ControllerResizeError", "status": "True", "message": "x"}),
        )
        .unwrap(),
    ]);
    assert_eq!(fingerprint(&c), fingerprint(&conditions_only));
    for changed in [
        claim("3Gi", "1Gi", None, None, None),
        claim("2Gi", "2Gi", None, None, None),
        claim("2Gi", "1Gi", None, Some(resize_status::NODE_PENDING), None),
    ] {
        assert_ne!(fingerprint(&c), fingerprint(&changed));
    }
}

#[test]
fn the_pre_resize_capacity_goes_once_the_claim_has_the_size() {
    let mut others = volume("2Gi", "other.example.com");
    others.metadata.annotations = Some(
        [(
            super::super::ANN_PRE_RESIZE_CAPACITY.to_string(),
            "1Gi".to_string(),
        )]
        .into(),
    );
    assert!(!pre_resize_annotation_done(
        &claim("2Gi", "2Gi", None, None, None),
        &others,
        DRIVER.name
    ));
    let mut pv = volume("2Gi", "d.example.com");
    assert!(!pre_resize_annotation_done(
        &claim("2Gi", "2Gi", None, None, None),
        &pv,
        DRIVER.name
    ));
    pv.metadata.annotations = Some(
        [(
            super::super::ANN_PRE_RESIZE_CAPACITY.to_string(),
            "1Gi".to_string(),
        )]
        .into(),
    );
    assert!(!pre_resize_annotation_done(
        &claim("2Gi", "1Gi", None, None, None),
        &pv,
        DRIVER.name
    ));
    assert!(pre_resize_annotation_done(
        &claim("2Gi", "2Gi", None, None, None),
        &pv,
        DRIVER.name
    ));
}

#[test]
fn only_bound_claims_of_our_driver_are_resized() {
    let grown = claim("2Gi", "1Gi", None, None, None);
    let other = volume("1Gi", "other.example.com");
    assert_eq!(expansion(&grown, Some(&other), DRIVER), None);
    assert_eq!(expansion(&grown, None, DRIVER), None);
    let mut pending = grown.clone();
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    let pv = volume("1Gi", "d.example.com");
    assert_eq!(expansion(&pending, Some(&pv), DRIVER), None);
    // A PV bound to another claim of the same name (another uid) is not this claim's.
    let mut stolen = pv.clone();
    stolen
        .spec
        .as_mut()
        .unwrap()
        .claim_ref
        .as_mut()
        .unwrap()
        .uid = Some("u-2".into());
    assert_eq!(expansion(&grown, Some(&stolen), DRIVER), None);
}

#[test]
fn statuses_follow_external_resizers_steps() {
    let c = claim("2Gi", "1Gi", None, None, Some(CONTROLLER_RESIZE_ERROR));
    let started = resize_started(&c, 2 * GI, NOW);
    assert_eq!(
        started["status"]["allocatedResources"],
        json!({"storage": "2Gi"})
    );
    assert_eq!(
        started["status"]["allocatedResourceStatuses"],
        json!({"storage": "ControllerResizeInProgress"})
    );
    let kinds = |v: &Value| -> Vec<String> {
        v["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kinds(&started), ["Resizing"]);
    let resizing: PersistentVolumeClaim = {
        let mut v = serde_json::to_value(&c).unwrap();
        json_patch::merge(&mut v, &started);
        serde_json::from_value(v).unwrap()
    };
    let pending = resize_done(&resizing, 2 * GI, true, "T");
    assert_eq!(kinds(&pending), ["Resizing", "FileSystemResizePending"]);
    assert_eq!(
        pending["status"]["allocatedResourceStatuses"],
        json!({"storage": "NodeResizePending"})
    );
    assert!(pending["status"].get("capacity").is_none());
    let done = resize_done(&resizing, 2 * GI, false, "T");
    assert_eq!(done["status"]["capacity"], json!({"storage": "2Gi"}));
    assert_eq!(done["status"]["allocatedResourceStatuses"], Value::Null);
    assert_eq!(done["status"]["conditions"], Value::Null);
    // Another resource's status stays.
    let mut two = resizing.clone();
    two.status.as_mut().unwrap().allocated_resource_statuses = Some(
        [
            ("storage".to_string(), "NodeResizePending".to_string()),
            ("other".to_string(), "x".to_string()),
        ]
        .into(),
    );
    assert_eq!(
        finished(&two, 2 * GI)["status"]["allocatedResourceStatuses"],
        json!({"storage": null})
    );

    let error = sidecar_kit::csi::CallError {
        method: "ControllerExpandVolume",
        code: tonic::Code::OutOfRange,
        message: "too big".into(),
    }
    .status_text();
    assert_eq!(error, "rpc error: code = OutOfRange desc = too big");
    let failed = resize_failed(&resizing, tonic::Code::OutOfRange, &error, "T").unwrap();
    assert_eq!(
        failed["status"]["allocatedResourceStatuses"],
        json!({"storage": "ControllerResizeInfeasible"})
    );
    assert_eq!(kinds(&failed), ["Resizing", "ControllerResizeError"]);
    assert_eq!(
        failed["status"]["conditions"][1]["message"],
        "failed to expand pvc with rpc error: code = OutOfRange desc = too big"
    );
    let internal = resize_failed(&resizing, tonic::Code::Internal, "x", "T").unwrap();
    assert!(
        internal["status"]
            .get("allocatedResourceStatuses")
            .is_none()
    );
    assert_eq!(
        resize_failed(&resizing, tonic::Code::DeadlineExceeded, "x", "T"),
        None
    );
}

fn class(name: &str, parameters: &[(&str, &str)]) -> VolumeAttributesClass {
    serde_json::from_value(json!({
        "metadata": {"name": name}, "driverName": "d.example.com",
        "parameters": parameters.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap()
}

fn wanting(
    target: &str,
    current: Option<&str>,
    last: Option<(&str, &str)>,
) -> PersistentVolumeClaim {
    let mut c = serde_json::to_value(claim("1Gi", "1Gi", None, None, None)).unwrap();
    c["spec"]["volumeAttributesClassName"] = json!(target);
    if let Some(current) = current {
        c["status"]["currentVolumeAttributesClassName"] = json!(current);
    }
    if let Some((t, s)) = last {
        c["status"]["modifyVolumeStatus"] =
            json!({"targetVolumeAttributesClassName": t, "status": s});
    }
    serde_json::from_value(c).unwrap()
}

#[test]
fn a_claim_naming_another_class_has_its_volume_modified() {
    let pv = volume("1Gi", "d.example.com");
    let gold = class("gold", &[("iops", "3000")]);
    let lookup = |name: &str| (name == "gold").then(|| gold.clone());
    let Some(Modification::Modify {
        pv: name,
        target,
        request,
        secret,
    }) = modification(
        &wanting("gold", Some("silver"), None),
        Some(&pv),
        lookup,
        DRIVER,
    )
    else {
        panic!("expected a modification");
    };
    assert_eq!((name.as_str(), target.as_str()), ("pv-1", "gold"));
    assert_eq!(request.volume_id, "h-1");
    assert_eq!(
        request.mutable_parameters,
        HashMap::from([("iops".to_string(), "3000".to_string())])
    );
    // No modify secret recorded: the expansion's.
    assert_eq!(secret.unwrap().name, "s");
    let cases = [
        ("already there", wanting("gold", Some("gold"), None), None),
        (
            "back to the current class after a refused one",
            wanting("gold", Some("gold"), Some(("silly", "Infeasible"))),
            Some(Modification::Modify {
                pv: "pv-1".into(),
                target: "gold".into(),
                request: csi::ControllerModifyVolumeRequest {
                    volume_id: "h-1".into(),
                    secrets: HashMap::new(),
                    mutable_parameters: HashMap::from([("iops".to_string(), "3000".to_string())]),
                },
                secret: Some(SecretRef {
                    name: "s".into(),
                    namespace: "secrets".into(),
                }),
            }),
        ),
        (
            "refused for good, same target",
            wanting("gold", None, Some(("gold", "Infeasible"))),
            None,
        ),
        (
            "missing class",
            wanting("platinum", None, None),
            Some(Modification::Pending {
                target: "platinum".into(),
            }),
        ),
    ];
    for (what, claim, want) in cases {
        assert_eq!(
            modification(&claim, Some(&pv), lookup, DRIVER),
            want,
            "{what}"
        );
    }
    let no_modify = Driver {
        modifies: false,
        ..DRIVER
    };
    assert_eq!(
        modification(&wanting("gold", None, None), Some(&pv), lookup, no_modify),
        None
    );
}

#[test]
fn modify_statuses_follow_external_resizers_steps() {
    let c = wanting("gold", None, None);
    let started = modify_started(&c, "gold", "T");
    assert_eq!(
        started["status"]["modifyVolumeStatus"],
        json!({"targetVolumeAttributesClassName": "gold", "status": "InProgress"})
    );
    assert_eq!(
        started["status"]["conditions"][0]["message"],
        "Modifying volume to \"gold\" is in progress."
    );
    let failed = modify_failed(&c, "gold", tonic::Code::InvalidArgument, "bad iops", "T");
    assert_eq!(
        failed["status"]["modifyVolumeStatus"]["status"],
        "Infeasible"
    );
    let conditions = failed["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[1]["type"], "ModifyVolumeError");
    assert_eq!(conditions[1]["reason"], "InvalidArgument");
    assert_eq!(conditions[1]["message"], "bad iops");
    let retried = modify_failed(&c, "gold", tonic::Code::Internal, "x", "T");
    assert_eq!(
        retried["status"]["modifyVolumeStatus"]["status"],
        "InProgress"
    );
    let done = modify_done(&c, "gold");
    assert_eq!(done["status"]["currentVolumeAttributesClassName"], "gold");
    assert_eq!(done["status"]["modifyVolumeStatus"], Value::Null);
    assert_eq!(
        modify_pending()["status"]["modifyVolumeStatus"]["status"],
        "Pending"
    );
}
