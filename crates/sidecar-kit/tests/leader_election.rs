//! Leader election: client-go's semantics. The bounds in time (a leader stops within its renew
//! deadline, a skewed holder's lease is respected for its duration) are checked in paused time
//! against an in-memory Lease endpoint, so a busy machine cannot make them pass or fail; one
//! test runs the same election against our API server with a hanging lease call.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use parking_lot::Mutex;
use serde_json::{Value, json};
use sidecar_kit::leader::{ElectionConfig, ElectionError, Elector, LeaderStatus};
use tokio::time::Instant;

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
        events: Some("hostpath.csi.k8s.io".into()),
        metric_name: String::new(),
    }
}

/// What the in-memory Lease endpoint does with a call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// Serve it.
    Serve,
    /// Never answer.
    Hang,
    /// 500 at once.
    Fail,
}

/// One Lease, `default/election`, served as the API server does (get, create, replace with a
/// resourceVersion check), with the instant of each successful write.
#[derive(Default)]
struct LeaseEndpoint {
    lease: Mutex<Option<Value>>,
    version: Mutex<u64>,
    answer: Mutex<Option<Answer>>,
    writes: Mutex<Vec<Instant>>,
    /// Reads of the lease.
    reads: Mutex<usize>,
    /// Events created in the lease's namespace.
    events: Mutex<Vec<Value>>,
}

const COLLECTION: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

fn status(code: u16, reason: &str) -> (u16, Value) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "reason": reason, "code": code, "message": reason});
    (code, body)
}

impl LeaseEndpoint {
    fn set(&self, answer: Answer) {
        *self.answer.lock() = Some(answer);
    }

    fn serve(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        let item = format!("{COLLECTION}/election");
        let mut lease = self.lease.lock();
        let written = |object: &mut Value, version: &mut u64| {
            *version += 1;
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            object["apiVersion"] = json!("coordination.k8s.io/v1");
            object["kind"] = json!("Lease");
            self.writes.lock().push(Instant::now());
            object.clone()
        };
        match (method, path) {
            ("GET", p) if p == item => match lease.as_ref().inspect(|_| *self.reads.lock() += 1) {
                Some(object) => (200, object.clone()),
                None => status(404, "NotFound"),
            },
            ("POST", p) if p == COLLECTION => {
                if lease.is_some() {
                    return status(409, "AlreadyExists");
                }
                let mut object: Value = serde_json::from_slice(body).unwrap();
                let stored = written(&mut object, &mut self.version.lock());
                *lease = Some(stored.clone());
                (201, stored)
            }
            ("PUT", p) if p == item => {
                let mut object: Value = serde_json::from_slice(body).unwrap();
                let current = lease
                    .as_ref()
                    .map(|l| l["metadata"]["resourceVersion"].clone());
                if current != Some(object["metadata"]["resourceVersion"].clone()) {
                    return status(409, "Conflict");
                }
                let stored = written(&mut object, &mut self.version.lock());
                *lease = Some(stored.clone());
                (200, stored)
            }
            ("POST", "/api/v1/namespaces/default/events") => {
                let event: Value = serde_json::from_slice(body).unwrap();
                self.events.lock().push(event.clone());
                (201, event)
            }
            _ => status(404, "NotFound"),
        }
    }

    /// A client whose every request this endpoint answers.
    fn client(self: &Arc<Self>) -> kube::Client {
        let endpoint = self.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let endpoint = endpoint.clone();
            async move {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let answer = endpoint.answer.lock().unwrap_or(Answer::Serve);
                let (code, value) = match answer {
                    Answer::Serve => endpoint.serve(&method, &path, &body),
                    Answer::Fail => status(500, "InternalError"),
                    Answer::Hang => std::future::pending().await,
                };
                let response = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(value.to_string())))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
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

/// Waits until `status` leads, failing after `within` (of the test's clock).
async fn wait_to_lead(status: &LeaderStatus, within: Duration) {
    let deadline = Instant::now() + within;
    while !status.is_leader() {
        assert!(
            Instant::now() < deadline,
            "did not become leader within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    wait_to_lead(&status, Duration::from_secs(60)).await;
    (status, stopped, run)
}

/// Waits for the leader to lose: its run ends with `Lost`, its work was stopped and its status
/// says it does not lead.
async fn lose((status, stopped, run): Leading, within: Duration) {
    let outcome = tokio::time::timeout(within, run)
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

#[tokio::test(start_paused = true)]
async fn a_new_leader_records_a_leader_election_event_on_its_lease_as_client_go_does() {
    let endpoint = Arc::new(LeaseEndpoint::default());
    let mut releasing = config("me_1", 15, Duration::from_secs(10), Duration::from_secs(2));
    releasing.release_on_exit = true;
    let elector = Elector::new(endpoint.client(), releasing);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(elector.run(|_| async {}, async {
        let _ = stopped.await;
    }));
    let events = |n: usize| {
        let endpoint = endpoint.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while endpoint.events.lock().len() < n {
                assert!(Instant::now() < deadline, "fewer than {n} events recorded");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    events(1).await;
    let event = endpoint.events.lock()[0].clone();
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["reason"], "LeaderElection");
    assert_eq!(event["message"], "me_1 became leader");
    // csi-lib-utils' lock name (the driver's), not the lease's sanitized one.
    assert_eq!(event["source"]["component"], "hostpath.csi.k8s.io/me_1");
    let lease = &event["involvedObject"];
    assert_eq!(lease["kind"], "Lease");
    assert_eq!(lease["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(lease["name"], "election");
    assert_eq!(lease["namespace"], "default");
    assert_eq!(lease["resourceVersion"], "1", "the lease as it was written");
    // Stopping releases the lease, then says so, naming the lease as released, and the event
    // is written before the election returns (the process stops next).
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(endpoint.events.lock().len(), 2, "the last event is written");
    let stopped = endpoint.events.lock()[1].clone();
    assert_eq!(stopped["message"], "me_1 stopped leading");
    let released = endpoint.lease.lock().clone().unwrap();
    assert_eq!(released["spec"]["holderIdentity"], serde_json::Value::Null);
    assert_eq!(
        stopped["involvedObject"]["resourceVersion"],
        released["metadata"]["resourceVersion"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_hang_stops_its_work_within_the_renew_deadline() {
    let endpoint = Arc::new(LeaseEndpoint::default());
    // Lease 8 s, renew deadline 1 s: the leader must stop within 1 s of its last renewal,
    // before its lease could expire for the other replicas (8 s after it).
    let elector = Elector::new(
        endpoint.client(),
        config("me", 8, Duration::from_secs(1), Duration::from_millis(200)),
    );
    let leading = lead_with_stubborn_work(elector).await;
    endpoint.set(Answer::Hang);
    lose(leading, Duration::from_secs(60)).await;
    let last_renewal = *endpoint.writes.lock().last().unwrap();
    let took = last_renewal.elapsed();
    assert!(
        took <= Duration::from_secs(1),
        "the leader stopped {took:?} after its last renewal; its renew deadline is 1 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_at_once_stops_at_its_renew_deadline() {
    let endpoint = Arc::new(LeaseEndpoint::default());
    // Renew deadline 2 s, retry period 1.6 s (client-go accepts it: 2 > 1.2 × 1.6): the
    // renewal 1.6 s after the last one fails at once and leaves 0.4 s. The leader must stop
    // at the deadline, not after sleeping another retry period (3.2 s after its last
    // renewal).
    let elector = Elector::new(
        endpoint.client(),
        config(
            "me",
            10,
            Duration::from_secs(2),
            Duration::from_millis(1600),
        ),
    );
    let leading = lead_with_stubborn_work(elector).await;
    endpoint.set(Answer::Fail);
    lose(leading, Duration::from_secs(60)).await;
    let last_renewal = *endpoint.writes.lock().last().unwrap();
    let after = last_renewal.elapsed();
    assert!(
        after <= Duration::from_secs(2),
        "the leader stopped {after:?} after its last renewal; its renew deadline is 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_renewed_by_a_skewed_clock_is_respected_for_its_duration_from_observation() {
    let endpoint = Arc::new(LeaseEndpoint::default());
    // The holder's clock is an hour behind: its renewTime looks expired to ours.
    let renewed =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
    *endpoint.lease.lock() = Some(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "election", "namespace": "default", "resourceVersion": "1"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 2,
                 "acquireTime": renewed.to_string(), "renewTime": renewed.to_string(),
                 "leaseTransitions": 0}
    }));
    let elector = Elector::new(
        endpoint.client(),
        config("me", 2, Duration::from_secs(1), Duration::from_millis(100)),
    );
    let status = elector.status();
    let started = Instant::now();
    let _run = tokio::spawn(elector.run(
        |_stop| async move {
            std::future::pending::<()>().await;
        },
        std::future::pending::<()>(),
    ));
    wait_to_lead(&status, Duration::from_secs(60)).await;
    // It may only take over once it has itself seen the record unchanged for 2 s.
    let waited = *endpoint.writes.lock().first().unwrap() - started;
    assert!(
        waited >= Duration::from_secs(2),
        "took over after {waited:?}"
    );
}

#[tokio::test]
async fn against_our_api_server_a_hanging_lease_call_does_not_keep_a_leader_leading() {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(apiserver::Config::default(), async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let mut config_ = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    config_.default_retry = false;
    let client = kube::Client::try_from(config_).unwrap();
    let elector = Elector::new(
        client.clone(),
        config("me", 8, Duration::from_secs(1), Duration::from_millis(200)),
    );
    let leading = lead_with_stubborn_work(elector).await;
    let lease = Api::<Lease>::namespaced(client, "default")
        .get("election")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("me")
    );
    // Every lease call now takes an hour: a leader that waited for its renewal would still
    // lead when the test gives up; one that keeps to its deadline has stopped.
    server.set_faults(
        serde_json::from_value(
            json!([{"resource": "leases", "verb": "*", "latency_ms": 3_600_000}]),
        )
        .unwrap(),
    );
    lose(leading, Duration::from_secs(120)).await;
    let _ = stop.send(());
}

/// Waits until `done` holds, failing after a minute of the test's clock.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// As client-go: a leader renews its lease with one write and no read while nobody else
/// changed it; once someone did (the write conflicts) it reads the lease (the slow path,
/// counted in `leader_election_slowpath_total`), goes on leading, and writes without reading
/// again.
#[tokio::test(start_paused = true)]
async fn a_leader_renews_without_reading_until_the_lease_changes_under_it() {
    let endpoint = Arc::new(LeaseEndpoint::default());
    let counter = prometheus::IntCounterVec::new(
        prometheus::Opts::new("leader_election_slowpath_total", "slow paths"),
        &["name"],
    )
    .unwrap();
    let mut releasing = config("me_1", 15, Duration::from_secs(10), Duration::from_secs(2));
    releasing.release_on_exit = true;
    let elector = Elector::new(endpoint.client(), releasing).count_slow_paths(counter.clone());
    let status = elector.status();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(elector.run(|_| async {}, async {
        let _ = stopped.await;
    }));
    wait_to_lead(&status, Duration::from_secs(60)).await;
    let reads = *endpoint.reads.lock();
    let writes = endpoint.writes.lock().len();
    wait_for("three renewals", || {
        endpoint.writes.lock().len() >= writes + 3
    })
    .await;
    assert_eq!(*endpoint.reads.lock(), reads, "renewed without reading");
    let series = |c: &prometheus::IntCounterVec| {
        prometheus::core::Collector::collect(c)
            .iter()
            .map(|f| f.get_metric().len())
            .sum::<usize>()
    };
    assert_eq!(
        series(&counter),
        0,
        "no slow path yet, no series (as client-go's)"
    );
    // Someone else writes the lease (its resourceVersion moves): the next renewal conflicts.
    if let Some(lease) = endpoint.lease.lock().as_mut() {
        lease["metadata"]["labels"] = json!({"touched": "yes"});
        lease["metadata"]["resourceVersion"] = json!("999");
    }
    wait_for("the lease read again", || *endpoint.reads.lock() > reads).await;
    let writes = endpoint.writes.lock().len();
    wait_for("two more renewals", || {
        endpoint.writes.lock().len() >= writes + 2
    })
    .await;
    assert!(status.is_leader(), "still leading");
    assert_eq!(
        *endpoint.reads.lock(),
        reads + 1,
        "one read, then fast again"
    );
    assert_eq!(counter.with_label_values(&[""]).get(), 1);
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    // Released after reading the lease, as client-go's release.
    let released = endpoint.lease.lock().clone().unwrap();
    assert_eq!(released["spec"]["holderIdentity"], Value::Null);
    assert_eq!(*endpoint.reads.lock(), reads + 2, "the release read it");
}
