//! Identity and Node services, restart durability and fault injection.

#![allow(clippy::unwrap_used)]

mod harness;

use std::time::Duration;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, block, create_request, mount, segment};
use hostpath_driver::config::DEFAULT_TOPOLOGY_KEY as KEY;
use tonic::Code;

const GI: i64 = 1 << 30;

#[tokio::test]
async fn identity_reports_name_capabilities_and_readiness() {
    let h = Harness::start(&[
        "--drivername=example.csi.test",
        "--disable=group-snapshots",
        "--disable=expansion",
    ])
    .await;
    let mut id = h.identity();
    let info = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "example.csi.test");
    assert!(!info.vendor_version.is_empty());
    assert_eq!(
        id.probe(csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        caps.capabilities.len(),
        2,
        "controller service and accessibility constraints"
    );

    let flat = Harness::start(&[
        "--disable-topology",
        "--disable=group-snapshots",
        "--disable=expansion",
    ])
    .await;
    let caps = flat
        .identity()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1);
}

#[tokio::test]
async fn node_get_info_reports_id_topology_and_limit() {
    let h = Harness::start(&[
        "--nodeid=worker-7",
        "--topology-value=zone-b",
        "--max-volumes-per-node=12",
        "--disable=stage-unstage",
        "--disable=volume-stats",
        "--disable=expansion",
        "--disable=volume-condition",
    ])
    .await;
    let info = h
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "worker-7");
    assert_eq!(info.max_volumes_per_node, 12);
    assert_eq!(info.accessible_topology, Some(segment(KEY, "zone-b")));
    let caps = h
        .node()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        caps.capabilities.is_empty(),
        "every optional node capability is off: {caps:?}"
    );
}

#[tokio::test]
async fn node_publish_exposes_the_volume_and_is_idempotent() {
    let h = Harness::start(&["--disable=stage-unstage"]).await;
    let v = h
        .controller()
        .create_volume(create_request("n", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let target = h.dir.path().join("pods/uid/volumes/mount");
    std::fs::create_dir_all(&target).unwrap();
    let publish = |readonly: bool| csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    };
    let mut node = h.node();
    node.node_publish_volume(publish(false)).await.unwrap();
    std::fs::write(target.join("hello.txt"), "data").unwrap();
    let in_volume = h
        .state_dir()
        .join("volumes")
        .join(&v.volume_id)
        .join("hello.txt");
    assert_eq!(
        std::fs::read_to_string(in_volume).unwrap(),
        "data",
        "writes land in the volume"
    );
    node.node_publish_volume(publish(false)).await.unwrap();
    assert_eq!(
        node.node_publish_volume(publish(true))
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );

    let in_use = h
        .controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(in_use.code(), Code::FailedPrecondition);

    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.display().to_string(),
    };
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "target removed"
    );
    node.node_unpublish_volume(unpublish).await.unwrap();
    h.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn node_publish_validates_its_request() {
    let h = Harness::start(&["--enable-attach", "--disable=stage-unstage"]).await;
    let v = h
        .controller()
        .create_volume(create_request("n", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let target = h.dir.path().join("t").display().to_string();
    let req = |id: &str, target: &str, cap: Option<csi::VolumeCapability>| {
        csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.into(),
            volume_capability: cap,
            ..Default::default()
        }
    };
    let mut node = h.node();
    let cap = Some(mount(Mode::SingleNodeWriter));
    assert_eq!(
        node.node_publish_volume(req("", &target, cap.clone()))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        node.node_publish_volume(req(&v.volume_id, "", cap.clone()))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        node.node_publish_volume(req(&v.volume_id, &target, None))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        node.node_publish_volume(req("missing", &target, cap.clone()))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        node.node_publish_volume(req(
            &v.volume_id,
            &target,
            Some(block(Mode::SingleNodeWriter))
        ))
        .await
        .unwrap_err()
        .code(),
        Code::FailedPrecondition,
        "the spec's \"exceeds capabilities\""
    );
    let not_attached = node
        .node_publish_volume(req(&v.volume_id, &target, cap.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        not_attached.code(),
        Code::FailedPrecondition,
        "{}",
        not_attached.message()
    );
    let unpublish = |id: &str, t: &str| csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: t.into(),
    };
    assert_eq!(
        node.node_unpublish_volume(unpublish("missing", &target))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(
        node.node_unpublish_volume(unpublish(&v.volume_id, ""))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn block_volumes_are_published_as_files() {
    let h = Harness::start(&["--disable=stage-unstage"]).await;
    let mut req = create_request("b", 64 << 20);
    req.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let v = h
        .controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let target = h.dir.path().join("dev/block0");
    h.node()
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.display().to_string(),
            volume_capability: Some(block(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(&target).unwrap().len(),
        64 << 20,
        "the device image has the volume's size"
    );
}

#[tokio::test]
async fn volumes_survive_a_restart_with_exact_accounting() {
    let mut h = Harness::start(&["--capacity=10Gi", "--enable-attach"]).await;
    let mut c = h.controller();
    let mut kept = Vec::new();
    for i in 0..10 {
        let v = c
            .create_volume(create_request(&format!("r{i}"), GI))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        kept.push(v.volume_id);
    }
    for id in kept.drain(..4) {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let published = kept[0].clone();
    c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
        volume_id: published.clone(),
        node_id: "node-1".into(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    })
    .await
    .unwrap();
    h.restart().await;
    let mut ids: Vec<String> = h
        .all_volumes()
        .await
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    ids.sort();
    kept.sort();
    assert_eq!(ids, kept);
    let cap = h
        .controller()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.available_capacity, 4 * GI);
    let again = h
        .controller()
        .create_volume(create_request("r5", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        kept.contains(&again.volume_id),
        "the name still maps to its volume after a restart"
    );
    let in_use = h
        .controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: published,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        in_use.code(),
        Code::FailedPrecondition,
        "publications survive too"
    );
}

#[tokio::test]
async fn faults_switch_on_and_off_at_run_time() {
    let h = Harness::start(&[]).await;
    let mut c = h.controller();
    c.create_volume(create_request("before", GI)).await.unwrap();

    h.set_faults("CreateVolume=error:UNAVAILABLE\n");
    let err = c
        .create_volume(create_request("during", GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("injected"), "{}", err.message());
    assert_eq!(
        h.all_volumes().await.len(),
        1,
        "an error before the work leaves no volume"
    );

    h.set_faults("CreateVolume=error:DEADLINE_EXCEEDED:1:after\n");
    let err = c
        .create_volume(create_request("ghost", GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert_eq!(
        h.all_volumes().await.len(),
        2,
        "an error after the work hides a real volume"
    );

    h.set_faults("# nothing\n");
    c.create_volume(create_request("ghost", GI)).await.unwrap();
    assert_eq!(
        h.all_volumes().await.len(),
        2,
        "the retry finds the hidden volume, no duplicate"
    );

    h.set_faults("DeleteVolume=latency:1500ms\n");
    let started = std::time::Instant::now();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: "none".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1500));

    std::fs::remove_file(h.fault_file()).unwrap();
    let started = std::time::Instant::now();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: "none".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "latency gone with the file"
    );
}

#[tokio::test]
async fn a_hung_method_times_out_at_the_client_and_recovers() {
    let h = Harness::start(&[]).await;
    h.set_faults("CreateVolume=hang\n");
    let mut c = h.controller();
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_millis(300),
        c.create_volume(create_request("h", GI)),
    )
    .await;
    assert!(
        outcome.is_err(),
        "the call must still be hanging when the client's deadline ends it"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        h.all_volumes().await.is_empty(),
        "a hang happens before the work"
    );
    h.set_faults("");
    c.create_volume(create_request("h", GI)).await.unwrap();
    assert_eq!(h.all_volumes().await.len(), 1);
}

#[tokio::test]
async fn probability_faults_fail_a_fraction_of_calls() {
    let h = Harness::start(&[]).await;
    h.set_faults("Probe=error:UNAVAILABLE:0.5\n");
    let mut id = h.identity();
    let mut failures = 0;
    for _ in 0..200 {
        if id.probe(csi::ProbeRequest {}).await.is_err() {
            failures += 1;
        }
    }
    assert!(
        (40..=160).contains(&failures),
        "{failures} of 200 failed at p=0.5"
    );
}

fn mounted(path: &std::path::Path) -> bool {
    sidecar_kit::mounts::is_mount_point(path)
}

#[tokio::test]
async fn bind_mode_mounts_read_write_and_read_only() {
    let probe = tempfile::tempdir().unwrap();
    // The tests run as root (as CI does): without CAP_SYS_ADMIN this test fails, it does not
    // pass without running (the driver's symlink fallback is tested above).
    assert!(
        hostpath_driver::driver::bind_mounts_permitted(probe.path()).await,
        "bind mounts are not permitted here: run the tests as root (CAP_SYS_ADMIN)"
    );
    let h = Harness::start(&["--publish-mode=bind", "--disable=stage-unstage"]).await;
    let v = h
        .controller()
        .create_volume(create_request("bind", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let rw = h.dir.path().join("rw");
    let ro = h.dir.path().join("ro");
    let publish = |target: &std::path::Path, readonly: bool| csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount(Mode::MultiNodeMultiWriter)),
        readonly,
        ..Default::default()
    };
    let mut node = h.node();
    node.node_publish_volume(publish(&rw, false)).await.unwrap();
    node.node_publish_volume(publish(&ro, true)).await.unwrap();
    assert!(mounted(&rw) && mounted(&ro));
    std::fs::write(rw.join("f"), "x").unwrap();
    assert_eq!(
        std::fs::read_to_string(ro.join("f")).unwrap(),
        "x",
        "both show the same volume"
    );
    assert!(
        std::fs::write(ro.join("g"), "y").is_err(),
        "the read-only mount refuses writes"
    );
    for target in [&rw, &ro] {
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!mounted(target));
        assert!(!target.exists());
    }
}
