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
    let mut logs = Vec::with_capacity(listing.logs.len());
    for generation in &listing.logs {
        let path = files::log_path(dir, *generation);
        let size = fs::metadata(&path).map_err(io("read", &path))?.len();
        logs.push((*generation, size));
    }
    let plan = plan(&listing.snapshots, &logs).map_err(|what| LogError::Inconsistent {
        dir: dir.to_path_buf(),
        what,
    })?;
    let mut recovered = Recovered::default();
    let mut snapshot_bytes = 0;
    if plan.base > 0 {
        let path = files::snapshot_path(dir, plan.base);
        let bytes = fs::read(&path).map_err(io("read", &path))?;
        snapshot_bytes = bytes.len() as u64;
        let (seq, entries) = read_snapshot(&path, &bytes)?;
        recovered.snapshot_seq = seq;
        recovered.snapshot = entries;
    }
    let mut log_bytes = 0;
    for step in &plan.logs {
        log_bytes += replay(dir, step, &mut recovered)?;
    }
    for old in listing.logs.iter().filter(|g| **g < plan.base) {
        let path = files::log_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    for old in listing.snapshots.iter().filter(|g| **g < plan.base) {
        let path = files::snapshot_path(dir, *old);
        fs::remove_file(&path).map_err(io("remove", &path))?;
    }
    Ok((plan.appends_to(), recovered, log_bytes, snapshot_bytes))
}

/// What an open reads.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The newest snapshot's generation (0: none).
    pub(crate) base: u64,
    /// The logs to replay, in order, from the base's on.
    pub(crate) logs: Vec<LogStep>,
}

impl Plan {
    /// The newest log's generation: appends go on there.
    fn appends_to(&self) -> u64 {
        self.logs.last().map_or(self.base, |step| step.generation)
    }
}

/// One log to replay.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LogStep {
    pub(crate) generation: u64,
    /// On disk when listed (only the base's own log may be absent: a snapshot whose log was
    /// never created). One that vanishes after the listing was removed under us: an error.
    pub(crate) listed: bool,
    /// Nothing was written after it (it is the newest, or only empty logs follow: a cut whose
    /// directory sync failed), so a torn last frame is a write never acknowledged.
    pub(crate) may_cut_tail: bool,
}

/// Which logs to replay, from the generations of the snapshots and of the logs (with their
/// sizes) on disk. Err names what is missing: a gap between the newest snapshot and the newest
/// log means files were removed by hand.
pub(crate) fn plan(snapshots: &[u64], logs: &[(u64, u64)]) -> Result<Plan, String> {
    let base = snapshots.iter().copied().max().unwrap_or(0);
    let newest = logs.iter().map(|(g, _)| *g).max().unwrap_or(base).max(base);
    let size = |g: u64| logs.iter().find(|(l, _)| *l == g).map(|(_, s)| *s);
    if newest > base
        && let Some(missing) = (base..=newest).find(|g| size(*g).is_none())
    {
        return Err(format!(
            "log generation {missing} is missing between the newest snapshot ({base}) and log generation {newest}; refusing to guess what was removed"
        ));
    }
    let steps = (base..=newest)
        .map(|generation| LogStep {
            generation,
            listed: size(generation).is_some(),
            may_cut_tail: ((generation + 1)..=newest).all(|g| size(g) == Some(0)),
        })
        .collect();
    Ok(Plan { base, logs: steps })
}

/// Appends one log's records to `recovered`; cuts a torn tail off the last log written to.
/// Returns the log's good bytes (0 when it does not exist).
fn replay(dir: &Path, step: &LogStep, recovered: &mut Recovered) -> Result<u64, LogError> {
    let generation = step.generation;
    let log_path = files::log_path(dir, generation);
    let bytes = match fs::read(&log_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !step.listed => return Ok(0),
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
        if !step.may_cut_tail {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step(generation: u64, listed: bool, may_cut_tail: bool) -> LogStep {
        LogStep {
            generation,
            listed,
            may_cut_tail,
        }
    }

    #[test]
    fn the_logs_replayed_run_from_the_newest_snapshot_without_gaps() {
        type Case = (
            &'static [u64],
            &'static [(u64, u64)],
            Result<(u64, Vec<LogStep>), u64>,
        );
        let cases: Vec<Case> = vec![
            // A new directory: log 0, not there yet.
            (&[], &[], Ok((0, vec![step(0, false, true)]))),
            // A snapshot whose log was never created (the layout before the cut came first).
            (&[2], &[], Ok((2, vec![step(2, false, true)]))),
            // Older generations are not replayed.
            (
                &[2],
                &[(1, 90), (2, 10)],
                Ok((2, vec![step(2, true, true)])),
            ),
            // A crash before the new snapshot's rename: its log follows the old one.
            (
                &[1],
                &[(1, 100), (2, 50)],
                Ok((1, vec![step(1, true, false), step(2, true, true)])),
            ),
            // A failed cut left an empty newer log: the older one was the last written to.
            (
                &[],
                &[(0, 100), (1, 0)],
                Ok((0, vec![step(0, true, true), step(1, true, true)])),
            ),
            (
                &[],
                &[(0, 100), (1, 0), (2, 8)],
                Ok((
                    0,
                    vec![
                        step(0, true, false),
                        step(1, true, false),
                        step(2, true, true),
                    ],
                )),
            ),
            // Gaps: files removed by hand.
            (&[], &[(0, 10), (3, 10)], Err(1)),
            (&[1], &[(2, 10)], Err(1)),
            (&[], &[(3, 10)], Err(0)),
        ];
        for (snapshots, logs, want) in cases {
            let got = plan(snapshots, logs);
            match want {
                Ok((base, steps)) => assert_eq!(
                    got,
                    Ok(Plan { base, logs: steps }),
                    "{snapshots:?} {logs:?}"
                ),
                Err(missing) => {
                    let what = got.unwrap_err();
                    assert!(
                        what.starts_with(&format!("log generation {missing} is missing")),
                        "{snapshots:?} {logs:?}: {what}"
                    );
                }
            }
        }
    }
}
