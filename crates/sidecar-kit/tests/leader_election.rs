//! Leader election against our API server with injected latency: client-go's semantics.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::json;
use sidecar_kit::leader::{ElectionConfig, ElectionError, Elector, LeaderStatus};

async fn server() -> (
    apiserver::RunningServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(apiserver::Config::default(), async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    (server, client, stop)
}

fn config(identity: &str, lease: u64, renew: Duration, retry: Duration) -> ElectionConfig {
    ElectionConfig {
        namespace: "default".into(),
        name: "election".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(lease),
        renew_deadline: renew,
        retry_period: retry,
        labels: Default::default(),
        release_on_exit: false,
    }
}

/// Sets a flag when dropped: shows that the leader's work was stopped.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A leader under test: its status, whether its work was stopped (dropped), and its run.
type Leading = (
    LeaderStatus,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<Result<(), ElectionError>>,
);

/// Runs `elector` until it leads, with work that ignores the stop signal (like a write stuck
/// in a slow API call).
async fn lead_with_stubborn_work(elector: Elector) -> Leading {
    let status = elector.status();
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let run = tokio::spawn(elector.run(
        move |_stop| async move {
            let _guard = Dropped(flag);
            std::future::pending::<()>().await;
        },
        std::future::pending::<()>(),
    ));
    while !status.is_leader() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (status, stopped, run)
}

/// Makes every lease call meet `fault` and waits for the leader to lose: its run ends with
/// `Lost`, its work was stopped and its status says it does not lead.
async fn lose_under(
    server: &apiserver::RunningServer,
    fault: serde_json::Value,
    (status, stopped, run): Leading,
) {
    server.set_faults(serde_json::from_value(json!([fault])).unwrap());
    let outcome = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the leader kept leading while its renewals failed")
        .unwrap();
    assert!(
        matches!(outcome, Err(ElectionError::Lost(_))),
        "{outcome:?}"
    );
    assert!(
        stopped.load(Ordering::SeqCst),
        "the leader's work was not stopped"
    );
    assert!(!status.is_leader());
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_its_work_within_the_renew_deadline() {
    let (server, client, _stop) = server().await;
    // Lease 8 s, renew deadline 1 s: the leader must stop before its lease could expire for
    // the other replicas (8 s after its last renewal), which is the safety property itself.
    let elector = Elector::new(
        client,
        config("me", 8, Duration::from_secs(1), Duration::from_millis(200)),
    );
    let leading = lead_with_stubborn_work(elector).await;
    let hung_at = tokio::time::Instant::now();
    // The renew call hangs for a minute; the leader must give up well before that.
    lose_under(
        &server,
        json!({"resource": "leases", "verb": "*", "latency_ms": 60_000}),
        leading,
    )
    .await;
    let took = hung_at.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the leader stopped {took:?} after its renewals hung: another replica could have led by then"
    );
}

#[tokio::test]
async fn a_lease_renewed_by_a_skewed_clock_is_respected_for_its_duration_from_observation() {
    let (_server, client, _stop) = server().await;
    // The holder's clock is an hour behind: its renewTime looks expired to ours.
    let renewed =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "election"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 2,
                 "acquireTime": renewed.to_string(), "renewTime": renewed.to_string(),
                 "leaseTransitions": 0}
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let elector = Elector::new(
        client,
        config("me", 2, Duration::from_secs(1), Duration::from_millis(100)),
    );
    let status = elector.status();
    let started = tokio::time::Instant::now();
    let _run = tokio::spawn(elector.run(
        |_stop| async move {
            std::future::pending::<()>().await;
        },
        std::future::pending::<()>(),
    ));
    while !status.is_leader() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // It may only take over once it has itself seen the record unchanged for 2 s.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "took over after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_leader_whose_renewals_fail_at_once_stops_at_its_renew_deadline() {
    let (server, client, _stop) = server().await;
    // Renew deadline 2 s, retry period 1.6 s (client-go accepts it: 2 > 1.2 × 1.6): the
    // renewal 1.6 s after the last one fails at once and leaves 0.4 s. The leader must stop
    // at the deadline, not after sleeping another retry period (3.2 s after its last
    // renewal).
    let elector = Elector::new(
        client.clone(),
        config(
            "me",
            10,
            Duration::from_secs(2),
            Duration::from_millis(1600),
        ),
    );
    let leading = lead_with_stubborn_work(elector).await;
    lose_under(
        &server,
        json!({"resource": "leases", "verb": "*", "error": 500}),
        leading,
    )
    .await;
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    server.set_faults(Vec::new());
    let lease = Api::<Lease>::namespaced(client, "default")
        .get("election")
        .await
        .unwrap();
    let renewed = lease.spec.and_then(|s| s.renew_time).unwrap().0;
    let after = stopped_at.duration_since(renewed).as_secs_f64();
    assert!(
        after < 2.8,
        "the leader stopped {after:.2} s after its last renewal; its renew deadline is 2 s"
    );
}
