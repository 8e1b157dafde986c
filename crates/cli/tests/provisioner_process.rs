//! The csi-provisioner process itself: it runs with one glibc malloc arena (it sets
//! `MALLOC_ARENA_MAX=1` and runs itself again, same PID and arguments) and still provisions.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use serde_json::json;

#[tokio::test]
async fn the_provisioner_runs_with_one_malloc_arena_and_provisions() {
    let mut c = Cluster::start(&[], &[], true).await;
    let pid = c.provisioner_pid().unwrap();
    let environ = format!("/proc/{pid}/environ");
    c.wait_until(
        "the provisioner to run with MALLOC_ARENA_MAX=1",
        Duration::from_secs(15),
        || async {
            std::fs::read(&environ)
                .map(|bytes| {
                    bytes
                        .split(|b| *b == 0)
                        .any(|entry| entry == b"MALLOC_ARENA_MAX=1")
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
