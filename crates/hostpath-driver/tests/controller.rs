//! The Controller service over a real unix socket: every RPC, the error codes the CSI spec
//! names for it, idempotency, paging and capacity accounting.

#![allow(clippy::unwrap_used)]

mod harness;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, block, create_request, mount, params, segment};
use hostpath_driver::config::DEFAULT_TOPOLOGY_KEY as KEY;
use tonic::Code;

const GI: i64 = 1 << 30;

#[tokio::test]
async fn create_returns_the_volume_and_repeats_are_idempotent() {
    let h = Harness::start(&["--capacity=10Gi"]).await;
    let mut c = h.controller();
    let v = c
        .create_volume(create_request("pvc-1", 2 * GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 2 * GI);
    assert!(!v.volume_id.is_empty());
    assert_eq!(v.accessible_topology, vec![segment(KEY, "node-1")]);
    // An empty mount volume is a record only: its directory is made at its first use.
    assert!(
        !h.state_dir().join("volumes").join(&v.volume_id).exists(),
        "a new mount volume has no directory yet"
    );

    let again = c
        .create_volume(create_request("pvc-1", 2 * GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    assert_eq!(h.all_volumes().await.len(), 1);

    let bigger = c
        .create_volume(create_request("pvc-1", 3 * GI))
        .await
        .unwrap_err();
    assert_eq!(bigger.code(), Code::AlreadyExists, "{bigger:?}");
    assert!(bigger.message().contains("pvc-1"), "{}", bigger.message());
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_volume() {
    let h = Harness::start(&[]).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut c = h.controller();
        let volumes = h.state_dir().join("volumes");
        tasks.push(tokio::spawn(async move {
            // A block volume: its image is made with it.
            let request = csi::CreateVolumeRequest {
                volume_capabilities: vec![block(Mode::SingleNodeWriter)],
                ..create_request("same", GI)
            };
            let id = c
                .create_volume(request)
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id;
            // No caller hears of the volume before its directory exists.
            assert!(
                volumes.join(&id).is_dir(),
                "answered before the directory existed"
            );
            id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every caller got the same volume");
    assert_eq!(h.all_volumes().await.len(), 1);
}

#[tokio::test]
async fn create_refuses_invalid_requests_with_the_spec_codes() {
    let h = Harness::start(&[
        "--capacity=10Gi",
        "--max-volume-size=4Gi",
        "--disable-block",
    ])
    .await;
    let mut c = h.controller();
    let cases: Vec<(&str, csi::CreateVolumeRequest, Code)> = vec![
        (
            "missing name",
            create_request("", GI),
            Code::InvalidArgument,
        ),
        (
            "missing capabilities",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create_request("a", GI)
            },
            Code::InvalidArgument,
        ),
        (
            "block disabled",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![block(Mode::SingleNodeWriter)],
                ..create_request("b", GI)
            },
            Code::InvalidArgument,
        ),
        (
            "unknown parameter",
            csi::CreateVolumeRequest {
                parameters: params(&[("speed", "fast")]),
                ..create_request("c", GI)
            },
            Code::InvalidArgument,
        ),
        (
            "unknown kind",
            csi::CreateVolumeRequest {
                parameters: params(&[("kind", "ssd")]),
                ..create_request("d", GI)
            },
            Code::InvalidArgument,
        ),
        (
            "above max size",
            create_request("e", 5 * GI),
            Code::OutOfRange,
        ),
        (
            "unsupported mode",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![mount(Mode::SingleNodeMultiWriter)],
                ..create_request("f", GI)
            },
            Code::InvalidArgument,
        ),
    ];
    for (case, request, code) in cases {
        let err = c.create_volume(request).await.unwrap_err();
        assert_eq!(err.code(), code, "{case}: {}", err.message());
        assert!(
            !err.message().is_empty(),
            "{case}: the message says what was wrong"
        );
    }
    assert!(
        h.all_volumes().await.is_empty(),
        "no refused request left a volume"
    );
}

#[tokio::test]
async fn capacity_is_exhausted_exactly_and_freed_by_delete() {
    let h = Harness::start(&["--capacity=4Gi", "--capacity=fast=1Gi"]).await;
    let mut c = h.controller();
    let capacity = |kind: &'static str| {
        let mut c = h.controller();
        async move {
            let parameters = if kind.is_empty() {
                params(&[])
            } else {
                params(&[("kind", kind)])
            };
            c.get_capacity(csi::GetCapacityRequest {
                parameters,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .available_capacity
        }
    };
    assert_eq!(capacity("").await, 4 * GI);
    assert_eq!(capacity("fast").await, GI);
    let a = c
        .create_volume(create_request("a", 3 * GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(capacity("").await, GI);
    assert_eq!(capacity("fast").await, GI, "pools are separate");
    let err = c
        .create_volume(create_request("b", 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    c.create_volume(create_request("c", GI)).await.unwrap();
    assert_eq!(capacity("").await, 0);
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: a.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(capacity("").await, 3 * GI);
    c.create_volume(create_request("b", 2 * GI)).await.unwrap();
    assert_eq!(capacity("").await, GI);
}

#[tokio::test]
async fn get_capacity_is_per_topology_segment_and_validates_its_input() {
    let h = Harness::start(&[
        "--capacity=2Gi",
        "--extra-node=node-2",
        "--max-volume-size=1Gi",
    ])
    .await;
    let mut c = h.controller();
    let at = |value: &'static str| {
        let mut c = h.controller();
        async move {
            c.get_capacity(csi::GetCapacityRequest {
                accessible_topology: Some(segment(KEY, value)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let mut req = create_request("a", GI);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "node-2")],
        preferred: vec![],
    });
    let v = c
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![segment(KEY, "node-2")]);
    assert_eq!(at("node-1").await.available_capacity, 2 * GI);
    assert_eq!(at("node-2").await.available_capacity, GI);
    assert_eq!(
        at("node-2").await.maximum_volume_size,
        Some(GI),
        "capped by --max-volume-size"
    );
    assert_eq!(
        at("node-9").await.available_capacity,
        0,
        "a segment we do not serve has nothing"
    );
    let total = c
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(total.available_capacity, 3 * GI);

    let bad_key = c
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: Some(segment("zone", "x")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_key.code(), Code::InvalidArgument);
    let bad_kind = c
        .get_capacity(csi::GetCapacityRequest {
            parameters: params(&[("kind", "nope")]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_kind.code(), Code::InvalidArgument);

    let unlimited = Harness::start(&[]).await;
    let err = unlimited
        .controller()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn topology_requirements_place_the_volume_or_exhaust() {
    let h = Harness::start(&["--extra-node=node-2", "--extra-node=node-3=rack-3"]).await;
    let mut c = h.controller();
    let mut req = create_request("t", GI);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "node-1"), segment(KEY, "rack-3")],
        preferred: vec![segment(KEY, "rack-3"), segment(KEY, "node-1")],
    });
    let v = c
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![segment(KEY, "rack-3")]);
    req.name = "u".into();
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "elsewhere")],
        preferred: vec![],
    });
    assert_eq!(
        c.create_volume(req).await.unwrap_err().code(),
        Code::ResourceExhausted
    );

    let flat = Harness::start(&["--disable-topology"]).await;
    let v = flat
        .controller()
        .create_volume(create_request("x", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(v.accessible_topology.is_empty());
}

#[tokio::test]
async fn delete_is_idempotent_and_validated() {
    let h = Harness::start(&[]).await;
    let mut c = h.controller();
    // A mount volume never used (no directory) deletes like any other.
    let unused = c
        .create_volume(create_request("unused", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: unused.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            volume_capabilities: vec![block(Mode::SingleNodeWriter)],
            ..create_request("d", GI)
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let dir = h.state_dir().join("volumes").join(&v.volume_id);
    assert!(dir.exists());
    for _ in 0..2 {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(!dir.exists(), "the directory went with the volume");
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: "never-existed".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let err = c
        .delete_volume(csi::DeleteVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(h.all_volumes().await.is_empty());
}

#[tokio::test]
async fn list_pages_return_every_volume_once() {
    let h = Harness::start(&[]).await;
    let mut c = h.controller();
    let mut created = Vec::new();
    for i in 0..23 {
        created.push(
            c.create_volume(create_request(&format!("v{i}"), 1024))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    created.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = c
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 5,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.entries.len() <= 5);
        pages += 1;
        seen.extend(r.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    assert_eq!(pages, 5);
    assert_eq!(seen, created);
    let all = h.list_unpaged().await;
    assert_eq!(all.entries.len(), 23);
    assert!(all.next_token.is_empty());

    let err = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: "garbage".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    let err = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_only_what_matches() {
    let h = Harness::start(&[]).await;
    let mut c = h.controller();
    let v = c
        .create_volume(create_request("val", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let ask = |caps: Vec<csi::VolumeCapability>, id: &str| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = c
        .validate_volume_capabilities(ask(vec![mount(Mode::MultiNodeReaderOnly)], &v.volume_id))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let no = c
        .validate_volume_capabilities(ask(vec![block(Mode::SingleNodeWriter)], &v.volume_id))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());
    assert!(no.message.contains("mount"), "{}", no.message);
    let err = c
        .validate_volume_capabilities(ask(vec![mount(Mode::SingleNodeWriter)], "nope"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = c
        .validate_volume_capabilities(ask(vec![], &v.volume_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .validate_volume_capabilities(ask(vec![mount(Mode::SingleNodeWriter)], ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn controller_get_volume_reports_publications() {
    let h = Harness::start(&["--enable-attach"]).await;
    let mut c = h.controller();
    let v = c
        .create_volume(create_request("g", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: "node-1".into(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    })
    .await
    .unwrap();
    let got = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status.unwrap().published_node_ids,
        vec!["node-1".to_string()]
    );
    let err = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn publish_and_unpublish_follow_the_spec_and_the_attach_limit() {
    let h = Harness::start(&[
        "--enable-attach",
        "--max-volumes-per-node=2",
        "--extra-node=node-2",
    ])
    .await;
    let mut c = h.controller();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            c.create_volume(create_request(&format!("p{i}"), GI))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    let publish = |id: &str, node: &str, readonly: bool| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    };
    let r = c
        .controller_publish_volume(publish(&ids[0], "node-1", false))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.publish_context.is_empty());
    c.controller_publish_volume(publish(&ids[0], "node-1", false))
        .await
        .unwrap();
    assert_eq!(
        c.controller_publish_volume(publish(&ids[0], "node-1", true))
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );
    assert_eq!(
        c.controller_publish_volume(publish(&ids[0], "node-2", false))
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        c.controller_publish_volume(publish(&ids[0], "node-x", false))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        c.controller_publish_volume(publish("missing", "node-1", false))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        c.controller_publish_volume(publish("", "node-1", false))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        c.controller_publish_volume(publish(&ids[0], "", false))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let mut no_cap = publish(&ids[0], "node-1", false);
    no_cap.volume_capability = None;
    assert_eq!(
        c.controller_publish_volume(no_cap)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    c.controller_publish_volume(publish(&ids[1], "node-1", false))
        .await
        .unwrap();
    let limit = c
        .controller_publish_volume(publish(&ids[2], "node-1", false))
        .await
        .unwrap_err();
    assert_eq!(limit.code(), Code::ResourceExhausted, "{}", limit.message());

    let in_use = c
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: ids[0].clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(in_use.code(), Code::FailedPrecondition);
    let unpublish = |id: &str, node: &str| csi::ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        ..Default::default()
    };
    c.controller_unpublish_volume(unpublish(&ids[0], "node-1"))
        .await
        .unwrap();
    c.controller_unpublish_volume(unpublish(&ids[0], "node-1"))
        .await
        .unwrap();
    c.controller_unpublish_volume(unpublish("missing", "node-1"))
        .await
        .unwrap();
    assert_eq!(
        c.controller_unpublish_volume(unpublish("", "node-1"))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    c.controller_publish_volume(publish(&ids[2], "node-1", false))
        .await
        .unwrap();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: ids[0].clone(),
        ..Default::default()
    })
    .await
    .unwrap();

    let listed = h.list_unpaged().await;
    let published: usize = listed
        .entries
        .iter()
        .map(|e| e.status.as_ref().unwrap().published_node_ids.len())
        .sum();
    assert_eq!(published, 2);
}

#[tokio::test]
async fn publish_is_unimplemented_without_enable_attach() {
    let h = Harness::start(&[]).await;
    let err = h
        .controller()
        .controller_publish_volume(csi::ControllerPublishVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let caps = h
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type
                .as_ref()
                .map(|csi::controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    use csi::controller_service_capability::rpc::Type;
    assert!(names.contains(&(Type::CreateDeleteVolume as i32)));
    assert!(!names.contains(&(Type::PublishUnpublishVolume as i32)));
    assert!(!names.contains(&(Type::GetCapacity as i32)));
}

#[tokio::test]
async fn snapshots_and_expansion_are_unimplemented_when_disabled() {
    let h = Harness::start(&[
        "--disable=snapshots",
        "--disable=expansion",
        "--disable=modify",
    ])
    .await;
    let mut c = h.controller();
    assert_eq!(
        c.create_snapshot(csi::CreateSnapshotRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::Unimplemented
    );
    assert_eq!(
        c.controller_expand_volume(csi::ControllerExpandVolumeRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::Unimplemented
    );
    assert_eq!(
        c.controller_modify_volume(csi::ControllerModifyVolumeRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::Unimplemented
    );
    // On by default: the same requests are served (and refused for what they lack).
    let on = Harness::start(&[]).await;
    assert_eq!(
        on.controller()
            .create_snapshot(csi::CreateSnapshotRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn messages_larger_than_the_codec_buffer_go_both_ways() {
    let h = Harness::start(&["--capacity=1000Gi"]).await;
    let mut c = h.controller();
    // A request of 16 KiB (secrets the driver ignores), sixteen times the codec's buffer.
    let mut request = create_request("pvc-big", GI);
    request.secrets = params(&[("blob", &"s".repeat(16 * 1024))]);
    let v = c
        .create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // And a response larger than the buffer: a list of 60 volumes in one page.
    for i in 0..59 {
        c.create_volume(create_request(&format!("pvc-{i}"), GI))
            .await
            .unwrap();
    }
    let listed = h.list_unpaged().await;
    assert_eq!(listed.entries.len(), 60);
    assert!(
        prost::Message::encoded_len(&listed) > 4 * csi_proto::CODEC_BUFFER,
        "{} bytes",
        prost::Message::encoded_len(&listed)
    );
    assert!(
        listed
            .entries
            .iter()
            .any(|e| e.volume.as_ref().map(|v| &v.volume_id) == Some(&v.volume_id))
    );
}
