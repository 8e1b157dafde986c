//! The durable volume table.
//!
//! Layout under `--state-dir` (0700; every file 0600):
//! - the [`durable_log`] files: a snapshot of the table and a log of changes since
//!   (`{"put":{..}}` or `{"delete":"id"}`, JSON), group-committed and fsynced;
//! - `volumes/<id>/`: the volume itself (a directory; block volumes hold a sparse `block.img`);
//! - `snapshots/<id>/`: a snapshot, a full copy of its volume's directory.
//!
//! A change is answered to the client only after it is on disk, so a restart, even after
//! `kill -9`, sees every acknowledged volume. A new volume is first *reserved* in the table (so
//! capacity and its name are taken) without a log record; its directory is made; only then is
//! its record logged. A crash in between leaves a directory no record names, which the next
//! start removes; never a record without its directory. Snapshots leave reservations out.

use parking_lot::Mutex;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_log::{Log, LogError, Options};

/// Why the table could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory or a file in it could not be used.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The log could not be opened, or a record in it does not parse.
    #[error("failed to open the volume log: {0}")]
    Open(#[source] LogError),
    /// A logged change does not parse.
    #[error("failed to replay the volume log: {0}")]
    Replay(#[source] serde_json::Error),
    /// The state directory was written by an older release.
    #[error(
        "failed to open the volume table: {0} is from an older release; move the state directory away to start afresh"
    )]
    Legacy(PathBuf),
    /// An earlier write failed; the table refuses further changes.
    #[error("the volume table cannot be written any more: {0}")]
    Failed(Arc<str>),
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

mod table;
pub use table::{
    Change, ContentSource, GroupRecord, NodeTarget, Publication, SnapshotRecord, StagedTarget,
    Table, VolumeRecord,
};

struct Inner {
    table: Table,
    next_seq: u64,
}

/// The durable table: in-memory [`Table`] plus the log.
pub struct Store {
    inner: Mutex<Inner>,
    /// Woken when a reservation is logged or cancelled.
    settled: tokio::sync::Notify,
    log: Log,
    volumes_dir: PathBuf,
    snapshots_dir: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("volumes_dir", &self.volumes_dir)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the table under `dir`, replaying the log, and removing volume
    /// directories that no record names (left by a crash mid-create).
    pub fn open(dir: &Path, options: Options) -> Result<Store, StoreError> {
        for legacy in ["volumes.json", "journal.jsonl"] {
            if dir.join(legacy).exists() {
                return Err(StoreError::Legacy(dir.join(legacy)));
            }
        }
        let (log, recovered) =
            Log::open(dir, options, Box::new(|_| {})).map_err(StoreError::Open)?;
        let volumes_dir = dir.join("volumes");
        durable_log::files::create_durable_private_dir(&volumes_dir)
            .map_err(io("create", &volumes_dir))?;
        let snapshots_dir = dir.join("snapshots");
        durable_log::files::create_durable_private_dir(&snapshots_dir)
            .map_err(io("create", &snapshots_dir))?;
        let mut table = Table::default();
        for entry in recovered
            .snapshot
            .iter()
            .chain(recovered.records.iter().map(|(_, r)| r))
        {
            let change: Change = serde_json::from_slice(entry).map_err(StoreError::Replay)?;
            table.apply(change);
        }
        let dropped = table.drop_incomplete_groups();
        if dropped > 0 {
            tracing::warn!(
                snapshots = dropped,
                "dropping the snapshots of a group snapshot that was never completed"
            );
        }
        remove_orphans(&volumes_dir, "volume", |id| table.get(id).is_some());
        remove_orphans(&snapshots_dir, "snapshot", |id| {
            table.snapshot(id).is_some()
        });
        Ok(Store {
            inner: Mutex::new(Inner {
                table,
                next_seq: recovered.last_seq() + 1,
            }),
            settled: tokio::sync::Notify::new(),
            log,
            volumes_dir,
            snapshots_dir,
        })
    }

    /// Runs `f` on the table; the changes it returns are applied and logged in the same
    /// critical section, so log order is table order. Returns the value and the sequence
    /// number to wait for with [`Store::wait_durable`].
    pub fn mutate<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Table) -> Result<(R, Vec<Change>), E>,
    ) -> Result<(R, u64), E> {
        let mut inner = self.inner.lock();
        let (value, changes) = f(&inner.table)?;
        for change in changes {
            self.log_change(&mut inner, &change)?;
            inner.table.apply(change);
        }
        Ok((value, inner.next_seq - 1))
    }

    fn log_change(&self, inner: &mut Inner, change: &Change) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(change).map_err(StoreError::Replay)?;
        self.log
            .append(inner.next_seq, bytes)
            .map_err(|e| StoreError::Failed(e.to_string().into()))?;
        inner.next_seq += 1;
        if self.log.wants_compaction() {
            let table = inner.table.clone();
            let pending = change.clone();
            self.log
                .compact(Box::new(move || snapshot_entries(table, pending)))
                .map_err(|e| StoreError::Failed(e.to_string().into()))?;
        }
        Ok(())
    }

    /// Like [`Store::mutate`] for one new volume, but the record is only reserved: the table
    /// holds it (its name and capacity are taken) and nothing is logged until
    /// [`Store::confirm`]; [`Store::cancel`] drops it.
    pub fn reserve<R, E>(
        &self,
        f: impl FnOnce(&Table) -> Result<(R, Option<VolumeRecord>), E>,
    ) -> Result<R, E> {
        let mut inner = self.inner.lock();
        let (value, record) = f(&inner.table)?;
        if let Some(record) = record {
            inner.table.reserve(record);
        }
        Ok(value)
    }

    /// Logs a reserved volume's record; returns the sequence number to wait for.
    pub fn confirm(&self, id: &str) -> Result<u64, StoreError> {
        let mut inner = self.inner.lock();
        let Some(record) = inner.table.reserved(id).cloned() else {
            return Ok(inner.next_seq - 1);
        };
        let change = Change::Put(record);
        let logged = match self.log_change(&mut inner, &change) {
            Ok(()) => {
                inner.table.apply(change);
                Ok(inner.next_seq - 1)
            }
            // The caller cancels the reservation, which wakes the listings waiting on it.
            Err(error) => Err(error),
        };
        drop(inner);
        self.settled.notify_waiters();
        logged
    }

    /// Drops a reserved volume that was never logged.
    pub fn cancel(&self, id: &str) {
        let mut inner = self.inner.lock();
        if inner.table.reserved(id).is_some() {
            inner.table.apply(Change::Delete(id.to_string()));
        }
        drop(inner);
        self.settled.notify_waiters();
    }

    /// Waits until none of `ids` is reserved any more: each was logged (and is listed) or
    /// cancelled (and was never made).
    pub async fn wait_settled(&self, ids: &[String]) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let pending = {
                let inner = self.inner.lock();
                ids.iter().any(|id| inner.table.reserved(id).is_some())
            };
            if !pending {
                return;
            }
            settled.await;
        }
    }

    /// Reads the table. The returned sequence number covers every change issued so far, so a
    /// reader that answers with a record can first wait until that record is durable.
    pub fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> (R, u64) {
        let inner = self.inner.lock();
        (f(&inner.table), inner.next_seq - 1)
    }

    /// Waits until every change up to `seq` is on disk.
    pub async fn wait_durable(&self, seq: u64) -> Result<(), StoreError> {
        self.log
            .wait_durable(seq)
            .await
            .map_err(|e| StoreError::Failed(e.to_string().into()))
    }

    /// Whether the log still accepts writes.
    pub fn healthy(&self) -> bool {
        self.log.failure().is_none()
    }

    /// Directory of a volume.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.volumes_dir.join(id)
    }

    /// Directory of a snapshot's copy.
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.snapshots_dir.join(id)
    }

    /// The directory holding the snapshots.
    pub fn snapshots_dir(&self) -> &Path {
        &self.snapshots_dir
    }

    /// The directory holding the volumes.
    pub fn volumes_dir(&self) -> &Path {
        &self.volumes_dir
    }
}

/// The snapshot: every logged record, plus the change being logged right now (the snapshot
/// is taken after it is appended).
fn snapshot_entries(mut table: Table, latest: Change) -> Vec<Vec<u8>> {
    table.apply(latest);
    table
        .entries()
        .filter_map(|change| serde_json::to_vec(&change).ok())
        .collect()
}

/// Removes directories no record names: left by a crash between copying or creating them and
/// logging their record, or between logging a deletion and removing them.
fn remove_orphans(dir: &Path, what: &str, known: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !known(&name) {
            tracing::info!(id = %name, what, "removing a directory no record names");
            if let Err(error) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(id = %name, what, %error, "failed to remove an orphaned directory");
            }
        }
    }
}

#[cfg(test)]
mod tests;
