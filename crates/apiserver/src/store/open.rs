//! Opening a store: an empty one in memory, or a durable one rebuilt from its log's snapshot
//! and the records after it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use durable_log::{Log, Options};
use parking_lot::Mutex;

use super::publish::publish_weak;
use super::{Core, HistoryLimits, Inner, MAX_FEED, Store, StoreError, Stored};
use serde_json::Value;

use crate::record::{decode, encode};

impl Store {
    /// An in-memory store, or a durable one under `data_dir`.
    pub fn open(
        data_dir: Option<&Path>,
        history: HistoryLimits,
        log_options: Options,
    ) -> Result<Store, StoreError> {
        let core = Arc::new(Core {
            inner: Mutex::new(Inner {
                visible_rv: 0,
                next_rv: 0,
                objects: BTreeMap::new(),
                pending: VecDeque::new(),
                overlay: HashMap::new(),
                history: VecDeque::new(),
                history_bytes: 0,
                compacted: 0,
                feeds: HashMap::new(),
            }),
            feed_capacity: history.count.clamp(1024, MAX_FEED),
            visible: tokio::sync::watch::Sender::new(0),
            history_cap: history.count,
            history_budget: history.bytes,
            observers: parking_lot::RwLock::new(Vec::new()),
        });
        let Some(dir) = data_dir else {
            return Ok(Store { core, log: None });
        };
        for legacy in ["wal.jsonl", "snapshot.json"] {
            if dir.join(legacy).exists() {
                return Err(StoreError::Legacy(dir.join(legacy)));
            }
        }
        let weak = Arc::downgrade(&core);
        let (log, recovered) = Log::open(
            dir,
            log_options,
            Box::new(move |rv| publish_weak(&weak, rv)),
        )
        .map_err(StoreError::Open)?;
        {
            let mut inner = core.inner.lock();
            for entry in recovered.snapshot {
                let (key, object) = decode(&entry)?;
                if let Some(object) = object {
                    let (key, object, entry) = moved_event(key, object, entry)?;
                    inner.objects.insert(key, Stored::new(object, entry));
                }
            }
            for (_, record) in recovered.records {
                let (key, object) = decode(&record)?;
                match object {
                    Some(object) => {
                        let (key, object, record) = moved_event(key, object, record)?;
                        inner.objects.insert(key, Stored::new(object, record))
                    }
                    // A deletion an older release wrote of an Event it stored apart.
                    None => inner.objects.remove(&moved_key(&key).unwrap_or(key)),
                };
            }
            let rv = recovered.snapshot_seq.max(log.durable());
            inner.visible_rv = rv;
            inner.next_rv = rv;
            inner.compacted = rv;
            core.visible.send_replace(rv);
        }
        Ok(Store {
            core,
            log: Some(log),
        })
    }
}

/// The key prefix releases before 2026-11-29 stored events.k8s.io/v1 Events under, apart from
/// the core/v1 ones.
const EVENTS_V1_KEY: &str = "events.k8s.io/events\u{0}";

/// The core Events' key of an events.k8s.io/v1 Event a release before 2026-11-29 stored apart.
fn moved_key(key: &str) -> Option<String> {
    key.strip_prefix(EVENTS_V1_KEY)
        .map(|rest| format!("/events\u{0}{rest}"))
}

/// A recovered record as this release keeps it: an events.k8s.io/v1 Event a release before
/// 2026-11-29 stored apart is moved to the core Events, converted, with its record written
/// again for the new key (so a snapshot keeps it there). The log's old records stay until it
/// is compacted; each open moves them again, before the records that came after them. A core
/// Event of the same namespace and name becomes one object with it: in the snapshot the moved
/// one wins, among later records the later write.
fn moved_event(
    key: String,
    object: Value,
    record: Vec<u8>,
) -> Result<(String, Value, Vec<u8>), StoreError> {
    let Some(key) = moved_key(&key) else {
        return Ok((key, object, record));
    };
    let object = crate::event_versions::stored_core_event(object);
    let record = encode(&key, Some(&object)).map_err(StoreError::Encode)?;
    Ok((key, object, record))
}
