//! The thread that writes the log's snapshots: one, kept from the first compaction on and named
//! like the writer, so a process can count the log's CPU by thread name (a thread that ends
//! takes its CPU figure with it).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use durable_log::{Log, Options, files};

/// The ids of this process's threads called `name`.
fn threads_named(name: &str) -> BTreeSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| entry.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// Waits up to 60 s for `done`.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn every_compaction_runs_on_the_same_thread_named_like_the_writer() {
    const NAME: &str = "dlog-thread-t";
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        compact_min_bytes: 512,
        thread_name: NAME,
    };
    let (log, _) = Log::open(dir.path(), options, Box::new(|_| {})).unwrap();
    // A thread takes its name once it runs.
    wait_for("the writer's name", || threads_named(NAME).len() == 1).await;
    let writer = threads_named(NAME);
    let mut seq = 0;
    let mut kept: Option<BTreeSet<u32>> = None;
    for round in 1..=3u64 {
        while !log.wants_compaction() {
            seq += 1;
            log.append(seq, format!("k{seq}=value").into_bytes())
                .unwrap();
            log.wait_durable(seq).await.unwrap();
        }
        let entries = vec![format!("state-{round}").into_bytes()];
        log.compact(move || entries).unwrap();
        let path = dir.path().to_path_buf();
        wait_for("the snapshot", || {
            files::list(&path)
                .unwrap()
                .snapshots
                .last()
                .is_some_and(|g| *g >= round)
        })
        .await;
        wait_for("the compaction thread's name", || {
            threads_named(NAME).len() > 1
        })
        .await;
        let now = threads_named(NAME);
        assert!(now.is_superset(&writer), "{now:?}");
        assert_eq!(
            now.len(),
            2,
            "the writer and one compaction thread: {now:?}"
        );
        match &kept {
            None => kept = Some(now),
            Some(first) => assert_eq!(&now, first, "compaction {round} ran on another thread"),
        }
    }
    drop(log);
    // An ended thread leaves /proc/self/task a moment after it is joined.
    wait_for("no thread outliving the log", || {
        threads_named(NAME).is_empty()
    })
    .await;
}
