//! The recorder against a client that records what it is sent.
#![allow(clippy::unwrap_used)]

use super::*;

fn claim(name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("PersistentVolumeClaim".into()),
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(format!("uid-{name}")),
        ..Default::default()
    }
}

/// A client whose every request hangs: the API server does not answer.
fn stuck_client() -> kube::Client {
    let service = tower::service_fn(|_: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, tower::BoxError>>()
    });
    kube::Client::new(service, "default")
}

/// What the client was sent: method, path, body.
type Sent = (String, String, serde_json::Value);

/// A client answering creates with their body, patches with `patch_code` (a Status when not
/// 200), and passing each request's method, path and body to the returned channel.
fn recording_client(patch_code: u16) -> (kube::Client, mpsc::UnboundedReceiver<Sent>) {
    let (sent, received) = mpsc::unbounded_channel();
    let service =
        tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let sent = sent.clone();
            async move {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let body = request.into_body().collect_bytes().await?;
                let value: serde_json::Value = serde_json::from_slice(&body)?;
                let _ = sent.send((method.clone(), path, value));
                let (code, answer) = match method.as_str() {
                "PATCH" if patch_code != 200 => (
                    patch_code,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "refused", "reason": "Refused", "code": patch_code})
                    .to_string()
                    .into_bytes(),
                ),
                "PATCH" => (200, serde_json::json!({"count": 1}).to_string().into_bytes()),
                _ => (201, body.to_vec()),
            };
                let response = http::Response::builder()
                    .status(code)
                    .body(kube::client::Body::from(answer))?;
                Ok::<_, tower::BoxError>(response)
            }
        });
    (kube::Client::new(service, "default"), received)
}

/// The next request the client was sent, within two (paused) minutes.
async fn next(received: &mut mpsc::UnboundedReceiver<Sent>) -> Sent {
    tokio::time::timeout(Duration::from_secs(120), received.recv())
        .await
        .expect("nothing more was sent")
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn queued_events_are_written_as_built() {
    let (client, mut received) = recording_client(200);
    let recorder = Recorder::on_host(client, "csi-provisioner", "host-1");
    let object = claim("c1");
    recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
    let (method, path, body) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("POST", "/api/v1/namespaces/ns/events")
    );
    let written: Event = serde_json::from_value(body).unwrap();
    assert_eq!(written.involved_object, object);
    assert_eq!(written.reason.as_deref(), Some("ProvisioningFailed"));
    assert_eq!(written.message.as_deref(), Some("no room"));
    assert_eq!(written.type_.as_deref(), Some("Warning"));
    assert_eq!(written.count, Some(1));
    assert_eq!(written.reporting_instance.as_deref(), Some("host-1"));
    assert_eq!(written.source.unwrap().host.as_deref(), Some("host-1"));
    let hostless = Recorder::new(stuck_client(), "persistentvolume-controller");
    let event = hostless.build(&object, EventType::Normal, "R", "m", Timestamp::now());
    assert_eq!(event.source.unwrap().host, None);
    assert_eq!(event.reporting_instance.as_deref(), Some(""));
    assert!(written.metadata.name.unwrap().starts_with("c1."));
}

#[tokio::test(flavor = "current_thread")]
async fn recording_never_waits_and_drops_past_the_queue() {
    let recorder = Recorder::on_host(stuck_client(), "csi-provisioner", "host");
    // Nothing else runs until this test yields: the writer takes nothing meanwhile.
    for i in 0..QUEUED_EVENTS + 100 {
        recorder.record(
            &claim(&format!("c{i}")),
            EventType::Normal,
            "ProvisioningSucceeded",
            "done",
        );
    }
    assert_eq!(recorder.dropped(), 100);
    // The same event again at once is counted, not queued.
    recorder.record(
        &claim("c0"),
        EventType::Normal,
        "ProvisioningSucceeded",
        "done",
    );
    assert_eq!(recorder.dropped(), 100);
    // Another message is another event.
    recorder.record(&claim("c0"), EventType::Warning, "ProvisioningFailed", "no");
    assert_eq!(recorder.dropped(), 101);
}

/// Repeats are counted on the Event first written: a patch of its count and last time, at
/// most every COUNT_EVERY, a repeat in between written by the next pass over the counts;
/// another message, or the same after the series window, is another Event.
#[tokio::test(start_paused = true)]
async fn repeats_are_counted_on_the_first_event_at_most_every_few_seconds() {
    let (client, mut received) = recording_client(200);
    let recorder = Recorder::new(client, "csi-provisioner");
    let object = claim("c1");
    let fail = || recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
    fail();
    let (method, path, created) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("POST", "/api/v1/namespaces/ns/events")
    );
    let name = created["metadata"]["name"].as_str().unwrap().to_string();
    let count_path = format!("/api/v1/namespaces/ns/events/{name}");
    // Two repeats at once: counted; the pass after COUNT_EVERY writes them.
    fail();
    fail();
    tokio::time::advance(COUNT_EVERY).await;
    let (method, path, patch) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("PATCH", count_path.as_str())
    );
    assert_eq!(patch["count"], 3, "{patch}");
    assert!(
        patch["lastTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{patch}"
    );
    // Another right after that write: not due yet; the next pass writes it.
    fail();
    tokio::time::advance(COUNT_EVERY).await;
    let (method, _, patch) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), patch["count"].as_i64()),
        ("PATCH", Some(4))
    );
    // A repeat when the last write is old enough is written at once.
    tokio::time::advance(COUNT_EVERY).await;
    fail();
    let (method, _, patch) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), patch["count"].as_i64()),
        ("PATCH", Some(5))
    );
    // Another message: a new Event, not a count.
    recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no disk");
    let (method, _, other) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), other["count"].as_i64()),
        ("POST", Some(1))
    );
    // Ten minutes without a repeat end the series: the next is a new Event.
    tokio::time::advance(SERIES_WINDOW).await;
    fail();
    let (method, _, again) = next(&mut received).await;
    assert_eq!(method, "POST");
    assert_ne!(again["metadata"]["name"].as_str(), Some(name.as_str()));
}

/// An Event gone when its count is written (it expired, or its create was lost) is made
/// again, with its name, first time and the count so far.
#[tokio::test(start_paused = true)]
async fn an_event_gone_when_counted_is_made_again_with_its_count() {
    let (client, mut received) = recording_client(404);
    let recorder = Recorder::new(client, "csi-provisioner");
    let object = claim("c1");
    recorder.record(&object, EventType::Normal, "R", "m");
    let (_, _, created) = next(&mut received).await;
    recorder.record(&object, EventType::Normal, "R", "m");
    tokio::time::advance(COUNT_EVERY).await;
    assert_eq!(next(&mut received).await.0, "PATCH");
    let (method, path, again) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("POST", "/api/v1/namespaces/ns/events")
    );
    assert_eq!(again["metadata"]["name"], created["metadata"]["name"]);
    assert_eq!(again["firstTimestamp"], created["firstTimestamp"]);
    assert_eq!(again["count"], 2);
}

/// Where patching events is forbidden, counts are not written after the refusal; an event
/// repeated meanwhile gets a new Event once its Event is a series window old.
#[tokio::test(start_paused = true)]
async fn a_forbidden_count_stops_the_counts_and_events_are_still_made() {
    let (client, mut received) = recording_client(403);
    let recorder = Recorder::new(client, "csi-provisioner");
    let object = claim("c1");
    let again = || recorder.record(&object, EventType::Normal, "R", "m");
    again();
    let (_, _, first) = next(&mut received).await;
    again();
    tokio::time::advance(COUNT_EVERY).await;
    assert_eq!(next(&mut received).await.0, "PATCH");
    let mut waited = Duration::ZERO;
    while !recorder.refusal.active() {
        assert!(waited < Duration::from_secs(60), "the refusal was not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    // Repeats every minute: counted only, until the Event is ten minutes old.
    for _ in 0..9 {
        tokio::time::advance(Duration::from_secs(60)).await;
        again();
    }
    recorder.record(&object, EventType::Normal, "R", "other");
    let (method, _, other) = next(&mut received).await;
    assert_eq!(method, "POST", "no count written once refused: {other}");
    assert_eq!(other["message"], "other");
    // Ten minutes after the first Event (the refusal, 10 s later, still holds): a new one.
    tokio::time::advance(Duration::from_secs(50)).await;
    again();
    let (method, _, renewed) = next(&mut received).await;
    assert_eq!(method, "POST");
    assert_eq!(renewed["message"], "m");
    assert_ne!(renewed["metadata"]["name"], first["metadata"]["name"]);
}

/// A flush writes the counts not written yet before the queue closes.
#[tokio::test(start_paused = true)]
async fn a_flush_writes_the_counts_not_written_yet() {
    let (client, mut received) = recording_client(200);
    let recorder = Recorder::new(client, "csi-provisioner");
    let object = claim("c1");
    recorder.record(&object, EventType::Normal, "R", "m");
    recorder.record(&object, EventType::Normal, "R", "m");
    recorder.flush(Duration::from_secs(5)).await;
    assert_eq!(next(&mut received).await.0, "POST");
    let (method, _, patch) = next(&mut received).await;
    assert_eq!(
        (method.as_str(), patch["count"].as_i64()),
        ("PATCH", Some(2))
    );
}
