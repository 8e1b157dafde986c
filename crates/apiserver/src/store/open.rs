//! Opening a store: an empty one in memory, or a durable one rebuilt from its log's snapshot
//! and the records after it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use durable_log::{Log, Options};
use parking_lot::Mutex;

use super::publish::publish_weak;
use super::{Core, HistoryLimits, Inner, MAX_FEED, Store, StoreError, Stored};
use crate::record::decode;

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
                    inner.objects.insert(key, Stored::new(object, entry));
                }
            }
            for (_, record) in recovered.records {
                let (key, object) = decode(&record)?;
                match object {
                    Some(object) => inner.objects.insert(key, Stored::new(object, record)),
                    None => inner.objects.remove(&key),
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
