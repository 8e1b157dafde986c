//! The node service touches only paths it recorded for a volume, and checks the real mount table:
//! NodeUnstage and NodeUnpublish leave any other path as it is (even when they answer
//! NOT_FOUND), a target unmounted behind the driver's back is mounted again when it is published
//! again, and a target whose path has a space or a trailing slash is recognised as mounted.
//! Bind mounts need CAP_SYS_ADMIN: these tests run as root (as CI does); without it they fail,
//! they do not pass silently.

#![allow(clippy::unwrap_used)]

mod harness;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, create_request, mount};

const GI: i64 = 1 << 30;
use sidecar_kit::mounts::is_mount_point;

async fn volume(h: &Harness, name: &str) -> String {
    h.controller()
        .create_volume(create_request(name, GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

async fn require_bind_mounts() {
    let probe = tempfile::tempdir().unwrap();
    assert!(
        hostpath_driver::driver::bind_mounts_permitted(probe.path()).await,
        "bind mounts are not permitted here: run the tests as root (CAP_SYS_ADMIN)"
    );
}

#[tokio::test]
async fn unstage_and_unpublish_leave_paths_they_did_not_record_alone() {
    let h = Harness::start(&["--publish-mode=symlink"]).await;
    let kept = h.dir.path().join("F");
    std::fs::write(&kept, "keep").unwrap();
    let path = kept.display().to_string();
    let mut node = h.node();
    // An unknown volume: NOT_FOUND, and the path is untouched.
    let refused = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "no-such-vol".into(),
            staging_target_path: path.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    let refused = node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "no-such-vol".into(),
            target_path: path.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "keep");
    // A volume that exists but was never staged or published there: OK, and untouched.
    let id = volume(&h, "v").await;
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: path.clone(),
    })
    .await
    .unwrap();
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: path.clone(),
    })
    .await
    .unwrap();
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "keep");
    // A directory with content, likewise.
    let dir = h.dir.path().join("D");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("inside"), "x").unwrap();
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id,
        target_path: dir.display().to_string(),
    })
    .await
    .unwrap();
    assert!(dir.join("inside").exists());
}

#[tokio::test]
async fn a_target_unmounted_behind_the_drivers_back_is_mounted_again() {
    require_bind_mounts().await;
    let h = Harness::start(&["--publish-mode=bind"]).await;
    let id = volume(&h, "v").await;
    let staging = h.dir.path().join("staging");
    let target = h.dir.path().join("target");
    let mut node = h.node();
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_publish_volume(publish.clone()).await.unwrap();
    std::fs::write(target.join("data"), "tenant").unwrap();
    // A reboot, or someone, unmounts both: the records still say staged and published.
    for path in [&target, &staging] {
        let out = std::process::Command::new("umount")
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    assert!(!target.join("data").exists(), "a plain directory now");
    // Staged and published again, as kubelet asks after a reboot: the volume is back.
    node.node_stage_volume(stage).await.unwrap();
    node.node_publish_volume(publish).await.unwrap();
    assert!(is_mount_point(&staging) && is_mount_point(&target));
    assert_eq!(
        std::fs::read_to_string(target.join("data")).unwrap(),
        "tenant"
    );
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id,
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!is_mount_point(&staging) && !is_mount_point(&target));
}

#[tokio::test]
async fn a_target_with_a_space_or_a_trailing_slash_is_seen_mounted_and_unmounted() {
    require_bind_mounts().await;
    let h = Harness::start(&["--publish-mode=bind", "--disable=stage-unstage"]).await;
    let id = volume(&h, "v").await;
    let target = h.dir.path().join("with space").join("target");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let named = format!("{}/", target.display());
    let mut node = h.node();
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        target_path: named.clone(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(is_mount_point(&target));
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id,
        target_path: named,
    })
    .await
    .unwrap();
    assert!(!is_mount_point(&target), "unmounted");
    assert!(!target.exists(), "and removed");
}
