#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use super::*;
use crate::decide::parameters::ParameterError;
use crate::decide::testing::{claim, class};

const D: &str = "hostpath.csi";

fn caps() -> DriverCapabilities {
    DriverCapabilities {
        name: D.into(),
        accessibility: true,
        ..Default::default()
    }
}

fn options() -> ProvisionOptions {
    ProvisionOptions {
        naming: VolumeNaming::new("pvc", -1).unwrap(),
        default_fstype: String::new(),
        extra_create_metadata: false,
        controller_publish_readonly: false,
        topology: true,
        attributes_classes: true,
    }
}

fn modes(plan: &ProvisionPlan) -> Vec<Mode> {
    plan.capabilities
        .iter()
        .map(|c| Mode::try_from(c.access_mode.unwrap().mode).unwrap())
        .collect()
}

#[test]
fn access_modes_map_to_csi_capabilities() {
    let c = claim("c")
        .size("1Gi")
        .access_modes(&[
            "ReadWriteOnce",
            "ReadOnlyMany",
            "ReadWriteMany",
            "ReadWriteOncePod",
        ])
        .build();
    let sc = class("sc", D).build();
    let plan = plan_provision(&caps(), &options(), &c, &sc).unwrap();
    assert_eq!(
        modes(&plan),
        vec![
            Mode::SingleNodeWriter,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeMultiWriter,
            Mode::SingleNodeWriter
        ]
    );
    let multi = DriverCapabilities {
        single_node_multi_writer: true,
        ..caps()
    };
    let plan = plan_provision(&multi, &options(), &c, &sc).unwrap();
    assert_eq!(modes(&plan)[0], Mode::SingleNodeMultiWriter);
    assert_eq!(modes(&plan)[3], Mode::SingleNodeSingleWriter);
    let bad = claim("c")
        .size("1Gi")
        .access_modes(&["ReadWriteSometimes"])
        .build();
    assert!(matches!(
        plan_provision(&caps(), &options(), &bad, &sc),
        Err(ProvisionError::AccessMode(_))
    ));
    let none = claim("c").size("1Gi").access_modes(&[]).build();
    assert!(matches!(
        plan_provision(&caps(), &options(), &none, &sc),
        Err(ProvisionError::AccessMode(_))
    ));
}

#[test]
fn the_request_carries_name_size_fstype_mount_options_and_driver_parameters() {
    let c = claim("data").size("2Gi").limit("3Gi").build();
    let sc = class("fast", D)
        .param("kind", "ssd")
        .param("csi.storage.k8s.io/fstype", "xfs")
        .param(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-creds",
        )
        .param(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
        .mount_options(&["noatime"])
        .build();
    let plan = plan_provision(&caps(), &options(), &c, &sc).unwrap();
    let secrets = HashMap::from([("password".to_string(), "hunter2".to_string())]);
    let req = create_request(&plan, secrets.clone(), None);
    assert_eq!(req.name, "pvc-3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d");
    assert_eq!(
        req.capacity_range,
        Some(csi::CapacityRange {
            required_bytes: 2 << 30,
            limit_bytes: 0
        }),
        "the claim's limit is not sent (upstream sends none)"
    );
    assert_eq!(
        req.parameters,
        HashMap::from([("kind".to_string(), "ssd".to_string())])
    );
    assert_eq!(req.secrets, secrets);
    match req.volume_capabilities[0].access_type.as_ref().unwrap() {
        AccessType::Mount(m) => {
            assert_eq!(m.fs_type, "xfs");
            assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
        }
        AccessType::Block(_) => panic!("expected a mount volume"),
    }
    assert_eq!(
        plan.provisioner_secret,
        Some(SecretRef {
            name: "data-creds".into(),
            namespace: "default".into()
        })
    );
}

#[test]
fn default_fstype_applies_only_without_a_class_fstype_and_never_to_block() {
    let mut opts = options();
    opts.default_fstype = "ext4".into();
    let sc = class("sc", D).build();
    let plan = plan_provision(&caps(), &opts, &claim("c").size("1").build(), &sc).unwrap();
    assert_eq!(plan.fs_type, "ext4");
    let plan = plan_provision(&caps(), &opts, &claim("c").size("1").block().build(), &sc).unwrap();
    assert!(plan.block);
    assert!(matches!(
        plan.capabilities[0].access_type,
        Some(AccessType::Block(_))
    ));
    // The class's mount options do not refuse a Block claim (upstream's): the capability has
    // no mount flags, the plan keeps them for the PV.
    let with_opts = class("sc", D).mount_options(&["discard"]).build();
    let plan = plan_provision(
        &caps(),
        &opts,
        &claim("c").size("1").block().build(),
        &with_opts,
    )
    .unwrap();
    assert!(matches!(
        plan.capabilities[0].access_type,
        Some(AccessType::Block(_))
    ));
    assert_eq!(plan.mount_options, vec!["discard".to_string()]);
}

#[test]
fn extra_create_metadata_adds_the_three_keys() {
    let mut opts = options();
    opts.extra_create_metadata = true;
    let plan = plan_provision(
        &caps(),
        &opts,
        &claim("data").size("1").build(),
        &class("sc", D).build(),
    )
    .unwrap();
    assert_eq!(
        plan.parameters.get(PVC_NAME_KEY).map(String::as_str),
        Some("data")
    );
    assert_eq!(
        plan.parameters.get(PVC_NAMESPACE_KEY).map(String::as_str),
        Some("default")
    );
    assert_eq!(plan.parameters.get(PV_NAME_KEY), Some(&plan.pv_name));
}

#[test]
fn bad_claims_and_classes_are_refused_before_any_create_volume() {
    let sc = class("sc", D).build();
    let table: Vec<(PersistentVolumeClaim, StorageClass, &str)> = vec![
        (
            claim("c").size("1Gi").selector().build(),
            sc.clone(),
            "claim Selector is not supported",
        ),
        (
            claim("c").size("lots").build(),
            sc.clone(),
            "not a valid quantity",
        ),
        (
            claim("c").size("0").build(),
            sc.clone(),
            "greater than zero",
        ),
        (claim("c").size("7Ei").build(), sc.clone(), "too large"),
        (
            claim("c").size("1Gi").build(),
            class("sc", D)
                .param("csi.storage.k8s.io/bogus", "x")
                .build(),
            "reserved",
        ),
        (
            claim("c").size("1Gi").build(),
            class("sc", D)
                .param("csi.storage.k8s.io/provisioner-secret-name", "x")
                .build(),
            "Both must be specified",
        ),
        (
            claim("c").size("1Gi").build(),
            class("sc", D)
                .param("csi.storage.k8s.io/provisioner-secret-name", "${pvc.uid}")
                .param("csi.storage.k8s.io/provisioner-secret-namespace", "ns")
                .build(),
            "invalid tokens",
        ),
        (
            claim("c").size("1Gi").build(),
            class("sc", "other.csi").build(),
            "names provisioner",
        ),
    ];
    for (c, sc, words) in table {
        let err = plan_provision(&caps(), &options(), &c, &sc).unwrap_err();
        assert!(err.to_string().contains(words), "{words}: got {err}");
    }
    let err = plan_provision(
        &caps(),
        &options(),
        &claim("c").size("1").build(),
        &class("sc", D).param("csi.storage.k8s.io/x", "1").build(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        ProvisionError::Parameter(ParameterError::UnknownReserved(_))
    ));
    // As upstream's event reads.
    assert_eq!(
        err.to_string(),
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/x\" with reserved namespace csi.storage.k8s.io/"
    );
}

#[test]
fn volume_attributes_class_parameters_become_mutable_parameters() {
    let vac = VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some("gold".into()),
            ..Default::default()
        },
        driver_name: D.into(),
        parameters: Some(BTreeMap::from([("iops".to_string(), "3000".to_string())])),
    };
    let c = claim("c").size("1Gi").vac("gold").build();
    let mut plan = plan_provision(&caps(), &options(), &c, &class("sc", D).build()).unwrap();
    assert!(plan.mutable_parameters.is_empty(), "read after the plan");
    plan.mutable_parameters = vac_parameters(&caps(), Some(&vac)).unwrap();
    assert_eq!(
        create_request(&plan, HashMap::new(), None)
            .mutable_parameters
            .get("iops")
            .map(String::as_str),
        Some("3000")
    );
    let foreign = VolumeAttributesClass {
        driver_name: "other".into(),
        ..vac
    };
    let refused = vac_parameters(&caps(), Some(&foreign)).unwrap_err();
    assert!(matches!(refused, ProvisionError::VacDriver { .. }));
    let name = foreign.metadata.name.clone().unwrap_or_default();
    assert_eq!(
        refused.to_string(),
        format!(
            "VAC {name} referenced in PVC is for driver other which does not match driver name {D}"
        )
    );
}

fn volume(bytes: i64, topology: &[(&str, &str)]) -> csi::Volume {
    csi::Volume {
        capacity_bytes: bytes,
        volume_id: "vol-1".into(),
        volume_context: HashMap::from([("kind".to_string(), "ssd".to_string())]),
        content_source: None,
        accessible_topology: topology
            .iter()
            .map(|(k, v)| csi::Topology {
                segments: HashMap::from([(k.to_string(), v.to_string())]),
            })
            .collect(),
    }
}

#[test]
fn the_pv_is_written_as_upstream_writes_it() {
    let c = claim("data").size("1Gi").build();
    let sc = class("fast", D)
        .param("csi.storage.k8s.io/provisioner-secret-name", "prov")
        .param(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "kube-system",
        )
        .param("csi.storage.k8s.io/node-publish-secret-name", "np")
        .param("csi.storage.k8s.io/node-publish-secret-namespace", "ns")
        .build();
    let plan = plan_provision(&caps(), &options(), &c, &sc).unwrap();
    let pv = build_pv(
        &plan,
        &caps(),
        &options(),
        &c,
        Some(&volume(2 << 30, &[("zone", "a"), ("zone", "b")])),
        "id-1",
    )
    .unwrap();
    let ann = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann[ANN_PROVISIONED_BY], D);
    assert_eq!(ann[ANN_DELETION_SECRET_NAME], "prov");
    assert_eq!(ann[ANN_DELETION_SECRET_NAMESPACE], "kube-system");
    assert_eq!(pv.metadata.finalizers, Some(vec![PV_FINALIZER.to_string()]));
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(
        spec.capacity.as_ref().unwrap()["storage"].0,
        "2Gi",
        "the driver's size, binary SI"
    );
    let claim_ref = spec.claim_ref.as_ref().unwrap();
    assert_eq!(
        claim_ref.uid.as_deref(),
        Some("3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d")
    );
    assert_eq!(claim_ref.resource_version.as_deref(), Some("42"));
    assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.volume_attributes.as_ref().unwrap()["kind"], "ssd");
    assert_eq!(
        csi.volume_attributes.as_ref().unwrap()[IDENTITY_ATTRIBUTE],
        "id-1"
    );
    assert_eq!(
        csi.node_publish_secret_ref
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("np")
    );
    assert!(csi.controller_publish_secret_ref.is_none());
    // A driver that names the identity's key itself: its value is kept, as upstream keeps it.
    let mut own = volume(2 << 30, &[]);
    own.volume_context
        .insert(IDENTITY_ATTRIBUTE.to_string(), "the driver's".to_string());
    let with_own = build_pv(&plan, &caps(), &options(), &c, Some(&own), "id-1").unwrap();
    let attributes = with_own
        .spec
        .unwrap()
        .csi
        .unwrap()
        .volume_attributes
        .unwrap();
    assert_eq!(attributes[IDENTITY_ATTRIBUTE], "the driver's");
    assert_eq!(attributes["kind"], "ssd");
    let terms = &spec
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 2, "one term per accessible topology (form 1)");
    let expr = &terms[1].match_expressions.as_ref().unwrap()[0];
    assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("zone", "In"));
    assert_eq!(expr.values, Some(vec!["b".to_string()]));
}

#[test]
fn node_affinity_and_the_attributes_class_follow_the_gates() {
    // (Topology gate, driver's accessibility, attributes-class gate, the claim's class name)
    // -> (node affinity written, the PV's class name): upstream's `supportsTopology` and its
    // `vacName != ""` with the gate on.
    type Row = (
        bool,
        bool,
        bool,
        Option<&'static str>,
        bool,
        Option<&'static str>,
    );
    let table: Vec<Row> = vec![
        (true, true, true, Some("gold"), true, Some("gold")),
        (false, true, true, Some("gold"), false, Some("gold")),
        (true, false, true, None, false, None),
        (true, true, false, Some("gold"), true, None),
        (true, true, true, Some(""), true, None),
    ];
    for (gate, accessible, vac_gate, vac, affinity, pv_vac) in table {
        let mut c = claim("data").size("1Gi");
        if let Some(name) = vac {
            c = c.vac(name);
        }
        let c = c.build();
        let mut opts = options();
        opts.topology = gate;
        opts.attributes_classes = vac_gate;
        let mut driver = caps();
        driver.accessibility = accessible;
        let plan = plan_provision(&driver, &opts, &c, &class("sc", D).build()).unwrap();
        let topology = volume(1 << 30, &[("zone", "a")]);
        let pv = build_pv(&plan, &driver, &opts, &c, Some(&topology), "id").unwrap();
        let spec = pv.spec.unwrap();
        let case = (gate, accessible, vac_gate, vac);
        assert_eq!(spec.node_affinity.is_some(), affinity, "{case:?}");
        assert_eq!(
            spec.volume_attributes_class_name.as_deref(),
            pv_vac,
            "{case:?}"
        );
    }
}

#[test]
fn pv_details_follow_the_class_and_claim() {
    let c = claim("data")
        .size("1Gi")
        .access_modes(&["ReadOnlyMany"])
        .build();
    let retain = class("keep", D).policy("Retain").build();
    let mut opts = options();
    opts.controller_publish_readonly = true;
    let plan = plan_provision(&caps(), &opts, &c, &retain).unwrap();
    let pv = build_pv(&plan, &caps(), &opts, &c, Some(&volume(0, &[])), "id").unwrap();
    assert_eq!(
        pv.metadata.finalizers, None,
        "no finalizer unless the policy is Delete"
    );
    let ann = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        ann[ANN_DELETION_SECRET_NAME], "",
        "always written, empty without a secret"
    );
    let spec = pv.spec.unwrap();
    assert_eq!(
        spec.capacity.unwrap()["storage"].0,
        "1Gi",
        "capacity 0 means as requested"
    );
    assert!(spec.node_affinity.is_none());
    assert_eq!(
        spec.csi.unwrap().read_only,
        Some(true),
        "controller-publish-readonly with only ROX"
    );
}

#[test]
fn an_unusable_answer_is_an_error() {
    let c = claim("data").size("1Gi").build();
    let plan = plan_provision(&caps(), &options(), &c, &class("sc", D).build()).unwrap();
    assert_eq!(
        build_pv(&plan, &caps(), &options(), &c, None, "id").unwrap_err(),
        ResponseError::NoVolumeId
    );
    assert_eq!(
        build_pv(
            &plan,
            &caps(),
            &options(),
            &c,
            Some(&volume(1 << 20, &[])),
            "id"
        )
        .unwrap_err(),
        ResponseError::TooSmall {
            got: 1 << 20,
            wanted: 1 << 30
        }
    );
}

#[test]
fn an_existing_pv_is_ours_only_if_it_names_the_same_claim_uid() {
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeSpec};
    let pv = |uid: Option<&str>| PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            claim_ref: uid.map(|u| ObjectReference {
                uid: Some(u.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(made_for_claim(&pv(Some("u1")), "u1"));
    assert!(!made_for_claim(&pv(Some("u2")), "u1"));
    assert!(!made_for_claim(&pv(None), "u1"));
    assert!(!made_for_claim(&PersistentVolume::default(), "u1"));
}

#[test]
fn a_claim_naming_an_attributes_class_needs_a_driver_that_modifies_volumes() {
    let modifies = DriverCapabilities {
        modify_volume: true,
        ..caps()
    };
    let named = claim("c").size("1Gi").vac("gold").build();
    let unnamed = claim("c").size("1Gi").build();
    let empty = claim("c").size("1Gi").vac("").build();
    // (driver, claim, gate, refused)
    let cases = [
        (&caps(), &named, true, true),
        (&caps(), &named, false, false),
        (&modifies, &named, true, false),
        (&caps(), &unnamed, true, false),
        (&caps(), &empty, true, false),
    ];
    for (driver, c, gate, refused) in cases {
        let result = check_modify_volume(driver, c, gate);
        assert_eq!(result.is_err(), refused, "{driver:?} {gate}");
        if let Err(error) = result {
            assert_eq!(
                error.to_string(),
                "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
            );
        }
    }
}

#[test]
fn a_driver_that_cannot_provision_fails_each_claim_with_upstreams_words() {
    use NoDynamicProvisioning::{ControllerService, CreateDeleteVolume};
    // (controller service, CREATE_DELETE_VOLUME, why not)
    let rows = [
        (false, false, Some(ControllerService)),
        (false, true, Some(ControllerService)),
        (true, false, Some(CreateDeleteVolume)),
        (true, true, None),
    ];
    for (service, create_delete, why) in rows {
        assert_eq!(
            no_dynamic_provisioning(service, create_delete),
            why,
            "{service} {create_delete}"
        );
    }
    let sc = class("fast", D).build();
    for (why, words) in [
        (
            ControllerService,
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported",
        ),
        (
            CreateDeleteVolume,
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
        ),
    ] {
        let cannot = DriverCapabilities {
            no_dynamic_provisioning: Some(why),
            ..caps()
        };
        // Said before the claim's own faults (a selector), as upstream checks it first.
        for c in [
            claim("data").size("1Gi").build(),
            claim("data").size("1Gi").selector().build(),
        ] {
            let error = plan_provision(&cannot, &options(), &c, &sc).unwrap_err();
            assert_eq!(error.to_string(), words);
        }
    }
    let c = claim("data").size("1Gi").build();
    assert!(plan_provision(&caps(), &options(), &c, &sc).is_ok());
}
