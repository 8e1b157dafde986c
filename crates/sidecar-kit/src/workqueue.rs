//! A work queue keyed by object: each key is queued at most once and processed by at most one
//! worker at a time (a change during processing re-queues it once when the worker is done),
//! with per-key exponential backoff from `start` to `max` that watch events do not bypass, and
//! looks later ([`Next::After`]) that they do.

use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

/// What a reconcile asks the queue to do with its key next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing: the key's failures are forgotten; it comes back when something changes.
    Done,
    /// Look again after the key's backoff (it counts as a failure), without logging an error.
    Retry,
    /// Look again after this long (not a failure; a change meanwhile queues the key at once).
    After(Duration),
}

/// The upstream `workqueue_*` series of one queue (`name` label).
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    depth: prometheus::IntGauge,
    adds: prometheus::IntCounter,
    retries: prometheus::IntCounter,
    wait: prometheus::Histogram,
    work: prometheus::Histogram,
    unfinished: prometheus::Gauge,
    longest: prometheus::Gauge,
}

impl QueueMetrics {
    /// The series of the queue `name` (upstream names its queues `claims` and `volumes`).
    pub fn new(metrics: &crate::metrics::Metrics, name: &str) -> Self {
        QueueMetrics {
            depth: metrics.queue_depth.with_label_values(&[name]),
            adds: metrics.queue_adds.with_label_values(&[name]),
            retries: metrics.queue_retries.with_label_values(&[name]),
            wait: metrics.queue_wait.with_label_values(&[name]),
            work: metrics.queue_work.with_label_values(&[name]),
            unfinished: metrics.queue_unfinished.with_label_values(&[name]),
            longest: metrics.queue_longest.with_label_values(&[name]),
        }
    }
}

/// Backoff bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First retry delay.
    pub start: Duration,
    /// Largest retry delay.
    pub max: Duration,
}

impl Backoff {
    /// Delay after `failures` consecutive failures (1 → start, doubling up to max).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(32);
        self.start.saturating_mul(1u32 << exp.min(31)).min(self.max)
    }
}

/// Which kind of wait a delayed key is in.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// A failure's backoff ([`WorkQueue::retry`]).
    Backoff,
    /// A look later ([`WorkQueue::add_after`]).
    Later,
}

impl Wait {
    /// The keys in this kind of wait, with when each wait ends.
    fn keys<K>(self, state: &mut State<K>) -> &mut HashMap<K, Instant> {
        match self {
            Wait::Backoff => &mut state.backoff_until,
            Wait::Later => &mut state.later_until,
        }
    }
}

#[derive(Debug)]
struct State<K> {
    queue: VecDeque<K>,
    /// The keys in `queue`, with when each was queued (for the wait metric): one copy of each
    /// key besides the queue's (a storm queues every claim at once).
    queued: HashMap<K, Instant>,
    processing: HashSet<K>,
    dirty: HashSet<K>,
    /// Dirty keys that go to the front when their processing ends.
    urgent: HashSet<K>,
    failures: HashMap<K, u32>,
    /// Keys waiting out a failure's backoff: a change does not queue them before it ends.
    backoff_until: HashMap<K, Instant>,
    /// Keys to look at again later ([`Next::After`]): a change queues them at once.
    later_until: HashMap<K, Instant>,
    /// When each key in progress was taken (for the work metrics).
    started_at: HashMap<K, Instant>,
    shutting_down: bool,
}

/// The queue. Cheap to clone.
#[derive(Debug)]
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
    backoff: Backoff,
    metrics: Option<QueueMetrics>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            state: self.state.clone(),
            notify: self.notify.clone(),
            backoff: self.backoff,
            metrics: self.metrics.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A queue with the given backoff.
    pub fn new(backoff: Backoff) -> Self {
        WorkQueue {
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                queued: HashMap::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                urgent: HashSet::new(),
                failures: HashMap::new(),
                backoff_until: HashMap::new(),
                later_until: HashMap::new(),
                started_at: HashMap::new(),
                shutting_down: false,
            })),
            notify: Arc::new(Notify::new()),
            backoff,
            metrics: None,
        }
    }

    /// The same queue, counted in `workqueue_depth`, `workqueue_adds_total` and
    /// `workqueue_retries_total`.
    pub fn with_metrics(mut self, metrics: QueueMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Whether the queue is counted in `workqueue_*` metrics.
    pub fn has_metrics(&self) -> bool {
        self.metrics.is_some()
    }

    fn count_depth(&self, state: &State<K>) {
        if let Some(m) = &self.metrics {
            m.depth
                .set(i64::try_from(state.queue.len()).unwrap_or(i64::MAX));
        }
    }

    fn push(&self, state: &mut State<K>, key: K) {
        self.push_at(state, key, false);
    }

    fn push_at(&self, state: &mut State<K>, key: K, front: bool) {
        let added = if state.processing.contains(&key) {
            if front {
                state.urgent.insert(key.clone());
            }
            state.dirty.insert(key)
        } else if let Entry::Vacant(slot) = state.queued.entry(key.clone()) {
            slot.insert(Instant::now());
            if front {
                state.queue.push_front(key);
            } else {
                state.queue.push_back(key);
            }
            self.notify.notify_one();
            true
        } else {
            if front && let Some(at) = state.queue.iter().position(|k| *k == key) {
                state.queue.remove(at);
                state.queue.push_front(key);
            }
            false
        };
        if added && let Some(m) = &self.metrics {
            m.adds.inc();
        }
        self.count_depth(state);
    }

    /// Queues a key because something changed, unless it is waiting out a failure's backoff
    /// (the delayed retry comes on time; a watch event does not shorten it). A key waiting to
    /// be looked at later ([`Next::After`]) is queued at once.
    pub fn add(&self, key: K) {
        let mut state = self.state.lock();
        if state
            .backoff_until
            .get(&key)
            .is_some_and(|until| Instant::now() < *until)
        {
            return;
        }
        self.push(&mut state, key);
    }

    /// Queues a key now, ignoring any backoff (a change that may fix the cause, e.g. the
    /// StorageClass it waited for appeared).
    pub fn add_now(&self, key: K) {
        let mut state = self.state.lock();
        state.backoff_until.remove(&key);
        self.push(&mut state, key);
    }

    /// Queues a key now and ahead of every waiting key, ignoring any backoff (a change that
    /// makes the key's state stale: it is worth more than routine work already queued). A key
    /// being processed goes to the front when its processing ends.
    pub fn add_first(&self, key: K) {
        let mut state = self.state.lock();
        state.backoff_until.remove(&key);
        self.push_at(&mut state, key, true);
    }

    /// Looks at the key again after `delay`. This is not a backoff: a change meanwhile
    /// ([`WorkQueue::add`]) queues the key at once, and what that pass returns replaces the
    /// wait.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.queue_at(key, Instant::now() + delay, Wait::Later);
    }

    /// Queues the key at `until` unless a newer wait, or handing the key out, replaced it.
    fn queue_at(&self, key: K, until: Instant, wait: Wait) {
        wait.keys(&mut self.state.lock()).insert(key.clone(), until);
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut state = queue.state.lock();
            let waiting = wait.keys(&mut state);
            if waiting.get(&key) == Some(&until) {
                waiting.remove(&key);
                queue.push(&mut state, key);
            }
        });
    }

    /// Records a failure and queues the key after its backoff; returns the delay.
    pub fn retry(&self, key: K) -> Duration {
        self.retry_counted(key).0
    }

    /// [`WorkQueue::retry`], also returning the key's consecutive failures.
    fn retry_counted(&self, key: K) -> (Duration, u32) {
        let failures = {
            let mut state = self.state.lock();
            let n = state.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let delay = self.backoff.delay(failures);
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
        self.queue_at(key, Instant::now() + delay, Wait::Backoff);
        (delay, failures)
    }

    /// Forgets the failures of a key (after a success).
    pub fn forget(&self, key: &K) {
        let mut state = self.state.lock();
        state.failures.remove(key);
        state.backoff_until.remove(key);
    }

    /// Consecutive failures of a key.
    pub fn failures(&self, key: &K) -> u32 {
        self.state.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key; None after [`WorkQueue::shutdown`].
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut state = self.state.lock();
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.queue.pop_front() {
                    self.count_depth(&state);
                    let queued_at = state.queued.remove(&key);
                    if let Some(m) = &self.metrics {
                        let now = Instant::now();
                        if let Some(at) = queued_at {
                            m.wait
                                .observe(now.saturating_duration_since(at).as_secs_f64());
                        }
                        state.started_at.insert(key.clone(), now);
                    }
                    // Handed out: no longer waiting out a delay (a change seen while it is
                    // processed must mark it dirty, not be dropped as "the timer will come"),
                    // and what this pass returns decides when it comes back.
                    state.backoff_until.remove(&key);
                    state.later_until.remove(&key);
                    state.processing.insert(key.clone());
                    if !state.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks a key as processed; a change seen meanwhile queues it again.
    pub fn done(&self, key: &K) {
        let mut state = self.state.lock();
        state.processing.remove(key);
        if let (Some(m), Some(at)) = (&self.metrics, state.started_at.remove(key)) {
            m.work.observe(at.elapsed().as_secs_f64());
        }
        if state.dirty.remove(key) {
            let front = state.urgent.remove(key);
            let key = key.clone();
            self.push_at(&mut state, key, front);
        }
    }

    /// Keys waiting (not counting those in backoff or being processed).
    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether no key waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handles keys until [`WorkQueue::shutdown`], each in a span naming the queue and the key:
    /// [`Next::Done`] forgets the key's failures, [`Next::After`] looks again later,
    /// [`Next::Retry`], an error (logged as a warning) and a panic (logged as an error) retry it
    /// after its backoff.
    /// One bad item never takes a worker down.
    pub async fn run_worker<F, Fut, E>(&self, what: &'static str, handle: F)
    where
        F: Fn(K) -> Fut,
        Fut: std::future::Future<Output = Result<Next, E>> + Send + 'static,
        E: std::fmt::Display,
        K: std::fmt::Display,
    {
        use futures::FutureExt;
        while let Some(key) = self.next().await {
            let span = tracing::info_span!("reconcile", queue = what, key = %key);
            let outcome = std::panic::AssertUnwindSafe(handle(key.clone()).instrument(span))
                .catch_unwind()
                .await;
            match outcome {
                Ok(Ok(Next::Done)) => self.forget(&key),
                Ok(Ok(Next::After(delay))) => {
                    self.forget(&key);
                    self.add_after(key.clone(), delay);
                }
                Ok(Ok(Next::Retry)) => {
                    self.retry(key.clone());
                }
                Ok(Err(error)) => {
                    let (delay, failures) = self.retry_counted(key.clone());
                    tracing::warn!(%key, %error, failures, retry_in = ?delay, "{what} sync failed");
                }
                Err(panic) => {
                    let delay = self.retry(key.clone());
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".into());
                    tracing::error!(%key, panic = %message, retry_in = ?delay, "{what} sync panicked; retrying with backoff");
                }
            }
            self.done(&key);
        }
    }

    /// Updates `workqueue_unfinished_work_seconds` and
    /// `workqueue_longest_running_processor_seconds` from the work in progress (client-go does it
    /// every 500 ms; the runtime calls this as often).
    pub fn update_progress_metrics(&self) {
        let Some(m) = &self.metrics else { return };
        let state = self.state.lock();
        let now = Instant::now();
        let running = state
            .started_at
            .values()
            .map(|at| now.saturating_duration_since(*at).as_secs_f64());
        let (total, longest) = running.fold((0.0, 0.0f64), |(t, l), s| (t + s, l.max(s)));
        m.unfinished.set(total);
        m.longest.set(longest);
    }

    /// Stops handing out keys.
    pub fn shutdown(&self) {
        self.state.lock().shutting_down = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
}
