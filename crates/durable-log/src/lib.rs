//! The one crash-safe log, shared by the API server's object store and the reference driver's
//! volume journal.
//!
//! - Records are opaque bytes with a caller-chosen, strictly increasing sequence number.
//! - One writer thread takes every record waiting at that moment and writes them as one
//!   checksummed frame with one `write` and one fsync (group commit); then it calls the
//!   `on_durable` hook with the last sequence number and wakes [`Log::wait_durable`] waiters.
//!   Callers make a change visible only from that hook or after that wait.
//! - Compaction: the caller hands a closure that produces the whole state as entries, taken at
//!   the point in the record stream where [`Log::compact`] is called. The writer cuts there: it
//!   creates `log-<g+1>`, fsyncs the directory and appends to it from then on. A thread of its
//!   own (named like the writer, kept from the first compaction on) runs the closure, writes
//!   `snapshot-<g+1>.tmp`, fsyncs, renames it to `snapshot-<g+1>`, fsyncs the directory, and
//!   only then removes the older generations (`compaction`). Appends never wait for a
//!   snapshot. A crash before the rename leaves
//!   `snapshot-<g>` with `log-<g>` and `log-<g+1>`; after it, generation `g+1` whole.
//! - Recovery reads the newest snapshot and every log from its generation on (`recovery`).
//!   Only the newest log's last frame can be torn (cut off and truncated); a bad frame with
//!   data after it fails the open loudly instead of dropping the acknowledged records behind
//!   it. Start-up reads the live data plus about one compaction threshold of log (one more per
//!   compaction that failed or was cut short by a crash).
//! - After a failed write the log refuses every later append until reopened.
//! - Files are 0600 in a 0700 directory, created with those modes.

mod compaction;
pub mod files;
mod frame;
mod recovery;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use tokio::sync::watch;

pub use frame::FrameError;

/// Why the log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file or directory operation failed.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A log file holds a bad frame before acknowledged data; nothing was dropped.
    #[error("failed to replay {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where and what.
        source: FrameError,
    },
    /// A snapshot is incomplete or not a snapshot.
    #[error("failed to read the snapshot {path}: {what}")]
    BadSnapshot {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: &'static str,
    },
    /// A log generation newer than every snapshot: files were removed by hand.
    #[error("failed to open the log in {dir}: {what}")]
    Inconsistent {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// An earlier write failed; the log refuses writes until it is reopened.
    #[error("the log cannot be written any more: {0}")]
    Failed(Arc<str>),
    /// The writer thread is gone (the log is being dropped).
    #[error("the log's writer thread has stopped")]
    Stopped,
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LogError + 'a {
    move |source| LogError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// How the log batches, syncs and compacts.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Compaction is wanted once the current log holds this many bytes, or twice the last
    /// snapshot's size if that is larger.
    pub compact_min_bytes: u64,
    /// The name of the writer thread and of the compaction thread (at most 15 bytes are kept
    /// by Linux), so a process that holds several logs can tell their CPU apart.
    pub thread_name: &'static str,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            compact_min_bytes: 16 << 20,
            thread_name: "durable-log",
        }
    }
}

/// What was on disk at open.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The sequence number the snapshot was taken at (0 without a snapshot).
    pub snapshot_seq: u64,
    /// The snapshot's entries.
    pub snapshot: Vec<Vec<u8>>,
    /// Records after the snapshot, in order.
    pub records: Vec<(u64, Vec<u8>)>,
}

impl Recovered {
    /// The highest sequence number on disk.
    pub fn last_seq(&self) -> u64 {
        self.records
            .last()
            .map_or(self.snapshot_seq, |(seq, _)| *seq)
    }
}

/// Called on the writer thread with the last sequence number made durable, before waiters wake.
pub type OnDurable = Box<dyn Fn(u64) + Send>;
/// Produces the state as snapshot entries; runs on a thread of its own, while the writer goes
/// on appending to the next log generation.
pub type SnapshotFn = Box<dyn FnOnce() -> Snapshot + Send>;

/// A snapshot's entries, made one by one as they are written (a whole snapshot of a large
/// store is hundreds of MB): how many, then each.
pub struct Snapshot {
    count: u64,
    entries: Box<dyn Iterator<Item = Vec<u8>> + Send>,
}

impl Snapshot {
    /// `count` entries, from `entries`. If they turn out not to number `count`, the compaction
    /// fails: the snapshot is not installed and the log, complete, keeps growing.
    pub fn new(count: usize, entries: impl Iterator<Item = Vec<u8>> + Send + 'static) -> Self {
        Snapshot {
            count: count as u64,
            entries: Box::new(entries),
        }
    }

    /// How many entries it announces, and the entries as the log would write them.
    pub fn into_parts(self) -> (u64, impl Iterator<Item = Vec<u8>>) {
        (self.count, self.entries)
    }
}

impl From<Vec<Vec<u8>>> for Snapshot {
    fn from(entries: Vec<Vec<u8>>) -> Self {
        Snapshot::new(entries.len(), entries.into_iter())
    }
}

enum Msg {
    Record(u64, Vec<u8>),
    Compact(SnapshotFn),
}

#[derive(Debug, Clone)]
struct Progress {
    durable: u64,
    failed: Option<Arc<str>>,
}

struct Shared {
    progress: watch::Sender<Progress>,
    log_bytes: AtomicU64,
    threshold: AtomicU64,
    compacting: AtomicBool,
    min_bytes: u64,
}

/// The log. Dropping it stops the writer after it has written everything queued.
pub struct Log {
    tx: Option<mpsc::Sender<Msg>>,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    dir: PathBuf,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Log {
    /// Opens (or creates) the log in `dir` and starts its writer.
    pub fn open(
        dir: &Path,
        options: Options,
        on_durable: OnDurable,
    ) -> Result<(Log, Recovered), LogError> {
        files::create_durable_private_dir(dir).map_err(io("create", dir))?;
        let (generation, recovered, log_bytes, snapshot_bytes) = recovery::recover(dir)?;
        let log_path = files::log_path(dir, generation);
        let file = files::open_private_append(&log_path).map_err(io("open", &log_path))?;
        files::sync_dir(dir).map_err(io("sync", dir))?;
        let (progress, _) = watch::channel(Progress {
            durable: recovered.last_seq(),
            failed: None,
        });
        let shared = Arc::new(Shared {
            progress,
            log_bytes: AtomicU64::new(log_bytes),
            threshold: AtomicU64::new(options.compact_min_bytes.max(snapshot_bytes * 2)),
            compacting: AtomicBool::new(false),
            min_bytes: options.compact_min_bytes,
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            dir: dir.to_path_buf(),
            generation,
            file,
            last_seq: recovered.last_seq(),
            shared: shared.clone(),
            on_durable,
            thread_name: options.thread_name,
            compactor: None,
        };
        let handle = std::thread::Builder::new()
            .name(options.thread_name.into())
            .spawn(move || writer.run(&rx))
            .map_err(io("start the writer thread for", dir))?;
        Ok((
            Log {
                tx: Some(tx),
                shared,
                writer: Some(handle),
                dir: dir.to_path_buf(),
            },
            recovered,
        ))
    }

    /// Queues a record. Sequence numbers must strictly increase; call this in the order the
    /// changes were decided (under the caller's lock).
    pub fn append(&self, seq: u64, record: Vec<u8>) -> Result<(), LogError> {
        if let Some(reason) = self.failure() {
            return Err(LogError::Failed(reason));
        }
        self.send(Msg::Record(seq, record))
    }

    /// Whether the current log has grown past the compaction threshold and no compaction is
    /// queued.
    pub fn wants_compaction(&self) -> bool {
        !self.shared.compacting.load(Ordering::Relaxed)
            && self.shared.log_bytes.load(Ordering::Relaxed)
                >= self.shared.threshold.load(Ordering::Relaxed)
    }

    /// Queues a compaction. `snapshot` must describe exactly the state after every record
    /// appended before this call (capture it under the same lock as `append`).
    pub fn compact<S: Into<Snapshot>>(
        &self,
        snapshot: impl FnOnce() -> S + Send + 'static,
    ) -> Result<(), LogError> {
        self.shared.compacting.store(true, Ordering::Relaxed);
        self.send(Msg::Compact(Box::new(move || snapshot().into())))
    }

    fn send(&self, msg: Msg) -> Result<(), LogError> {
        match &self.tx {
            Some(tx) => tx.send(msg).map_err(|_| LogError::Stopped),
            None => Err(LogError::Stopped),
        }
    }

    /// Waits until every record up to `seq` is on disk.
    pub async fn wait_durable(&self, seq: u64) -> Result<(), LogError> {
        let mut rx = self.shared.progress.subscribe();
        let state = rx
            .wait_for(|p| p.durable >= seq || p.failed.is_some())
            .await
            .map_err(|_| LogError::Stopped)?;
        if state.durable >= seq {
            return Ok(());
        }
        match &state.failed {
            Some(reason) => Err(LogError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// The last sequence number on disk.
    pub fn durable(&self) -> u64 {
        self.shared.progress.borrow().durable
    }

    /// Why the log refuses writes, if it does.
    pub fn failure(&self) -> Option<Arc<str>> {
        self.shared.progress.borrow().failed.clone()
    }

    /// Bytes in the current log generation.
    pub fn log_bytes(&self) -> u64 {
        self.shared.log_bytes.load(Ordering::Relaxed)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Largest group commit, so one frame stays far below the 4 GiB a frame length can say.
const MAX_BATCH: usize = 64 << 20;

struct Writer {
    dir: PathBuf,
    generation: u64,
    file: File,
    last_seq: u64,
    shared: Arc<Shared>,
    on_durable: OnDurable,
    thread_name: &'static str,
    /// The thread writing snapshots, once there was a compaction.
    compactor: Option<compaction::Compactor>,
}

impl Writer {
    fn run(mut self, rx: &mpsc::Receiver<Msg>) {
        let mut payload = Vec::new();
        while let Ok(first) = rx.recv() {
            payload.clear();
            let mut last = None;
            let mut compaction = None;
            let mut next = Some(first);
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Record(seq, record) => {
                        frame::push_record(&mut payload, seq, &record);
                        last = Some(seq);
                    }
                    Msg::Compact(snapshot) => {
                        compaction = Some(snapshot);
                        break;
                    }
                }
                if payload.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            if let Some(seq) = last {
                if let Err(error) = self.write(&payload) {
                    self.fail(&error);
                    return;
                }
                self.last_seq = seq;
                (self.on_durable)(seq);
                self.shared.progress.send_modify(|p| p.durable = seq);
            }
            if let Some(snapshot) = compaction {
                self.start_compaction(snapshot);
            }
        }
    }

    /// Moves the appends to a new log generation at once and writes the snapshot of the state
    /// at the cut on a thread of its own ([`compaction`]): appends go on meanwhile.
    fn start_compaction(&mut self, snapshot: SnapshotFn) {
        // One at a time: the flag keeps callers from asking for another while one runs.
        self.finish_compaction();
        // The thread first: without it there is no cut (a cut with no snapshot behind it would
        // leave one more generation for every start-up to replay).
        if self.compactor.is_none() {
            match compaction::Compactor::start(self.thread_name) {
                Ok(compactor) => self.compactor = Some(compactor),
                Err(error) => {
                    tracing::warn!(%error, "log compaction could not start; the log keeps growing and is still complete");
                    self.postpone_compaction();
                    return;
                }
            }
        }
        let next = self.generation + 1;
        let log_path = files::log_path(&self.dir, next);
        let cut = files::open_private_append(&log_path)
            .map_err(io("create", &log_path))
            .and_then(|file| {
                files::sync_dir(&self.dir).map_err(io("sync", &self.dir))?;
                Ok(file)
            });
        let file = match cut {
            Ok(file) => file,
            Err(error) => {
                // The empty new log goes (recovery would also take it for nothing); the next
                // attempt waits for another threshold's worth of log instead of every append.
                let _ = std::fs::remove_file(&log_path);
                tracing::warn!(%error, "log compaction failed; the log keeps growing and is still complete");
                self.postpone_compaction();
                return;
            }
        };
        self.file = file;
        self.generation = next;
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        let job = compaction::Compaction {
            dir: self.dir.clone(),
            generation: next,
            seq: self.last_seq,
            shared: self.shared.clone(),
        };
        let started = self
            .compactor
            .as_mut()
            .is_some_and(|compactor| compactor.run(job, snapshot));
        if !started {
            // Its thread is gone: the next compaction starts another.
            tracing::warn!("the log's compaction thread has stopped; the log is still complete");
            self.compactor = None;
            self.shared.compacting.store(false, Ordering::Relaxed);
        }
    }

    /// No compaction now: the next is wanted once another threshold's worth of log is written,
    /// not at every append.
    fn postpone_compaction(&self) {
        let grown = self.shared.log_bytes.load(Ordering::Relaxed);
        let threshold = self.shared.threshold.load(Ordering::Relaxed);
        self.shared
            .threshold
            .store(grown.saturating_add(threshold), Ordering::Relaxed);
        self.shared.compacting.store(false, Ordering::Relaxed);
    }

    /// Waits for the compaction under way; a compaction thread found gone is dropped, so the
    /// next compaction starts another.
    fn finish_compaction(&mut self) {
        if let Some(compactor) = &mut self.compactor
            && !compactor.finish()
        {
            self.compactor = None;
        }
    }

    fn write(&mut self, payload: &[u8]) -> Result<(), LogError> {
        let path = files::log_path(&self.dir, self.generation);
        let mut buffer = Vec::with_capacity(payload.len() + frame::HEADER);
        frame::push_frame(&mut buffer, payload);
        self.file
            .write_all(&buffer)
            .map_err(io("append to", &path))?;
        self.file.sync_data().map_err(io("sync", &path))?;
        self.shared
            .log_bytes
            .fetch_add(buffer.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn fail(&self, error: &LogError) {
        tracing::error!(%error, "log write failed; refusing every later write until restarted");
        let reason: Arc<str> = error.to_string().into();
        self.shared
            .progress
            .send_modify(|p| p.failed = Some(reason));
    }
}
