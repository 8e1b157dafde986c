//! Writing a compaction's snapshot beside the writer.
//!
//! The writer has already cut: appends go to `log-<g>` (`g` the new generation) and the state
//! up to sequence number `seq` is in the older generations. This thread writes
//! `snapshot-<g>.tmp` with the state at `seq`, fsyncs it, renames it to `snapshot-<g>`, fsyncs the
//! directory, and only then removes the generations before `g`. A crash before the rename
//! leaves the older generations and the logs after them, which recovery replays in turn; after
//! it, `snapshot-<g>` and `log-<g>` hold everything.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use crate::{LogError, Shared, SnapshotFn, files, frame, io};

/// The thread that writes the snapshots, started at the log's first compaction and kept while
/// the log is open: its CPU stays countable under the writer's name (a thread started for each
/// compaction took its figure with it when it ended). One compaction at a time: the writer
/// waits for the last one ([`Compactor::finish`]) before it cuts again.
pub(crate) struct Compactor {
    jobs: Option<mpsc::Sender<(Compaction, SnapshotFn)>>,
    done: mpsc::Receiver<()>,
    /// A compaction was handed over and has not reported back.
    busy: bool,
    thread: Option<JoinHandle<()>>,
}

impl Compactor {
    pub(crate) fn start(name: &'static str) -> std::io::Result<Self> {
        let (jobs, received) = mpsc::channel::<(Compaction, SnapshotFn)>();
        let (finished, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for (job, snapshot) in received {
                    // A snapshot closure that panics fails its compaction, not the later ones.
                    let run = std::panic::AssertUnwindSafe(|| job.run(snapshot));
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("a log compaction panicked; the log is still complete");
                    }
                    if finished.send(()).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Compactor {
            jobs: Some(jobs),
            done,
            busy: false,
            thread: Some(thread),
        })
    }

    /// Hands a compaction to the thread; false when it is gone (nothing was started).
    pub(crate) fn run(&mut self, job: Compaction, snapshot: SnapshotFn) -> bool {
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send((job, snapshot)).is_ok());
        self.busy = sent;
        sent
    }

    /// Waits for the compaction under way, if one is; false when the thread is gone.
    pub(crate) fn finish(&mut self) -> bool {
        if std::mem::take(&mut self.busy) && self.done.recv().is_err() {
            tracing::error!("the log's compaction thread stopped; the log is still complete");
            return false;
        }
        true
    }
}

/// The thread never outlives the log's writer: a log reopened in the same process must not
/// have older generations removed under it.
impl Drop for Compactor {
    fn drop(&mut self) {
        self.finish();
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

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
        use std::io::Write;
        let path = files::snapshot_path(&self.dir, self.generation);
        let snapshot = snapshot();
        let count = snapshot.count;
        let mut size = 0u64;
        files::write_private_atomic_with(&path, |file| {
            let mut made = 0u64;
            let entries = snapshot.entries.inspect(|_| made += 1);
            for frame in frame::snapshot_frames(self.seq, count, entries) {
                file.write_all(&frame)?;
                size += frame.len() as u64;
            }
            if made != count {
                // Removed, not installed: its header would not match its entries.
                return Err(std::io::Error::other(format!(
                    "the snapshot made {made} entries, not the {count} it announced"
                )));
            }
            Ok(())
        })
        .map_err(io("write", &path))?;
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
