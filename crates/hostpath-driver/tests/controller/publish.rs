//! ControllerPublishVolume and ControllerUnpublishVolume, and the services a driver turns off.

use super::*;

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
