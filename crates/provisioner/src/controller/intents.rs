//! The intent log: before CreateVolume, the request is recorded in a Lease object
//! (annotation `volstack.dev/in-flight`), so that after a crash at any instant the next leader
//! knows every volume that may exist without a PV, and finishes or undoes it.
//!
//! - Sharded: a real API server refuses annotations over 256 KiB per object, so records are
//!   spread over Leases `<base>` (shard 0, the name earlier releases used), `<base>-1`,
//!   `<base>-2`, ...; a new record goes to the first shard with room under [`SHARD_BUDGET`]. Any
//!   number of volumes can be in flight (a driver outage with thousands of claims pending).
//! - Group commit: records waiting at that moment share one write per shard they touch.
//!   Removals ride along with the next write, or go out after a quiet period.
//! - Merge on conflict: on 409 the shard is read again and merged: records this process did not
//!   remove are kept (another writer's included), never overwritten.
//! - Fail closed: a stored annotation that does not parse stops the open (and any write to
//!   that shard) instead of being taken for empty.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use tokio::sync::{Notify, watch};

/// The annotation holding the records.
pub const ANNOTATION: &str = "volstack.dev/in-flight";
/// Bytes of records one shard holds at most (the API limit on annotations is 256 KiB).
pub const SHARD_BUDGET: usize = 200 * 1024;

pub use super::intent_record::Record;

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// API failure.
    #[error("failed to {action} the intent log: {source}")]
    Api {
        /// What was being done to the intent log (read, write).
        action: &'static str,
        /// The API server's error.
        source: kube::Error,
    },
    /// A shard's annotation does not parse: nothing is overwritten.
    #[error(
        "failed to read the intent log {lease}: its {ANNOTATION} annotation does not parse ({source}); refusing to overwrite records that may name existing volumes"
    )]
    Corrupt {
        /// The Lease.
        lease: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// One record does not fit in a shard.
    #[error(
        "failed to record volume {volume}: its record ({bytes} bytes) is larger than one intent log object may hold ({SHARD_BUDGET} bytes)"
    )]
    TooLarge {
        /// The volume.
        volume: String,
        /// The record's size.
        bytes: usize,
    },
    /// The shard holding the record could not be written (the writer retries).
    #[error("failed to write the intent log: {0}")]
    Write(String),
    /// The writer stopped.
    #[error("the intent log writer stopped")]
    Stopped,
}

/// One Lease's worth of records.
#[derive(Default)]
struct Shard {
    name: String,
    records: BTreeMap<String, Record>,
    /// Each record's size in the annotation (measured once, when it comes in).
    sizes: HashMap<String, usize>,
    bytes: usize,
    /// Removed here since the last successful write (a merge must not bring them back).
    removed: BTreeSet<String>,
    version: u64,
    /// The Lease as last read or written, so a write needs no read first.
    last: Option<Lease>,
}

struct State {
    shards: Vec<Shard>,
    shard_of: HashMap<String, usize>,
    waiters: usize,
}

/// Written version and last failure, per shard.
#[derive(Debug, Clone, Default)]
struct Written {
    versions: Vec<u64>,
    failures: Vec<Option<String>>,
}

/// The log.
pub struct IntentLog {
    api: Api<Lease>,
    base: String,
    state: Mutex<State>,
    dirty: Notify,
    written: watch::Sender<Written>,
}

impl std::fmt::Debug for IntentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentLog")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// Bytes a record takes in a shard's annotation.
fn record_size(volume: &str, record: &Record) -> usize {
    volume.len() + serde_json::to_string(record).map_or(0, |t| t.len()) + 4
}

impl Shard {
    /// Holds `record` for `volume`, `size` bytes in the annotation.
    fn put(&mut self, volume: &str, record: Record, size: usize) {
        self.take(volume);
        self.records.insert(volume.to_string(), record);
        self.sizes.insert(volume.to_string(), size);
        self.bytes += size;
    }

    /// Drops the record of `volume`, if any.
    fn take(&mut self, volume: &str) -> Option<Record> {
        let record = self.records.remove(volume)?;
        let size = self.sizes.remove(volume).unwrap_or(0);
        self.bytes = self.bytes.saturating_sub(size);
        Some(record)
    }
}

/// Shards the log may have: [`SHARD_BUDGET`] each, 800 MiB of records in all, far beyond any
/// number of volumes in flight. A Lease named past it is not one of the log's (a name like
/// `<base>-99999999999` would otherwise make the log allocate that many empty shards).
pub const MAX_SHARDS: usize = 4096;

/// The shard number of a Lease named `<base>` (0) or `<base>-<n>`, `n` below [`MAX_SHARDS`].
fn shard_number(base: &str, name: &str) -> Option<usize> {
    if name == base {
        return Some(0);
    }
    let n = name.strip_prefix(base)?.strip_prefix('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
        .filter(|n| *n > 0 && *n < MAX_SHARDS)
}

fn shard_name(base: &str, n: usize) -> String {
    if n == 0 {
        base.to_string()
    } else {
        format!("{base}-{n}")
    }
}

/// The records a Lease holds; an annotation that does not parse is an error, never empty.
fn stored_records(lease: &Lease) -> Result<BTreeMap<String, Record>, IntentError> {
    let Some(text) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
    else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(text).map_err(|source| IntentError::Corrupt {
        lease: lease.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// Merges what is stored with what this writer holds: its own records win, stored records it
/// did not remove are kept.
pub fn merge(
    stored: BTreeMap<String, Record>,
    mine: &BTreeMap<String, Record>,
    removed: &BTreeSet<String>,
) -> BTreeMap<String, Record> {
    let mut merged = mine.clone();
    for (volume, record) in stored {
        if !removed.contains(&volume) {
            merged.entry(volume).or_insert(record);
        }
    }
    merged
}

impl IntentLog {
    /// Reads every shard (creating nothing yet) and starts the writer. Fails when a shard
    /// does not parse.
    pub async fn open(
        client: kube::Client,
        namespace: &str,
        base: &str,
    ) -> Result<Arc<IntentLog>, IntentError> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let leases = api
            .list(&ListParams::default())
            .await
            .map_err(|source| IntentError::Api {
                action: "list",
                source,
            })?;
        let mut shards: Vec<Shard> = Vec::new();
        let mut shard_of = HashMap::new();
        for lease in leases.items {
            let Some(n) = lease
                .metadata
                .name
                .as_deref()
                .and_then(|name| shard_number(base, name))
            else {
                continue;
            };
            while shards.len() <= n {
                let name = shard_name(base, shards.len());
                shards.push(Shard {
                    name,
                    ..Shard::default()
                });
            }
            let records = stored_records(&lease)?;
            let shard = &mut shards[n];
            for (volume, record) in records {
                shard_of.insert(volume.clone(), n);
                let size = record_size(&volume, &record);
                shard.put(&volume, record, size);
            }
            shard.last = Some(lease);
        }
        if shards.is_empty() {
            shards.push(Shard {
                name: shard_name(base, 0),
                ..Shard::default()
            });
        }
        let (written, _) = watch::channel(Written {
            versions: vec![0; shards.len()],
            failures: vec![None; shards.len()],
        });
        let log = Arc::new(IntentLog {
            api,
            base: base.to_string(),
            state: Mutex::new(State {
                shards,
                shard_of,
                waiters: 0,
            }),
            dirty: Notify::new(),
            written,
        });
        tokio::spawn(log.clone().writer());
        Ok(log)
    }

    /// The records found at start (and since).
    pub fn records(&self) -> BTreeMap<String, Record> {
        let state = self.state.lock();
        state
            .shards
            .iter()
            .flat_map(|s| s.records.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }

    /// Records an intent and waits until it is stored.
    pub async fn record(&self, volume: &str, record: Record) -> Result<(), IntentError> {
        let size = record_size(volume, &record);
        if size > SHARD_BUDGET {
            return Err(IntentError::TooLarge {
                volume: volume.to_string(),
                bytes: size,
            });
        }
        let (shard, version) = {
            let mut state = self.state.lock();
            let index = match state.shard_of.get(volume) {
                Some(&i) => i,
                None => {
                    let room = state
                        .shards
                        .iter()
                        .position(|s| s.bytes + size <= SHARD_BUDGET);
                    let i = match room {
                        Some(i) => i,
                        None => {
                            let n = state.shards.len();
                            state.shards.push(Shard {
                                name: shard_name(&self.base, n),
                                ..Shard::default()
                            });
                            self.written.send_modify(|w| {
                                w.versions.push(0);
                                w.failures.push(None);
                            });
                            n
                        }
                    };
                    state.shard_of.insert(volume.to_string(), i);
                    i
                }
            };
            let shard = &mut state.shards[index];
            if shard.records.get(volume) != Some(&record) {
                shard.put(volume, record.clone(), size);
                shard.removed.remove(volume);
                shard.version += 1;
            }
            let version = shard.version;
            state.waiters += 1;
            (index, version)
        };
        let mut rx = self.written.subscribe();
        self.dirty.notify_one();
        let waited = rx
            .wait_for(|w| {
                w.versions.get(shard).is_some_and(|v| *v >= version)
                    || w.failures.get(shard).is_some_and(Option::is_some)
            })
            .await
            .map(|w| w.clone());
        self.state.lock().waiters -= 1;
        let written = waited.map_err(|_| IntentError::Stopped)?;
        if written.versions.get(shard).is_some_and(|v| *v >= version) {
            return Ok(());
        }
        let reason = written
            .failures
            .get(shard)
            .cloned()
            .flatten()
            .unwrap_or_default();
        Err(IntentError::Write(reason))
    }

    /// Forgets an intent. Not written by itself: removals ride along with the next write of
    /// their shard, or go out after a quiet period, so they cost no write per volume.
    pub fn forget(&self, volume: &str) {
        let mut state = self.state.lock();
        let Some(index) = state.shard_of.remove(volume) else {
            return;
        };
        let shard = &mut state.shards[index];
        if shard.take(volume).is_some() {
            shard.removed.insert(volume.to_string());
            shard.version += 1;
        }
        drop(state);
        // Wake the writer: with no record waiting it writes the removal after a quiet period.
        self.dirty.notify_one();
    }

    async fn writer(self: Arc<Self>) {
        let mut written: Vec<u64> = Vec::new();
        let mut removals_since: Option<tokio::time::Instant> = None;
        loop {
            let (dirty, waiting) = {
                let state = self.state.lock();
                written.resize(state.shards.len(), 0);
                let dirty: Vec<usize> = (0..state.shards.len())
                    .filter(|i| state.shards[*i].version > written[*i])
                    .collect();
                (dirty, state.waiters)
            };
            if dirty.is_empty() {
                self.dirty.notified().await;
                continue;
            }
            if waiting == 0 {
                // Only removals are pending: give a record up to ten seconds (from the first
                // pending removal, so a stream of removals cannot postpone them for ever) to
                // take them along.
                let due = *removals_since.get_or_insert_with(tokio::time::Instant::now)
                    + Duration::from_secs(10);
                if tokio::time::Instant::now() < due {
                    tokio::select! {
                        () = self.dirty.notified() => continue,
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
            }
            removals_since = None;
            let mut failed = false;
            for index in dirty {
                match self.write_shard(index).await {
                    Ok(version) => {
                        written[index] = version;
                        self.written.send_modify(|w| {
                            if let Some(v) = w.versions.get_mut(index) {
                                *v = version;
                            }
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "failed to write the intent log; retrying");
                        failed = true;
                        self.written.send_modify(|w| {
                            if let Some(f) = w.failures.get_mut(index) {
                                *f = Some(error.to_string());
                            }
                        });
                    }
                }
            }
            if failed {
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.written
                    .send_modify(|w| w.failures.iter_mut().for_each(|f| *f = None));
            }
        }
    }

    /// Writes one shard as it is now; returns the version written.
    async fn write_shard(&self, index: usize) -> Result<u64, IntentError> {
        let (name, version, mut records, removed, mut lease) = {
            let state = self.state.lock();
            let shard = &state.shards[index];
            (
                shard.name.clone(),
                shard.version,
                shard.records.clone(),
                shard.removed.clone(),
                shard.last.clone(),
            )
        };
        for _ in 0..5 {
            let text = serde_json::to_string(&records).map_err(|source| IntentError::Corrupt {
                lease: name.clone(),
                source,
            })?;
            let result = match lease.clone() {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            annotations: Some(BTreeMap::from([(ANNOTATION.to_string(), text)])),
                            ..Default::default()
                        },
                        spec: None,
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
                Some(mut lease) => {
                    lease.metadata.managed_fields = None;
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(ANNOTATION.to_string(), text);
                    self.api
                        .replace(&name, &PostParams::default(), &lease)
                        .await
                }
            };
            match result {
                Ok(stored) => {
                    self.written_shard(index, stored, &records, &removed);
                    return Ok(version);
                }
                Err(error)
                    if sidecar_kit::api_errors::is_conflict(&error)
                        || sidecar_kit::api_errors::is_already_exists(&error)
                        || sidecar_kit::api_errors::is_not_found(&error) =>
                {
                    // Someone else wrote it (or it was removed): read it again and merge.
                    lease = self
                        .api
                        .get_opt(&name)
                        .await
                        .map_err(|source| IntentError::Api {
                            action: "read",
                            source,
                        })?;
                    if let Some(fresh) = &lease {
                        records = merge(stored_records(fresh)?, &records, &removed);
                    }
                }
                Err(source) => {
                    return Err(IntentError::Api {
                        action: "write",
                        source,
                    });
                }
            }
        }
        Err(IntentError::Write(format!(
            "{name} kept changing under concurrent writers"
        )))
    }

    /// After a write: keep the Lease, adopt records merged in from other writers (so later
    /// writes keep them), and drop the removals that are now on the server.
    fn written_shard(
        &self,
        index: usize,
        stored: Lease,
        records: &BTreeMap<String, Record>,
        removed: &BTreeSet<String>,
    ) {
        let mut state = self.state.lock();
        let State {
            shards, shard_of, ..
        } = &mut *state;
        let shard = &mut shards[index];
        shard.last = Some(stored);
        for volume in removed {
            shard.removed.remove(volume);
        }
        for (volume, record) in records {
            if !shard.records.contains_key(volume)
                && !shard.removed.contains(volume)
                && !shard_of.contains_key(volume)
            {
                shard.put(volume, record.clone(), record_size(volume, record));
                shard_of.insert(volume.clone(), index);
            }
        }
    }
}

#[cfg(test)]
#[path = "intents_tests.rs"]
mod tests;
