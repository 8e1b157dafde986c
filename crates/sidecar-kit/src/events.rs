//! A core/v1 Event recorder, as client-go's: same reasons, `source.component`, counts and
//! timestamps, so `kubectl describe` shows our events exactly as the Go sidecar's.
//!
//! As client-go's, a repeat of an event (same object, type, reason and message) is counted on
//! the Event written first: its `count` and `lastTimestamp` are patched, so `kubectl describe`
//! shows `(x5 over 2m)`, and an Event gone when its count is written (expired, or its create
//! lost) is made again with the count so far. Unlike client-go, a count is written at most
//! every [`COUNT_EVERY`] per event, not at every repeat (one API write each there): a retry
//! loop against a failing driver does not become an event storm; a repeat in between is
//! written by the next pass over the counts, at most [`COUNT_EVERY`] later, or when the
//! recorder is flushed. A repeat after ten minutes without one starts a new Event. Where the
//! client may not patch events (RBAC granting only `create`), counts are not written for ten
//! minutes after each refusal (one warning each time) and an event repeated meanwhile gets a
//! new Event every ten minutes.
//!
//! As client-go's broadcaster, recording never waits for the API: events are queued (at most
//! [`QUEUED_EVENTS`], further ones dropped with a log line) and written by a background task,
//! a few at a time. Their writes yield to every other request under the client's QPS limit
//! ([`crate::ratelimit`]), so a worker never waits behind an event.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use crate::key::ObjectKey;
use crate::recent::Recent;

mod series;
#[cfg(test)]
mod tests;
mod writer;

use self::series::{Repeat, Series};
use self::writer::{Queued, Refusal, Write};

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

/// Recent events remembered at most to count repeats (client-go's event correlator keeps as
/// many in its LRU caches, `maxLruCacheEntries`).
pub const RECENT_EVENTS: usize = 4096;

/// A repeated event's count is written at most this often (client-go writes it at every
/// repeat).
pub const COUNT_EVERY: Duration = Duration::from_secs(10);

/// How long after its last repeat an event's series ends: a repeat later starts a new Event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);

/// Writes events; the repeats of one (object, type, reason, message) as its count.
pub struct Recorder {
    queue: mpsc::Sender<Queued>,
    /// The task writing the queue (it ends once the queue is closed and written).
    writer: tokio::task::JoinHandle<()>,
    /// The task writing counts not written yet, every [`COUNT_EVERY`].
    counts: tokio::task::JoinHandle<()>,
    dropped: Arc<AtomicU64>,
    /// When the API server last refused to patch a count.
    refusal: Arc<Refusal>,
    component: String,
    host: String,
    /// The (object, type, reason, message) that happened in the last ten minutes, by a hash
    /// of it (8 bytes a key instead of seven strings), with its Event and count, at most
    /// [`RECENT_EVENTS`] of them (a storm of 100,000 claims kept 200,000, 6 to 13 MB with the
    /// map's spare room, when they were not bounded).
    recent: Arc<Recent<u64, Series>>,
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
    /// kube-controller-manager's controllers). Starts its writer tasks: needs a Tokio runtime.
    /// They end once the recorder is dropped and its queue is written.
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
        let refusal = Arc::new(Refusal::default());
        let dropped = Arc::new(AtomicU64::new(0));
        let recent = Arc::new(Recent::bounded(SERIES_WINDOW, RECENT_EVENTS));
        let writer = tokio::spawn(writer::write_events(client, events, refusal.clone()));
        let counts = tokio::spawn(writer::write_pending_counts(
            Arc::downgrade(&recent),
            queue.downgrade(),
            refusal.clone(),
            dropped.clone(),
        ));
        Recorder {
            queue,
            writer,
            counts,
            dropped,
            refusal,
            component: component.into(),
            host: host.into(),
            recent,
            keys: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Records an event about `object`: queues it (or counts it) and returns. Failures are
    /// logged, never returned: an event is information, not a step of the protocol.
    pub fn record(&self, object: &ObjectReference, kind: EventType, reason: &str, message: &str) {
        let key = self.keys.hash_one((
            text(&object.uid),
            text(&object.kind),
            text(&object.namespace),
            text(&object.name),
            kind,
            reason,
            message,
        ));
        let now = Timestamp::now();
        let event = self.build(object, kind, reason, message, now);
        let json: Arc<[u8]> = match serde_json::to_vec(&event) {
            Ok(json) => json.into(),
            Err(error) => {
                tracing::warn!(%error, reason, object = ?object.name, "an event does not encode; not recording it");
                return;
            }
        };
        let event_key = ObjectKey::of(&event.metadata);
        let refused = self.refusal.active();
        let outcome = self.recent.renew_or_insert(
            key,
            || Series::new(event_key.clone(), now),
            |series| series.repeat(now, refused, &event_key, &json),
        );
        let queued = match outcome {
            None | Some(Repeat::Anew) => Queued {
                key: event_key,
                write: Write::Create(json),
            },
            // Counted; a later write carries it.
            Some(Repeat::Counted) => return,
            Some(Repeat::Count(queued)) => queued,
        };
        if self.queue.try_send(queued).is_err() {
            note_dropped(&self.dropped, reason, object.name.as_deref());
        }
    }

    /// Writes the counts not written yet, closes the queue and waits, at most `within`, until
    /// what it holds is written: a process that stops right after its last event (a leader
    /// that stops leading) would otherwise cut the write off.
    pub async fn flush(self, within: Duration) {
        let Recorder {
            queue,
            writer,
            counts,
            recent,
            refusal,
            dropped,
            ..
        } = self;
        counts.abort();
        if !refusal.active() {
            writer::queue_due_counts(&recent, &queue, &dropped, Duration::ZERO);
        }
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

/// Counts a write the full queue dropped; logs the first and every thousandth.
fn note_dropped(dropped: &AtomicU64, reason: &str, object: Option<&str>) {
    let dropped = dropped.fetch_add(1, Ordering::Relaxed) + 1;
    if dropped == 1 || dropped.is_multiple_of(1000) {
        tracing::warn!(
            dropped,
            reason,
            object,
            "event queue full ({QUEUED_EVENTS} waiting to be written): event dropped"
        );
    }
}

/// A field of a reference, none being empty.
fn text(field: &Option<String>) -> &str {
    field.as_deref().unwrap_or_default()
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
