//! Snapshots, restores, clones and group snapshots over gRPC: content copied, idempotency,
//! error codes, durability across a restart, features switched off, faults.

#![allow(clippy::unwrap_used)]

#[path = "../harness/mod.rs"]
mod harness;

mod copies;
mod groups;
mod snapshots;

use std::io::{Read, Seek, SeekFrom, Write};

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, block, create, create_request, mount, params};
use tonic::Code;

const MI: i64 = 1 << 20;

fn snapshot_request(name: &str, source: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn from_snapshot(name: &str, bytes: i64, snapshot: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, bytes);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.into(),
            },
        )),
    });
    req
}

fn from_volume(name: &str, bytes: i64, volume: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, bytes);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: volume.into(),
            },
        )),
    });
    req
}

async fn create_code(h: &Harness, req: csi::CreateVolumeRequest) -> Code {
    h.controller().create_volume(req).await.unwrap_err().code()
}

async fn snapshot(h: &Harness, name: &str, source: &str) -> csi::Snapshot {
    h.controller()
        .create_snapshot(snapshot_request(name, source))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

async fn list(h: &Harness, req: csi::ListSnapshotsRequest) -> (Vec<String>, String) {
    let r = h
        .controller()
        .list_snapshots(req)
        .await
        .unwrap()
        .into_inner();
    (
        r.entries
            .into_iter()
            .filter_map(|e| e.snapshot)
            .map(|s| s.snapshot_id)
            .collect(),
        r.next_token,
    )
}

fn volume_dir(h: &Harness, id: &str) -> std::path::PathBuf {
    h.state_dir().join("volumes").join(id)
}

/// A mount volume in use: staged on the node, as for a pod (which makes its directory); its
/// directory, to write content into as the pod would.
async fn in_use(h: &Harness, id: &str) -> std::path::PathBuf {
    let staging = h.dir.path().join("staging").join(id);
    std::fs::create_dir_all(h.dir.path().join("staging")).unwrap();
    h.node()
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap();
    volume_dir(h, id)
}
