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
    /// Its create request's body: it is made again from it, with the count so far, should it
    /// be gone when a count is written.
    json: Arc<[u8]>,
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
    /// A series whose Event (`key`, made with `json`) is queued now, at `now`.
    pub(super) fn new(key: ObjectKey, json: Arc<[u8]>, now: Timestamp) -> Series {
        let at = Instant::now();
        Series {
            key,
            json,
            count: 1,
            written_count: 1,
            last: now,
            written: at,
            started: at,
        }
    }

    /// The event happened again at `now`. While counts cannot be written (`refused`), an
    /// Event older than the series window gives way to a new one (`key`, made with `json`).
    pub(super) fn repeat(
        &mut self,
        now: Timestamp,
        refused: bool,
        key: &ObjectKey,
        json: &Arc<[u8]>,
    ) -> Repeat {
        if refused && self.started.elapsed() >= SERIES_WINDOW {
            *self = Series::new(key.clone(), json.clone(), now);
            return Repeat::Anew;
        }
        self.count = self.count.saturating_add(1);
        self.last = now;
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
        self.written = Instant::now();
        self.written_count = self.count;
        Some(Queued {
            key: self.key.clone(),
            write: Write::Count {
                count: self.count,
                last: self.last,
                event: self.json.clone(),
            },
        })
    }
}
