//! The object store: every object as JSON under one cluster-wide resourceVersion sequence,
//! a history of changes for watches bounded in count and bytes, and optional durability
//! through [`durable_log`].
//!
//! Invariants:
//! - A change becomes visible (reads, lists, watches, the current resourceVersion) only once it
//!   is on disk. Until then it lives in `pending`/`overlay`, which later writes read so that
//!   read-modify-writes stay serial; the log's durability hook publishes it.
//! - So every resourceVersion a client can see is durable, and a restart continues the sequence
//!   after the highest one on disk: versions strictly increase across restarts.
//! - After a log failure every write is refused until the server is restarted.
//! - An object nested deeper than [`MAX_DEPTH`] is refused, so everything stored can be read back.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use durable_log::{Log, LogError};
use serde_json::Value;
use tokio::sync::broadcast;

use self::limits::etcd_size;
pub use self::limits::{MAX_DEPTH, MAX_OBJECT_BYTES, depth};
pub use crate::change::{Change, ChangeKind};
use crate::record::{self, encode, snapshot_entries};

mod limits;
mod open;
mod publish;
mod read;

use self::publish::{Released, publish};

/// Most changes a watcher of one resource may fall behind (see `Core::feed_capacity`).
const MAX_FEED: usize = 16_384;

/// How long a request naming a resourceVersion the store has not reached waits for it.
pub const FUTURE_VERSION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// What [`Store::write_change`] did.
#[derive(Debug)]
pub struct Written {
    /// The resulting object (the deleted one for a deletion); the current one when nothing
    /// changed.
    pub object: Option<Arc<Value>>,
    /// The change made, if any.
    pub change: Option<Arc<Change>>,
    /// The resourceVersion to pass to [`Store::wait_durable`] before answering.
    pub rv: u64,
}

/// Changes to replay plus the live feed.
pub type Resume = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// A watch cannot resume from a version older than the history: the oldest it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest version a watch can resume from.
    pub oldest: u64,
}

/// Why a continued list cannot read the objects at a resourceVersion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeError {
    /// Older than the history: the oldest version it can read.
    Gone(u64),
    /// Newer than anything visible: the current version.
    TooLarge(u64),
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data directory or its log could not be opened.
    #[error("failed to open the store: {0}")]
    Open(#[source] LogError),
    /// The data directory holds a log in the format of an older release.
    #[error(
        "failed to open the store: {0} is a log of an older volstack release; move the data directory away to start afresh"
    )]
    Legacy(PathBuf),
    /// A stored record does not parse.
    #[error("failed to replay the store: record for {key} does not parse: {source}")]
    Replay {
        /// The object key.
        key: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A stored record is not framed as the store writes them.
    #[error("failed to replay the store: {0}")]
    Malformed(&'static str),
    /// Queueing or writing the log failed; the store refuses writes from now on.
    #[error("storage failed: {0}")]
    Failed(#[source] LogError),
    /// The object is nested more deeply than the store can read back.
    #[error("the object is nested more than {MAX_DEPTH} levels deep")]
    TooDeep,
    /// The object is larger than etcd stores (what kube-apiserver answers then).
    #[error("etcdserver: request is too large")]
    TooLarge,
    /// The object could not be encoded.
    #[error("failed to encode the object: {0}")]
    Encode(#[source] serde_json::Error),
}

/// What a read-modify-write decided.
#[derive(Debug)]
pub enum Write2 {
    /// Store this object (create or replace).
    Put(Value),
    /// Remove the object.
    Delete,
    /// Nothing changes.
    Keep,
}

struct Pending {
    key: String,
    change: Arc<Change>,
    bytes: usize,
    /// The object as it is kept once published (None for a deletion).
    stored: Option<Stored>,
}

/// An object as kept: its JSON tree and its log record. A compaction's snapshot is made of
/// the records as they are, instead of encoding every object again (at 200,000 objects that
/// was 4.7% of the stack's CPU in the first 38 s of a storm). The records cost their size in
/// memory: 250 MB at those 200,000 objects, 0.31 to 0.38 GB more peak RSS in the benchmark's
/// stack (an in-memory store keeps none).
#[derive(Clone)]
struct Stored {
    object: Arc<Value>,
    record: Arc<[u8]>,
}

struct Inner {
    /// The last published (durable) resourceVersion.
    visible_rv: u64,
    /// The last assigned resourceVersion.
    next_rv: u64,
    objects: BTreeMap<String, Stored>,
    /// Written, not yet durable, in order.
    pending: VecDeque<Pending>,
    /// The newest pending state per key: (rv, object or None if deleted).
    overlay: HashMap<String, (u64, Option<Stored>)>,
    history: VecDeque<(Arc<Change>, usize)>,
    history_bytes: usize,
    /// Lowest resourceVersion a watch can resume from.
    compacted: u64,
    /// The live feed of each resource someone watches: a change wakes only the watchers of
    /// its resource. Made on the first subscription, dropped when a change finds no one left
    /// (a resource that no longer changes keeps its feed's 512 KiB until it does).
    feeds: HashMap<String, broadcast::Sender<Arc<Change>>>,
}

/// The record of every object of an in-memory store.
static NO_RECORD: std::sync::LazyLock<Arc<[u8]>> = std::sync::LazyLock::new(|| Arc::from([]));

impl Stored {
    /// A recovered object and the record it was read from.
    fn new(object: Value, record: Vec<u8>) -> Self {
        Stored {
            object: Arc::new(object),
            record: record.into(),
        }
    }
}

impl Inner {
    /// The newest version of the object at `key` (its pending write's, else the visible one)
    /// and the resourceVersion of that pending write (0 when none is pending).
    fn newest(&self, key: &str) -> (Option<Arc<Value>>, u64) {
        match self.overlay.get(key) {
            Some((rv, stored)) => (stored.as_ref().map(|s| s.object.clone()), *rv),
            None => (self.objects.get(key).map(|s| s.object.clone()), 0),
        }
    }

    /// A subscription to the changes of `resource` (made under the store's lock, so none is
    /// missed between a snapshot or history and the feed).
    fn subscribe(&mut self, resource: &str, capacity: usize) -> broadcast::Receiver<Arc<Change>> {
        match self.feeds.get(resource) {
            Some(feed) => feed.subscribe(),
            None => {
                let (feed, rx) = broadcast::channel(capacity);
                self.feeds.insert(resource.to_string(), feed);
                rx
            }
        }
    }
}

struct Core {
    inner: Mutex<Inner>,
    /// How many changes a watcher of one resource may fall behind before its watch ends (its
    /// client then resumes from the history). Each feed holds this many slots from the start
    /// (32 bytes each): 16,384 keeps a watched resource's feed at 512 KiB.
    feed_capacity: usize,
    /// The visible resourceVersion, for waiters on a version not reached yet.
    visible: tokio::sync::watch::Sender<u64>,
    history_cap: usize,
    history_budget: usize,
    /// Told of every change as it becomes visible (under the store's lock: they must be quick).
    observers: parking_lot::RwLock<Vec<Observer>>,
}

/// What [`Store::observe`] is given.
pub type Observer = Box<dyn Fn(&Change) + Send + Sync>;

/// The store.
pub struct Store {
    core: Arc<Core>,
    log: Option<Log>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

/// `group/plural\0namespace\0name`.
pub fn object_key(resource: &str, namespace: &str, name: &str) -> String {
    format!("{resource}\u{0}{namespace}\u{0}{name}")
}

/// Sizes of the watch history.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Most changes kept.
    pub count: usize,
    /// Most bytes of objects kept.
    pub bytes: usize,
}

impl Store {
    /// Tells `observer` of every change as it becomes visible, before any reader or watcher
    /// can see it (a write's answer comes after). Called under the store's lock: it must only
    /// note the change. Every observer added is told (authentication keeps what it found
    /// only while its observer reports no change: one left out would keep a deleted account's
    /// tokens valid).
    pub fn observe(&self, observer: Observer) {
        self.core.observers.write().push(observer);
    }

    /// The current (visible, durable) resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.core.inner.lock().visible_rv
    }

    /// Waits up to `timeout` for the store to make `rv` visible; whether it did. (A client may
    /// name a version just before it becomes visible; kube-apiserver waits 3 s for it.)
    pub async fn wait_visible(&self, rv: u64, timeout: std::time::Duration) -> bool {
        let mut visible = self.core.visible.subscribe();
        tokio::time::timeout(timeout, visible.wait_for(|v| *v >= rv))
            .await
            .is_ok_and(|reached| reached.is_ok())
    }

    /// Why the store refuses writes, if it does.
    pub fn failure(&self) -> Option<String> {
        self.log
            .as_ref()
            .and_then(Log::failure)
            .map(|reason| reason.to_string())
    }

    /// The newest version of one object, written but perhaps not yet durable: the version
    /// [`Store::write_change`] would decide on now. A read-modify-write (a patch) starts from it,
    /// so its resourceVersion is the one the write checks; [`Store::get`] may still give the
    /// version before, until the newest is on disk.
    pub fn newest(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let key = object_key(resource, namespace, name);
        self.core.inner.lock().newest(&key).0
    }

    /// Atomically reads an object (including writes not yet durable), lets `decide` choose what
    /// to write, and queues it with the next resourceVersion. Returns the resulting object (or
    /// the deleted one) and the resourceVersion to pass to [`Store::wait_durable`] before
    /// answering; the change is visible once that returns.
    pub fn write<E: From<StoreError>>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: impl FnOnce(Option<&Value>, u64) -> Result<Write2, E>,
    ) -> Result<(Option<Arc<Value>>, u64), E> {
        let written = self.write_change(resource, namespace, name, decide)?;
        Ok((written.object, written.rv))
    }

    /// [`Store::write`], also returning the change it made (none when nothing changed): an
    /// answer can send the change's JSON instead of writing the object again.
    pub fn write_change<E: From<StoreError>>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: impl FnOnce(Option<&Value>, u64) -> Result<Write2, E>,
    ) -> Result<Written, E> {
        self.refuse_after_failure()?;
        let key = object_key(resource, namespace, name);
        let mut inner = self.core.inner.lock();
        let (current, pending_rv) = inner.newest(&key);
        let next_rv = inner.next_rv + 1;
        let decision = decide(current.as_deref(), next_rv)?;
        let (kind, object, stored) = match decision {
            Write2::Keep => {
                return Ok(Written {
                    object: current,
                    change: None,
                    rv: pending_rv,
                });
            }
            Write2::Put(mut value) => {
                if depth(&value) > MAX_DEPTH {
                    return Err(StoreError::TooDeep.into());
                }
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), Value::String(next_rv.to_string()));
                }
                let object = Arc::new(value);
                let kind = if current.is_some() {
                    ChangeKind::Modified
                } else {
                    ChangeKind::Added
                };
                (kind, object.clone(), Some(object))
            }
            Write2::Delete => {
                let Some(old) = current.clone() else {
                    return Ok(Written {
                        object: None,
                        change: None,
                        rv: pending_rv,
                    });
                };
                let mut value = (*old).clone();
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), Value::String(next_rv.to_string()));
                }
                (ChangeKind::Deleted, Arc::new(value), None)
            }
        };
        let record = encode(&key, stored.as_deref()).map_err(StoreError::Encode)?;
        if record.len() > MAX_OBJECT_BYTES
            && stored
                .as_deref()
                .is_some_and(|o| etcd_size(o) > MAX_OBJECT_BYTES)
        {
            return Err(StoreError::TooLarge.into());
        }
        let bytes = record.len();
        // Watchers are sent the object's JSON: the record holds it, except a deletion's.
        let json: Cow<'_, [u8]> = match &stored {
            Some(_) => Cow::Borrowed(record::object_json(&record)),
            None => Cow::Owned(serde_json::to_vec(&*object).map_err(StoreError::Encode)?),
        };
        let change = Arc::new(
            Change::new(next_rv, kind, resource, namespace, object.clone(), current)
                .with_json(&json),
        );
        drop(json);
        // The record is kept for compactions; an in-memory store never compacts and shares
        // one empty record instead of allocating one per write.
        let stored = stored.map(|object| Stored {
            object,
            record: match &self.log {
                Some(_) => Arc::from(record.as_slice()),
                None => Arc::clone(&NO_RECORD),
            },
        });
        if let Some(log) = &self.log {
            log.append(next_rv, record).map_err(StoreError::Failed)?;
        }
        inner.next_rv = next_rv;
        inner.overlay.insert(key.clone(), (next_rv, stored.clone()));
        inner.pending.push_back(Pending {
            key,
            change: change.clone(),
            bytes,
            stored,
        });
        let released = match &self.log {
            None => publish(&self.core, &mut inner, next_rv),
            Some(log) if log.wants_compaction() => {
                // Under the lock only the records' handles are taken (no key or object is
                // copied); the snapshot is assembled on the compaction's thread.
                let published: Vec<Arc<[u8]>> =
                    inner.objects.values().map(|s| s.record.clone()).collect();
                let overlay: Vec<(String, Option<Arc<[u8]>>)> = inner
                    .overlay
                    .iter()
                    .map(|(k, (_, v))| (k.clone(), v.as_ref().map(|s| s.record.clone())))
                    .collect();
                log.compact(move || snapshot_entries(published, overlay))
                    .map_err(StoreError::Failed)?;
                Released::default()
            }
            Some(_) => Released::default(),
        };
        drop(inner);
        drop(released);
        Ok(Written {
            object: Some(object),
            change: Some(change),
            rv: next_rv,
        })
    }

    /// A dry run of [`Store::write_change`]: `decide` sees what a write would see now, and the
    /// answer is the object the write would leave (the deleted one for a deletion), checked as
    /// a write checks it (depth, size), with nothing stored, logged or sent to watchers. As
    /// kube-apiserver answers a dry run, the object keeps the resourceVersion it has (a new one
    /// has none). `change` is none; `rv` is the version the object was read at, which the
    /// answer waits for as a write that changes nothing does (it may not be durable yet).
    pub fn dry_run_change<E: From<StoreError>>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: impl FnOnce(Option<&Value>, u64) -> Result<Write2, E>,
    ) -> Result<Written, E> {
        self.refuse_after_failure()?;
        let key = object_key(resource, namespace, name);
        let ((current, read_rv), next_rv) = {
            let inner = self.core.inner.lock();
            (inner.newest(&key), inner.next_rv + 1)
        };
        let object = match decide(current.as_deref(), next_rv)? {
            Write2::Keep | Write2::Delete => current,
            Write2::Put(mut value) => {
                if depth(&value) > MAX_DEPTH {
                    return Err(StoreError::TooDeep.into());
                }
                // As a write: the JSON first (cheap), then the size etcd would be sent.
                let json_len = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
                if json_len > MAX_OBJECT_BYTES && etcd_size(&value) > MAX_OBJECT_BYTES {
                    return Err(StoreError::TooLarge.into());
                }
                let version = current
                    .as_deref()
                    .map(|c| c["metadata"]["resourceVersion"].clone());
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    match version {
                        Some(version) => meta.insert("resourceVersion".into(), version),
                        None => meta.remove("resourceVersion"),
                    };
                }
                Some(Arc::new(value))
            }
        };
        Ok(Written {
            object,
            change: None,
            rv: read_rv,
        })
    }

    /// After a failed log write, every write (and dry run) is refused.
    fn refuse_after_failure(&self) -> Result<(), StoreError> {
        match self.log.as_ref().and_then(Log::failure) {
            Some(reason) => Err(StoreError::Failed(LogError::Failed(reason))),
            None => Ok(()),
        }
    }

    /// Waits until `rv` is on disk and visible (no-op in memory).
    pub async fn wait_durable(&self, rv: u64) -> Result<(), StoreError> {
        match &self.log {
            Some(log) if rv > 0 => log.wait_durable(rv).await.map_err(StoreError::Failed),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
