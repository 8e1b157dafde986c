//! The driver and the CSI client as processes: what an operator types, and `kill -9`.

#![allow(clippy::unwrap_used)]

use sidecar_kit::testing as poll;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_volstack");

struct Driver {
    child: Child,
    endpoint: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver(dir: &Path, extra: &[&str]) -> Driver {
    let socket = dir.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());
    let child = Command::new(BIN)
        .arg("driver")
        .arg(format!("--endpoint={endpoint}"))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg(format!("--fault-file={}", dir.join("faults").display()))
        .arg("--publish-mode=symlink")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver { child, endpoint };
    poll::poll_blocking(
        "the driver to answer Probe",
        Duration::from_secs(20),
        || {
            let code = csi(&driver.endpoint, &["probe"]).status.code();
            if code == Some(0) {
                Ok(())
            } else {
                Err(format!("exit code {code:?}"))
            }
        },
    );
    driver
}

fn csi(endpoint: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("csi")
        .arg(format!("--endpoint={endpoint}"))
        .args(args)
        .output()
        .unwrap()
}

fn csi_json(endpoint: &str, args: &[&str]) -> Value {
    let out = csi(endpoint, args);
    assert!(
        out.status.success(),
        "volstack csi {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn listed_ids(endpoint: &str) -> Vec<String> {
    let list = csi_json(endpoint, &["list", "--all", "--max-entries=100"]);
    list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["volume_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_operator_can_drive_the_driver_with_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_driver(
        dir.path(),
        &["--capacity=5Gi", "--drivername=demo.csi.test"],
    );
    let info = csi_json(&d.endpoint, &["info"]);
    assert_eq!(info["name"], "demo.csi.test");
    let caps = csi_json(&d.endpoint, &["capabilities"]);
    assert!(
        caps["controller"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "GET_CAPACITY")
    );
    let node = csi_json(&d.endpoint, &["node-info"]);
    assert_eq!(node["node_id"], "node-1");

    let v = csi_json(&d.endpoint, &["create", "pvc-demo", "--size=2Gi"]);
    assert_eq!(v["capacity_bytes"], 2i64 << 30);
    let id = v["volume_id"].as_str().unwrap().to_string();
    assert_eq!(listed_ids(&d.endpoint), vec![id.clone()]);
    let cap = csi_json(&d.endpoint, &["capacity"]);
    assert_eq!(cap["available_capacity"], 3i64 << 30);

    let refused = csi(&d.endpoint, &["create", "too-big", "--size=4Gi"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("ResourceExhausted"), "{stderr}");

    csi_json(&d.endpoint, &["delete", &id]);
    assert!(listed_ids(&d.endpoint).is_empty());
    let cap = csi_json(&d.endpoint, &["capacity"]);
    assert_eq!(cap["available_capacity"], 5i64 << 30);

    let rt = csi_json(&d.endpoint, &["roundtrip", "--count=50", "--concurrency=4"]);
    assert_eq!(rt["round_trips"], 50);
    assert!(rt["round_trips_per_second"].as_f64().unwrap() > 0.0);
    assert!(
        listed_ids(&d.endpoint).is_empty(),
        "round trips leave nothing behind"
    );
}

#[test]
fn snapshots_restores_clones_expansion_and_the_node_side_from_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_driver(dir.path(), &[]);
    let e = d.endpoint.as_str();
    let source = csi_json(
        e,
        &["create", "source", "--size=8Mi", "--mutable=tier=standard"],
    );
    let source_id = source["volume_id"].as_str().unwrap().to_string();
    // Mount it as kubelet would (stage, then publish) and write a file through the mount.
    let target = dir.path().join("pods/a/mount");
    let target_s = target.display().to_string();
    let mounted = csi_json(e, &["mount", &source_id, "--target", &target_s]);
    assert!(
        mounted["staging_path"]
            .as_str()
            .unwrap()
            .ends_with(".staging")
    );
    std::fs::write(target.join("hello.txt"), "written through NodePublish").unwrap();

    let snap = csi_json(e, &["snapshot", "create", "snap-1", "--source", &source_id]);
    assert_eq!(snap["ready_to_use"], true);
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    let listed = csi_json(e, &["snapshot", "list", "--source", &source_id, "--all"]);
    assert_eq!(listed["entries"].as_array().unwrap().len(), 1);
    assert_eq!(
        csi_json(e, &["snapshot", "get", &snap_id])["snapshot_id"],
        snap_id.as_str()
    );

    let restored = csi_json(
        e,
        &[
            "create",
            "restored",
            "--size=8Mi",
            "--from-snapshot",
            &snap_id,
        ],
    );
    assert_eq!(restored["content_source"]["snapshot"], snap_id.as_str());
    let cloned = csi_json(
        e,
        &[
            "create",
            "cloned",
            "--size=16Mi",
            "--from-volume",
            &source_id,
        ],
    );
    for (name, volume) in [("restored", &restored), ("cloned", &cloned)] {
        let id = volume["volume_id"].as_str().unwrap();
        let t = dir.path().join(format!("pods/{name}/mount"));
        csi_json(e, &["mount", id, "--target", &t.display().to_string()]);
        assert_eq!(
            std::fs::read_to_string(t.join("hello.txt")).unwrap(),
            "written through NodePublish",
            "{name}"
        );
    }

    let grown = csi_json(e, &["expand", &source_id, "--size=32Mi"]);
    assert_eq!(grown["capacity_bytes"], 32 << 20);
    assert_eq!(grown["node_expansion_required"], true);
    let node_grown = csi_json(e, &["node-expand", &source_id, "--path", &target_s]);
    assert_eq!(node_grown["capacity_bytes"], 32 << 20);
    let stats = csi_json(e, &["stats", &source_id, "--path", &target_s]);
    assert_eq!(stats["usage"][0]["unit"], "BYTES");
    assert_eq!(stats["usage"][0]["total"], 32 << 20);
    assert_eq!(stats["condition"]["abnormal"], false);
    csi_json(e, &["modify", &source_id, "--mutable=tier=premium"]);
    let got = csi_json(e, &["get", &source_id]);
    assert_eq!(got["condition"]["abnormal"], false);

    let group = csi_json(
        e,
        &[
            "group",
            "create",
            "g",
            "--volume",
            &source_id,
            "--volume",
            cloned["volume_id"].as_str().unwrap(),
        ],
    );
    let group_id = group["group_snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(group["snapshots"].as_array().unwrap().len(), 2);
    assert_eq!(
        csi_json(e, &["group", "get", &group_id])["group_snapshot_id"],
        group_id.as_str()
    );
    csi_json(e, &["group", "delete", &group_id]);
    csi_json(e, &["snapshot", "delete", &snap_id]);
    let left = csi_json(e, &["snapshot", "list", "--all"]);
    assert!(left["entries"].as_array().unwrap().is_empty());

    csi_json(e, &["unmount", &source_id, "--target", &target_s]);
    csi_json(e, &["delete", &source_id]);
    let caps = csi_json(e, &["capabilities"]);
    let controller: Vec<&str> = caps["controller"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for wanted in [
        "CREATE_DELETE_SNAPSHOT",
        "CLONE_VOLUME",
        "EXPAND_VOLUME",
        "MODIFY_VOLUME",
    ] {
        assert!(controller.contains(&wanted), "{wanted} in {controller:?}");
    }
}

#[test]
fn faults_are_switched_on_a_running_driver_by_the_faults_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_driver(dir.path(), &[]);
    let faults = dir.path().join("faults");
    let set = |rules: &[&str]| {
        let out = Command::new(BIN)
            .arg("faults")
            .arg(format!("--file={}", faults.display()))
            .args(rules)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    set(&["CreateVolume=error:RESOURCE_EXHAUSTED"]);
    let out = csi(&d.endpoint, &["create", "a"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ResourceExhausted"));
    set(&[]);
    csi_json(&d.endpoint, &["create", "a"]);
    let bad = Command::new(BIN)
        .arg("faults")
        .arg(format!("--file={}", faults.display()))
        .arg("CreateVolume=explode")
        .output()
        .unwrap();
    assert!(
        !bad.status.success(),
        "a malformed rule is refused before it reaches the driver"
    );
}

#[test]
fn acknowledged_volumes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_driver(dir.path(), &[]);
    let endpoint = d.endpoint.clone();
    // Clients keep creating while the driver is killed; every create that was answered must
    // be there after the restart, and nothing that was never asked for.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let acknowledged = runtime.block_on(async move {
        let channel = sidecar_kit::csi::connect(&endpoint).await.unwrap();
        let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut workers = Vec::new();
        for w in 0..8 {
            let channel = channel.clone();
            let acked = acked.clone();
            workers.push(tokio::spawn(async move {
                let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
                // Half the workers make block volumes: their image is made with them, before
                // their record; empty mount volumes get a directory only at first use.
                let block = w % 2 == 1;
                for i in 0.. {
                    let name = format!("{}{w}-{i}", if block { "b" } else { "k" });
                    let mode =
                        csi_proto::v1::volume_capability::access_mode::Mode::SingleNodeWriter;
                    let capability = match block {
                        true => csi_proto::v1::VolumeCapability::block(mode),
                        false => csi_proto::v1::VolumeCapability::mount("", mode),
                    };
                    let req = csi_proto::v1::CreateVolumeRequest {
                        name: name.clone(),
                        capacity_range: Some(csi_proto::v1::CapacityRange {
                            required_bytes: 1024,
                            limit_bytes: 0,
                        }),
                        volume_capabilities: vec![capability],
                        ..Default::default()
                    };
                    match client.create_volume(req).await {
                        Ok(r) => acked
                            .lock()
                            .unwrap()
                            .push((name, r.into_inner().volume.unwrap().volume_id)),
                        Err(_) => return i,
                    }
                }
                0
            }));
        }
        let started = Instant::now();
        while acked.lock().unwrap().len() < 300 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // SIGKILL while the workers are mid-flight.
        Command::new("kill")
            .arg("-9")
            .arg(d.child.id().to_string())
            .status()
            .unwrap();
        let mut attempted = 0;
        for w in workers {
            attempted += w.await.unwrap() + 1;
        }
        drop(d);
        let acked = acked.lock().unwrap().clone();
        (acked, attempted)
    });
    let (acked, attempted) = acknowledged;
    assert!(
        acked.len() >= 300,
        "only {} creates acknowledged",
        acked.len()
    );

    let d = start_driver(dir.path(), &[]);
    let listed = listed_ids(&d.endpoint);
    for (name, id) in &acked {
        assert!(
            listed.contains(id),
            "acknowledged volume {name} ({id}) lost by kill -9"
        );
    }
    assert!(
        listed.len() <= attempted,
        "{} volumes but only {attempted} creates attempted",
        listed.len()
    );
    let mut unique = listed.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), listed.len());
    // No orphan directory is left, and every acknowledged block volume has its directory (the
    // empty mount volumes, never used, need none).
    let volumes_dir = dir.path().join("state/volumes");
    let mut dirs: Vec<String> = std::fs::read_dir(&volumes_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    unique.sort();
    assert!(
        dirs.iter().all(|d| unique.contains(d)),
        "an orphan directory was left: {dirs:?} against {unique:?}"
    );
    let block_acked: Vec<&String> = acked
        .iter()
        .filter(|(name, _)| name.starts_with('b'))
        .map(|(_, id)| id)
        .collect();
    assert!(!block_acked.is_empty(), "no block volume was acknowledged");
    for id in block_acked {
        assert!(
            dirs.contains(id),
            "acknowledged block volume {id} has no directory after kill -9"
        );
    }
}

#[test]
fn bad_flags_exit_non_zero_and_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["driver", "--capacity=lots"], "--capacity"),
        (&["driver", "--max-volume-size=0"], "--max-volume-size"),
        (&["driver", "--fault=CreateVolume=explode"], "--fault"),
        (&["driver", "--endpoint=tcp://1.2.3.4:5"], "--endpoint"),
        (&["driver", "--no-such-flag"], "--no-such-flag"),
        (&["csi", "create", "x", "--size=abc"], "--size"),
    ];
    for (args, flag) in cases {
        let out = Command::new(BIN).args(*args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(flag),
            "{args:?}: stderr does not name {flag}: {stderr}"
        );
    }
}

#[test]
fn a_second_driver_on_the_same_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = start_driver(dir.path(), &[]);
    let out = Command::new(BIN)
        .arg("driver")
        .arg(format!(
            "--endpoint=unix://{}",
            dir.path().join("csi.sock").display()
        ))
        .arg(format!(
            "--state-dir={}",
            dir.path().join("other").display()
        ))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
}
