//! Restores and clones: the content of their source, byte for byte, and durable when cut off.

use super::*;

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
