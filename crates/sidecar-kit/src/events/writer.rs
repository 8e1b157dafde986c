//! The writes of events: creates and counts from the queue, a few at a time; an Event gone
//! when its count is written made again; the counts not written yet, every [`COUNT_EVERY`].

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::series::Series;
use super::{COUNT_EVERY, note_dropped};
use crate::key::ObjectKey;
use crate::recent::Recent;

/// Event writes in flight at once.
const WRITERS: usize = 8;

/// How long counts are not written after the API server refused to patch one: then they are
/// tried again (the RBAC may have been fixed).
const REFUSAL_HOLDS: Duration = Duration::from_secs(600);

/// A write waiting in the queue: the Event (namespace and name) and what to write. A create's
/// body is the Event's JSON, about 700 bytes, where the decoded `Event` is over 1 KB inline
/// plus a dozen strings (a full queue's slots alone held 1 MB).
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) key: ObjectKey,
    pub(super) write: Write,
}

/// What is written.
#[derive(Debug)]
pub(super) enum Write {
    /// The Event, made.
    Create(Arc<[u8]>),
    /// Its count and last time, patched; made again from `event` with them, its name and
    /// first time if it is gone.
    Count {
        /// How many times it happened.
        count: i32,
        /// When it first happened.
        first: Timestamp,
        /// When it last happened.
        last: Timestamp,
        /// A repeat's create request's body.
        event: Arc<[u8]>,
    },
}

/// When the API server last refused to patch a count (as forbidden).
#[derive(Debug, Default)]
pub(super) struct Refusal {
    at: Mutex<Option<Instant>>,
}

impl Refusal {
    /// Whether counts are not to be written now: refused less than [`REFUSAL_HOLDS`] ago.
    pub(super) fn active(&self) -> bool {
        self.at
            .lock()
            .is_some_and(|at| at.elapsed() < REFUSAL_HOLDS)
    }

    /// The API server refused a count's patch: said once per refusal period.
    fn refused(&self, event: &ObjectKey, message: &str) {
        let mut at = self.at.lock();
        let was_active = at.is_some_and(|at| at.elapsed() < REFUSAL_HOLDS);
        *at = Some(Instant::now());
        if !was_active {
            tracing::warn!(
                %event,
                message,
                "may not patch events: repeated events are not counted on their Event for the \
                 next 10 minutes (grant `patch` on events)"
            );
        }
    }
}

/// Writes queued events, [`WRITERS`] at a time, until the recorder is gone.
pub(super) async fn write_events(
    client: kube::Client,
    mut events: mpsc::Receiver<Queued>,
    refusal: Arc<Refusal>,
) {
    use futures::StreamExt;
    futures::stream::poll_fn(|cx| events.poll_recv(cx))
        .for_each_concurrent(WRITERS, |Queued { key, write }| {
            let client = client.clone();
            let refusal = refusal.clone();
            async move {
                let written = match write {
                    // The queued JSON is the request's body as it is: not decoded and encoded
                    // again.
                    Write::Create(json) => create(&client, &key, json.to_vec()).await,
                    Write::Count {
                        count,
                        first,
                        last,
                        event,
                    } => {
                        let patch =
                            serde_json::json!({"count": count, "lastTimestamp": Time(last)});
                        match count_write(&client, &key, patch).await {
                            Err(kube::Error::Api(status)) if status.code == 403 => {
                                refusal.refused(&key, &status.message);
                                Ok(())
                            }
                            // Gone (expired, or its create was lost): made again with the count
                            // so far, as client-go does.
                            Err(kube::Error::Api(status)) if status.code == 404 => {
                                match remade(&event, &key, count, first, last) {
                                    Some(body) => create(&client, &key, body).await,
                                    None => Ok(()),
                                }
                            }
                            other => other,
                        }
                    }
                };
                match written {
                    Ok(()) => {}
                    // Made already: its first create and a count's re-creation crossed.
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        tracing::debug!(event = %key, "event made already");
                    }
                    Err(error) => {
                        tracing::warn!(%error, event = %key, "failed to record event");
                    }
                }
            }
        })
        .await;
}

async fn create(client: &kube::Client, key: &ObjectKey, body: Vec<u8>) -> Result<(), kube::Error> {
    let path = <Event as kube::Resource>::url_path(&(), key.namespace());
    let request = kube::core::Request::new(path)
        .create(&PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

async fn count_write(
    client: &kube::Client,
    key: &ObjectKey,
    patch: serde_json::Value,
) -> Result<(), kube::Error> {
    let path = <Event as kube::Resource>::url_path(&(), key.namespace());
    let request = kube::core::Request::new(path)
        .patch(key.name(), &PatchParams::default(), &Patch::Merge(patch))
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

/// The Event `key` made again from a repeat's create body: its name, first and last time and
/// count (None if the body does not read back, which cannot happen to one this recorder
/// wrote).
fn remade(
    event: &[u8],
    key: &ObjectKey,
    count: i32,
    first: Timestamp,
    last: Timestamp,
) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(event).ok()?;
    let object = value.as_object_mut()?;
    object.insert("count".into(), count.into());
    let time = |at: Timestamp| serde_json::to_value(Time(at)).ok();
    object.insert("firstTimestamp".into(), time(first)?);
    object.insert("lastTimestamp".into(), time(last)?);
    let metadata = object.get_mut("metadata")?.as_object_mut()?;
    metadata.insert("name".into(), key.name().into());
    serde_json::to_vec(&value).ok()
}

/// Every [`COUNT_EVERY`], queues the counts not written yet whose last write is that old,
/// until the recorder is gone.
pub(super) async fn write_pending_counts(
    recent: Weak<Recent<u64, Series>>,
    queue: mpsc::WeakSender<Queued>,
    refusal: Arc<Refusal>,
    dropped: Arc<AtomicU64>,
) {
    let mut tick = tokio::time::interval(COUNT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(recent), Some(queue)) = (recent.upgrade(), queue.upgrade()) else {
            return;
        };
        if !refusal.active() {
            queue_due_counts(&recent, &queue, &dropped, COUNT_EVERY);
        }
    }
}

/// Queues the counts not written yet whose last write is at least `spacing` old (the pass
/// above, and a flush with no spacing).
pub(super) fn queue_due_counts(
    recent: &Recent<u64, Series>,
    queue: &mpsc::Sender<Queued>,
    dropped: &AtomicU64,
    spacing: Duration,
) {
    let mut due = Vec::new();
    recent.for_each_mut(|series| due.extend(series.due(spacing)));
    for queued in due {
        if queue.try_send(queued).is_err() {
            note_dropped(dropped, "count", None);
        }
    }
}
