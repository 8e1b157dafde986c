//! Crash tests of the log: reopen after drop, every compaction step interrupted, torn tails,
//! corruption before acknowledged data, and `kill -9` of a writing process at random instants.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use durable_log::{Log, LogError, Options, Recovered, files};

fn tiny() -> Options {
    Options {
        compact_min_bytes: 512,
        ..Options::default()
    }
}

/// A key-value state whose records are `key=value` (or `key=` to delete).
#[derive(Default, Clone)]
struct State(BTreeMap<String, String>);

impl State {
    fn apply(&mut self, record: &[u8]) {
        let text = String::from_utf8(record.to_vec()).unwrap();
        let (k, v) = text.split_once('=').unwrap();
        if v.is_empty() {
            self.0.remove(k);
        } else {
            self.0.insert(k.into(), v.into());
        }
    }

    fn from(recovered: &Recovered) -> State {
        let mut state = State::default();
        for entry in &recovered.snapshot {
            state.apply(entry);
        }
        for (_, record) in &recovered.records {
            state.apply(record);
        }
        state
    }

    fn entries(&self) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect()
    }
}

/// Writes `record` as `seq`, compacting when the log asks, and waits until it is durable.
async fn put(log: &Log, state: &Mutex<State>, seq: u64, record: &str) {
    {
        let mut state = state.lock().unwrap();
        state.apply(record.as_bytes());
        log.append(seq, record.as_bytes().to_vec()).unwrap();
        if log.wants_compaction() {
            let copy = state.clone();
            log.compact(Box::new(move || copy.entries())).unwrap();
        }
    }
    log.wait_durable(seq).await.unwrap();
}

fn open(dir: &Path) -> (Log, Recovered) {
    Log::open(dir, tiny(), Box::new(|_| {})).unwrap()
}

#[tokio::test]
async fn acknowledged_records_survive_a_reopen_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), 0);
    let state = Mutex::new(State::default());
    put(&log, &state, 1, "a=1").await;
    put(&log, &state, 2, "b=2").await;
    put(&log, &state, 5, "a=").await;
    drop(log);
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), 5);
    let seqs: Vec<u64> = recovered.records.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, vec![1, 2, 5]);
    assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
}

#[tokio::test]
async fn the_durable_hook_sees_every_batch_before_waiters_wake() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(0u64));
    let hook = seen.clone();
    let (log, _) = Log::open(
        dir.path(),
        tiny(),
        Box::new(move |seq| *hook.lock().unwrap() = seq),
    )
    .unwrap();
    for seq in 1..=20 {
        log.append(seq, b"k=v".to_vec()).unwrap();
        log.wait_durable(seq).await.unwrap();
        assert!(*seen.lock().unwrap() >= seq);
    }
    assert_eq!(log.durable(), 20);
}

#[tokio::test]
async fn compaction_bounds_the_log_and_keeps_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path());
    let state = Mutex::new(State::default());
    let mut seq = 0;
    for round in 0..50 {
        for key in 0..10 {
            seq += 1;
            put(&log, &state, seq, &format!("k{key}=round{round}")).await;
        }
    }
    // A last compaction of everything; dropping the log waits for it.
    let copy = state.lock().unwrap().clone();
    log.compact(Box::new(move || copy.entries())).unwrap();
    drop(log);
    let listing = files::list(dir.path()).unwrap();
    assert_eq!(listing.snapshots.len(), 1, "old snapshots are removed");
    assert_eq!(listing.logs.len(), 1, "old logs are removed");
    assert!(listing.snapshots[0] > 1, "compaction ran more than once");
    let (_log, recovered) = open(dir.path());
    assert!(!recovered.snapshot.is_empty());
    assert!(
        recovered.records.is_empty(),
        "{} records replayed",
        recovered.records.len()
    );
    assert_eq!(recovered.last_seq(), seq);
    assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
}

/// Copies the log's files as they are on disk now: what a `kill -9` at this instant leaves.
fn copy_files(from: &Path, to: &Path) {
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::test]
async fn appends_go_on_while_a_snapshot_is_written_and_a_crash_then_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path());
    let state = Mutex::new(State::default());
    put(&log, &state, 1, "a=1").await;
    put(&log, &state, 2, "b=2").await;
    // A snapshot that takes as long as the test wants.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (started, snapshot_started) = tokio::sync::oneshot::channel::<()>();
    let copy = state.lock().unwrap().clone();
    log.compact(Box::new(move || {
        let _ = started.send(());
        let _ = held.recv();
        copy.entries()
    }))
    .unwrap();
    snapshot_started.await.unwrap();
    // Appends are durable while the snapshot is still being made: they go to the next log.
    let more = async {
        put(&log, &state, 3, "c=3").await;
        put(&log, &state, 4, "a=").await;
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), more)
        .await
        .expect("appends waited for the snapshot");
    let listing = files::list(dir.path()).unwrap();
    assert_eq!(listing.logs, vec![0, 1]);
    assert!(listing.snapshots.is_empty());
    // A crash now: the old log and the new one hold every acknowledged record.
    let crashed = tempfile::tempdir().unwrap();
    copy_files(dir.path(), crashed.path());
    {
        let (_copy, recovered) = open(crashed.path());
        assert_eq!(recovered.last_seq(), 4);
        assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
    }
    // Appends after such a crash follow in the newest log, and a later compaction supersedes
    // both logs.
    {
        let (copy, _) = open(crashed.path());
        copy.append(5, b"d=5".to_vec()).unwrap();
        copy.wait_durable(5).await.unwrap();
        let entries = vec![b"b=2".to_vec(), b"c=3".to_vec(), b"d=5".to_vec()];
        copy.compact(Box::new(move || entries)).unwrap();
        copy.append(6, b"e=6".to_vec()).unwrap();
        copy.wait_durable(6).await.unwrap();
    }
    let listing = files::list(crashed.path()).unwrap();
    assert_eq!((listing.snapshots, listing.logs), (vec![2], vec![2]));
    let (_copy, recovered) = open(crashed.path());
    assert_eq!(recovered.snapshot_seq, 5);
    assert_eq!(State::from(&recovered).0.len(), 4);
    // The snapshot finishes: it covers the state at its cut, the new log what came after.
    release.send(()).unwrap();
    drop(log);
    let listing = files::list(dir.path()).unwrap();
    assert_eq!((listing.snapshots, listing.logs), (vec![1], vec![1]));
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.snapshot_seq, 2);
    let seqs: Vec<u64> = recovered.records.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, vec![3, 4]);
    assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
}

/// Appends half a frame to a log file, as a write cut off by a crash leaves; returns the file's
/// bytes before and after.
fn tear(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let good = fs::read(path).unwrap();
    let mut torn = good.clone();
    torn.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, b'x']);
    fs::write(path, &torn).unwrap();
    (good, torn)
}

/// Builds generation `g` on disk by hand: a snapshot of `snapshot` (if g > 0) and a log.
fn write_generation(dir: &Path, generation: u64, snapshot: &[(&str, u64)], log: &[(u64, &str)]) {
    // Use a real log to produce the bytes, then move its files into place.
    let scratch = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (l, _) = Log::open(scratch.path(), tiny(), Box::new(|_| {})).unwrap();
        if generation > 0 {
            let seq = snapshot.iter().map(|(_, s)| *s).max().unwrap_or(0);
            for (record, s) in snapshot {
                l.append(*s, record.as_bytes().to_vec()).unwrap();
            }
            l.wait_durable(seq).await.unwrap();
            let entries: Vec<Vec<u8>> = snapshot
                .iter()
                .map(|(r, _)| r.as_bytes().to_vec())
                .collect();
            l.compact(Box::new(move || entries)).unwrap();
            // A record after the compaction proves the switch happened.
            l.append(seq + 1, b"marker=1".to_vec()).unwrap();
            l.wait_durable(seq + 1).await.unwrap();
            drop(l);
            fs::copy(
                files::snapshot_path(scratch.path(), 1),
                files::snapshot_path(dir, generation),
            )
            .unwrap();
        } else {
            drop(l);
        }
    });
    let scratch2 = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let (l, _) = Log::open(scratch2.path(), tiny(), Box::new(|_| {})).unwrap();
        for (s, r) in log {
            l.append(*s, r.as_bytes().to_vec()).unwrap();
            l.wait_durable(*s).await.unwrap();
        }
        drop(l);
    });
    fs::copy(
        files::log_path(scratch2.path(), 0),
        files::log_path(dir, generation),
    )
    .unwrap();
}

#[test]
fn a_crash_before_the_snapshot_rename_keeps_the_old_generation() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0, &[], &[(1, "a=1"), (2, "b=2")]);
    fs::write(
        dir.path().join("snapshot-00000000000000000001.tmp"),
        b"half",
    )
    .unwrap();
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), 2);
    assert_eq!(State::from(&recovered).0.len(), 2);
    assert!(files::list(dir.path()).unwrap().temporaries.is_empty());
}

#[test]
fn a_crash_after_the_rename_uses_the_new_snapshot_without_its_log() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 1, &[("a=1", 1), ("b=2", 2)], &[(3, "c=3")]);
    write_generation(dir.path(), 2, &[("a=1", 1), ("b=2", 2), ("c=3", 3)], &[]);
    fs::remove_file(files::log_path(dir.path(), 2)).unwrap();
    let (log, recovered) = open(dir.path());
    assert_eq!(recovered.snapshot_seq, 3);
    assert_eq!(recovered.last_seq(), 3);
    assert_eq!(State::from(&recovered).0.len(), 3);
    drop(log);
    let listing = files::list(dir.path()).unwrap();
    assert_eq!(listing.snapshots, vec![2]);
    assert_eq!(listing.logs, vec![2]);
}

#[test]
fn a_crash_before_old_files_are_removed_reads_only_the_new_generation() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 1, &[("a=1", 1)], &[(2, "a=")]);
    write_generation(dir.path(), 2, &[("z=9", 2)], &[(3, "y=8")]);
    let (_log, recovered) = open(dir.path());
    let state = State::from(&recovered);
    assert_eq!(state.0.keys().cloned().collect::<Vec<_>>(), vec!["y", "z"]);
}

#[test]
fn a_log_without_its_snapshot_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0, &[], &[(1, "a=1")]);
    fs::copy(
        files::log_path(dir.path(), 0),
        files::log_path(dir.path(), 3),
    )
    .unwrap();
    let error = Log::open(dir.path(), tiny(), Box::new(|_| {})).unwrap_err();
    assert!(matches!(error, LogError::Inconsistent { .. }), "{error}");
}

#[test]
fn a_torn_frame_in_a_log_that_a_newer_one_follows_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0, &[], &[(1, "a=1")]);
    write_generation(dir.path(), 1, &[("a=1", 1)], &[(2, "b=2")]);
    fs::remove_file(files::snapshot_path(dir.path(), 1)).unwrap();
    let path = files::log_path(dir.path(), 0);
    let (_, bytes) = tear(&path);
    let error = Log::open(dir.path(), tiny(), Box::new(|_| {})).unwrap_err();
    assert!(matches!(error, LogError::Inconsistent { .. }), "{error}");
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was truncated");
}

#[test]
fn a_torn_tail_followed_only_by_an_empty_log_is_cut() {
    // What a cut whose directory sync failed leaves, if its new log could not be removed,
    // after a crash in a later append to the old log.
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0, &[], &[(1, "a=1"), (2, "b=2")]);
    let path = files::log_path(dir.path(), 0);
    let (good, _) = tear(&path);
    fs::write(files::log_path(dir.path(), 1), b"").unwrap();
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), 2);
    assert_eq!(State::from(&recovered).0.len(), 2);
    assert_eq!(fs::metadata(&path).unwrap().len(), good.len() as u64);
}

#[tokio::test]
async fn a_snapshot_that_panics_leaves_the_log_complete_and_compaction_possible_again() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path());
    let state = Mutex::new(State::default());
    put(&log, &state, 1, "a=1").await;
    log.compact(Box::new(|| -> Vec<Vec<u8>> {
        panic!("a snapshot closure that panics")
    }))
    .unwrap();
    // The log keeps taking records, and asks for a compaction again once the panicked one
    // is over and the new log has grown past the threshold.
    let mut seq = 1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !log.wants_compaction() {
        assert!(
            std::time::Instant::now() < deadline,
            "compaction was never wanted again"
        );
        seq += 1;
        let record = format!("k{}=v", seq % 7);
        state.lock().unwrap().apply(record.as_bytes());
        log.append(seq, record.into_bytes()).unwrap();
        log.wait_durable(seq).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let copy = state.lock().unwrap().clone();
    log.compact(Box::new(move || copy.entries())).unwrap();
    drop(log);
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), seq);
    assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
    assert!(
        recovered.snapshot_seq > 1,
        "the compaction after the panicked one installed its snapshot"
    );
}

/// A snapshot whose entries do not number what it announced is not installed: the log keeps
/// every record, and a reopen sees them all.
#[tokio::test]
async fn a_snapshot_short_of_its_count_is_not_installed() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path());
    let state = Mutex::new(State::default());
    for (seq, record) in [(1, "a=1"), (2, "b=2"), (3, "c=3")] {
        put(&log, &state, seq, record).await;
    }
    let entries = state.lock().unwrap().entries();
    log.compact(move || durable_log::Snapshot::new(entries.len() + 1, entries.into_iter()))
        .unwrap();
    drop(log);
    let listing = files::list(dir.path()).unwrap();
    assert_eq!(listing.logs, [0, 1], "the compaction ran: the log was cut");
    assert!(listing.snapshots.is_empty() && listing.temporaries.is_empty());
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.snapshot_seq, 0, "no snapshot was installed");
    assert!(recovered.snapshot.is_empty());
    assert_eq!(recovered.last_seq(), 3);
    assert_eq!(State::from(&recovered).0, state.lock().unwrap().0);
    assert!(files::list(dir.path()).unwrap().snapshots.is_empty());
}

#[test]
fn a_torn_tail_is_cut_and_later_appends_follow_the_good_records() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0, &[], &[(1, "a=1"), (2, "b=2")]);
    let path = files::log_path(dir.path(), 0);
    let (good, _) = tear(&path);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (log, recovered) = open(dir.path());
        assert_eq!(recovered.last_seq(), 2);
        assert_eq!(fs::metadata(&path).unwrap().len(), good.len() as u64);
        log.append(3, b"c=3".to_vec()).unwrap();
        log.wait_durable(3).await.unwrap();
    });
    let (_log, recovered) = open(dir.path());
    assert_eq!(recovered.last_seq(), 3);
    assert_eq!(State::from(&recovered).0.len(), 3);
}

#[test]
fn a_bad_frame_before_acknowledged_records_fails_the_open_instead_of_dropping_them() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(
        dir.path(),
        0,
        &[],
        &[(1, "first=1"), (2, "second=2"), (3, "third=3")],
    );
    let path = files::log_path(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    // The second frame's payload starts after the first frame (8 + 8 + 4 + 7 bytes).
    bytes[8 + 8 + 4 + 7 + 8 + 10] ^= 0x55;
    fs::write(&path, &bytes).unwrap();
    let error = Log::open(dir.path(), tiny(), Box::new(|_| {})).unwrap_err();
    assert!(matches!(error, LogError::Corrupt { .. }), "{error}");
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was truncated");
}

#[test]
fn an_incomplete_snapshot_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 1, &[("a=1", 1), ("b=2", 2)], &[]);
    let path = files::snapshot_path(dir.path(), 1);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let error = Log::open(dir.path(), tiny(), Box::new(|_| {})).unwrap_err();
    assert!(matches!(error, LogError::BadSnapshot { .. }), "{error}");
}

/// The child side of the kill -9 test: writes records until killed, printing each sequence
/// number once it is durable. Does nothing unless the parent set the variable.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var("DURABLE_LOG_CHILD_DIR") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (log, recovered) = open(Path::new(&dir));
        let log = Arc::new(log);
        let state = Arc::new(Mutex::new(State::from(&recovered)));
        let next = Arc::new(Mutex::new(recovered.last_seq()));
        let mut tasks = Vec::new();
        for writer in 0..4 {
            let (log, state, next) = (log.clone(), state.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0.. {
                    let seq = {
                        let mut state = state.lock().unwrap();
                        let mut next = next.lock().unwrap();
                        *next += 1;
                        let record = format!("w{writer}-{}={}", i % 50, *next);
                        state.apply(record.as_bytes());
                        log.append(*next, record.into_bytes()).unwrap();
                        if log.wants_compaction() {
                            let copy = state.clone();
                            log.compact(Box::new(move || copy.entries())).unwrap();
                        }
                        *next
                    };
                    log.wait_durable(seq).await.unwrap();
                    println!("{seq}");
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
    });
}

#[test]
fn kill_9_at_random_instants_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acknowledged = BTreeMap::new();
    for round in 0..6u64 {
        let mut child = Command::new(&exe)
            .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
            .env("DURABLE_LOG_CHILD_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Kill after a varying number of acknowledgements, so kills land in appends and in
        // compactions (the threshold is 512 bytes).
        let target = 50 + (round * 97) % 300;
        let mut seen = 0;
        while seen < target {
            let Some(Ok(line)) = lines.next() else { break };
            if let Ok(seq) = line.trim().parse::<u64>() {
                acknowledged.insert(seq, round);
                seen += 1;
            }
        }
        child.kill().unwrap();
        // Lines already printed before the kill are acknowledged too.
        for line in lines.map_while(Result::ok) {
            if let Ok(seq) = line.trim().parse::<u64>() {
                acknowledged.insert(seq, round);
            }
        }
        let _ = child.wait();
        assert!(seen > 0, "round {round}: the child acknowledged nothing");
        let (log, recovered) = open(dir.path());
        let state = State::from(&recovered);
        let values: std::collections::BTreeSet<u64> =
            state.0.values().map(|v| v.parse().unwrap()).collect();
        let last = recovered.last_seq();
        for seq in acknowledged.keys() {
            assert!(
                *seq <= last,
                "round {round}: acknowledged {seq} but the log ends at {last}"
            );
        }
        // Each key's value is the newest acknowledged write to it, never an older one.
        assert!(values.iter().all(|v| *v <= last));
        drop(log);
    }
}
