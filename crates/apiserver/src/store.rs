//! The object store: every object as JSON under one cluster-wide resourceVersion sequence,
//! a bounded history of changes for watches, and optional durability (a write-ahead log with
//! group commit, compacted into a snapshot).

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};

/// Change kinds, as watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// ADDED.
    Added,
    /// MODIFIED.
    Modified,
    /// DELETED.
    Deleted,
}

impl ChangeKind {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One change.
#[derive(Debug)]
pub struct Change {
    /// Its resourceVersion.
    pub rv: u64,
    /// Kind.
    pub kind: ChangeKind,
    /// Resource key (`group/plural`).
    pub resource: String,
    /// Namespace ("" for cluster scoped).
    pub namespace: String,
    /// The object (its last state for DELETED).
    pub object: Arc<Value>,
}

/// Changes to replay plus the live feed.
pub type Resume = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O on the data directory.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// What.
        action: &'static str,
        /// File.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The log cannot be written any more.
    #[error("storage failed: {0}")]
    Failed(String),
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
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

struct Inner {
    rv: u64,
    objects: BTreeMap<String, Arc<Value>>,
    history: VecDeque<Arc<Change>>,
    /// Lowest resourceVersion a watch can resume from.
    compacted: u64,
    log: Option<mpsc::UnboundedSender<(u64, String)>>,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Change>>,
    durable: watch::Receiver<(u64, Option<String>)>,
    history_cap: usize,
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

#[derive(serde::Serialize, serde::Deserialize)]
struct LogLine {
    rv: u64,
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    obj: Option<Value>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    rv: u64,
    objects: BTreeMap<String, Value>,
}

impl Store {
    /// An in-memory store, or a durable one under `data_dir`.
    pub fn open(data_dir: Option<&Path>, history_cap: usize) -> Result<Store, StoreError> {
        let (events, _) = broadcast::channel(history_cap.max(1024));
        let (durable_tx, durable_rx) = watch::channel((0u64, None::<String>));
        let mut inner = Inner {
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            log: None,
        };
        if let Some(dir) = data_dir {
            fs::create_dir_all(dir).map_err(io("create", dir))?;
            let snapshot_path = dir.join("snapshot.json");
            if let Ok(bytes) = fs::read(&snapshot_path) {
                let snapshot: Snapshot = serde_json::from_slice(&bytes)
                    .map_err(|e| io("parse", &snapshot_path)(std::io::Error::other(e)))?;
                inner.rv = snapshot.rv;
                inner.objects = snapshot
                    .objects
                    .into_iter()
                    .map(|(k, v)| (k, Arc::new(v)))
                    .collect();
            }
            let log_path = dir.join("wal.jsonl");
            let lines = replay(&log_path, &mut inner)?;
            inner.compacted = inner.rv;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(io("open", &log_path))?;
            let (tx, rx) = mpsc::unbounded_channel();
            inner.log = Some(tx);
            let committer = Committer {
                dir: dir.to_path_buf(),
                file,
                lines,
                durable: durable_tx,
            };
            let store = Store {
                inner: Mutex::new(inner),
                events,
                durable: durable_rx,
                history_cap,
            };
            std::thread::Builder::new()
                .name("apiserver-wal".into())
                .spawn(move || committer.run(rx))
                .map_err(io("start the log thread for", dir))?;
            return Ok(store);
        }
        drop(durable_tx);
        Ok(Store {
            inner: Mutex::new(inner),
            events,
            durable: durable_rx,
            history_cap,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The current resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// One object.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(&object_key(resource, namespace, name))
            .cloned()
    }

    /// Objects of a resource (in one namespace, or all), in key order, with the list's rv.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let items = objects_of(&inner, resource, namespace);
        (items, inner.rv)
    }

    /// Atomically reads an object, lets `decide` choose what to write, and writes it with the
    /// next resourceVersion. Returns the resulting object (or the deleted one) and the change.
    pub fn write<E>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: impl FnOnce(Option<&Value>, u64) -> Result<Write2, E>,
    ) -> Result<(Option<Arc<Value>>, u64), E> {
        let key = object_key(resource, namespace, name);
        let mut inner = self.lock();
        let current = inner.objects.get(&key).cloned();
        let next_rv = inner.rv + 1;
        let decision = decide(current.as_deref(), next_rv)?;
        let (kind, object) = match decision {
            Write2::Keep => return Ok((current, 0)),
            Write2::Put(mut value) => {
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), Value::String(next_rv.to_string()));
                }
                let object = Arc::new(value);
                let kind = if current.is_some() {
                    ChangeKind::Modified
                } else {
                    ChangeKind::Added
                };
                inner.objects.insert(key.clone(), object.clone());
                (kind, object)
            }
            Write2::Delete => {
                let Some(old) = inner.objects.remove(&key) else {
                    return Ok((None, 0));
                };
                let mut value = (*old).clone();
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), Value::String(next_rv.to_string()));
                }
                (ChangeKind::Deleted, Arc::new(value))
            }
        };
        inner.rv = next_rv;
        if let Some(log) = &inner.log {
            let line = LogLine {
                rv: next_rv,
                key: key.clone(),
                obj: (kind != ChangeKind::Deleted).then(|| (*object).clone()),
            };
            let text = serde_json::to_string(&line).unwrap_or_default();
            let _ = log.send((next_rv, text));
        }
        let change = Arc::new(Change {
            rv: next_rv,
            kind,
            resource: resource.to_string(),
            namespace: namespace.to_string(),
            object: object.clone(),
        });
        inner.history.push_back(change.clone());
        while inner.history.len() > self.history_cap {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        let _ = self.events.send(change);
        Ok((Some(object), next_rv))
    }

    /// Waits until `rv` is on disk (no-op in memory).
    pub async fn wait_durable(&self, rv: u64) -> Result<(), StoreError> {
        if rv == 0 || self.lock().log.is_none() {
            return Ok(());
        }
        let mut rx = self.durable.clone();
        let state = rx
            .wait_for(|(done, failed)| *done >= rv || failed.is_some())
            .await
            .map_err(|_| StoreError::Failed("log thread stopped".into()))?;
        match &state.1 {
            Some(reason) => Err(StoreError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// Changes after `rv` plus a live subscription, with no gap between them; Err(oldest) if
    /// `rv` is older than the history.
    pub fn watch_from(&self, rv: u64) -> Result<Resume, u64> {
        let inner = self.lock();
        if rv < inner.compacted {
            return Err(inner.compacted);
        }
        let backlog = inner
            .history
            .iter()
            .filter(|c| c.rv > rv)
            .cloned()
            .collect();
        Ok((backlog, self.events.subscribe()))
    }

    /// Current objects of a resource plus a live subscription, atomically.
    pub fn snapshot_and_watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
    ) -> (Vec<Arc<Value>>, u64, broadcast::Receiver<Arc<Change>>) {
        let inner = self.lock();
        let items = objects_of(&inner, resource, namespace);
        (items, inner.rv, self.events.subscribe())
    }

    /// Every object in a namespace (for namespace deletion), as (resource, name).
    pub fn in_namespace(&self, namespace: &str) -> Vec<(String, String)> {
        let inner = self.lock();
        inner
            .objects
            .keys()
            .filter_map(|k| {
                let mut parts = k.splitn(3, '\u{0}');
                let (r, ns, n) = (parts.next()?, parts.next()?, parts.next()?);
                (ns == namespace).then(|| (r.to_string(), n.to_string()))
            })
            .collect()
    }
}

/// Objects of a resource (in one namespace, or all), in key order.
fn objects_of(inner: &Inner, resource: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
    let prefix = match namespace {
        Some(ns) => format!("{resource}\u{0}{ns}\u{0}"),
        None => format!("{resource}\u{0}"),
    };
    inner
        .objects
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| v.clone())
        .collect()
}

fn replay(path: &Path, inner: &mut Inner) -> Result<usize, StoreError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io("read", path)(e)),
    };
    let mut good = 0;
    let mut lines = 0;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        let Some(body) = line.strip_suffix(b"\n") else {
            break;
        };
        let Ok(entry) = serde_json::from_slice::<LogLine>(body) else {
            break;
        };
        if entry.rv > inner.rv {
            inner.rv = entry.rv;
            match entry.obj {
                Some(obj) => {
                    inner.objects.insert(entry.key, Arc::new(obj));
                }
                None => {
                    inner.objects.remove(&entry.key);
                }
            }
        }
        good += line.len();
        lines += 1;
    }
    if good < bytes.len() {
        tracing::warn!(log = %path.display(), dropped = bytes.len() - good, "cutting an unacknowledged torn tail off the log");
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io("open", path))?;
        f.set_len(good as u64).map_err(io("truncate", path))?;
        f.sync_all().map_err(io("sync", path))?;
    }
    Ok(lines)
}

struct Committer {
    dir: PathBuf,
    file: File,
    lines: usize,
    durable: watch::Sender<(u64, Option<String>)>,
}

impl Committer {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<(u64, String)>) {
        let mut buffer = Vec::new();
        while let Some((rv, line)) = rx.blocking_recv() {
            buffer.clear();
            let mut last = rv;
            buffer.extend_from_slice(line.as_bytes());
            buffer.push(b'\n');
            let mut count = 1;
            while let Ok((rv, line)) = rx.try_recv() {
                last = rv;
                buffer.extend_from_slice(line.as_bytes());
                buffer.push(b'\n');
                count += 1;
            }
            let path = self.dir.join("wal.jsonl");
            let result = self
                .file
                .write_all(&buffer)
                .and_then(|()| self.file.sync_data());
            if let Err(error) = result {
                let reason = format!("failed to write {}: {error}", path.display());
                tracing::error!(%reason, "log write failed; refusing further writes");
                self.durable.send_modify(|d| d.1 = Some(reason));
                return;
            }
            self.lines += count;
            self.durable.send_modify(|d| d.0 = last);
        }
    }
}
