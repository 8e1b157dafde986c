//! A core/v1 Event recorder, as client-go's: same reasons, `source.component`, counts and
//! timestamps, so `kubectl describe` shows our events exactly as the Go sidecar's.
//!
//! As client-go's, a repeat of an event (same object, type, reason and message) is counted on
//! the Event written first: its `count` and `lastTimestamp` are patched, so `kubectl describe`
//! shows `(x5 over 2m)`. Unlike client-go, the count is written at most every [`COUNT_EVERY`]
//! per event, not at every repeat (one API write each there): a retry loop against a failing
//! driver does not become an event storm, and a repeat in between is carried by the next
//! write. A repeat after ten minutes without one starts a new Event. Where the client may not
//! patch events (RBAC granting only `create`), repeats are counted in memory only, with one
//! warning.
//!
//! As client-go's broadcaster, recording never waits for the API: events are queued (at most
//! [`QUEUED_EVENTS`], further ones dropped with a log line) and written by a background task,
//! a few at a time. Their writes yield to every other request under the client's QPS limit
//! ([`crate::ratelimit`]), so a worker never waits behind an event.

use crate::recent::Recent;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::time::Instant;

use crate::key::ObjectKey;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Events queued at most before further ones are dropped (client-go's `maxQueuedEvents`).
pub const QUEUED_EVENTS: usize = 1000;

/// Recent events remembered at most to drop repeats (client-go's event correlator keeps as many
/// in its LRU caches, `maxLruCacheEntries`).
pub const RECENT_EVENTS: usize = 4096;

/// Event writes in flight at once.
const WRITERS: usize = 8;

/// A repeated event's count is written at most this often (client-go writes it at every
/// repeat).
pub const COUNT_EVERY: Duration = Duration::from_secs(10);

/// How long after its last repeat an event's series ends: a repeat later starts a new Event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);

/// An event waiting to be written: its key (namespace and name) and the body of its request.
/// A create's is the Event's JSON, about 700 bytes, where the decoded `Event` is over 1 KB
/// inline plus a dozen strings (a full queue's slots alone held 1 MB).
struct Queued {
    key: ObjectKey,
    write: Write,
}

enum Write {
    /// The Event's JSON.
    Create(Box<[u8]>),
    /// A merge patch of its count and last time.
    Count(serde_json::Value),
}

/// An event written, as remembered to count its repeats.
#[derive(Debug)]
struct Series {
    /// The Event's name.
    name: Box<str>,
    /// How many times it happened, the first included.
    count: i32,
    /// When it was created or its count last written.
    written: Instant,
}

/// Writes events; the repeats of one (object, type, reason, message) as its count.
pub struct Recorder {
    queue: mpsc::Sender<Queued>,
    /// The task writing the queue (it ends once the queue is closed and written).
    writer: tokio::task::JoinHandle<()>,
    dropped: AtomicU64,
    /// The API server refused a count's patch as forbidden: repeats are not written any more.
    patch_refused: Arc<AtomicBool>,
    component: String,
    host: String,
    /// The (object UID, type, reason, message) that happened in the last ten minutes, by a
    /// hash of it (8 bytes a key instead of four strings), with its Event's name and count,
    /// at most [`RECENT_EVENTS`] of them (a storm of 100,000 claims kept 200,000, 6 to 13 MB
    /// with the map's spare room, when they were not bounded).
    recent: Recent<u64, Series>,
    /// The hasher of `recent`'s keys (random keys, as std's maps).
    keys: std::collections::hash_map::RandomState,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `component` from no host (`source.host` unset and
    /// `reportingInstance` "", as client-go's recorders of the sidecars and of
    /// kube-controller-manager's controllers). Starts its writer task: needs a Tokio runtime.
    /// The task ends once the recorder is dropped and its queue is written.
    pub fn new(client: kube::Client, component: impl Into<String>) -> Self {
        Recorder::on_host(client, component, "")
    }

    /// A recorder reporting as `component` from `host` (`source.host` and
    /// `reportingInstance`), as kubelet's names its node; otherwise as [`Recorder::new`].
    pub fn on_host(
        client: kube::Client,
        component: impl Into<String>,
        host: impl Into<String>,
    ) -> Self {
        let (queue, events) = mpsc::channel(QUEUED_EVENTS);
        let patch_refused = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_events(client, events, patch_refused.clone()));
        Recorder {
            queue,
            writer,
            dropped: AtomicU64::new(0),
            patch_refused,
            component: component.into(),
            host: host.into(),
            recent: Recent::bounded(SERIES_WINDOW, RECENT_EVENTS),
            keys: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Records an event about `object`: queues it and returns. Failures are logged, never
    /// returned: an event is information, not a step of the protocol.
    pub fn record(&self, object: &ObjectReference, kind: EventType, reason: &str, message: &str) {
        let key = self.keys.hash_one((
            object.uid.as_deref().unwrap_or_default(),
            kind,
            reason,
            message,
        ));
        let now = Timestamp::now();
        let first = || Series {
            name: event_name(object, now).into(),
            count: 1,
            written: Instant::now(),
        };
        let repeat = |series: &mut Series| {
            series.count = series.count.saturating_add(1);
            let due = series.written.elapsed() >= COUNT_EVERY;
            due.then(|| {
                series.written = Instant::now();
                (series.name.clone(), series.count)
            })
        };
        match self.recent.renew_or_insert(key, first, repeat) {
            None => {}
            // Counted; the next write carries it.
            Some(None) => return,
            Some(Some((name, count))) => {
                if self.patch_refused.load(Ordering::Relaxed) {
                    return;
                }
                let patch = serde_json::json!({"count": count, "lastTimestamp": Time(now)});
                let key = ObjectKey::new(Some(event_namespace(object)), &name);
                self.enqueue(
                    Queued {
                        key,
                        write: Write::Count(patch),
                    },
                    reason,
                    object,
                );
                return;
            }
        }
        let event = self.build(object, kind, reason, message, now);
        let json = match serde_json::to_vec(&event) {
            Ok(json) => json,
            Err(error) => {
                tracing::warn!(%error, reason, object = ?object.name, "an event does not encode; not recording it");
                return;
            }
        };
        // Boxed to its length: serde_json grows its buffer by doubling, to 1 KB here.
        let queued = Queued {
            key: ObjectKey::of(&event.metadata),
            write: Write::Create(json.into_boxed_slice()),
        };
        self.enqueue(queued, reason, object);
    }

    /// Queues a write, or drops it (counted, logged now and then) when the queue is full.
    fn enqueue(&self, queued: Queued, reason: &str, object: &ObjectReference) {
        if self.queue.try_send(queued).is_err() {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped == 1 || dropped.is_multiple_of(1000) {
                tracing::warn!(
                    dropped,
                    reason,
                    object = ?object.name,
                    "event queue full ({QUEUED_EVENTS} waiting to be written): event dropped"
                );
            }
        }
    }

    /// Closes the queue and waits, at most `within`, until what it holds is written: a process
    /// that stops right after its last event (a leader that stops leading) would otherwise
    /// cut the write off.
    pub async fn flush(self, within: Duration) {
        let Recorder { queue, writer, .. } = self;
        drop(queue);
        if tokio::time::timeout(within, writer).await.is_err() {
            tracing::warn!(?within, "events still queued when stopping; not written");
        }
    }

    /// Events dropped so far because [`QUEUED_EVENTS`] were waiting.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The Event object (separate for tests). Its namespace is the object's, else `default`.
    pub fn build(
        &self,
        object: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(object, now)),
                namespace: Some(event_namespace(object).to_string()),
                ..Default::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(kind.as_str().to_string()),
            // As client-go: the source's host is also the reporting instance; controllers of
            // kube-controller-manager and the sidecars name no host, kubelet its node.
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: (!self.host.is_empty()).then(|| self.host.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            action: None,
            related: None,
            series: None,
        }
    }
}

/// An event's name: its object's, then the time in hexadecimal nanoseconds (client-go's).
fn event_name(object: &ObjectReference, now: Timestamp) -> String {
    let name = object.name.as_deref().unwrap_or_default();
    format!("{name}.{:x}", now.as_nanosecond())
}

/// An event's namespace: its object's, else `default`.
fn event_namespace(object: &ObjectReference) -> &str {
    object
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
}

/// Writes queued events, [`WRITERS`] at a time, until the recorder is gone; a count's patch
/// refused as forbidden sets `patch_refused` (and is said once).
async fn write_events(
    client: kube::Client,
    mut events: mpsc::Receiver<Queued>,
    patch_refused: Arc<AtomicBool>,
) {
    use futures::StreamExt;
    futures::stream::poll_fn(|cx| events.poll_recv(cx))
        .for_each_concurrent(WRITERS, |Queued { key, write }| {
            let client = client.clone();
            let patch_refused = patch_refused.clone();
            async move {
                let path = <Event as kube::Resource>::url_path(&(), key.namespace());
                let request = kube::core::Request::new(path);
                let counting = matches!(write, Write::Count(_));
                let built = match write {
                    // The queued JSON is the request's body as it is: not decoded and encoded
                    // again.
                    Write::Create(json) => request.create(&PostParams::default(), json.into_vec()),
                    Write::Count(patch) => {
                        request.patch(key.name(), &PatchParams::default(), &Patch::Merge(patch))
                    }
                };
                let written = match built.map_err(kube::Error::BuildRequest) {
                    Ok(request) => client.request_text(request).await.map(drop),
                    Err(error) => Err(error),
                };
                match written {
                    Ok(()) => {}
                    Err(kube::Error::Api(status)) if counting && status.code == 403 => {
                        if !patch_refused.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                event = %key,
                                message = %status.message,
                                "may not patch events: repeated events are not counted on the \
                                 Event (grant `patch` on events)"
                            );
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, event = %key, "failed to record event");
                    }
                }
            }
        })
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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

    #[tokio::test(flavor = "current_thread")]
    async fn queued_events_are_written_as_built() {
        let (sent, mut received) = mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let sent = sent.clone();
            async move {
                let path = request.uri().path().to_string();
                let body = request.into_body().collect_bytes().await?;
                let _ = sent.send((path, body.clone()));
                let response = http::Response::builder()
                    .status(201)
                    .body(kube::client::Body::from(body.to_vec()))?;
                Ok::<_, tower::BoxError>(response)
            }
        });
        let recorder = Recorder::on_host(
            kube::Client::new(service, "default"),
            "csi-provisioner",
            "host-1",
        );
        let object = claim("c1");
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        let (path, body) = received.recv().await.unwrap();
        assert_eq!(path, "/api/v1/namespaces/ns/events");
        let written: Event = serde_json::from_slice(&body).unwrap();
        assert_eq!(written.involved_object, object);
        assert_eq!(written.reason.as_deref(), Some("ProvisioningFailed"));
        assert_eq!(written.message.as_deref(), Some("no room"));
        assert_eq!(written.type_.as_deref(), Some("Warning"));
        assert_eq!(written.reporting_instance.as_deref(), Some("host-1"));
        assert_eq!(written.source.unwrap().host.as_deref(), Some("host-1"));
        let hostless = Recorder::new(stuck_client(), "persistentvolume-controller");
        let event = hostless.build(&object, EventType::Normal, "R", "m", Timestamp::now());
        assert_eq!(event.source.unwrap().host, None);
        assert_eq!(event.reporting_instance.as_deref(), Some(""));
        assert!(written.metadata.name.unwrap().starts_with("c1."));
    }

    /// A client answering creates with the body, patches with `patch_code` (a Status when not
    /// 200), and passing each request's method, path and body to the returned channel.
    fn recording_client(
        patch_code: u16,
    ) -> (
        kube::Client,
        mpsc::UnboundedReceiver<(String, String, serde_json::Value)>,
    ) {
        let (sent, received) = mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
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
                            "message": "events is forbidden", "reason": "Forbidden", "code": patch_code})
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

    /// Repeats are counted on the Event first written: a patch of its count and last time,
    /// at most every COUNT_EVERY, carrying the repeats in between; another message is another
    /// Event.
    #[tokio::test(start_paused = true)]
    async fn repeats_are_counted_on_the_first_event_at_most_every_few_seconds() {
        let (client, mut received) = recording_client(200);
        let recorder = Recorder::new(client, "csi-provisioner");
        let object = claim("c1");
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        let (method, path, created) = received.recv().await.unwrap();
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/api/v1/namespaces/ns/events")
        );
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        // Two repeats at once: counted, not written yet.
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        tokio::time::advance(COUNT_EVERY).await;
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        let (method, path, patch) = received.recv().await.unwrap();
        assert_eq!(method, "PATCH");
        assert_eq!(path, format!("/api/v1/namespaces/ns/events/{name}"));
        assert_eq!(patch["count"], 4, "{patch}");
        assert!(
            patch["lastTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z')),
            "{patch}"
        );
        // Another message: a new Event, not a count.
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no disk");
        let (method, _, other) = received.recv().await.unwrap();
        assert_eq!(method, "POST");
        assert_eq!(other["count"], 1);
        // Ten minutes without a repeat end the series: the next is a new Event.
        tokio::time::advance(SERIES_WINDOW).await;
        recorder.record(&object, EventType::Warning, "ProvisioningFailed", "no room");
        let (method, _, again) = received.recv().await.unwrap();
        assert_eq!(method, "POST");
        assert_ne!(again["metadata"]["name"].as_str(), Some(name.as_str()));
    }

    /// Where patching events is forbidden, the first refusal stops the counts' writes; events
    /// are still created.
    #[tokio::test(start_paused = true)]
    async fn a_forbidden_count_stops_the_counts_and_events_are_still_created() {
        let (client, mut received) = recording_client(403);
        let recorder = Recorder::new(client, "csi-provisioner");
        let object = claim("c1");
        recorder.record(&object, EventType::Normal, "R", "m");
        assert_eq!(received.recv().await.unwrap().0, "POST");
        tokio::time::advance(COUNT_EVERY).await;
        recorder.record(&object, EventType::Normal, "R", "m");
        assert_eq!(received.recv().await.unwrap().0, "PATCH");
        let mut waited = Duration::ZERO;
        while !recorder.patch_refused.load(Ordering::Relaxed) {
            assert!(waited < Duration::from_secs(60), "the refusal was not seen");
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += Duration::from_millis(10);
        }
        tokio::time::advance(COUNT_EVERY).await;
        recorder.record(&object, EventType::Normal, "R", "m");
        recorder.record(&object, EventType::Normal, "R", "other");
        let (method, _, created) = received.recv().await.unwrap();
        assert_eq!(method, "POST", "no count written once refused");
        assert_eq!(created["message"], "other");
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
}
