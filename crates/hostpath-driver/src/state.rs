//! The durable volume table.
//!
//! Layout under `--state-dir` (0700; every file 0600):
//! - the [`durable_log`] files: a snapshot of the table and a log of changes since
//!   (`{"put":{..}}` or `{"delete":"id"}`, JSON), group-committed and fsynced;
//! - `volumes/<id>/`: the volume itself (a directory; block volumes hold a sparse `block.img`).
//!
//! A change is answered to the client only after it is on disk, so a restart, even after
//! `kill -9`, sees every acknowledged volume. A new volume is first *reserved* in the table (so
//! capacity and its name are taken) without a log record; its directory is made; only then is
//! its record logged. A crash in between leaves a directory no record names, which the next
//! start removes; never a record without its directory. Snapshots leave reservations out.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_log::{Log, LogError, Options};
use serde::{Deserialize, Serialize};

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
    /// Volumes being created: their name and capacity are taken, but they are not logged yet,
    /// so readers (ListVolumes, ControllerGetVolume, snapshots) do not see them.
    reserved: HashSet<String>,
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
                self.reserved.remove(&record.id);
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

    /// Takes a new volume's name and capacity without making it visible; a logged
    /// [`Change::Put`] of it makes it visible.
    pub fn reserve(&mut self, record: VolumeRecord) {
        let id = record.id.clone();
        self.apply(Change::Put(record));
        self.reserved.insert(id);
    }

    /// A reserved volume's record.
    pub fn reserved(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.get(id).filter(|_| self.reserved.contains(id))
    }

    fn visible(&self, record: &VolumeRecord) -> bool {
        !self.reserved.contains(&record.id)
    }

    fn forget(&mut self, id: &str) {
        self.reserved.remove(id);
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

    /// The volume with this id (not one still being created).
    pub fn get(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.get(id).filter(|r| self.visible(r))
    }

    /// The volume created with this name (one being created too: the name is taken).
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

    /// All volumes, ordered by id (not those still being created).
    pub fn iter(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volumes.values().filter(|r| self.visible(r))
    }

    /// Volumes with an id strictly greater than `after`, ordered by id.
    pub fn after<'a>(&'a self, after: &str) -> impl Iterator<Item = &'a VolumeRecord> + 'a {
        use std::ops::Bound;
        self.volumes
            .range::<str, _>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(_, v)| v)
            .filter(|r| self.visible(r))
    }

    /// Number of volumes (not those still being created).
    pub fn len(&self) -> usize {
        self.volumes.len() - self.reserved.len()
    }

    /// Whether there is no volume.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Inner {
    table: Table,
    next_seq: u64,
}

/// The durable table: in-memory [`Table`] plus the log.
pub struct Store {
    inner: Mutex<Inner>,
    log: Log,
    volumes_dir: PathBuf,
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
        durable_log::files::create_private_dir(&volumes_dir).map_err(io("create", &volumes_dir))?;
        let mut table = Table::default();
        for entry in recovered
            .snapshot
            .iter()
            .chain(recovered.records.iter().map(|(_, r)| r))
        {
            let change: Change = serde_json::from_slice(entry).map_err(StoreError::Replay)?;
            table.apply(change);
        }
        remove_orphans(&volumes_dir, &table);
        Ok(Store {
            inner: Mutex::new(Inner {
                table,
                next_seq: recovered.last_seq() + 1,
            }),
            log,
            volumes_dir,
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
            let records: Vec<VolumeRecord> = inner.table.iter().cloned().collect();
            let pending = change.clone();
            self.log
                .compact(Box::new(move || snapshot_entries(records, pending)))
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
        self.log_change(&mut inner, &change)?;
        inner.table.apply(change);
        Ok(inner.next_seq - 1)
    }

    /// Drops a reserved volume that was never logged.
    pub fn cancel(&self, id: &str) {
        let mut inner = self.inner.lock();
        if inner.table.reserved(id).is_some() {
            inner.table.apply(Change::Delete(id.to_string()));
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
}

/// The snapshot: every logged record, plus the change being logged right now (the snapshot
/// is taken after it is appended).
fn snapshot_entries(records: Vec<VolumeRecord>, latest: Change) -> Vec<Vec<u8>> {
    let mut table = Table::from_records(records);
    table.apply(latest);
    table
        .iter()
        .filter_map(|r| serde_json::to_vec(&Change::Put(r.clone())).ok())
        .collect()
}

fn remove_orphans(volumes_dir: &Path, table: &Table) {
    let Ok(entries) = std::fs::read_dir(volumes_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if table.get(&name).is_none() {
            tracing::info!(volume_id = %name, "removing the directory of a volume never acknowledged");
            if let Err(error) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(volume_id = %name, %error, "failed to remove an orphaned volume directory");
            }
        }
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

    fn open(dir: &Path, compact_min_bytes: u64) -> Store {
        Store::open(dir, Options { compact_min_bytes }).unwrap()
    }

    async fn put(store: &Store, r: VolumeRecord) {
        let ((), seq) = store
            .mutate(|_| Ok::<_, StoreError>(((), vec![Change::Put(r)])))
            .unwrap();
        store.wait_durable(seq).await.unwrap();
    }

    async fn delete(store: &Store, id: &str) {
        let ((), seq) = store
            .mutate(|_| Ok::<_, StoreError>(((), vec![Change::Delete(id.into())])))
            .unwrap();
        store.wait_durable(seq).await.unwrap();
    }

    fn ids(store: &Store) -> Vec<String> {
        store.read(|t| t.iter().map(|r| r.id.clone()).collect()).0
    }

    #[tokio::test]
    async fn acknowledged_changes_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), 1 << 20);
        put(&store, record("a", "va", 10)).await;
        put(&store, record("b", "vb", 20)).await;
        delete(&store, "a").await;
        drop(store);
        let store = open(dir.path(), 1 << 20);
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
    async fn a_reserved_volume_is_not_logged_until_confirmed_and_can_be_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), 1 << 20);
        store
            .reserve(|_| Ok::<_, StoreError>(((), Some(record("r", "vr", 5)))))
            .unwrap();
        store
            .reserve(|_| Ok::<_, StoreError>(((), Some(record("c", "vc", 5)))))
            .unwrap();
        // Reserved volumes hold their name and capacity in memory...
        assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 10);
        assert!(store.read(|t| t.by_name("vr").is_some()).0);
        // ...but readers (ListVolumes, ControllerGetVolume) do not see them before they are
        // logged: a crash now would make them vanish.
        assert_eq!(
            store
                .read(|t| (t.len(), t.iter().count(), t.get("r").is_none()))
                .0,
            (0, 0, true)
        );
        store.cancel("c");
        let seq = store.confirm("r").unwrap();
        store.wait_durable(seq).await.unwrap();
        assert_eq!(store.read(|t| (t.len(), t.get("r").is_some())).0, (1, true));
        store
            .reserve(|_| Ok::<_, StoreError>(((), Some(record("x", "vx", 5)))))
            .unwrap();
        drop(store);
        // ...but only a confirmed one is on disk.
        let store = open(dir.path(), 1 << 20);
        assert_eq!(ids(&store), vec!["r"]);
    }

    #[tokio::test]
    async fn orphan_volume_directories_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), 1 << 20);
        put(&store, record("kept", "v", 1)).await;
        std::fs::create_dir_all(store.volume_dir("kept")).unwrap();
        std::fs::create_dir_all(store.volume_dir("orphan")).unwrap();
        drop(store);
        let store = open(dir.path(), 1 << 20);
        assert!(store.volume_dir("kept").exists());
        assert!(!store.volume_dir("orphan").exists());
    }

    #[tokio::test]
    async fn compaction_keeps_the_table_and_leaves_reservations_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), 512);
        store
            .reserve(|_| Ok::<_, StoreError>(((), Some(record("reserved", "vr", 1)))))
            .unwrap();
        for i in 0..40 {
            put(&store, record(&format!("v{i:02}"), &format!("n{i:02}"), 1)).await;
        }
        for i in 0..10 {
            delete(&store, &format!("v{i:02}")).await;
        }
        drop(store);
        assert!(
            durable_log::files::list(dir.path())
                .unwrap()
                .snapshots
                .last()
                .copied()
                .unwrap_or(0)
                > 0,
            "compaction ran"
        );
        let store = open(dir.path(), 512);
        assert_eq!(store.read(|t| t.len()).0, 30);
        assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 30);
        assert!(store.read(|t| t.get("reserved").is_none()).0);
    }

    #[tokio::test]
    async fn concurrent_writers_are_all_durable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path(), 1 << 20));
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
        drop(store);
        let store = open(dir.path(), 1 << 20);
        assert_eq!(store.read(|t| t.len()).0, 200);
    }

    #[test]
    fn the_state_directory_and_its_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let store = open(&dir, 1 << 20);
        drop(store);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("volumes")), 0o700);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
            }
        }
    }
}
