//! CreateVolume, DeleteVolume, ListVolumes, ControllerGetVolume and
//! ValidateVolumeCapabilities, and messages of any size.

use super::*;

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
