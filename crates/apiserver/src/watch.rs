//! Watch streams: resume from a resourceVersion (410 when too old, 504 when not reached yet),
//! selectors with objects entering and leaving them, bookmarks that never overtake queued
//! events, timeouts and closing on request. Events waiting for a stream go out together
//! ([`Out`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::{broadcast, mpsc, watch};

use crate::change::event_line_of;
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::server::{Query, Shared, Target, selectors, wants_table};
use crate::status::ApiError;
use crate::store::{Change, ChangeKind, Compacted};
use crate::tables::table;

mod out;
use out::{Out, Put, Sent, body_of};

/// A live subscription to changes.
type Feed = broadcast::Receiver<Arc<Change>>;

fn event_line(kind: &str, object: &Value) -> Bytes {
    event_line_of(
        kind,
        &serde_json::to_vec(object).unwrap_or_else(|_| b"null".to_vec()),
    )
}

/// How a stream writes its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// One JSON event per line.
    Json,
    /// Length-prefixed protobuf WatchEvents.
    Protobuf,
}

impl Framing {
    /// Protobuf when the client prefers it and the kind has a protobuf form; otherwise JSON,
    /// which client-go reads by the answer's Content-Type.
    fn choose(headers: &HeaderMap, api_version: &str, kind: &str) -> Self {
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        match crate::media::accepted(accept) {
            Ok(a)
                if a.preferred == crate::media::Format::Protobuf
                    && crate::protobuf::supports(api_version, kind) =>
            {
                Framing::Protobuf
            }
            _ => Framing::Json,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Framing::Json => "application/json",
            Framing::Protobuf => crate::protobuf::WATCH_MEDIA_TYPE,
        }
    }

    /// One event; `Err` carries an ERROR event that ends the stream (an object this server
    /// cannot write in protobuf).
    fn frame(self, kind: &str, object: &Value) -> Result<Bytes, Bytes> {
        match self {
            Framing::Json => Ok(event_line(kind, object)),
            Framing::Protobuf => match crate::protobuf::watch_frame(kind, object) {
                Ok(frame) => Ok(Bytes::from(frame)),
                Err(error) => {
                    let status = ApiError::internal(format!(
                        "this object cannot be sent in protobuf: {error}; watch with Accept: application/json"
                    ))
                    .to_status();
                    Err(crate::protobuf::watch_frame("ERROR", &status)
                        .map(Bytes::from)
                        .unwrap_or_default())
                }
            },
        }
    }
}

/// Whether this watch has been closed (by the fault admin) since it began, `before` being
/// its resource's count of closes then; a close of another resource is taken as seen.
fn closed(close: &mut watch::Receiver<Closes>, plural: &str, before: u64) -> bool {
    match close.has_changed() {
        Err(_) => true,
        Ok(false) => false,
        Ok(true) => close.borrow_and_update().of(plural) != before,
    }
}

/// How a watcher's objects are written: as stored, in the version its resource serves when
/// that is not the stored one (events.k8s.io/v1 Events), or as a table of one row (drawn from
/// the stored form, whichever version is asked for).
#[derive(Debug, Clone, Copy)]
enum Shape<'a> {
    /// As stored.
    Stored,
    /// Converted to the resource's version.
    Served(&'a ResourceType),
    /// A table of one row.
    Table(&'a ResourceType),
}

impl<'a> Shape<'a> {
    fn of(rt: &'a ResourceType, as_table: bool) -> Self {
        if as_table {
            Shape::Table(rt)
        } else if rt.stored_as_core_events() {
            Shape::Served(rt)
        } else {
            Shape::Stored
        }
    }
}

/// An object as a watcher asked for it (see [`Shape`]).
fn render<'a>(shape: Shape<'_>, object: &'a Arc<Value>) -> Cow<'a, Value> {
    match shape {
        Shape::Table(rt) => Cow::Owned(table(rt, std::slice::from_ref(object), 0)),
        Shape::Served(rt) => Cow::Owned(Arc::unwrap_or_clone(crate::event_versions::served(
            rt,
            object.clone(),
        ))),
        Shape::Stored => Cow::Borrowed(object),
    }
}

/// A change as a watcher sees it: its event line, written once for every watcher (a watcher
/// whose selectors make it see another event type writes the line around the object's JSON),
/// unless it must be converted, rendered as a table or framed in protobuf (`Err` as
/// [`Framing::frame`]).
fn change_event(
    framing: Framing,
    shape: Shape<'_>,
    event: &str,
    change: &Change,
) -> Result<Bytes, Bytes> {
    if framing == Framing::Json && matches!(shape, Shape::Stored) {
        return Ok(if event == change.kind.as_str() {
            change.event_line()
        } else {
            event_line_of(event, &change.json())
        });
    }
    framing.frame(event, &render(shape, &change.object))
}

/// The longest `timeoutSeconds` a watch keeps (a year): a larger one, up to `u64::MAX`, would
/// overflow the stream's end.
pub const MAX_WATCH_SECONDS: u64 = 365 * 24 * 3600;

pub(crate) async fn watch(
    app: &Shared,
    t: &Target,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query, &t.rt)?;
    let resource = t.rt.key();
    let namespace = t.namespace.clone();
    let rt = t.rt.clone();
    let as_table = wants_table(headers);
    let requested_rv: Option<u64> = query
        .get("resourceVersion")
        .filter(|r| !r.is_empty())
        .and_then(|r| r.parse().ok());
    let send_initial = query.flag("sendInitialEvents");
    let bookmarks = query.flag("allowWatchBookmarks");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(|seconds| Duration::from_secs(seconds.min(MAX_WATCH_SECONDS)))
        .unwrap_or(Duration::from_secs(1800));
    let filter = Filter {
        resource,
        namespace,
        labels,
        fields,
    };
    let (initial, backlog, mut rx, start_rv): (Vec<Arc<Value>>, Vec<Arc<Change>>, Feed, u64) =
        match requested_rv {
            Some(rv) if rv > 0 && !send_initial => {
                match app.store.watch_from(&filter.resource, rv) {
                    Ok((backlog, rx)) => (Vec::new(), backlog, rx, rv),
                    Err(Compacted { oldest }) => {
                        let status =
                            ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                                .to_status();
                        let framing = Framing::choose(headers, &t.rt.api_version(), &t.rt.kind);
                        let body = framing.frame("ERROR", &status).unwrap_or_else(|e| e);
                        return Ok((
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, framing.content_type())],
                            body,
                        )
                            .into_response());
                    }
                }
            }
            _ => {
                let (items, rv, rx) = app
                    .store
                    .snapshot_and_watch(&t.rt.key(), t.namespace.as_deref());
                (items, Vec::new(), rx, rv)
            }
        };
    let (tx, out) = mpsc::channel::<Sent>(Out::QUEUED);
    let framing = if as_table {
        Framing::Json
    } else {
        Framing::choose(headers, &rt.api_version(), &rt.kind)
    };
    let kind = rt.kind.clone();
    let api_version = rt.api_version();
    let app = app.clone();
    let mut close = app.close_watches.subscribe();
    let plural = rt.plural.clone();
    let closed_before = close.borrow().of(&plural);
    tokio::spawn(async move {
        let shape = Shape::of(&rt, as_table);
        // The stream ends at its timeout, counted from its start, also while a send waits
        // for a client that does not read.
        let ends = tokio::time::Instant::now() + timeout;
        let mut out = Out::new(tx, ends);
        let mut last_rv = start_rv;
        for obj in &initial {
            if filter.selects(obj)
                && out.put(framing.frame("ADDED", &render(shape, obj))).await == Put::Over
            {
                return;
            }
        }
        if send_initial {
            let bookmark = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": start_rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}});
            if out.put(framing.frame("BOOKMARK", &bookmark)).await == Put::Over {
                return;
            }
        }
        for change in backlog {
            last_rv = change.rv;
            if let Some(event) = filter.event(&change)
                && out.put(change_event(framing, shape, event, &change)).await == Put::Over
            {
                return;
            }
        }
        if !out.flush().await {
            return;
        }
        let deadline = tokio::time::sleep_until(ends);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(Duration::from_secs(10));
        // A send held up for longer than the period sends one bookmark after it, not one per
        // period missed.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            // In this order: a watch closed (by the fault admin) or ended passes on no change
            // made after that, even when both are ready at once, as on a busy machine where
            // this task runs only after the close and the next write.
            tokio::select! {
                biased;
                changed = close.changed() => {
                    if changed.is_err() || close.borrow().of(&plural) != closed_before {
                        return;
                    }
                }
                () = &mut deadline => return,
                () = out.closed() => return,
                _ = ticker.tick(), if bookmarks => {
                    // Every change up to the store's version has been broadcast before that
                    // version became current; only when none of them is still queued for this
                    // watcher may the bookmark carry it. Otherwise it carries the last change
                    // this stream has passed on.
                    let rv = bookmark_rv(app.store.current_rv(), rx.len(), last_rv);
                    let bookmark = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}});
                    if out.put(framing.frame("BOOKMARK", &bookmark)).await == Put::Over || !out.flush().await {
                        return;
                    }
                }
                received = rx.recv() => {
                    // The changes already queued go out with this one, up to a chunk. Each is
                    // taken before the close is looked at, so one made after a close of this
                    // watch is never passed on.
                    let mut next = received.map_err(|_| ());
                    loop {
                        if closed(&mut close, &plural, closed_before) {
                            let _ = out.flush().await;
                            return;
                        }
                        match next {
                            Ok(change) if change.rv > last_rv => {
                                last_rv = change.rv;
                                if let Some(event) = filter.event(&change) {
                                    match out.put(change_event(framing, shape, event, &change)).await {
                                        Put::Queued => {}
                                        Put::SentBefore => break,
                                        Put::Over => return,
                                    }
                                }
                            }
                            Ok(_) => {}
                            // Fell behind: end the watch, after what was taken before; the
                            // client watches again from the last version it saw (the history
                            // replays the rest) or re-lists if that is gone.
                            Err(()) => {
                                let _ = out.flush().await;
                                return;
                            }
                        }
                        next = match rx.try_recv() {
                            Ok(change) => Ok(change),
                            Err(TryRecvError::Empty) => break,
                            Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => Err(()),
                        };
                    }
                    if !out.flush().await {
                        return;
                    }
                }
            }
        }
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, framing.content_type())
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(body_of(out))
        .unwrap_or_else(|_| {
            ApiError::internal("failed to build the watch response").into_response()
        }))
}

/// How many times the open watches of each resource, or of all (`*`), were closed: a watch
/// ends when its resource's count or the count of all moves past what it was when the watch
/// began. Counts, not the last resource closed: two closes in a row, of two resources, must
/// both reach a watch task that runs only after them.
#[derive(Debug, Default)]
pub struct Closes(std::collections::HashMap<String, u64>);

impl Closes {
    /// Records a close of `resource` (`*`: all).
    pub(crate) fn count(&mut self, resource: &str) {
        *self.0.entry(resource.to_string()).or_default() += 1;
    }

    /// The closes that concern the watches of `resource`.
    pub(crate) fn of(&self, resource: &str) -> u64 {
        let count = |r: &str| self.0.get(r).copied().unwrap_or(0);
        count(resource) + count("*")
    }
}

/// What one watch stream passes on.
struct Filter {
    resource: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches_object(object) && self.fields.matches(object)
    }

    /// The event a watcher sees for a change, if any: an object that stops matching the
    /// selectors is sent as DELETED, one that starts matching as ADDED (as kube-apiserver's
    /// watch cache does).
    fn event(&self, c: &Change) -> Option<&'static str> {
        let in_scope = c.resource == self.resource
            && self.namespace.as_ref().is_none_or(|ns| &c.namespace == ns);
        if !in_scope {
            return None;
        }
        selector_event(
            c.kind,
            c.previous.as_deref().map(|p| self.selects(p)),
            self.selects(&c.object),
        )
    }
}

/// The event type a watcher with selectors sees for a change, given whether the object matched
/// before (None: it did not exist) and matches now.
fn selector_event(kind: ChangeKind, before: Option<bool>, now: bool) -> Option<&'static str> {
    match (kind, before.unwrap_or(false), now) {
        (ChangeKind::Added, _, true) => Some("ADDED"),
        (ChangeKind::Deleted, _, true) => Some("DELETED"),
        (ChangeKind::Modified, true, true) => Some("MODIFIED"),
        (ChangeKind::Modified, true, false) => Some("DELETED"),
        (ChangeKind::Modified, false, true) => Some("ADDED"),
        (ChangeKind::Added | ChangeKind::Deleted | ChangeKind::Modified, _, false) => None,
    }
}

/// The resourceVersion a bookmark may carry: the store's current version (read first) only when
/// no change is still queued for this watcher, else the last change the stream passed on.
fn bookmark_rv(current: u64, queued: usize, last_sent: u64) -> u64 {
    if queued == 0 {
        current.max(last_sent)
    } else {
        last_sent
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_event_line_is_the_json_of_its_type_and_object() {
        let object = json!({"metadata": {"name": "a\"b"}, "data": {"k": "é"}});
        for kind in ["ADDED", "MODIFIED", "DELETED", "ERROR", "BOOKMARK", "a\"b"] {
            let line = event_line(kind, &object);
            assert!(line.ends_with(b"\n"));
            let parsed: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(parsed, json!({"type": kind, "object": object}));
        }
    }

    #[test]
    fn objects_entering_and_leaving_a_selector_are_added_and_deleted() {
        use ChangeKind::{Added, Deleted, Modified};
        let cases = [
            (Added, None, true, Some("ADDED")),
            (Added, None, false, None),
            (Modified, Some(true), true, Some("MODIFIED")),
            (Modified, Some(true), false, Some("DELETED")),
            (Modified, Some(false), true, Some("ADDED")),
            (Modified, Some(false), false, None),
            (Deleted, Some(true), true, Some("DELETED")),
            (Deleted, Some(false), false, None),
        ];
        for (kind, before, now, want) in cases {
            assert_eq!(
                selector_event(kind, before, now),
                want,
                "{kind:?} {before:?} {now}"
            );
        }
    }

    #[test]
    fn a_close_of_this_watch_is_seen_and_one_of_another_resource_is_passed_over() {
        let (tx, mut close) = watch::channel(Closes::default());
        assert!(!closed(&mut close, "configmaps", 0));
        tx.send_modify(|c| c.count("secrets"));
        assert!(!closed(&mut close, "configmaps", 0), "another resource's");
        assert!(!closed(&mut close, "configmaps", 0), "taken as seen");
        tx.send_modify(|c| c.count("configmaps"));
        assert!(closed(&mut close, "configmaps", 0));
        let (tx, mut all) = watch::channel(Closes::default());
        tx.send_modify(|c| c.count("*"));
        assert!(closed(&mut all, "configmaps", 0), "a close of every watch");
        drop(tx);
        assert!(closed(&mut all, "configmaps", 1), "the server going away");
    }

    #[test]
    fn a_bookmark_never_overtakes_queued_changes() {
        // (store's version, changes queued for this watcher, last version sent) -> bookmark
        let cases = [(10, 0, 7, 10), (10, 3, 7, 7), (10, 1, 0, 0), (5, 0, 5, 5)];
        for (current, queued, last, want) in cases {
            assert_eq!(
                bookmark_rv(current, queued, last),
                want,
                "{current} {queued} {last}"
            );
        }
    }
}
