//! Leader election: a standby takes over within one retry period when the leader gets SIGTERM,
//! because the lease is released on the way out.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Cluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;

async fn holder(c: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    leases
        .get_opt("hostpath-csi-volstack-dev")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn a_standby_takes_over_within_a_retry_period_after_sigterm() {
    let election = [
        "--leader-election",
        "--leader-election-lease-duration=15s",
        "--leader-election-renew-deadline=10s",
        "--leader-election-retry-period=1s",
    ];
    let mut c = Cluster::start(&[], &election, false).await;
    c.wait_until("a leader", Duration::from_secs(15), || async {
        holder(&c).await.is_some()
    })
    .await;
    let first = holder(&c).await.unwrap();
    let standby = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .args(&c.provisioner_args)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _standby = Kill(standby);

    // SIGTERM to the leader (the harness's own child).
    let pid = c.provisioner_pid().unwrap();
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    let started = Instant::now();
    c.wait_until("the standby to lead", Duration::from_secs(10), || async {
        holder(&c).await.is_some_and(|h| h != first)
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "takeover took {took:?}: the lease was not released (upstream waits out the 15 s lease)"
    );
    // Exactly one handover: the standby waited while the lease was held.
    let transitions = Api::<Lease>::namespaced(c.client.clone(), "kube-system")
        .get("hostpath-csi-volstack-dev")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.lease_transitions);
    assert_eq!(transitions, Some(1));
    // The new leader provisions.
    c.class("plain", json!({})).await;
    let claim = c
        .claim("after-failover", "plain", "1Gi", json!({}), true)
        .await;
    c.wait_pv(&claim, Duration::from_secs(15)).await;
    c.kill_provisioner();
}
