//! Writing a compaction's snapshot beside the writer.
//!
//! The writer has already cut: appends go to `log-<g>` (`g` the new generation) and the state
//! up to sequence number `seq` is in the older generations. This thread writes
//! `snapshot-<g>.tmp` with the state at `seq`, fsyncs it, renames it to `snapshot-<g>`, fsyncs the
//! directory, and only then removes the generations before `g`. A crash before the rename
//! leaves the older generations and the logs after them, which recovery replays in turn; after
//! it, `snapshot-<g>` and `log-<g>` hold everything.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::{LogError, Shared, SnapshotFn, files, frame, io};

/// Snapshot entries per frame, roughly.
const SNAPSHOT_FRAME: usize = 1 << 20;

/// One snapshot to write.
pub(crate) struct Compaction {
    pub(crate) dir: PathBuf,
    /// The generation the snapshot starts (its log already takes the appends).
    pub(crate) generation: u64,
    /// The last sequence number the snapshot covers.
    pub(crate) seq: u64,
    pub(crate) shared: Arc<Shared>,
}

impl Compaction {
    pub(crate) fn run(self, snapshot: SnapshotFn) {
        // Cleared however this ends, a panicking snapshot closure included, so a later
        // compaction can start.
        let _running = Running(&self.shared);
        match self.write(snapshot) {
            Ok(size) => self
                .shared
                .threshold
                .store(self.shared.min_bytes.max(size * 2), Ordering::Relaxed),
            Err(error) => {
                // The next compaction comes once the new log has grown past the threshold.
                tracing::warn!(%error, "log compaction failed; the log keeps growing and is still complete");
            }
        }
    }

    /// Writes and installs the snapshot, then removes what it supersedes; returns its size.
    fn write(&self, snapshot: SnapshotFn) -> Result<u64, LogError> {
        let entries = snapshot();
        let final_path = files::snapshot_path(&self.dir, self.generation);
        let mut tmp_name = final_path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = self.dir.join(tmp_name);
        let installed = write_snapshot(&tmp, self.seq, &entries).and_then(|size| {
            fs::rename(&tmp, &final_path).map_err(io("rename", &final_path))?;
            files::sync_dir(&self.dir).map_err(io("sync", &self.dir))?;
            Ok(size)
        });
        let size = match installed {
            Ok(size) => size,
            Err(error) => {
                let _ = fs::remove_file(&tmp);
                return Err(error);
            }
        };
        self.remove_superseded();
        Ok(size)
    }

    /// Every snapshot and log of an older generation: the new snapshot and its log hold all.
    fn remove_superseded(&self) {
        let listing = match files::list(&self.dir) {
            Ok(listing) => listing,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "failed to list superseded log files; the next start removes them");
                return;
            }
        };
        let older = |g: &&u64| **g < self.generation;
        let paths = (listing.logs.iter().filter(older))
            .map(|g| files::log_path(&self.dir, *g))
            .chain(
                (listing.snapshots.iter().filter(older))
                    .map(|g| files::snapshot_path(&self.dir, *g)),
            );
        for path in paths {
            if let Err(error) = fs::remove_file(&path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), %error, "failed to remove a superseded log file");
            }
        }
        let _ = files::sync_dir(&self.dir);
    }
}

/// Clears the log's "compacting" flag when dropped.
struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.compacting.store(false, Ordering::Relaxed);
    }
}

fn write_snapshot(tmp: &Path, seq: u64, entries: &[Vec<u8>]) -> Result<u64, LogError> {
    let mut bytes = Vec::new();
    frame::push_frame(
        &mut bytes,
        &frame::snapshot_header(seq, entries.len() as u64),
    );
    let mut chunk = Vec::new();
    for entry in entries {
        frame::push_entry(&mut chunk, entry);
        if chunk.len() >= SNAPSHOT_FRAME {
            frame::push_frame(&mut bytes, &chunk);
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        frame::push_frame(&mut bytes, &chunk);
    }
    let mut file = files::create_private_file(tmp).map_err(io("create", tmp))?;
    file.write_all(&bytes).map_err(io("write", tmp))?;
    file.sync_all().map_err(io("sync", tmp))?;
    Ok(bytes.len() as u64)
}
