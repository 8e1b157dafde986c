//! The csi-provisioner process itself: it runs with mimalloc returning freed pages at once (it
//! sets `MIMALLOC_PURGE_DELAY=0` and runs itself again, same PID and arguments) and still
//! provisions;
//! the sidecars take klog's flags as the Go sidecars do.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use serde_json::json;

/// (That the allocator is mimalloc shows only in the binary, not here: this checks the
/// re-execution and its setting.)
#[tokio::test]
async fn the_provisioner_runs_with_mimalloc_purging_at_once_and_provisions() {
    let mut c = Cluster::start(&[], &[], true).await;
    let pid = c.provisioner_pid().unwrap();
    let environ = format!("/proc/{pid}/environ");
    c.wait_until(
        "the provisioner to run with MIMALLOC_PURGE_DELAY=0",
        Duration::from_secs(15),
        || async {
            std::fs::read(&environ)
                .map(|bytes| {
                    bytes
                        .split(|b| *b == 0)
                        .any(|entry| entry == b"MIMALLOC_PURGE_DELAY=0")
                })
                .unwrap_or(false)
        },
    )
    .await;
    c.class("plain", json!({})).await;
    let claim = c.claim("arena", "plain", "1Gi", json!({}), true).await;
    c.wait_pv(&claim, Duration::from_secs(15)).await;
    assert!(!c.exited(), "the provisioner runs on");
    c.kill_provisioner();
}

/// klog's flags, as deployments of the Go sidecars pass them, are accepted: the process starts,
/// writes its logs to the `-log_file` of `-logtostderr=false` (and to stderr with
/// `-alsologtostderr`), and names the flags that change nothing here in one warning.
#[test]
fn klog_flags_are_accepted_and_send_the_logs_where_klog_would() {
    for program in [
        env!("CARGO_BIN_EXE_csi-provisioner"),
        env!("CARGO_BIN_EXE_csi-attacher"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sidecar.log");
        let mut child = std::process::Command::new(program)
            .arg("-logtostderr=false")
            .arg(format!("-log_file={}", log.display()))
            .arg("-alsologtostderr")
            .arg("-stderrthreshold=INFO")
            .arg("-vmodule=foo=5")
            .arg("-v=2")
            .arg(format!(
                "--kubeconfig={}",
                dir.path().join("none").display()
            ))
            .arg(format!(
                "--csi-address={}",
                dir.path().join("csi.sock").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // No driver answers: the sidecar waits for it, as upstream does, and says so.
        let text = sidecar_kit::testing::poll_blocking(
            "the sidecar to log that it waits for the driver",
            std::time::Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("still connecting to the CSI driver") {
                    Ok(text)
                } else {
                    Err(text)
                }
            },
        );
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        assert!(
            text.contains("klog flags accepted for compatibility")
                && text.contains("-stderrthreshold, -vmodule"),
            "{text}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("still connecting to the CSI driver"),
            "-alsologtostderr: {stderr}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{program}");
    }
}
