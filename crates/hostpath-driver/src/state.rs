//! The durable volume table.
//!
//! Layout under `--state-dir`:
//! - `volumes.json`: a snapshot of the whole table, replaced atomically (write, fsync, rename,
//!   fsync the directory);
//! - `journal.jsonl`: one line per change since the snapshot (`{"put":{..}}` or
//!   `{"delete":"id"}`), appended and fsynced by one committer thread that batches every change
//!   waiting at that moment (group commit);
//! - `volumes/<id>/`: the volume itself (a directory; block volumes hold a sparse `block.img`).
//!
//! A change is answered to the client only after its journal line is on disk, so a restart,
//! even after `kill -9`, sees every acknowledged volume. Lines after the first line that does
//! not parse were never acknowledged (their batch's fsync did not finish) and are cut off.
//! Replaying a journal line is idempotent, which makes the snapshot-then-truncate step safe.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

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
    /// The snapshot does not parse (the journal's torn tail is handled, a bad snapshot is not).
    #[error("failed to parse the volume snapshot {path}: {source}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
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

/// Where a volume is published by ControllerPublishVolume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// Published read-only.
    pub readonly: bool,
    /// The CSI access mode it was published with.
    pub access_mode: i32,
}

/// Where a volume is published by NodePublishVolume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTarget {
    /// Published read-only.
    pub readonly: bool,
    /// Published as a block device (a file) rather than a directory.
    pub block: bool,
    /// `bind` or `symlink`.
    pub how: String,
}

/// One volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// CSI volume id.
    pub id: String,
    /// CreateVolume name (the idempotency key).
    pub name: String,
    /// Size in bytes.
    pub capacity_bytes: i64,
    /// Capacity pool (class parameter `kind`; empty for the default pool).
    pub kind: String,
    /// Node the volume lives on; None when topology is disabled.
    pub node: Option<String>,
    /// Block (true) or mount (false) access type.
    pub block: bool,
    /// The CreateVolume parameters it was made with.
    pub parameters: BTreeMap<String, String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// ControllerPublishVolume state by node id.
    #[serde(default)]
    pub published: BTreeMap<String, Publication>,
    /// NodePublishVolume state by target path.
    #[serde(default)]
    pub targets: BTreeMap<String, NodeTarget>,
}

/// A change to the table, as written to the journal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Change {
    /// Insert or replace a volume.
    #[serde(rename = "put")]
    Put(VolumeRecord),
    /// Remove a volume.
    #[serde(rename = "delete")]
    Delete(String),
}

/// The in-memory table and its indexes. Pure: no I/O.
#[derive(Debug, Default, Clone)]
pub struct Table {
    volumes: BTreeMap<String, VolumeRecord>,
    by_name: HashMap<String, String>,
    used: HashMap<(String, Option<String>), i64>,
    attached: HashMap<String, usize>,
}

impl Table {
    /// Builds a table from records.
    pub fn from_records(records: impl IntoIterator<Item = VolumeRecord>) -> Self {
        let mut table = Table::default();
        for record in records {
            table.apply(Change::Put(record));
        }
        table
    }

    /// Applies a change, keeping the indexes and capacity accounting exact.
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::Put(record) => {
                self.forget(&record.id);
                *self
                    .used
                    .entry((record.kind.clone(), record.node.clone()))
                    .or_default() += record.capacity_bytes;
                for node in record.published.keys() {
                    *self.attached.entry(node.clone()).or_default() += 1;
                }
                self.by_name.insert(record.name.clone(), record.id.clone());
                self.volumes.insert(record.id.clone(), record);
            }
            Change::Delete(id) => self.forget(&id),
        }
    }

    fn forget(&mut self, id: &str) {
        if let Some(old) = self.volumes.remove(id) {
            if let Some(used) = self.used.get_mut(&(old.kind.clone(), old.node.clone())) {
                *used -= old.capacity_bytes;
            }
            for node in old.published.keys() {
                if let Some(count) = self.attached.get_mut(node) {
                    *count = count.saturating_sub(1);
                }
            }
            if self.by_name.get(&old.name).is_some_and(|v| v == id) {
                self.by_name.remove(&old.name);
            }
        }
    }

    /// The volume with this id.
    pub fn get(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.get(id)
    }

    /// The volume created with this name.
    pub fn by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.by_name.get(name).and_then(|id| self.volumes.get(id))
    }

    /// Bytes used in a pool.
    pub fn used(&self, kind: &str, node: Option<&str>) -> i64 {
        self.used
            .get(&(kind.to_string(), node.map(str::to_string)))
            .copied()
            .unwrap_or(0)
    }

    /// Volumes ControllerPublished to a node.
    pub fn attached(&self, node: &str) -> usize {
        self.attached.get(node).copied().unwrap_or(0)
    }

    /// All volumes, ordered by id.
    pub fn iter(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volumes.values()
    }

    /// Volumes with an id strictly greater than `after`, ordered by id.
    pub fn after<'a>(&'a self, after: &str) -> impl Iterator<Item = &'a VolumeRecord> + 'a {
        use std::ops::Bound;
        self.volumes
            .range::<str, _>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(_, v)| v)
    }

    /// Number of volumes.
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether there is no volume.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }
}

#[derive(Debug, Clone)]
struct Durability {
    seq: u64,
    failed: Option<Arc<str>>,
}

struct Inner {
    table: Table,
    next_seq: u64,
    tx: mpsc::UnboundedSender<(u64, Change)>,
}

/// The durable table: in-memory [`Table`] plus the journal committer.
pub struct Store {
    inner: Arc<Mutex<Inner>>,
    durable: watch::Receiver<Durability>,
    volumes_dir: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("volumes_dir", &self.volumes_dir)
            .finish_non_exhaustive()
    }
}

const SNAPSHOT: &str = "volumes.json";
const JOURNAL: &str = "journal.jsonl";

#[derive(Serialize, Deserialize)]
struct Snapshot {
    volumes: Vec<VolumeRecord>,
}

impl Store {
    /// Opens (or creates) the table under `dir`, replaying the journal, cutting a torn tail,
    /// and removing volume directories that no record names (left by a crash mid-create).
    pub fn open(dir: &Path, compact_after: usize) -> Result<Store, StoreError> {
        let volumes_dir = dir.join("volumes");
        fs::create_dir_all(&volumes_dir).map_err(io("create", &volumes_dir))?;
        let snapshot_path = dir.join(SNAPSHOT);
        let mut table = match fs::read(&snapshot_path) {
            Ok(bytes) => {
                let snapshot: Snapshot =
                    serde_json::from_slice(&bytes).map_err(|source| StoreError::Snapshot {
                        path: snapshot_path.clone(),
                        source,
                    })?;
                Table::from_records(snapshot.volumes)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::default(),
            Err(e) => return Err(io("read", &snapshot_path)(e)),
        };
        let journal_path = dir.join(JOURNAL);
        let journal_lines = replay_journal(&journal_path, &mut table)?;
        remove_orphans(&volumes_dir, &table);

        let journal = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(io("open", &journal_path))?;
        sync_dir(dir)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (durable_tx, durable_rx) = watch::channel(Durability {
            seq: 0,
            failed: None,
        });
        let store = Store {
            inner: Arc::new(Mutex::new(Inner {
                table,
                next_seq: 1,
                tx,
            })),
            durable: durable_rx,
            volumes_dir,
        };
        let committer = Committer {
            dir: dir.to_path_buf(),
            journal,
            journal_lines,
            compact_after,
            durable: durable_tx,
        };
        let snapshot_source = Arc::downgrade(&store.inner);
        std::thread::Builder::new()
            .name("volume-journal".into())
            .spawn(move || committer.run(rx, snapshot_source))
            .map_err(io("start the journal thread for", dir))?;
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Runs `f` on the table; the changes it returns are applied and queued for the journal
    /// in the same critical section, so journal order is table order. Returns the value and
    /// the sequence number to wait for with [`Store::wait_durable`].
    pub fn mutate<R, E>(
        &self,
        f: impl FnOnce(&Table) -> Result<(R, Vec<Change>), E>,
    ) -> Result<(R, u64), E> {
        let mut inner = self.lock();
        let (value, changes) = f(&inner.table)?;
        for change in changes {
            inner.table.apply(change.clone());
            let seq = inner.next_seq;
            inner.next_seq += 1;
            // The committer only stops when the store is dropped or failed; a failure is
            // reported to every waiter through `durable`.
            let _ = inner.tx.send((seq, change));
        }
        let wait_for = inner.next_seq - 1;
        Ok((value, wait_for))
    }

    /// Reads the table. The returned sequence number covers every change issued so far, so a
    /// reader that answers with a record can first wait until that record is durable.
    pub fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> (R, u64) {
        let inner = self.lock();
        (f(&inner.table), inner.next_seq - 1)
    }

    /// Waits until every change up to `seq` is on disk.
    pub async fn wait_durable(&self, seq: u64) -> Result<(), StoreError> {
        let mut rx = self.durable.clone();
        let state = rx
            .wait_for(|d| d.seq >= seq || d.failed.is_some())
            .await
            .map_err(|_| StoreError::Failed("the journal thread stopped".into()))?;
        match &state.failed {
            Some(reason) => Err(StoreError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// Whether the journal still accepts writes.
    pub fn healthy(&self) -> bool {
        self.durable.borrow().failed.is_none()
    }

    /// Directory of a volume.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.volumes_dir.join(id)
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    match inner.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn replay_journal(path: &Path, table: &mut Table) -> Result<usize, StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io("read", path)(e)),
    };
    let mut good_end = 0;
    let mut lines = 0;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        let Some(body) = line.strip_suffix(b"\n") else {
            break;
        };
        match serde_json::from_slice::<Change>(body) {
            Ok(change) => table.apply(change),
            Err(_) => break,
        }
        good_end += line.len();
        lines += 1;
    }
    if good_end < bytes.len() {
        tracing::warn!(
            journal = %path.display(),
            dropped_bytes = bytes.len() - good_end,
            "cutting an unacknowledged torn tail off the volume journal"
        );
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io("open", path))?;
        file.set_len(good_end as u64)
            .map_err(io("truncate", path))?;
        file.sync_all().map_err(io("sync", path))?;
    }
    Ok(lines)
}

fn remove_orphans(volumes_dir: &Path, table: &Table) {
    let Ok(entries) = fs::read_dir(volumes_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if table.get(&name).is_none() {
            tracing::info!(volume_id = %name, "removing the directory of a volume never acknowledged");
            if let Err(error) = fs::remove_dir_all(entry.path()) {
                tracing::warn!(volume_id = %name, %error, "failed to remove an orphaned volume directory");
            }
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

struct Committer {
    dir: PathBuf,
    journal: File,
    journal_lines: usize,
    compact_after: usize,
    durable: watch::Sender<Durability>,
}

impl Committer {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<(u64, Change)>, source: Weak<Mutex<Inner>>) {
        let mut batch = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            batch.clear();
            batch.push(first);
            while let Ok(next) = rx.try_recv() {
                batch.push(next);
            }
            let last_seq = batch.last().map_or(0, |(seq, _)| *seq);
            if let Err(error) = self.append(&batch) {
                self.fail(&error);
                return;
            }
            self.durable.send_modify(|d| d.seq = last_seq);
            if self.journal_lines >= self.compact_after {
                // Compaction failure is not fatal: the journal is still complete.
                if let Err(error) = self.compact(&source) {
                    tracing::warn!(%error, "volume table compaction failed; journal keeps growing");
                }
            }
        }
    }

    fn fail(&self, error: &StoreError) {
        tracing::error!(%error, "volume journal write failed; refusing further changes");
        let reason: Arc<str> = error.to_string().into();
        self.durable.send_modify(|d| d.failed = Some(reason));
    }

    fn append(&mut self, batch: &[(u64, Change)]) -> Result<(), StoreError> {
        let path = self.dir.join(JOURNAL);
        let mut buffer = Vec::with_capacity(batch.len() * 256);
        for (_, change) in batch {
            serde_json::to_writer(&mut buffer, change)
                .map_err(|e| io("encode a journal line for", &path)(std::io::Error::other(e)))?;
            buffer.push(b'\n');
        }
        self.journal
            .write_all(&buffer)
            .map_err(io("append to", &path))?;
        self.journal.sync_data().map_err(io("sync", &path))?;
        self.journal_lines += batch.len();
        Ok(())
    }

    fn compact(&mut self, source: &Weak<Mutex<Inner>>) -> Result<(), StoreError> {
        // The table may already hold changes still queued behind this batch; they are written
        // to the fresh journal next, and replaying them over the snapshot is harmless.
        let Some(inner) = source.upgrade() else {
            return Ok(());
        };
        let records: Vec<VolumeRecord> = lock(&inner).table.iter().cloned().collect();
        drop(inner);
        let tmp = self.dir.join("volumes.json.tmp");
        let file = File::create(&tmp).map_err(io("create", &tmp))?;
        let mut writer = BufWriter::new(file);
        serde_json::to_writer(&mut writer, &Snapshot { volumes: records })
            .map_err(|e| io("write", &tmp)(std::io::Error::other(e)))?;
        let file = writer
            .into_inner()
            .map_err(|e| io("write", &tmp)(e.into_error()))?;
        file.sync_all().map_err(io("sync", &tmp))?;
        let snapshot = self.dir.join(SNAPSHOT);
        fs::rename(&tmp, &snapshot).map_err(io("rename", &snapshot))?;
        sync_dir(&self.dir)?;
        let journal = self.dir.join(JOURNAL);
        self.journal.set_len(0).map_err(io("truncate", &journal))?;
        self.journal.sync_all().map_err(io("sync", &journal))?;
        self.journal_lines = 0;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(id: &str, name: &str, bytes: i64) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            name: name.into(),
            capacity_bytes: bytes,
            kind: String::new(),
            node: Some("n1".into()),
            block: false,
            parameters: BTreeMap::new(),
            created_ms: 1,
            published: BTreeMap::new(),
            targets: BTreeMap::new(),
        }
    }

    async fn put(store: &Store, r: VolumeRecord) {
        let ((), seq) = store
            .mutate(|_| Ok::<_, ()>(((), vec![Change::Put(r)])))
            .unwrap();
        store.wait_durable(seq).await.unwrap();
    }

    async fn delete(store: &Store, id: &str) {
        let ((), seq) = store
            .mutate(|_| Ok::<_, ()>(((), vec![Change::Delete(id.into())])))
            .unwrap();
        store.wait_durable(seq).await.unwrap();
    }

    fn ids(store: &Store) -> Vec<String> {
        store.read(|t| t.iter().map(|r| r.id.clone()).collect()).0
    }

    #[tokio::test]
    async fn acknowledged_changes_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        put(&store, record("a", "va", 10)).await;
        put(&store, record("b", "vb", 20)).await;
        delete(&store, "a").await;
        drop(store);
        let store = Store::open(dir.path(), 1000).unwrap();
        assert_eq!(ids(&store), vec!["b"]);
        assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 20);
        assert_eq!(
            store
                .read(|t| t.by_name("vb").map(|r| r.id.clone()))
                .0
                .as_deref(),
            Some("b")
        );
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_later_writes_append_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        put(&store, record("a", "va", 10)).await;
        drop(store);
        let journal = dir.path().join(JOURNAL);
        let mut bytes = fs::read(&journal).unwrap();
        bytes.extend_from_slice(b"{\"put\":{\"id\":\"b\",\"na");
        fs::write(&journal, &bytes).unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        assert_eq!(ids(&store), vec!["a"]);
        put(&store, record("c", "vc", 10)).await;
        drop(store);
        let store = Store::open(dir.path(), 1000).unwrap();
        assert_eq!(ids(&store), vec!["a", "c"]);
    }

    #[tokio::test]
    async fn garbage_in_the_middle_cuts_everything_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        put(&store, record("a", "va", 10)).await;
        drop(store);
        let journal = dir.path().join(JOURNAL);
        let mut bytes = fs::read(&journal).unwrap();
        bytes.extend_from_slice(&[0u8; 40]);
        bytes.push(b'\n');
        let good = serde_json::to_vec(&Change::Put(record("z", "vz", 1))).unwrap();
        bytes.extend_from_slice(&good);
        bytes.push(b'\n');
        fs::write(&journal, &bytes).unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        assert_eq!(ids(&store), vec!["a"]);
    }

    #[tokio::test]
    async fn orphan_volume_directories_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1000).unwrap();
        put(&store, record("kept", "v", 1)).await;
        fs::create_dir_all(store.volume_dir("kept")).unwrap();
        fs::create_dir_all(store.volume_dir("orphan")).unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1000).unwrap();
        assert!(store.volume_dir("kept").exists());
        assert!(!store.volume_dir("orphan").exists());
    }

    #[tokio::test]
    async fn compaction_writes_a_snapshot_and_empties_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 16).unwrap();
        for i in 0..40 {
            put(&store, record(&format!("v{i:02}"), &format!("n{i:02}"), 1)).await;
        }
        for i in 0..10 {
            delete(&store, &format!("v{i:02}")).await;
        }
        // Compaction runs on the committer thread right after a batch: give it a moment.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(dir.path().join(SNAPSHOT).exists());
        let journal_lines = fs::read_to_string(dir.path().join(JOURNAL))
            .unwrap()
            .lines()
            .count();
        assert!(journal_lines < 16, "journal has {journal_lines} lines");
        drop(store);
        let store = Store::open(dir.path(), 16).unwrap();
        assert_eq!(store.read(|t| t.len()).0, 30);
        assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 30);
    }

    #[tokio::test]
    async fn concurrent_writers_are_group_committed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), 100_000).unwrap());
        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                put(&store, record(&format!("v{i:03}"), &format!("n{i:03}"), 1)).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let lines = fs::read_to_string(dir.path().join(JOURNAL))
            .unwrap()
            .lines()
            .count();
        assert_eq!(lines, 200);
        drop(store);
        let store = Store::open(dir.path(), 100_000).unwrap();
        assert_eq!(store.read(|t| t.len()).0, 200);
    }
}
