//! Leader election with two replicas under the same ServiceAccount: one leads, the other
//! takes over when the leader is killed, and claims keep being provisioned.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;

use crate::bed::{Bed, Setup};

const WAIT: Duration = Duration::from_secs(90);
const LEASE: &str = "hostpath-csi-volstack-dev";

async fn holder(bed: &Bed) -> Option<String> {
    Api::<Lease>::namespaced(bed.admin.clone(), "default")
        .get_opt(LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn the_second_replica_takes_over_when_the_leader_is_killed() {
    let mut bed = Bed::start(Setup::default()).await;
    let election = [
        "--leader-election",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=1s",
    ];
    for replica in ["replica-a", "replica-b"] {
        bed.provisioner(replica, &election, &[]).await;
    }
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.claim("before", "fast", "1Gi", json!({})).await;
    bed.bound("before", WAIT).await;

    let first = bed
        .until_some("a leader", WAIT, || async { holder(&bed).await })
        .await;
    let leader = ["replica-a", "replica-b"]
        .into_iter()
        .find(|r| bed.log(r).contains(&first))
        .unwrap_or_else(|| panic!("no replica logged the identity {first}\n{}", bed.logs()));
    bed.kill(leader);
    let second = bed
        .until_some("another leader", WAIT, || async {
            holder(&bed).await.filter(|h| *h != first)
        })
        .await;
    let survivor = if leader == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };
    assert!(bed.log(survivor).contains(&second), "{}", bed.logs());
    bed.claim("after", "fast", "1Gi", json!({})).await;
    bed.bound("after", WAIT).await;
    bed.finish().await;
}
