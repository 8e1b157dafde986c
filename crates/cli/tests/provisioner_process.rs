//! The csi-provisioner process itself: it runs with mimalloc returning freed pages at once (it
//! sets `MIMALLOC_PURGE_DELAY=0` and runs itself again, same PID and arguments) and still
//! provisions;
//! the sidecars take klog's flags as the Go sidecars do; a driver that cannot provision does not
//! stop it; a repeated failure is counted on its event.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use kube::api::Api;
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

/// A driver without CREATE_DELETE_VOLUME does not stop the provisioner, as it does not stop
/// upstream's: each claim fails with upstream's words, each volume of ours to delete too.
#[tokio::test]
async fn a_driver_that_cannot_provision_is_said_so_on_each_claim_and_volume() {
    let mut c = Cluster::start(&["--disable=create-delete"], &[], true).await;
    let words = "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported";
    c.class("fast", json!({})).await;
    c.claim("data", "fast", "1Gi", json!({}), false).await;
    c.wait_event("data", "ProvisioningFailed", words).await;
    // A populator's claim is left to its populator, whatever the driver can do (as upstream).
    c.populator_claim_left_alone("populated", "fast").await;
    // A volume of ours whose claim is gone, to be deleted: refused with the same words.
    c.apply_cluster::<PersistentVolume>(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "made-before",
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "fast",
            "claimRef": {"namespace": "default", "name": "gone", "uid": "5e0d6c1a-0000-4000-8000-000000000001"},
            "csi": {"driver": DRIVER, "volumeHandle": "made-before"},
        },
    }))
    .await;
    c.wait_pv_phase("made-before", "Released", Duration::from_secs(15))
        .await;
    c.wait_event("made-before", "VolumeFailedDelete", words)
        .await;
    assert!(!c.exited(), "the provisioner keeps running");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    assert!(pvs.get_opt("made-before").await.unwrap().is_some());
}

/// A claim that keeps failing has one `ProvisioningFailed` Event whose count and last time go
/// up, as with client-go's recorder (`kubectl describe`: `(x5 over 20s)`): the provisioner's
/// identity may patch events under the stack's RBAC.
#[tokio::test]
async fn a_failure_repeated_is_counted_on_one_event() {
    let c = Cluster::start(&[], &[], false).await;
    c.faults("CreateVolume=error:INTERNAL\n");
    c.class("fast", json!({})).await;
    c.claim("data", "fast", "1Gi", json!({}), true).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let failed = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some("data")
                    && e.reason.as_deref() == Some("ProvisioningFailed")
            })
            .collect::<Vec<_>>()
    };
    // Retries every second at most: the count is written within COUNT_EVERY (10 s) of the
    // first failure.
    c.wait_until(
        "the failure's event counted",
        Duration::from_secs(60),
        || async {
            failed()
                .await
                .iter()
                .any(|e| e.count.unwrap_or_default() >= 3)
        },
    )
    .await;
    let failed = failed().await;
    assert_eq!(failed.len(), 1, "one Event, counted: {failed:?}");
    let event = &failed[0];
    let first = event.first_timestamp.as_ref().unwrap().0;
    let last = event.last_timestamp.as_ref().unwrap().0;
    assert!(last > first, "its last time moved on: {event:?}");
    assert!(!c.provisioner_log().contains("may not patch events"));
}
