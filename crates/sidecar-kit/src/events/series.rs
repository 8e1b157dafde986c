//! One event's series: the Event written first and how many times it happened since, and
//! which count is due to be written.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::writer::{Queued, Write};
use super::{COUNT_EVERY, SERIES_WINDOW};
use crate::key::ObjectKey;

/// An event written, as remembered to count its repeats.
#[derive(Debug)]
pub(super) struct Series {
    /// The Event (namespace and name).
    key: ObjectKey,
    /// When it first happened (the Event's `firstTimestamp`).
    first: Timestamp,
    /// A repeat's create request's body, kept from the first repeat on (most events never
    /// repeat: 4,096 bodies held for nothing were 3 to 4 MB): the Event is made again from
    /// it, with its own name, first time and the count so far, should it be gone when a
    /// count is written.
    json: Option<Arc<[u8]>>,
    /// How many times it happened, the first included.
    count: i32,
    /// The count last queued to be written (1: the create's).
    written_count: i32,
    /// When it last happened.
    last: Timestamp,
    /// When its create or a count was last queued.
    written: Instant,
    /// When its Event was queued to be made.
    started: Instant,
}

/// What a repeat calls for.
#[derive(Debug)]
pub(super) enum Repeat {
    /// Nothing now: counted, a later write carries it.
    Counted,
    /// Writing the count.
    Count(Queued),
    /// A new Event (counts cannot be written, and this one is old): the series is now it.
    Anew,
}

impl Series {
    /// A series whose Event (`key`) is queued now, at `now`.
    pub(super) fn new(key: ObjectKey, now: Timestamp) -> Series {
        let at = Instant::now();
        Series {
            key,
            first: now,
            json: None,
            count: 1,
            written_count: 1,
            last: now,
            written: at,
            started: at,
        }
    }

    /// The event happened again at `now` (`json`: its create body as built now). While counts
    /// cannot be written (`refused`), an Event older than the series window gives way to a new
    /// one (`key`, made with `json`).
    pub(super) fn repeat(
        &mut self,
        now: Timestamp,
        refused: bool,
        key: &ObjectKey,
        json: &Arc<[u8]>,
    ) -> Repeat {
        if refused && self.started.elapsed() >= SERIES_WINDOW {
            *self = Series::new(key.clone(), now);
            return Repeat::Anew;
        }
        self.count = self.count.saturating_add(1);
        self.last = now;
        if self.json.is_none() {
            self.json = Some(json.clone());
        }
        if refused {
            return Repeat::Counted;
        }
        self.due(COUNT_EVERY).map_or(Repeat::Counted, Repeat::Count)
    }

    /// The write of a count not written yet, when the last write was queued at least `spacing`
    /// ago; None when nothing is due.
    pub(super) fn due(&mut self, spacing: Duration) -> Option<Queued> {
        if self.count == self.written_count || self.written.elapsed() < spacing {
            return None;
        }
        // Kept at the first repeat, so there whenever a count is ahead.
        let event = self.json.clone()?;
        self.written = Instant::now();
        self.written_count = self.count;
        Some(Queued {
            key: self.key.clone(),
            write: Write::Count {
                count: self.count,
                first: self.first,
                last: self.last,
                event,
            },
        })
    }
}
