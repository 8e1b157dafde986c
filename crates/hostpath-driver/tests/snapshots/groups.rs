//! Group snapshots, made whole and deleted whole.

use super::*;

#[tokio::test]
async fn group_snapshots_are_made_whole_and_deleted_whole() {
    let mut h = Harness::start(&[]).await;
    let a = create(&h, create_request("a", MI)).await;
    let b = create(&h, create_request("b", MI)).await;
    std::fs::write(in_use(&h, &a.volume_id).await.join("a.txt"), "from a").unwrap();
    let mut groups = csi::group_controller_client::GroupControllerClient::new(h.channel.clone());
    let caps = groups
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1);
    let request = csi::CreateVolumeGroupSnapshotRequest {
        name: "g".into(),
        source_volume_ids: vec![a.volume_id.clone(), b.volume_id.clone()],
        ..Default::default()
    };
    let group = groups
        .create_volume_group_snapshot(request.clone())
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert!(group.ready_to_use);
    assert_eq!(group.snapshots.len(), 2);
    assert!(
        group
            .snapshots
            .iter()
            .all(|s| s.group_snapshot_id == group.group_snapshot_id)
    );
    let again = groups
        .create_volume_group_snapshot(request)
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again, group);
    // A member restores like any snapshot, but cannot be deleted alone.
    let member = group
        .snapshots
        .iter()
        .find(|s| s.source_volume_id == a.volume_id)
        .unwrap();
    let restored = create(&h, from_snapshot("from-group", MI, &member.snapshot_id)).await;
    assert_eq!(
        std::fs::read_to_string(volume_dir(&h, &restored.volume_id).join("a.txt")).unwrap(),
        "from a"
    );
    assert_eq!(
        h.controller()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: member.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    h.restart().await;
    let mut groups = csi::group_controller_client::GroupControllerClient::new(h.channel.clone());
    let got = groups
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got, group, "the group survives a restart");
    let ids: Vec<String> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();
    let wrong = groups
        .delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            snapshot_ids: vec![ids[0].clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    for _ in 0..2 {
        groups
            .delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: group.group_snapshot_id.clone(),
                snapshot_ids: ids.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert!(
        list(&h, csi::ListSnapshotsRequest::default())
            .await
            .0
            .is_empty()
    );
    assert_eq!(
        groups
            .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
                group_snapshot_id: group.group_snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
}
