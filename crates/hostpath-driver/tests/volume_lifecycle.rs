//! Staging, expansion, volume statistics and condition, and mutable parameters over gRPC.

#![allow(clippy::unwrap_used)]

mod harness;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, block, create, create_request, mount, params};
use tonic::Code;

const MI: i64 = 1 << 20;

fn stage_request(
    volume: &str,
    staging: &str,
    cap: csi::VolumeCapability,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn publish_request(
    volume: &str,
    staging: &str,
    target: &str,
    cap: csi::VolumeCapability,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn node_rpcs(caps: &csi::NodeGetCapabilitiesResponse) -> Vec<&'static str> {
    caps.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::node_service_capability::Type::Rpc(rpc)) => {
                csi::node_service_capability::rpc::Type::try_from(rpc.r#type)
                    .ok()
                    .map(|t| t.as_str_name())
            }
            None => None,
        })
        .collect()
}

async fn stats(h: &Harness, volume: &str, path: &str) -> csi::NodeGetVolumeStatsResponse {
    h.node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: volume.into(),
            volume_path: path.into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_volume_is_staged_before_it_is_published_and_unstaged_after() {
    let mut h = Harness::start(&[]).await;
    let caps = h
        .node()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs = node_rpcs(&caps);
    for wanted in [
        "STAGE_UNSTAGE_VOLUME",
        "GET_VOLUME_STATS",
        "EXPAND_VOLUME",
        "VOLUME_CONDITION",
    ] {
        assert!(rpcs.contains(&wanted), "{wanted} missing from {rpcs:?}");
    }
    let v = create(&h, create_request("v", MI)).await;
    let root = h.dir.path().join("kubelet");
    let staging = root.join("globalmount");
    let target = root.join("pod/mount");
    std::fs::create_dir_all(&staging).unwrap();
    let (staging, target) = (staging.display().to_string(), target.display().to_string());
    let cap = mount(Mode::SingleNodeWriter);
    let mut node = h.node();
    // Publishing needs a staging path, and the volume staged there.
    for staging_path in ["", staging.as_str()] {
        let refused = node
            .node_publish_volume(publish_request(
                &v.volume_id,
                staging_path,
                &target,
                cap.clone(),
            ))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    for _ in 0..2 {
        node.node_stage_volume(stage_request(&v.volume_id, &staging, cap.clone()))
            .await
            .unwrap();
    }
    assert_eq!(
        node.node_stage_volume(stage_request(
            &v.volume_id,
            &staging,
            block(Mode::SingleNodeWriter)
        ))
        .await
        .unwrap_err()
        .code(),
        Code::FailedPrecondition,
        "a mount volume staged as block"
    );
    // A staged volume is in use: DeleteVolume refuses it (its data is mounted on the node).
    let refused = h
        .controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    node.node_publish_volume(publish_request(
        &v.volume_id,
        &staging,
        &target,
        cap.clone(),
    ))
    .await
    .unwrap();
    std::fs::write(
        std::path::Path::new(&target).join("note.txt"),
        "through the target",
    )
    .unwrap();
    let in_volume = h
        .state_dir()
        .join("volumes")
        .join(&v.volume_id)
        .join("note.txt");
    assert_eq!(
        std::fs::read_to_string(in_volume).unwrap(),
        "through the target"
    );
    assert_eq!(
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap_err()
        .code(),
        Code::FailedPrecondition,
        "unstaging while published"
    );
    // The staging survives a restart (the table records it).
    h.restart().await;
    let mut node = h.node();
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.clone(),
    })
    .await
    .unwrap();
    for _ in 0..2 {
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap();
    }
    assert_eq!(
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "missing".into(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );
    h.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn without_staging_a_volume_is_published_directly() {
    let h = Harness::start(&["--disable=stage-unstage"]).await;
    let caps = h
        .node()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!node_rpcs(&caps).contains(&"STAGE_UNSTAGE_VOLUME"));
    let v = create(&h, create_request("v", MI)).await;
    let target = h.dir.path().join("target").display().to_string();
    let mut node = h.node();
    node.node_publish_volume(publish_request(
        &v.volume_id,
        "",
        &target,
        mount(Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();
    assert_eq!(
        node.node_stage_volume(stage_request(
            &v.volume_id,
            "/x",
            mount(Mode::SingleNodeWriter)
        ))
        .await
        .unwrap_err()
        .code(),
        Code::Unimplemented
    );
}

#[tokio::test]
async fn stats_report_usage_and_the_condition_turns_abnormal_when_content_is_gone() {
    let h = Harness::start(&["--disable=stage-unstage"]).await;
    let v = create(&h, create_request("v", 4 * MI)).await;
    let target = h.dir.path().join("target").display().to_string();
    h.node()
        .node_publish_volume(publish_request(
            &v.volume_id,
            "",
            &target,
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap();
    std::fs::create_dir_all(std::path::Path::new(&target).join("dir")).unwrap();
    std::fs::write(
        std::path::Path::new(&target).join("dir/data"),
        vec![1u8; 300_000],
    )
    .unwrap();
    let r = stats(&h, &v.volume_id, &target).await;
    let bytes = r
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    let inodes = r
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert_eq!(bytes.total, 4 * MI);
    assert!(bytes.used >= 300_000 && bytes.used < MI, "{bytes:?}");
    assert_eq!(bytes.available, bytes.total - bytes.used);
    assert_eq!((inodes.total, inodes.used), (4 * MI / 16384, 3));
    let condition = r.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    // Unknown volume or path.
    let mut node = h.node();
    for (volume, path) in [
        ("missing", target.as_str()),
        (v.volume_id.as_str(), "/not/there"),
    ] {
        let code = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: volume.into(),
                volume_path: path.into(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err()
            .code();
        assert_eq!(code, Code::NotFound, "{volume} at {path}");
    }
    // More data than the volume's size: abnormal.
    std::fs::write(
        std::path::Path::new(&target).join("big"),
        vec![1u8; 5 * MI as usize],
    )
    .unwrap();
    let over = stats(&h, &v.volume_id, &target)
        .await
        .volume_condition
        .unwrap();
    assert!(over.abnormal, "{over:?}");
    // The content disappears from under the driver: abnormal on the node and the controller.
    std::fs::remove_dir_all(h.state_dir().join("volumes").join(&v.volume_id)).unwrap();
    let gone = stats(&h, &v.volume_id, &target)
        .await
        .volume_condition
        .unwrap();
    assert!(
        gone.abnormal && gone.message.contains("not readable"),
        "{gone:?}"
    );
    let status = h
        .controller()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert!(status.volume_condition.unwrap().abnormal);
    let listed = h
        .controller()
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let entry = listed.entries[0].status.clone().unwrap();
    assert!(entry.volume_condition.unwrap().abnormal);
}

#[tokio::test]
async fn volumes_grow_online_at_the_controller_then_at_the_node() {
    let h = Harness::start(&["--disable=stage-unstage", "--max-volume-size=64Mi"]).await;
    let plugin = h
        .identity()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(plugin.capabilities.iter().any(|c| matches!(
        &c.r#type,
        Some(csi::plugin_capability::Type::VolumeExpansion(e))
            if e.r#type == csi::plugin_capability::volume_expansion::Type::Online as i32
    )));
    let v = create(&h, create_request("v", 2 * MI)).await;
    let target = h.dir.path().join("target").display().to_string();
    h.node()
        .node_publish_volume(publish_request(
            &v.volume_id,
            "",
            &target,
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap();
    let expand = |id: &str, bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let mut ctl = h.controller();
    let grown = ctl
        .controller_expand_volume(expand(&v.volume_id, 8 * MI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (grown.capacity_bytes, grown.node_expansion_required),
        (8 * MI, true)
    );
    // The filesystem at the node still shows the old size until NodeExpandVolume.
    let total = |r: &csi::NodeGetVolumeStatsResponse| r.usage[0].total;
    assert_eq!(total(&stats(&h, &v.volume_id, &target).await), 2 * MI);
    let node_grown = h
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            volume_path: target.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 8 * MI,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_grown.capacity_bytes, 8 * MI);
    assert_eq!(total(&stats(&h, &v.volume_id, &target).await), 8 * MI);
    // Again: nothing to do. Beyond the maximum, or an unknown volume: refused.
    assert_eq!(
        ctl.controller_expand_volume(expand(&v.volume_id, 8 * MI))
            .await
            .unwrap()
            .into_inner()
            .capacity_bytes,
        8 * MI
    );
    assert_eq!(
        ctl.controller_expand_volume(expand(&v.volume_id, 128 * MI))
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange
    );
    assert_eq!(
        ctl.controller_expand_volume(expand("missing", MI))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    // A block volume's image grows with it and needs no node step.
    let mut raw = create_request("raw", 2 * MI);
    raw.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let raw = create(&h, raw).await;
    let r = ctl
        .controller_expand_volume(expand(&raw.volume_id, 6 * MI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (6 * MI, false)
    );
    let image = h
        .state_dir()
        .join("volumes")
        .join(&raw.volume_id)
        .join("block.img");
    assert_eq!(std::fs::metadata(image).unwrap().len(), 6 * MI as u64);
}

#[tokio::test]
async fn mutable_parameters_are_set_at_creation_and_modified() {
    let mut h = Harness::start(&[]).await;
    let mut req = create_request("v", MI);
    req.mutable_parameters = params(&[("tier", "standard")]);
    let v = create(&h, req.clone()).await;
    let mut bad = req.clone();
    bad.name = "w".into();
    bad.mutable_parameters = params(&[("tier", "gold")]);
    assert_eq!(
        h.controller().create_volume(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut ctl = h.controller();
    let modify = |pairs: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        mutable_parameters: params(pairs),
        ..Default::default()
    };
    ctl.controller_modify_volume(modify(&[("tier", "premium"), ("iops", "3000")]))
        .await
        .unwrap();
    assert_eq!(
        ctl.controller_modify_volume(modify(&[("iops", "many")]))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let mut unknown = modify(&[("iops", "1")]);
    unknown.volume_id = "missing".into();
    assert_eq!(
        ctl.controller_modify_volume(unknown)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    h.restart().await;
    let validate = |pairs: &[(&str, &str)]| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: v.volume_id.clone(),
        volume_capabilities: vec![mount(Mode::SingleNodeWriter)],
        mutable_parameters: params(pairs),
        ..Default::default()
    };
    let mut ctl = h.controller();
    let confirmed = ctl
        .validate_volume_capabilities(validate(&[("tier", "premium"), ("iops", "3000")]))
        .await
        .unwrap()
        .into_inner();
    assert!(confirmed.confirmed.is_some(), "{confirmed:?}");
    let stale = ctl
        .validate_volume_capabilities(validate(&[("tier", "standard")]))
        .await
        .unwrap()
        .into_inner();
    assert!(
        stale.confirmed.is_none(),
        "the modification survived the restart"
    );
}

#[tokio::test]
async fn faults_are_injected_into_the_node_and_expansion_methods() {
    let h = Harness::start(&[
        "--fault=NodeStageVolume=error:INTERNAL",
        "--fault=ControllerExpandVolume=error:ABORTED",
    ])
    .await;
    let v = create(&h, create_request("v", MI)).await;
    assert_eq!(
        h.node()
            .node_stage_volume(stage_request(
                &v.volume_id,
                "/tmp/x",
                mount(Mode::SingleNodeWriter)
            ))
            .await
            .unwrap_err()
            .code(),
        Code::Internal
    );
    assert_eq!(
        h.controller()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: v.volume_id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 2 * MI,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code(),
        Code::Aborted
    );
}
