//! CSI ephemeral inline volumes: made at NodePublishVolume, removed at NodeUnpublishVolume.

#![allow(clippy::unwrap_used)]

mod harness;

use std::collections::HashMap;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, mount};
use tonic::Code;

const MI: i64 = 1 << 20;

fn publish(h: &Harness, id: &str, size: &str) -> csi::NodePublishVolumeRequest {
    let context: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "web"),
        ("size", size),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: h
            .state_dir()
            .join(format!("target-{id}"))
            .display()
            .to_string(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        volume_context: context,
        ..Default::default()
    }
}

async fn available(h: &Harness) -> i64 {
    h.controller()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn an_ephemeral_volume_lives_from_publish_to_unpublish() {
    // Staging and attach on: an ephemeral volume is published without NodeStageVolume and
    // without ControllerPublishVolume.
    let h = Harness::start(&["--capacity=64Mi", "--enable-attach"]).await;
    let before = available(&h).await;
    let req = publish(&h, "csi-abc123", "8Mi");
    h.node().node_publish_volume(req.clone()).await.unwrap();
    // Repeated (kubelet retries): the same volume, still published once.
    h.node().node_publish_volume(req.clone()).await.unwrap();
    let volumes = h.all_volumes().await;
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].volume_id, "csi-abc123");
    assert_eq!(volumes[0].capacity_bytes, 8 * MI);
    assert_eq!(
        available(&h).await,
        before - 8 * MI,
        "its size is taken from the pool"
    );
    std::fs::write(std::path::Path::new(&req.target_path).join("f"), b"x").unwrap();
    h.node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: req.volume_id.clone(),
            target_path: req.target_path.clone(),
        })
        .await
        .unwrap();
    assert!(h.all_volumes().await.is_empty(), "gone with its target");
    assert_eq!(available(&h).await, before);

    // Too large for the pool: refused, nothing made.
    let big = publish(&h, "csi-big", "1Gi");
    let error = h.node().node_publish_volume(big).await.unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
    assert!(h.all_volumes().await.is_empty());
    // A bad size or id: InvalidArgument naming it.
    let error = h
        .node()
        .node_publish_volume(publish(&h, "csi-x", "lots"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("size"), "{error:?}");
    // An unpublish for a volume whose publish never got as far as its target still removes
    // the volume (a crash between making and publishing).
    let half = publish(&h, "csi-half", "1Mi");
    h.node().node_publish_volume(half.clone()).await.unwrap();
    h.node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: half.volume_id.clone(),
            target_path: "/elsewhere/never/recorded".into(),
        })
        .await
        .unwrap();
    assert!(
        h.all_volumes()
            .await
            .iter()
            .any(|v| v.volume_id == "csi-half"),
        "still published at its own target"
    );
}

#[tokio::test]
async fn a_persistent_volume_is_never_published_as_ephemeral() {
    let h = Harness::start(&[]).await;
    let made = harness::create(&h, harness::create_request("pv-1", MI)).await;
    let mut req = publish(&h, &made.volume_id, "1Mi");
    req.volume_id = made.volume_id.clone();
    // Its id is a UUID, never a name: the ephemeral create under that id conflicts.
    let error = h.node().node_publish_volume(req).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert_eq!(
        h.all_volumes().await.len(),
        1,
        "the persistent volume stays"
    );
}
