#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use super::*;

const KEY: &str = "topology.test/node";

fn config() -> DriverConfig {
    crate::config::test_config()
}

fn mount(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability::mount("", mode)
}

fn block(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability::block(mode)
}

fn seg(value: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(KEY.to_string(), value.to_string())]),
    }
}

fn request(name: &str, required: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

fn create(
    table: &mut Table,
    cfg: &DriverConfig,
    req: &csi::CreateVolumeRequest,
    id: &str,
) -> Result<VolumeRecord> {
    let parsed = parse_create(cfg, req)?;
    match plan_create(cfg, table, &parsed, id, 1)? {
        CreatePlan::New(record) => {
            table.apply(Change::Put(record.clone()));
            Ok(record)
        }
        CreatePlan::Existing(record) => Ok(record),
    }
}

#[test]
fn create_requests_are_validated_with_the_spec_codes() {
    let cfg = config();
    let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
        let mut req = request("v", 1 << 30);
        f(&mut req);
        parse_create(&cfg, &req).map(|_| ()).map_err(|e| e.code())
    };
    use tonic::Code;
    let table: Vec<(&str, Result<(), Code>)> = vec![
        ("valid", with(&|_| {})),
        ("no name", with(&|r| r.name.clear())),
        ("no capabilities", with(&|r| r.volume_capabilities.clear())),
        (
            "no access mode",
            with(&|r| r.volume_capabilities[0].access_mode = None),
        ),
        (
            "no access type",
            with(&|r| r.volume_capabilities[0].access_type = None),
        ),
        (
            "unknown mode",
            with(&|r| r.volume_capabilities[0] = mount(Mode::Unknown)),
        ),
        (
            "single-writer not advertised",
            with(&|r| r.volume_capabilities[0] = mount(Mode::SingleNodeSingleWriter)),
        ),
        (
            "mixed access types",
            with(&|r| r.volume_capabilities.push(block(Mode::SingleNodeWriter))),
        ),
        (
            "negative size",
            with(&|r| {
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                })
            }),
        ),
        (
            "required above limit",
            with(&|r| {
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: 10,
                    limit_bytes: 5,
                })
            }),
        ),
        (
            "above max size",
            with(&|r| {
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: 9 << 30,
                    limit_bytes: 0,
                })
            }),
        ),
        (
            "unknown parameter",
            with(&|r| {
                r.parameters.insert("color".into(), "red".into());
            }),
        ),
        (
            "unknown kind",
            with(&|r| {
                r.parameters.insert("kind".into(), "slow".into());
            }),
        ),
        (
            "metadata parameters",
            with(&|r| {
                r.parameters
                    .insert("csi.storage.k8s.io/pvc/name".into(), "c".into());
            }),
        ),
        (
            "content source",
            with(&|r| r.volume_content_source = Some(csi::VolumeContentSource::default())),
        ),
        (
            "unknown mutable parameter",
            with(&|r| {
                r.mutable_parameters.insert("size".into(), "5".into());
            }),
        ),
    ];
    let want = [
        Ok(()),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Err(Code::OutOfRange),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
        Ok(()),
        Err(Code::InvalidArgument),
        Err(Code::InvalidArgument),
    ];
    for ((case, got), want) in table.into_iter().zip(want) {
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn block_is_refused_when_disabled_and_single_writer_accepted_when_advertised() {
    let mut cfg = config();
    let mut req = request("v", 1);
    req.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    assert!(parse_create(&cfg, &req).unwrap().block);
    cfg.disable_block = true;
    assert_eq!(
        parse_create(&cfg, &req).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    cfg.single_node_multi_writer = true;
    req.volume_capabilities = vec![mount(Mode::SingleNodeSingleWriter)];
    assert!(parse_create(&cfg, &req).is_ok());
}

#[test]
fn a_volume_still_being_made_is_pending_not_an_answer() {
    let cfg = config();
    let mut table = Table::default();
    let parsed = parse_create(&cfg, &request("v", 1 << 30)).unwrap();
    let CreatePlan::New(record) = plan_create(&cfg, &table, &parsed, "id-1", 1).unwrap() else {
        panic!("a new volume");
    };
    table.reserve(record.clone());
    assert_eq!(
        plan_create(&cfg, &table, &parsed, "id-2", 1)
            .unwrap_err()
            .code(),
        tonic::Code::Aborted
    );
    table.apply(Change::Put(record));
    assert!(matches!(
        plan_create(&cfg, &table, &parsed, "id-2", 1).unwrap(),
        CreatePlan::Existing(_)
    ));
}

#[test]
fn create_is_idempotent_by_name_and_conflicts_on_an_incompatible_repeat() {
    let cfg = config();
    let mut table = Table::default();
    let first = create(&mut table, &cfg, &request("v", 1 << 30), "id-1").unwrap();
    let again = create(&mut table, &cfg, &request("v", 1 << 30), "id-2").unwrap();
    assert_eq!(first, again, "same name returns the same volume");
    assert_eq!(table.len(), 1);

    let smaller_ok = create(&mut table, &cfg, &request("v", 1 << 20), "id-3").unwrap();
    assert_eq!(
        smaller_ok.id, "id-1",
        "a smaller requirement is satisfied by the existing volume"
    );

    let err = create(&mut table, &cfg, &request("v", 2 << 30), "id-4").unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);

    let mut blocky = request("v", 1 << 30);
    blocky.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    assert_eq!(
        create(&mut table, &cfg, &blocky, "id-5")
            .unwrap_err()
            .code(),
        tonic::Code::AlreadyExists
    );

    let mut other_kind = request("v", 1 << 30);
    other_kind.parameters.insert("kind".into(), "fast".into());
    assert_eq!(
        create(&mut table, &cfg, &other_kind, "id-6")
            .unwrap_err()
            .code(),
        tonic::Code::AlreadyExists
    );
}

#[test]
fn capacity_is_accounted_per_kind_and_node_and_exhaustion_is_reported() {
    let cfg = config();
    let mut table = Table::default();
    let mut fast = request("f1", 2 << 30);
    fast.parameters.insert("kind".into(), "fast".into());
    let v = create(&mut table, &cfg, &fast, "a").unwrap();
    assert_eq!(v.node.as_deref(), Some("n1"), "first node first");
    assert_eq!(table.used("fast", Some("n1")), 2 << 30);
    fast.name = "f2".into();
    let v = create(&mut table, &cfg, &fast, "b").unwrap();
    assert_eq!(
        v.node.as_deref(),
        Some("n2"),
        "spills to the next node with room"
    );
    fast.name = "f3".into();
    let err = create(&mut table, &cfg, &fast, "c").unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.to_string().contains("n1 has 0 bytes free"), "{err}");
    // The default kind is a separate pool.
    assert!(create(&mut table, &cfg, &request("d1", 2 << 30), "d").is_ok());
    // Deleting frees the pool.
    for change in plan_delete(&table, "a").unwrap() {
        table.apply(change);
    }
    assert_eq!(table.used("fast", Some("n1")), 0);
    assert!(create(&mut table, &cfg, &fast, "e").is_ok());
}

#[test]
fn topology_picks_preferred_then_requisite_and_refuses_foreign_segments() {
    let cfg = config();
    let mut table = Table::default();
    let mut req = request("t1", 1);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![seg("zone-a"), seg("zone-b")],
        preferred: vec![seg("zone-b"), seg("zone-a")],
    });
    let v = create(&mut table, &cfg, &req, "x").unwrap();
    assert_eq!(v.node.as_deref(), Some("n2"));
    let csi_volume = to_csi_volume(&cfg, &v);
    assert_eq!(csi_volume.accessible_topology, vec![seg("zone-b")]);

    req.name = "t2".into();
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![seg("zone-z")],
        preferred: vec![],
    });
    assert_eq!(
        create(&mut table, &cfg, &req, "y").unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );

    // A repeated name whose volume lies outside the new requisite is a conflict.
    req.name = "t1".into();
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![seg("zone-a")],
        preferred: vec![],
    });
    assert_eq!(
        create(&mut table, &cfg, &req, "z").unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
}

#[test]
fn publish_rules_follow_the_spec() {
    let cfg = config();
    let mut table = Table::default();
    let v = create(&mut table, &cfg, &request("p", 1), "vol").unwrap();
    let publish = |table: &Table, node: &str, mode: Mode, readonly: bool| {
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: node.into(),
            volume_capability: Some(mount(mode)),
            readonly,
            ..Default::default()
        };
        parse_publish(&cfg, &req).and_then(|p| plan_publish(&cfg, table, &p))
    };
    let changes = publish(&table, "n1", Mode::SingleNodeWriter, false).unwrap();
    assert_eq!(changes.len(), 1);
    for c in changes {
        table.apply(c);
    }
    assert_eq!(table.attached("n1"), 1);
    assert!(
        publish(&table, "n1", Mode::SingleNodeWriter, false)
            .unwrap()
            .is_empty(),
        "idempotent"
    );
    assert_eq!(
        publish(&table, "n1", Mode::SingleNodeWriter, true)
            .unwrap_err()
            .code(),
        tonic::Code::AlreadyExists
    );
    assert_eq!(
        publish(&table, "n2", Mode::SingleNodeWriter, false)
            .unwrap_err()
            .code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        publish(&table, "n9", Mode::SingleNodeWriter, false)
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        plan_delete(&table, &v.id).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    let missing = csi::ControllerPublishVolumeRequest {
        volume_id: "nope".into(),
        node_id: "n1".into(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    let parsed = parse_publish(&cfg, &missing).unwrap();
    assert_eq!(
        plan_publish(&cfg, &table, &parsed).unwrap_err().code(),
        tonic::Code::NotFound
    );
    let no_node = csi::ControllerPublishVolumeRequest {
        volume_id: "x".into(),
        ..Default::default()
    };
    assert_eq!(
        parse_publish(&cfg, &no_node).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    for c in plan_unpublish(&table, &v.id, "n1").unwrap() {
        table.apply(c);
    }
    assert_eq!(table.attached("n1"), 0);
    assert!(
        plan_unpublish(&table, &v.id, "n1").unwrap().is_empty(),
        "idempotent"
    );
    assert!(plan_unpublish(&table, "unknown", "n1").unwrap().is_empty());
    assert!(plan_delete(&table, &v.id).unwrap().len() == 1);
}

#[test]
fn the_attach_limit_is_enforced_per_node() {
    let cfg = config();
    let mut table = Table::default();
    for i in 0..3 {
        let v = create(
            &mut table,
            &cfg,
            &request(&format!("a{i}"), 1),
            &format!("id{i}"),
        )
        .unwrap();
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: "n1".into(),
            volume_capability: Some(mount(Mode::SingleNodeWriter)),
            ..Default::default()
        };
        let result = parse_publish(&cfg, &req).and_then(|p| plan_publish(&cfg, &table, &p));
        if i < 2 {
            for c in result.unwrap() {
                table.apply(c);
            }
        } else {
            assert_eq!(result.unwrap_err().code(), tonic::Code::ResourceExhausted);
        }
    }
}

#[test]
fn delete_of_an_unknown_volume_is_a_no_op_and_an_empty_id_is_invalid() {
    let table = Table::default();
    assert!(plan_delete(&table, "unknown").unwrap().is_empty());
    assert_eq!(
        plan_delete(&table, "").unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[test]
fn tokens_are_volume_ids() {
    assert!(valid_token("3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d"));
    assert!(!valid_token("page-2"));
}

#[test]
fn the_nodes_of_segments_come_in_segment_order_once_each() {
    let mut cfg = config();
    cfg.nodes.push(KnownNode {
        id: "n3".into(),
        topology_value: "zone-a".into(),
    });
    let segment = |value: &str| Segment::from([(KEY.to_string(), value.to_string())]);
    let ids = |segments: &[Segment]| -> Vec<String> {
        nodes_in(&cfg, segments)
            .into_iter()
            .map(|n| n.id.clone())
            .collect()
    };
    assert_eq!(
        ids(&[segment("zone-b"), segment("zone-a")]),
        ["n2", "n1", "n3"]
    );
    assert_eq!(
        ids(&[segment("zone-a"), segment("zone-a"), segment("zone-b")]),
        ["n1", "n3", "n2"],
        "a repeated segment adds nothing"
    );
    let mut extra = segment("zone-a");
    extra.insert("other".into(), "x".into());
    assert!(
        ids(&[extra, segment("zone-c")]).is_empty(),
        "no node has those"
    );
    // A segment for every node of a large cluster.
    let mut big = config();
    big.nodes = (0..2000)
        .map(|i| KnownNode {
            id: format!("node-{i}"),
            topology_value: format!("node-{i}"),
        })
        .collect();
    let all: Vec<Segment> = (0..2000)
        .rev()
        .map(|i| segment(&format!("node-{i}")))
        .collect();
    let found = nodes_in(&big, &all);
    assert_eq!(found.len(), 2000);
    assert_eq!(found[0].id, "node-1999");
}

#[test]
fn the_provisioners_marks_come_back_with_the_name_and_do_not_make_a_repeat_conflict() {
    use sidecar_kit::recoverable;
    let cfg = config();
    let mut table = Table::default();
    let plain = create(&mut table, &cfg, &request("plain", 1 << 20), "id-p").unwrap();
    assert!(
        to_csi_volume(&cfg, &plain).volume_context.is_empty(),
        "no marks, no name"
    );
    let mut marked = request("v", 1 << 20);
    marked
        .parameters
        .insert(recoverable::CLUSTER.into(), "cluster-a".into());
    marked
        .parameters
        .insert(recoverable::CLAIM.into(), "ns/claim".into());
    let first = create(&mut table, &cfg, &marked, "id-1").unwrap();
    let context = to_csi_volume(&cfg, &first).volume_context;
    assert_eq!(
        context.get(recoverable::NAME).map(String::as_str),
        Some("v")
    );
    assert_eq!(
        context.get(recoverable::CLUSTER).map(String::as_str),
        Some("cluster-a")
    );
    assert_eq!(
        context.get(recoverable::CLAIM).map(String::as_str),
        Some("ns/claim")
    );
    // A repeat with other marks (or none) is the same volume, with the first call's marks.
    let mut remarked = request("v", 1 << 20);
    remarked
        .parameters
        .insert(recoverable::CLUSTER.into(), "cluster-b".into());
    for repeat in [remarked, request("v", 1 << 20)] {
        let again = create(&mut table, &cfg, &repeat, "id-2").unwrap();
        assert_eq!(again.id, "id-1");
        assert_eq!(
            to_csi_volume(&cfg, &again)
                .volume_context
                .get(recoverable::CLUSTER)
                .map(String::as_str),
            Some("cluster-a")
        );
    }
    // Other parameters still count.
    let mut other = marked.clone();
    other.parameters.insert("kind".into(), "fast".into());
    assert_eq!(
        create(&mut table, &cfg, &other, "id-3").unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
}

#[test]
fn a_copy_of_a_volume_never_used_is_known_as_such_and_only_then() {
    let record = |id: &str, lazy_content: bool| VolumeRecord {
        id: id.into(),
        lazy_content,
        ..VolumeRecord::default()
    };
    let table = Table::from_records([record("unused", true), record("used", false)]);
    let volume = |id: &str| ContentSource::Volume(id.into());
    // (source, is a volume never used)
    let cases = [
        (None, false),
        (Some(volume("unused")), true),
        (Some(volume("used")), false),
        (Some(volume("gone")), false),
        (Some(ContentSource::Snapshot("unused".into())), false),
    ];
    for (i, (source, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            copies_unused_volume(&table, source.as_ref()),
            want,
            "case {i}"
        );
    }
    assert!(never_used(&table, "unused"));
    assert!(!never_used(&table, "used"));
}
