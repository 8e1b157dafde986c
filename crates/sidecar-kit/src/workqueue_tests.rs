#![allow(clippy::unwrap_used)]

use super::*;

fn queue() -> WorkQueue<&'static str> {
    WorkQueue::new(Backoff {
        start: Duration::from_secs(1),
        max: Duration::from_secs(8),
    })
}

type Calls = Arc<Mutex<Vec<&'static str>>>;

/// A worker that records each key it is given and answers with `decide(key, attempt)`
/// (which may panic).
fn recording_worker(
    q: &WorkQueue<&'static str>,
    decide: fn(&'static str, usize) -> Next,
) -> (Calls, tokio::task::JoinHandle<()>) {
    let calls: Calls = Arc::default();
    let worker = tokio::spawn({
        let (q, calls) = (q.clone(), calls.clone());
        async move {
            q.run_worker("test", move |key: &'static str| {
                let calls = calls.clone();
                async move {
                    let attempt = {
                        let mut calls = calls.lock();
                        calls.push(key);
                        calls.iter().filter(|k| **k == key).count()
                    };
                    Ok::<Next, String>(decide(key, attempt))
                }
            })
            .await;
        }
    });
    (calls, worker)
}

#[tokio::test(start_paused = true)]
async fn a_change_while_a_delayed_key_is_processed_again_is_not_lost() {
    let q = queue();
    q.add("k");
    assert_eq!(q.next().await, Some("k"));
    q.add("k"); // changed while processed: dirty
    // The reconcile asked to look again later; the dirty key comes back at once.
    q.forget(&"k");
    q.add_after("k", Duration::from_secs(60));
    q.done(&"k");
    assert_eq!(q.next().await, Some("k"));
    q.add("k"); // changed again while processed the second time
    q.forget(&"k"); // ...which succeeded (the delayed look is moot)
    q.done(&"k");
    let again = tokio::time::timeout(Duration::from_secs(1), q.next()).await;
    assert_eq!(
        again.ok().flatten(),
        Some("k"),
        "the second change was dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_during_a_look_later_queues_the_key_at_once_and_only_once() {
    let q = queue();
    q.add("k");
    assert_eq!(q.next().await, Some("k"));
    q.add_after("k", Duration::from_secs(60));
    q.done(&"k");
    assert!(q.is_empty());
    q.add("k");
    assert_eq!(q.len(), 1, "a change is not held back by a look later");
    assert_eq!(q.next().await, Some("k"));
    q.done(&"k");
    // That pass returned nothing more: the earlier look later does not fire.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(q.is_empty(), "the replaced look later fired");
    // A look later with no change comes on time.
    q.add_after("k", Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(4900)).await;
    assert!(q.is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_look_later_does_not_cut_a_backoff_short() {
    let q = queue();
    q.add("k");
    let k = q.next().await.unwrap();
    assert_eq!(q.retry(k), Duration::from_secs(1));
    q.done(&k);
    // Something asks to look again in 100 ms while the key backs off for 1 s.
    q.add_after("k", Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(q.is_empty(), "the look later cut the backoff short");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(q.len(), 1, "the backoff's end queues the key");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_item_is_retried_with_backoff_and_the_worker_survives() {
    let q = queue();
    let (calls, worker) = recording_worker(&q, |key, attempt| {
        if key == "bad" && attempt == 1 {
            panic!("bad input");
        }
        Next::Done
    });
    q.add("bad");
    // The panic is retried after the key's backoff (1 s of paused time), and a later key
    // is still handled by the same worker.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    q.add("good");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*calls.lock(), vec!["bad", "bad", "good"]);
    assert_eq!(
        q.failures(&"bad"),
        0,
        "the successful retry forgot the failure"
    );
    q.shutdown();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn what_a_reconcile_returns_decides_when_the_key_comes_back() {
    let metrics = crate::metrics::Metrics::new().unwrap();
    let q = queue().with_metrics(QueueMetrics::new(&metrics, "claims"));
    let (calls, worker) = recording_worker(&q, |key, attempt| match (key, attempt) {
        ("later", 1) => Next::After(Duration::from_secs(5)),
        ("again", 1 | 2) => Next::Retry,
        _ => Next::Done,
    });
    q.add("later");
    q.add("again");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(q.failures(&"again"), 1, "Retry counts as a failure");
    assert_eq!(q.failures(&"later"), 0, "After does not");
    // again: retried after 1 s, then 2 s; later: after 5 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let calls = calls.lock().clone();
    assert_eq!(calls.iter().filter(|k| **k == "again").count(), 3);
    assert_eq!(calls.iter().filter(|k| **k == "later").count(), 2);
    assert_eq!(q.failures(&"again"), 0);
    let text = metrics.render();
    assert!(
        text.contains("workqueue_retries_total{name=\"claims\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_adds_total{name=\"claims\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_depth{name=\"claims\"} 0"),
        "{text}"
    );
    q.shutdown();
    worker.await.unwrap();
}

#[test]
fn backoff_doubles_up_to_the_maximum() {
    let b = Backoff {
        start: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };
    let delays: Vec<u64> = (1..=12).map(|n| b.delay(n).as_secs()).collect();
    assert_eq!(
        delays,
        vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    );
    assert_eq!(b.delay(1000).as_secs(), 300);
}

#[tokio::test]
async fn a_key_is_queued_once_and_requeued_once_if_it_changed_while_processed() {
    let q = queue();
    q.add("a");
    q.add("a");
    q.add("b");
    assert_eq!(q.len(), 2);
    let a = q.next().await.unwrap();
    assert_eq!(a, "a");
    q.add("a");
    q.add("a");
    assert_eq!(
        q.len(),
        1,
        "a is being processed: marked dirty, not queued twice"
    );
    assert_eq!(q.next().await.unwrap(), "b");
    q.done(&"b");
    q.done(&"a");
    assert_eq!(q.next().await.unwrap(), "a");
}

#[tokio::test(start_paused = true)]
async fn retries_wait_out_their_backoff_and_watch_events_do_not_shorten_it() {
    let q = queue();
    q.add("k");
    let k = q.next().await.unwrap();
    assert_eq!(q.retry(k), Duration::from_secs(1));
    q.done(&k);
    q.add("k");
    assert!(q.is_empty(), "a watch event during backoff is ignored");
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert_eq!(q.len(), 1);
    let k = q.next().await.unwrap();
    assert_eq!(q.retry(k), Duration::from_secs(2));
    q.done(&k);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(q.is_empty());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let k = q.next().await.unwrap();
    for expected in [4, 8, 8] {
        assert_eq!(q.retry(k), Duration::from_secs(expected));
    }
    q.forget(&k);
    assert_eq!(q.failures(&k), 0);
    q.add("k");
    q.done(&k);
    assert_eq!(q.len(), 1, "after forget, a change queues at once");
}

#[tokio::test(start_paused = true)]
async fn add_first_jumps_the_queue_also_after_processing() {
    let q = queue();
    for k in ["a", "b", "c"] {
        q.add(k);
    }
    q.add_first("c");
    q.add_first("d");
    assert_eq!(q.next().await, Some("d"));
    assert_eq!(q.next().await, Some("c"));
    // A key in progress that is made urgent comes first when it is done.
    assert_eq!(q.next().await, Some("a"));
    q.add_first("a");
    q.done(&"a");
    assert_eq!(q.next().await, Some("a"));
    assert_eq!(q.next().await, Some("b"));
    // A key waiting out a backoff is taken at once.
    q.retry("e");
    q.add_first("e");
    assert_eq!(q.next().await, Some("e"));
}

#[tokio::test(start_paused = true)]
async fn add_now_bypasses_a_backoff() {
    let q = queue();
    q.add("k");
    let k = q.next().await.unwrap();
    q.retry(k);
    q.done(&k);
    q.add_now("k");
    assert_eq!(q.len(), 1);
    let k = q.next().await.unwrap();
    q.done(&k);
    // The stale delayed add does not fire a second time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn workers_wake_up_for_new_keys_and_stop_on_shutdown() {
    let q = queue();
    let worker = tokio::spawn({
        let q = q.clone();
        async move {
            let mut seen = Vec::new();
            while let Some(k) = q.next().await {
                seen.push(k);
                q.done(&k);
            }
            seen
        }
    });
    tokio::task::yield_now().await;
    q.add("x");
    q.add("y");
    tokio::time::sleep(Duration::from_millis(50)).await;
    q.shutdown();
    assert_eq!(worker.await.unwrap(), vec!["x", "y"]);
}

#[tokio::test(start_paused = true)]
async fn work_in_progress_sees_the_shutdown_and_a_late_waiter_returns_at_once() {
    let q = queue();
    q.add("long");
    let key = q.next().await.unwrap();
    // A worker busy with `key` waits for the shutdown (or its work, which never ends here).
    let busy = tokio::spawn({
        let q = q.clone();
        async move {
            tokio::select! {
                () = q.stopping() => "stopped",
                () = std::future::pending::<()>() => "finished",
            }
        }
    });
    // Another worker waits for keys: the stop's waiter takes no wake-up of theirs.
    let idle = tokio::spawn({
        let q = q.clone();
        async move { q.next().await }
    });
    tokio::task::yield_now().await;
    q.add("next");
    assert_eq!(idle.await.unwrap(), Some("next"));
    q.shutdown();
    assert_eq!(busy.await.unwrap(), "stopped");
    q.done(&key);
    // Asked after the shutdown, it does not wait.
    tokio::time::timeout(Duration::from_secs(1), q.stopping())
        .await
        .unwrap();
}
