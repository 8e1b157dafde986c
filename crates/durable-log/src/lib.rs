//! The one crash-safe log, shared by the API server's object store and the reference driver's
//! volume journal.
//!
//! - Records are opaque bytes with a caller-chosen, strictly increasing sequence number.
//! - One writer thread takes every record waiting at that moment and writes them as one
//!   checksummed frame with one `write` and one fsync (group commit); then it calls the
//!   `on_durable` hook with the last sequence number and wakes [`Log::wait_durable`] waiters.
//!   Callers make a change visible only from that hook or after that wait.
//! - Compaction: the caller hands a closure that produces the whole state as entries, taken at
//!   the point in the record stream where [`Log::compact`] is called. The writer writes it to
//!   `snapshot-<g+1>.tmp`, fsyncs, renames it to `snapshot-<g+1>`, creates `log-<g+1>`, fsyncs the
//!   directory, and only then removes generation `g`. A crash at any step leaves either
//!   generation `g` whole or generation `g+1` whole; opening picks the newest snapshot.
//! - Recovery reads the snapshot and the log after it. Only the last frame can be torn (cut
//!   off and truncated); a bad frame with data after it fails the open loudly instead of
//!   dropping the acknowledged records behind it. Start-up reads the live data plus at most one
//!   compaction threshold of log.
//! - After a failed write the log refuses every later append until reopened.
//! - Files are 0600 in a 0700 directory, created with those modes.

pub mod files;
mod frame;

use std::fs::{self, File};
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

/// Tuning.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Compaction is wanted once the current log holds this many bytes, or twice the last
    /// snapshot's size if that is larger.
    pub compact_min_bytes: u64,
    /// The name of the writer thread (at most 15 bytes are kept by Linux), so a process that
    /// holds several logs can tell their CPU apart.
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
/// Produces the state as snapshot entries; runs on the writer thread.
pub type SnapshotFn = Box<dyn FnOnce() -> Vec<Vec<u8>> + Send>;

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
        files::create_private_dir(dir).map_err(io("create", dir))?;
        let (generation, recovered, log_bytes, snapshot_bytes) = recover(dir)?;
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
    pub fn compact(&self, snapshot: SnapshotFn) -> Result<(), LogError> {
        self.shared.compacting.store(true, Ordering::Relaxed);
        self.send(Msg::Compact(snapshot))
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

/// Reads the newest generation: (generation, recovered, log bytes, snapshot bytes).
fn recover(dir: &Path) -> Result<(u64, Recovered, u64, u64), LogError> {
    let listing = files::list(dir).map_err(io("list", dir))?;
    for tmp in &listing.temporaries {
        fs::remove_file(tmp).map_err(io("remove", tmp))?;
    }
    let generation = listing.snapshots.last().copied().unwrap_or(0);
    if let Some(newer) = listing.logs.iter().find(|g| **g > generation) {
        return Err(LogError::Inconsistent {
            dir: dir.to_path_buf(),
            what: format!(
                "log generation {newer} has no snapshot (newest snapshot: {generation}); refusing to guess what was removed"
            ),
        });
    }
    let mut recovered = Recovered::default();
    let mut snapshot_bytes = 0;
    if generation > 0 {
        let path = files::snapshot_path(dir, generation);
        let bytes = fs::read(&path).map_err(io("read", &path))?;
        snapshot_bytes = bytes.len() as u64;
        let (seq, entries) = read_snapshot(&path, &bytes)?;
        recovered.snapshot_seq = seq;
        recovered.snapshot = entries;
    }
    let log_path = files::log_path(dir, generation);
    let log_bytes = match fs::read(&log_path) {
        Ok(bytes) => {
            let frames = frame::read_frames(&bytes).map_err(|source| LogError::Corrupt {
                path: log_path.clone(),
                source,
            })?;
            let mut at = 0;
            for payload in &frames.payloads {
                let records = frame::records(payload, at).map_err(|source| LogError::Corrupt {
                    path: log_path.clone(),
                    source,
                })?;
                recovered.records.extend(records);
                at += frame::HEADER + payload.len();
            }
            if frames.good_len < bytes.len() {
                tracing::warn!(
                    log = %log_path.display(),
                    cut_bytes = bytes.len() - frames.good_len,
                    "cutting a torn tail (a write that was never acknowledged) off the log"
                );
                let file = fs::OpenOptions::new()
                    .write(true)
                    .open(&log_path)
                    .map_err(io("open", &log_path))?;
                file.set_len(frames.good_len as u64)
                    .map_err(io("truncate", &log_path))?;
                file.sync_all().map_err(io("sync", &log_path))?;
            }
            frames.good_len as u64
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io("read", &log_path)(e)),
    };
    for old in listing.logs.iter().filter(|g| **g < generation) {
        let path = files::log_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    for old in listing.snapshots.iter().filter(|g| **g < generation) {
        let path = files::snapshot_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    Ok((generation, recovered, log_bytes, snapshot_bytes))
}

fn read_snapshot(path: &Path, bytes: &[u8]) -> Result<(u64, Vec<Vec<u8>>), LogError> {
    let bad = |what| LogError::BadSnapshot {
        path: path.to_path_buf(),
        what,
    };
    let frames = frame::read_frames(bytes).map_err(|source| LogError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    if frames.good_len != bytes.len() {
        return Err(bad("the file ends inside a frame"));
    }
    let Some((header, rest)) = frames.payloads.split_first() else {
        return Err(bad("no header"));
    };
    let (seq, count) = frame::parse_snapshot_header(header).ok_or_else(|| bad("bad header"))?;
    let mut entries = Vec::new();
    for payload in rest {
        entries.extend(
            frame::entries(payload, 0).map_err(|_| bad("a frame does not hold whole entries"))?,
        );
    }
    if entries.len() as u64 != count {
        return Err(bad("fewer or more entries than its header says"));
    }
    Ok((seq, entries))
}

/// Largest group commit, so one frame stays far below the 4 GiB a frame length can say.
const MAX_BATCH: usize = 64 << 20;
/// Snapshot entries per frame, roughly.
const SNAPSHOT_FRAME: usize = 1 << 20;

struct Writer {
    dir: PathBuf,
    generation: u64,
    file: File,
    last_seq: u64,
    shared: Arc<Shared>,
    on_durable: OnDurable,
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
                let log_bytes = self.shared.log_bytes.load(Ordering::Relaxed);
                match self.compact(snapshot) {
                    Ok(snapshot_bytes) => self.shared.threshold.store(
                        self.shared.min_bytes.max(snapshot_bytes * 2),
                        Ordering::Relaxed,
                    ),
                    Err(error) => {
                        tracing::warn!(%error, "log compaction failed; the log keeps growing and is still complete");
                        let threshold = self.shared.threshold.load(Ordering::Relaxed);
                        self.shared
                            .threshold
                            .store(log_bytes + threshold, Ordering::Relaxed);
                    }
                }
                self.shared.compacting.store(false, Ordering::Relaxed);
            }
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

    /// Writes generation g+1 and switches to it; returns the snapshot's size.
    fn compact(&mut self, snapshot: SnapshotFn) -> Result<u64, LogError> {
        let entries = snapshot();
        let next = self.generation + 1;
        let final_path = files::snapshot_path(&self.dir, next);
        let mut tmp_name = final_path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = self.dir.join(tmp_name);
        let written = self.write_snapshot(&tmp, &entries);
        let size = match written {
            Ok(size) => size,
            Err(error) => {
                let _ = fs::remove_file(&tmp);
                return Err(error);
            }
        };
        fs::rename(&tmp, &final_path).map_err(io("rename", &final_path))?;
        let log_path = files::log_path(&self.dir, next);
        let file = files::open_private_append(&log_path).map_err(io("create", &log_path))?;
        files::sync_dir(&self.dir).map_err(io("sync", &self.dir))?;
        let old = self.generation;
        self.file = file;
        self.generation = next;
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        for path in [
            files::log_path(&self.dir, old),
            files::snapshot_path(&self.dir, old),
        ] {
            if let Err(error) = fs::remove_file(&path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), %error, "failed to remove a superseded log file");
            }
        }
        let _ = files::sync_dir(&self.dir);
        Ok(size)
    }

    fn write_snapshot(&self, tmp: &Path, entries: &[Vec<u8>]) -> Result<u64, LogError> {
        let mut bytes = Vec::new();
        frame::push_frame(
            &mut bytes,
            &frame::snapshot_header(self.last_seq, entries.len() as u64),
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
}
