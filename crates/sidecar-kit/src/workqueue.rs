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
    /// Wakes those waiting for the shutdown ([`WorkQueue::stopping`]); apart from `notify`,
    /// whose single wake-ups belong to the workers.
    stopped: Arc<Notify>,
    backoff: Backoff,
    metrics: Option<QueueMetrics>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            state: self.state.clone(),
            notify: self.notify.clone(),
            stopped: self.stopped.clone(),
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
            stopped: Arc::new(Notify::new()),
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
        {
            let mut state = self.state.lock();
            wait.keys(&mut state).insert(key.clone(), until);
            if let Wait::Backoff = wait {
                // The backoff's end queues the key: an earlier look later must not cut it short.
                state.later_until.remove(&key);
            }
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut state = queue.state.lock();
            let waiting = wait.keys(&mut state);
            if waiting.get(&key) != Some(&until) {
                return;
            }
            waiting.remove(&key);
            let backing_off = state
                .backoff_until
                .get(&key)
                .is_some_and(|end| Instant::now() < *end);
            if !backing_off {
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

    /// Keys waiting (not counting those in backoff, waiting to be looked at later or being
    /// processed).
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
        self.stopped.notify_waiters();
    }

    /// Resolves once [`WorkQueue::shutdown`] was called: long work in progress (a recycle
    /// waiting for its Pod) stops at it instead of holding the controller's stop up.
    pub async fn stopping(&self) {
        loop {
            let notified = self.stopped.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a shutdown between the two still wakes it.
            notified.as_mut().enable();
            if self.state.lock().shutting_down {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
#[path = "workqueue_tests.rs"]
mod tests;
