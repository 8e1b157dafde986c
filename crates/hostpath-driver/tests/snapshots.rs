//! Snapshots, restores, clones and group snapshots over gRPC: content copied, idempotency,
//! error codes, durability across a restart, features switched off, faults.

#![allow(clippy::unwrap_used)]

mod harness;

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
async fn restores_and_clones_hold_the_content_of_their_source() {
    let h = Harness::start(&[]).await;
    let source = create(&h, create_request("source", 4 * MI)).await;
    let dir = in_use(&h, &source.volume_id).await;
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/file.txt"), "before the snapshot").unwrap();
    let snap = snapshot(&h, "snap", &source.volume_id).await;
    std::fs::write(dir.join("sub/file.txt"), "after the snapshot").unwrap();

    let restored = create(&h, from_snapshot("restored", 4 * MI, &snap.snapshot_id)).await;
    assert_eq!(
        std::fs::read_to_string(volume_dir(&h, &restored.volume_id).join("sub/file.txt")).unwrap(),
        "before the snapshot"
    );
    assert!(matches!(
        restored.content_source.as_ref().and_then(|s| s.r#type.as_ref()),
        Some(csi::volume_content_source::Type::Snapshot(s)) if s.snapshot_id == snap.snapshot_id
    ));
    let clone = create(&h, from_volume("clone", 8 * MI, &source.volume_id)).await;
    assert_eq!(clone.capacity_bytes, 8 * MI);
    assert_eq!(
        std::fs::read_to_string(volume_dir(&h, &clone.volume_id).join("sub/file.txt")).unwrap(),
        "after the snapshot"
    );
    // Idempotent, and a different source under the same name conflicts.
    assert_eq!(
        create(&h, from_volume("clone", 8 * MI, &source.volume_id))
            .await
            .volume_id,
        clone.volume_id
    );
    assert_eq!(
        create_code(&h, from_snapshot("clone", 8 * MI, &snap.snapshot_id)).await,
        Code::AlreadyExists
    );
    // A request smaller than the source gets the source's size; a limit below it is refused.
    let small = create(&h, from_snapshot("small", MI, &snap.snapshot_id)).await;
    assert_eq!(small.capacity_bytes, 4 * MI);
    let mut limited = from_snapshot("limited", MI, &snap.snapshot_id);
    limited.capacity_range = Some(csi::CapacityRange {
        required_bytes: MI,
        limit_bytes: 2 * MI,
    });
    assert_eq!(create_code(&h, limited).await, Code::OutOfRange);
    assert_eq!(
        create_code(&h, from_snapshot("x", MI, "no-such-snapshot")).await,
        Code::NotFound
    );
    assert_eq!(
        create_code(&h, from_volume("x", MI, "no-such-volume")).await,
        Code::NotFound
    );
    // A mount volume cannot come from a block source.
    let mut raw = create_request("raw", 2 * MI);
    raw.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let raw = create(&h, raw).await;
    assert_eq!(
        create_code(&h, from_volume("y", 2 * MI, &raw.volume_id)).await,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn block_volumes_are_restored_and_cloned_byte_for_byte_and_grow() {
    let h = Harness::start(&[]).await;
    let mut req = create_request("raw", 8 * MI);
    req.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let raw = create(&h, req).await;
    let image = volume_dir(&h, &raw.volume_id).join("block.img");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        f.seek(SeekFrom::Start(5 * MI as u64)).unwrap();
        f.write_all(b"block payload").unwrap();
    }
    let snap = snapshot(&h, "raw-snap", &raw.volume_id).await;
    let mut restore = from_snapshot("raw-restored", 16 * MI, &snap.snapshot_id);
    restore.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let restored = create(&h, restore).await;
    let mut clone = from_volume("raw-clone", 8 * MI, &raw.volume_id);
    clone.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let cloned = create(&h, clone).await;
    for (volume, size) in [(&restored, 16 * MI), (&cloned, 8 * MI)] {
        let path = volume_dir(&h, &volume.volume_id).join("block.img");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
        let mut f = std::fs::File::open(&path).unwrap();
        f.seek(SeekFrom::Start(5 * MI as u64)).unwrap();
        let mut text = [0u8; 13];
        f.read_exact(&mut text).unwrap();
        assert_eq!(&text, b"block payload");
    }
}

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

/// A gRPC deadline drops the server's handler; a clone cut off mid-copy must still end as a
/// listed, durable volume (or none), never as a reservation a retry answers with.
#[tokio::test]
async fn a_clone_cut_off_by_its_deadline_ends_listed_and_durable() {
    let mut h = Harness::start(&[]).await;
    let source = create(&h, create_request("big", 256 * MI)).await;
    let data: Vec<u8> = (0..96 * MI as usize).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(in_use(&h, &source.volume_id).await.join("data.bin"), &data).unwrap();
    let mut hurried = tonic::Request::new(from_volume("copy", 256 * MI, &source.volume_id));
    hurried.set_timeout(std::time::Duration::from_millis(5));
    let cut = h.controller().create_volume(hurried).await.unwrap_err();
    assert!(
        matches!(cut.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{cut:?}"
    );
    // The retry waits for the first one (or is told it is still pending), then finds the copy.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let copy = loop {
        match h
            .controller()
            .create_volume(from_volume("copy", 256 * MI, &source.volume_id))
            .await
        {
            Ok(r) => break r.into_inner().volume.unwrap(),
            Err(status) if status.code() == Code::Aborted => {
                assert!(std::time::Instant::now() < deadline, "still pending");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    let listed: Vec<String> = h
        .all_volumes()
        .await
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    assert!(
        listed.contains(&copy.volume_id),
        "the answered clone is listed"
    );
    h.restart().await;
    let listed: Vec<String> = h
        .all_volumes()
        .await
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    assert!(listed.contains(&copy.volume_id), "and durable");
    assert_eq!(
        std::fs::read(volume_dir(&h, &copy.volume_id).join("data.bin"))
            .unwrap()
            .len(),
        data.len()
    );
}

/// An empty mount volume is a record until its first use: a snapshot or a clone of it is
/// empty, and staging makes its directory durably (it survives a restart as a volume in use).
#[tokio::test]
async fn a_volume_never_used_has_no_directory_and_copies_as_empty() {
    let mut h = Harness::start(&[]).await;
    let unused = create(&h, create_request("unused", MI)).await;
    assert!(!volume_dir(&h, &unused.volume_id).exists());
    let snap = snapshot(&h, "of-unused", &unused.volume_id).await;
    let restored = create(&h, from_snapshot("restored", MI, &snap.snapshot_id)).await;
    let restored_dir = volume_dir(&h, &restored.volume_id);
    assert!(restored_dir.is_dir(), "a restore is made with its content");
    assert_eq!(std::fs::read_dir(&restored_dir).unwrap().count(), 0);
    let clone = create(&h, from_volume("clone", MI, &unused.volume_id)).await;
    let clone_dir = volume_dir(&h, &clone.volume_id);
    assert!(clone_dir.is_dir(), "a clone is made with its content");
    assert_eq!(std::fs::read_dir(&clone_dir).unwrap().count(), 0);
    let second = create(&h, create_request("second", MI)).await;
    let dir = in_use(&h, &second.volume_id).await;
    std::fs::write(dir.join("kept.txt"), "in use").unwrap();
    h.restart().await;
    assert_eq!(
        std::fs::read_to_string(volume_dir(&h, &second.volume_id).join("kept.txt")).unwrap(),
        "in use",
        "the directory of a volume in use is not an orphan at start"
    );
}
