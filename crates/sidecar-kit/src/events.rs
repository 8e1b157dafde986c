//! A core/v1 Event recorder, as client-go's: same reasons, `source.component`, counts and
//! timestamps, so `kubectl describe` shows our events exactly as the Go sidecar's.
//!
//! Unlike client-go, identical events (same object, type, reason and message) within a window
//! are not written again: a retry loop against a failing driver does not become an event storm
//! (client-go patches the count of such an event on every repeat, one API write each time).
//!
//! As client-go's broadcaster, recording never waits for the API: events are queued (at most
//! [`QUEUED_EVENTS`], further ones dropped with a log line) and written by a background task,
//! a few at a time. Their writes yield to every other request under the client's QPS limit
//! ([`crate::ratelimit`]), so a worker never waits behind an event.

use crate::recent::Recent;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;

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

/// An event waiting to be written: its key (namespace and name) and its JSON, the body of its
/// create request, about 700 bytes, where the decoded `Event` is over 1 KB inline plus a dozen
/// strings (a full queue's slots alone held 1 MB).
struct Queued {
    key: ObjectKey,
    json: Box<[u8]>,
}

/// Writes events; one per (object, type, reason, message) per window.
pub struct Recorder {
    queue: mpsc::Sender<Queued>,
    /// The task writing the queue (it ends once the queue is closed and written).
    writer: tokio::task::JoinHandle<()>,
    dropped: AtomicU64,
    component: String,
    host: String,
    /// The (object UID, type, reason, message) written in the last ten minutes, by a hash of
    /// it: 8 bytes a key instead of four strings (10,000 volumes kept about 3 MB of them), and
    /// at most [`RECENT_EVENTS`] of them (a storm of 100,000 claims kept 200,000, 6 to 13 MB
    /// with the map's spare room).
    recent: Recent<u64>,
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
        let writer = tokio::spawn(write_events(client, events));
        Recorder {
            queue,
            writer,
            dropped: AtomicU64::new(0),
            component: component.into(),
            host: host.into(),
            recent: Recent::bounded(Duration::from_secs(600), RECENT_EVENTS),
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
        if !self.recent.first_time(key) {
            return;
        }
        let event = self.build(object, kind, reason, message, Timestamp::now());
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
            json: json.into_boxed_slice(),
        };
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
        let name = object.name.clone().unwrap_or_default();
        let suffix = format!("{:x}", now.as_nanosecond());
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{suffix}")),
                namespace: object
                    .namespace
                    .clone()
                    .filter(|n| !n.is_empty())
                    .or(Some("default".into())),
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

/// Writes queued events, [`WRITERS`] at a time, until the recorder is gone.
async fn write_events(client: kube::Client, mut events: mpsc::Receiver<Queued>) {
    use futures::StreamExt;
    futures::stream::poll_fn(|cx| events.poll_recv(cx))
        .for_each_concurrent(WRITERS, |Queued { key, json }| {
            let client = client.clone();
            async move {
                // The queued JSON is the request's body as it is: not decoded and encoded again.
                let path = <Event as kube::Resource>::url_path(&(), key.namespace());
                let written = kube::core::Request::new(path)
                    .create(&PostParams::default(), json.into_vec())
                    .map_err(kube::Error::BuildRequest);
                let written = match written {
                    Ok(request) => client.request_text(request).await.map(drop),
                    Err(error) => Err(error),
                };
                if let Err(error) = written {
                    tracing::warn!(%error, event = %key, "failed to record event");
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
        // The same event again within the window is not queued at all (nor counted).
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
