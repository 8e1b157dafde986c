//! Opening: the newest snapshot, then every log generation from its own on, in order.
//!
//! A compaction cuts to `log-<g+1>` before `snapshot-<g+1>` exists, so after a crash in between
//! the state is `snapshot-<g>` (or nothing for g = 0), `log-<g>` and `log-<g+1>`; after failed
//! compactions more logs may follow, always without a gap. Only the last log written to can end
//! in a torn frame: an older one was complete when the writer moved past it (newer logs after
//! a torn one are empty: a cut whose directory sync failed left its new log behind).

use std::fs;
use std::path::Path;

use crate::{LogError, Recovered, files, frame, io};

/// Reads the newest generation: (the generation appends go to, recovered, bytes of the logs
/// replayed, snapshot bytes).
pub(crate) fn recover(dir: &Path) -> Result<(u64, Recovered, u64, u64), LogError> {
    let listing = files::list(dir).map_err(io("list", dir))?;
    for tmp in &listing.temporaries {
        fs::remove_file(tmp).map_err(io("remove", tmp))?;
    }
    let base = listing.snapshots.last().copied().unwrap_or(0);
    let newest = listing.logs.last().copied().unwrap_or(base).max(base);
    if newest > base
        && let Some(missing) = (base..=newest).find(|g| !listing.logs.contains(g))
    {
        return Err(LogError::Inconsistent {
            dir: dir.to_path_buf(),
            what: format!(
                "log generation {missing} is missing between the newest snapshot ({base}) and log generation {newest}; refusing to guess what was removed"
            ),
        });
    }
    let mut recovered = Recovered::default();
    let mut snapshot_bytes = 0;
    if base > 0 {
        let path = files::snapshot_path(dir, base);
        let bytes = fs::read(&path).map_err(io("read", &path))?;
        snapshot_bytes = bytes.len() as u64;
        let (seq, entries) = read_snapshot(&path, &bytes)?;
        recovered.snapshot_seq = seq;
        recovered.snapshot = entries;
    }
    let mut log_bytes = 0;
    for generation in base..=newest {
        // A torn tail may be cut where nothing was written after it: in the newest log, or
        // one followed only by empty logs (a cut whose directory sync failed).
        let last_written = ((generation + 1)..=newest).all(|g| log_is_empty(dir, g));
        let listed = listing.logs.contains(&generation);
        log_bytes += replay(dir, generation, last_written, listed, &mut recovered)?;
    }
    for old in listing.logs.iter().filter(|g| **g < base) {
        let path = files::log_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    for old in listing.snapshots.iter().filter(|g| **g < base) {
        let path = files::snapshot_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    Ok((newest, recovered, log_bytes, snapshot_bytes))
}

/// Appends one log's records to `recovered`; cuts a torn tail off the last log written to.
/// Returns the log's good bytes (0 when it does not exist).
fn replay(
    dir: &Path,
    generation: u64,
    last_written: bool,
    listed: bool,
    recovered: &mut Recovered,
) -> Result<u64, LogError> {
    let log_path = files::log_path(dir, generation);
    let bytes = match fs::read(&log_path) {
        Ok(bytes) => bytes,
        // Only a log the listing did not show may be absent (a snapshot whose log was never
        // created); one that vanished since was removed under us.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !listed => return Ok(0),
        Err(e) => return Err(io("read", &log_path)(e)),
    };
    let corrupt = |source| LogError::Corrupt {
        path: log_path.clone(),
        source,
    };
    let frames = frame::read_frames(&bytes).map_err(corrupt)?;
    let mut at = 0;
    for payload in &frames.payloads {
        recovered
            .records
            .extend(frame::records(payload, at).map_err(corrupt)?);
        at += frame::HEADER + payload.len();
    }
    if frames.good_len < bytes.len() {
        if !last_written {
            return Err(LogError::Inconsistent {
                dir: dir.to_path_buf(),
                what: format!(
                    "log generation {generation} ends in a torn frame but a newer log follows it; refusing to drop what came after"
                ),
            });
        }
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
    Ok(frames.good_len as u64)
}

fn log_is_empty(dir: &Path, generation: u64) -> bool {
    fs::metadata(files::log_path(dir, generation)).is_ok_and(|m| m.len() == 0)
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
