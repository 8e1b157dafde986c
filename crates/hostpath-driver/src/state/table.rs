//! The records of the volume table and the table itself: volumes, snapshots and group
//! snapshots with their indexes and capacity accounting. Pure: no I/O.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

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

/// Where a volume is staged by NodeStageVolume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedTarget {
    /// Staged as a block volume (nothing is mounted; the image is published directly).
    pub block: bool,
    /// `bind`, `symlink` or `none`.
    pub how: String,
}

/// What a volume was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentSource {
    /// Restored from this snapshot.
    #[serde(rename = "snapshot")]
    Snapshot(String),
    /// Cloned from this volume.
    #[serde(rename = "volume")]
    Volume(String),
}

/// One volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// NodeStageVolume state by staging path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub staged: BTreeMap<String, StagedTarget>,
    /// The snapshot or volume it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ContentSource>,
    /// Mutable parameters (ControllerModifyVolume).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mutable_parameters: BTreeMap<String, String>,
    /// The size the node's "filesystem" was last expanded to (NodeExpandVolume); None: the
    /// volume's capacity at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_bytes: Option<i64>,
    /// An empty mount volume whose directory is made when it is first staged or published
    /// (CreateVolume then writes nothing to disk but its record). False for volumes made before
    /// this existed: their directory was made with them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy_content: bool,
    /// A CSI ephemeral inline volume: made by NodePublishVolume under the id it was given,
    /// removed by NodeUnpublishVolume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

/// One snapshot: a copy of a volume's content at the time it was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// CSI snapshot id.
    pub id: String,
    /// CreateSnapshot name (the idempotency key).
    pub name: String,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// The source volume's size when taken (the smallest volume it restores into).
    pub size_bytes: i64,
    /// Taken of a block volume.
    pub block: bool,
    /// The source volume's capacity pool.
    pub kind: String,
    /// CreateSnapshot parameters.
    pub parameters: BTreeMap<String, String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// The group snapshot it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
}

/// One group snapshot: snapshots of several volumes taken together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// CSI group snapshot id.
    pub id: String,
    /// CreateVolumeGroupSnapshot name (the idempotency key).
    pub name: String,
    /// Its snapshots, one per source volume, in the order of `source_volume_ids`.
    pub snapshot_ids: Vec<String>,
    /// The volumes, sorted.
    pub source_volume_ids: Vec<String>,
    /// CreateVolumeGroupSnapshot parameters.
    pub parameters: BTreeMap<String, String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
}

/// A change to the table, as written to the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Insert or replace a volume.
    #[serde(rename = "put")]
    Put(VolumeRecord),
    /// Remove a volume.
    #[serde(rename = "delete")]
    Delete(String),
    /// Insert or replace a snapshot.
    #[serde(rename = "put_snapshot")]
    PutSnapshot(SnapshotRecord),
    /// Remove a snapshot.
    #[serde(rename = "delete_snapshot")]
    DeleteSnapshot(String),
    /// Insert or replace a group snapshot.
    #[serde(rename = "put_group")]
    PutGroup(GroupRecord),
    /// Remove a group snapshot (its snapshots are removed by their own changes).
    #[serde(rename = "delete_group")]
    DeleteGroup(String),
}

/// The in-memory table and its indexes. Pure: no I/O.
#[derive(Debug, Default, Clone)]
pub struct Table {
    volumes: BTreeMap<String, VolumeRecord>,
    by_name: HashMap<String, String>,
    used: HashMap<(String, Option<String>), i128>,
    attached: HashMap<String, usize>,
    /// Volumes being created: their name and capacity are taken, but they are not logged yet,
    /// so readers (ListVolumes, ControllerGetVolume, snapshots) do not see them.
    reserved: HashSet<String>,
    snapshots: BTreeMap<String, SnapshotRecord>,
    snapshot_by_name: HashMap<String, String>,
    groups: BTreeMap<String, GroupRecord>,
    group_by_name: HashMap<String, String>,
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
                    .or_default() += i128::from(record.capacity_bytes);
                for node in record.published.keys() {
                    *self.attached.entry(node.clone()).or_default() += 1;
                }
                self.by_name.insert(record.name.clone(), record.id.clone());
                self.volumes.insert(record.id.clone(), record);
            }
            Change::Delete(id) => self.forget(&id),
            Change::PutSnapshot(record) => {
                if let Some(old) = self.snapshots.get(&record.id)
                    && self.snapshot_by_name.get(&old.name) == Some(&old.id)
                {
                    self.snapshot_by_name.remove(&old.name);
                }
                self.snapshot_by_name
                    .insert(record.name.clone(), record.id.clone());
                self.snapshots.insert(record.id.clone(), record);
            }
            Change::DeleteSnapshot(id) => {
                if let Some(old) = self.snapshots.remove(&id)
                    && self.snapshot_by_name.get(&old.name) == Some(&id)
                {
                    self.snapshot_by_name.remove(&old.name);
                }
            }
            Change::PutGroup(record) => {
                self.group_by_name
                    .insert(record.name.clone(), record.id.clone());
                self.groups.insert(record.id.clone(), record);
            }
            Change::DeleteGroup(id) => {
                if let Some(old) = self.groups.remove(&id)
                    && self.group_by_name.get(&old.name) == Some(&id)
                {
                    self.group_by_name.remove(&old.name);
                }
            }
        }
    }

    /// Whether a volume still being made copies from `source` (its source must stay).
    pub fn copying_from(&self, source: &ContentSource) -> bool {
        self.reserved
            .iter()
            .filter_map(|id| self.volumes.get(id))
            .any(|r| r.source.as_ref() == Some(source))
    }

    /// Drops snapshots that name a group snapshot the table does not hold: a crash between
    /// logging a group's members and the group itself. Their copies become orphans, removed at
    /// start like any directory no record names. Returns how many were dropped.
    pub fn drop_incomplete_groups(&mut self) -> usize {
        let orphans: Vec<String> = self
            .snapshots
            .values()
            .filter(|s| {
                s.group_id
                    .as_ref()
                    .is_some_and(|g| !self.groups.contains_key(g))
            })
            .map(|s| s.id.clone())
            .collect();
        for id in &orphans {
            self.apply(Change::DeleteSnapshot(id.clone()));
        }
        orphans.len()
    }

    /// The snapshot with this id.
    pub fn snapshot(&self, id: &str) -> Option<&SnapshotRecord> {
        self.snapshots.get(id)
    }

    /// The snapshot created with this name.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshot_by_name
            .get(name)
            .and_then(|id| self.snapshots.get(id))
    }

    /// Snapshots with an id strictly greater than `after` ("" for all), ordered by id.
    pub fn snapshots_after<'a>(
        &'a self,
        after: &str,
    ) -> impl Iterator<Item = &'a SnapshotRecord> + 'a {
        use std::ops::Bound;
        let start = if after.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(after)
        };
        self.snapshots
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(_, s)| s)
    }

    /// The group snapshot with this id.
    pub fn group(&self, id: &str) -> Option<&GroupRecord> {
        self.groups.get(id)
    }

    /// The group snapshot created with this name.
    pub fn group_by_name(&self, name: &str) -> Option<&GroupRecord> {
        self.group_by_name
            .get(name)
            .and_then(|id| self.groups.get(id))
    }

    /// Every logged change that rebuilds this table (reservations left out).
    pub(crate) fn entries(&self) -> impl Iterator<Item = Change> + '_ {
        self.iter()
            .cloned()
            .map(Change::Put)
            .chain(self.snapshots.values().cloned().map(Change::PutSnapshot))
            .chain(self.groups.values().cloned().map(Change::PutGroup))
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

    /// The ids of volumes being created (reserved, not yet logged or cancelled).
    pub fn reserved_ids(&self) -> Vec<String> {
        self.reserved.iter().cloned().collect()
    }

    fn visible(&self, record: &VolumeRecord) -> bool {
        !self.reserved.contains(&record.id)
    }

    fn forget(&mut self, id: &str) {
        self.reserved.remove(id);
        if let Some(old) = self.volumes.remove(id) {
            if let Some(used) = self.used.get_mut(&(old.kind.clone(), old.node.clone())) {
                *used -= i128::from(old.capacity_bytes);
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

    /// Bytes used in a pool, at most `i64::MAX` (the sum is kept exact: volumes of any sizes
    /// a request or a Pod's attributes gave cannot overflow it).
    pub fn used(&self, kind: &str, node: Option<&str>) -> i64 {
        let used = self
            .used
            .get(&(kind.to_string(), node.map(str::to_string)))
            .copied()
            .unwrap_or(0);
        i64::try_from(used.max(0)).unwrap_or(i64::MAX)
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
