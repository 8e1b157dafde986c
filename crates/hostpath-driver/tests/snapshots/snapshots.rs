//! Snapshots made, listed, got and deleted; features switched off; faults.

use super::*;

#[tokio::test]
async fn snapshots_are_made_listed_got_deleted_and_survive_a_restart() {
    let mut h = Harness::start(&[]).await;
    let a = create(&h, create_request("a", 4 * MI)).await;
    let b = create(&h, create_request("b", 2 * MI)).await;
    let s1 = snapshot(&h, "s1", &a.volume_id).await;
    assert!(s1.ready_to_use);
    assert_eq!(
        (s1.size_bytes, s1.source_volume_id.as_str()),
        (4 * MI, a.volume_id.as_str())
    );
    assert!(s1.creation_time.is_some());
    // The same request again answers the same snapshot; the name with another source conflicts.
    assert_eq!(
        snapshot(&h, "s1", &a.volume_id).await.snapshot_id,
        s1.snapshot_id
    );
    let mut ctl = h.controller();
    let code = |r: Result<tonic::Response<csi::CreateSnapshotResponse>, tonic::Status>| {
        r.unwrap_err().code()
    };
    assert_eq!(
        code(
            ctl.create_snapshot(snapshot_request("s1", &b.volume_id))
                .await
        ),
        Code::AlreadyExists
    );
    assert_eq!(
        code(ctl.create_snapshot(snapshot_request("s9", "missing")).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            ctl.create_snapshot(snapshot_request("", &a.volume_id))
                .await
        ),
        Code::InvalidArgument
    );
    let mut with_params = snapshot_request("s9", &a.volume_id);
    with_params.parameters = params(&[("compress", "yes")]);
    assert_eq!(
        code(ctl.create_snapshot(with_params).await),
        Code::InvalidArgument
    );
    let s2 = snapshot(&h, "s2", &b.volume_id).await;
    let s3 = snapshot(&h, "s3", &a.volume_id).await;

    let all = list(&h, csi::ListSnapshotsRequest::default()).await.0;
    assert_eq!(all.len(), 3);
    let of_a = list(
        &h,
        csi::ListSnapshotsRequest {
            source_volume_id: a.volume_id.clone(),
            ..Default::default()
        },
    )
    .await
    .0;
    let mut expected = vec![s1.snapshot_id.clone(), s3.snapshot_id.clone()];
    expected.sort();
    assert_eq!(of_a, expected);
    let one = list(
        &h,
        csi::ListSnapshotsRequest {
            snapshot_id: s2.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await
    .0;
    assert_eq!(one, vec![s2.snapshot_id.clone()]);
    // Pages of one follow each other to the end.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let (page, next) = list(
            &h,
            csi::ListSnapshotsRequest {
                max_entries: 1,
                starting_token: token,
                ..Default::default()
            },
        )
        .await;
        paged.extend(page);
        if next.is_empty() {
            break;
        }
        token = next;
    }
    assert_eq!(paged, all);
    let bad_token = ctl
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: "garbage".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), Code::Aborted);

    h.restart().await;
    let mut ctl = h.controller();
    let got = ctl
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got, s1, "the snapshot survives a restart unchanged");
    for _ in 0..2 {
        ctl.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert_eq!(
        ctl.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );
    assert!(
        !h.state_dir()
            .join("snapshots")
            .join(&s1.snapshot_id)
            .exists(),
        "the snapshot's copy is removed"
    );
    // A volume with snapshots can be deleted: snapshots are independent copies.
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: a.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        list(&h, csi::ListSnapshotsRequest::default()).await.0.len(),
        2
    );
}

#[tokio::test]
async fn switched_off_features_are_not_advertised_and_answer_unimplemented() {
    let h = Harness::start(&[
        "--disable=snapshots",
        "--disable=clones",
        "--disable=group-snapshots",
    ])
    .await;
    let caps = h
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(rpc)) => {
                csi::controller_service_capability::rpc::Type::try_from(rpc.r#type)
                    .ok()
                    .map(|t| t.as_str_name())
            }
            None => None,
        })
        .collect();
    for absent in [
        "CREATE_DELETE_SNAPSHOT",
        "LIST_SNAPSHOTS",
        "CLONE_VOLUME",
        "GET_SNAPSHOT",
    ] {
        assert!(!names.contains(&absent), "{absent} in {names:?}");
    }
    assert!(names.contains(&"EXPAND_VOLUME") && names.contains(&"MODIFY_VOLUME"));
    let v = create(&h, create_request("v", MI)).await;
    assert_eq!(
        h.controller()
            .create_snapshot(snapshot_request("s", &v.volume_id))
            .await
            .unwrap_err()
            .code(),
        Code::Unimplemented
    );
    assert_eq!(
        create_code(&h, from_volume("c", MI, &v.volume_id)).await,
        Code::InvalidArgument
    );
    let plugin = h
        .identity()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!plugin.capabilities.iter().any(|c| matches!(
        &c.r#type,
        Some(csi::plugin_capability::Type::Service(s))
            if s.r#type == csi::plugin_capability::service::Type::GroupControllerService as i32
    )));
}

#[tokio::test]
async fn faults_are_injected_into_the_snapshot_methods() {
    let h = Harness::start(&[]).await;
    let v = create(&h, create_request("v", MI)).await;
    h.set_faults(
        "CreateSnapshot=error:UNAVAILABLE\nCreateVolumeGroupSnapshot=error:RESOURCE_EXHAUSTED\n",
    );
    let mut ctl = h.controller();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The fault file is picked up when it changes; wait until the rule is in force.
    loop {
        match ctl
            .create_snapshot(snapshot_request("s", &v.volume_id))
            .await
        {
            Err(status) if status.code() == Code::Unavailable => break,
            Ok(_) | Err(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the fault never fired"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    let mut groups = csi::group_controller_client::GroupControllerClient::new(h.channel.clone());
    let refused = groups
        .create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest {
            name: "g".into(),
            source_volume_ids: vec![v.volume_id.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
}
