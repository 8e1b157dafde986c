//! The one shape every controller has: caches that must be synced before anything runs, an
//! optional start-up step (the provisioner reads its intent log there), work queues each with
//! a reconcile function and a number of workers, periodic passes, and a graceful stop (queues
//! stop handing out keys, work in progress finishes, periodic passes end).
//!
//! A reconcile function takes a key and returns [`Next`] (done, retry after backoff, look again
//! later) or an error (retried after backoff). The queue gives each key to one worker at a
//! time, isolates panics, wraps each call in a span and counts `workqueue_*` metrics.
//!
//! ```text
//! Controller::new("persistentvolume-controller")
//!     .wait_for(&claims)
//!     .reconcile("claim", claim_queue, workers, move |key| sync_claim(key))
//!     .every(Duration::from_secs(15), move || resync())
//!     .run(stop)
//!     .await;
//! ```

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{Lookup, Store};

use crate::workqueue::{Next, WorkQueue};

/// A boxed future, as the runtime holds them.
pub(crate) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A cache the runtime waits for before any worker starts.
pub trait Cache {
    /// Resolves once the cache has its first full list.
    fn synced(&self) -> Boxed<()>;
}

impl<K> Cache for Store<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn synced(&self) -> Boxed<()> {
        let store = self.clone();
        Box::pin(async move {
            // `wait_until_ready` wakes only the last task that waited on the store (its
            // readiness is a oneshot with one waker); the controllers sharing a kind's cache
            // each wait on it, so each asks again every `READY_RECHECK`. A ready store, or
            // one whose writer is gone, answers at once.
            while tokio::time::timeout(READY_RECHECK, store.wait_until_ready())
                .await
                .is_err()
            {}
        })
    }
}

/// How often a wait for a kube-runtime store asks again whether it is ready.
const READY_RECHECK: Duration = Duration::from_millis(50);

/// Spawns a queue's workers into the controller's task set.
type Spawn = Box<dyn FnOnce(&mut tokio::task::JoinSet<()>) + Send>;

/// A queue with its workers, started once the caches are synced.
struct Workers {
    start: Spawn,
    stop: Box<dyn Fn() + Send>,
}

/// A controller being assembled; [`Controller::run`] runs it.
pub struct Controller {
    name: &'static str,
    ready: Vec<Boxed<()>>,
    start_up: Option<Boxed<bool>>,
    workers: Vec<Workers>,
    periodic: Vec<(Duration, Arc<dyn Fn() + Send + Sync>)>,
    watches: Option<crate::watch::Watches>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("caches", &self.ready.len())
            .field("queues", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// A controller named `name` (in its log lines).
    pub fn new(name: &'static str) -> Self {
        Controller {
            name,
            ready: Vec::new(),
            start_up: None,
            workers: Vec::new(),
            periodic: Vec::new(),
            watches: None,
        }
    }

    /// Nothing runs before this cache has its first full list.
    pub fn wait_for(mut self, store: &impl Cache) -> Self {
        self.ready.push(store.synced());
        self
    }

    /// The watches feeding this controller's caches: stopped after its workers, so none
    /// outlives it.
    pub fn watches(mut self, watches: &crate::watch::Watches) -> Self {
        self.watches = Some(watches.clone());
        self
    }

    /// A step after the caches are synced and before any worker starts; `false` means stop
    /// was asked for meanwhile (nothing more runs).
    pub fn start_with(mut self, step: impl Future<Output = bool> + Send + 'static) -> Self {
        self.start_up = Some(Box::pin(step));
        self
    }

    /// `workers` workers handle the keys of `queue` with `reconcile`. A queue added here is
    /// always served: `workers` below one starts one (a queue that must not run is not added;
    /// the flags that set these counts refuse zero).
    pub fn reconcile<K, F, Fut, E>(
        mut self,
        what: &'static str,
        queue: WorkQueue<K>,
        workers: usize,
        reconcile: F,
    ) -> Self
    where
        K: Clone + Eq + Hash + Display + Send + Sync + 'static,
        F: Fn(K) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Next, E>> + Send + 'static,
        E: Display + 'static,
    {
        let stopper = queue.clone();
        if queue.has_metrics() {
            let progress = queue.clone();
            self.periodic.push((
                Duration::from_millis(500),
                Arc::new(move || progress.update_progress_metrics()),
            ));
        }
        self.workers.push(Workers {
            start: Box::new(move |set| {
                for _ in 0..workers.max(1) {
                    let (queue, reconcile) = (queue.clone(), reconcile.clone());
                    set.spawn(async move { queue.run_worker(what, reconcile).await });
                }
            }),
            stop: Box::new(move || stopper.shutdown()),
        });
        self
    }

    /// Calls `pass` every `period` while the controller runs (after the caches are synced).
    pub fn every(mut self, period: Duration, pass: impl Fn() + Send + Sync + 'static) -> Self {
        self.periodic.push((period, Arc::new(pass)));
        self
    }

    /// Runs only while `elector` holds the lease: waits for leadership, runs until `shutdown`
    /// (then releases the lease) or until leadership is lost (then stops, as the Go sidecars
    /// do, and returns the loss as an error so the process exits and is restarted).
    pub async fn run_as_leader(
        self,
        elector: crate::leader::Elector,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), crate::leader::ElectionError> {
        elector
            .run(
                move |mut stop| async move {
                    self.run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
                },
                shutdown,
            )
            .await
    }

    /// Runs until `stop` resolves: waits for the caches and the start-up step (returning early
    /// if `stop` comes first), starts the workers and periodic passes, and on stop lets work
    /// in progress finish.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let Controller {
            name,
            ready,
            start_up,
            workers,
            periodic,
            watches,
        } = self;
        let stop_watches = move || {
            if let Some(w) = &watches {
                w.stop();
            }
        };
        tokio::pin!(stop);
        tokio::select! {
            _ = futures::future::join_all(ready) => {}
            () = &mut stop => {
                stop_watches();
                return;
            }
        }
        tracing::info!(controller = name, "caches synced");
        if let Some(step) = start_up {
            let proceed = tokio::select! {
                proceed = step => proceed,
                () = &mut stop => false,
            };
            if !proceed {
                stop_watches();
                return;
            }
        }
        tracing::info!(controller = name, "starting workers");
        let mut set = tokio::task::JoinSet::new();
        let mut stoppers = Vec::new();
        for w in workers {
            (w.start)(&mut set);
            stoppers.push(w.stop);
        }
        let passes: Vec<tokio::task::JoinHandle<()>> = periodic
            .into_iter()
            .map(|(period, pass)| {
                tokio::spawn(async move {
                    let mut ticker = tokio::time::interval(period);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        ticker.tick().await;
                        pass();
                    }
                })
            })
            .collect();
        stop.await;
        tracing::info!(controller = name, "stopping workers");
        for pass in passes {
            pass.abort();
        }
        for stop in stoppers {
            stop();
        }
        while set.join_next().await.is_some() {}
        stop_watches();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::runtime::reflector::store;
    use kube::runtime::watcher;

    use super::*;
    use crate::workqueue::Backoff;

    type ConfigMap = k8s_openapi::api::core::v1::ConfigMap;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new(Backoff {
            start: Duration::from_millis(10),
            max: Duration::from_secs(1),
        })
    }

    #[tokio::test]
    async fn nothing_runs_before_the_caches_sync_then_keys_are_reconciled_and_stop_waits() {
        let (reader, mut writer) = store::<ConfigMap>();
        let q = queue();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let ticks = Arc::new(AtomicUsize::new(0));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let controller = Controller::new("test")
            .wait_for(&reader)
            .start_with({
                let started = started.clone();
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    true
                }
            })
            .reconcile("item", q.clone(), 2, {
                let seen = seen.clone();
                move |key: String| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().push(key);
                        Ok::<Next, String>(Next::Done)
                    }
                }
            })
            .every(Duration::from_millis(10), {
                let ticks = ticks.clone();
                move || {
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            });
        q.add("a".to_string());
        let running = tokio::spawn(controller.run(async {
            let _ = stop_rx.await;
        }));
        // The cache is not synced: nothing starts, whatever the wait.
        tokio::task::yield_now().await;
        assert_eq!(started.load(Ordering::SeqCst), 0);
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while seen.lock().is_empty() || ticks.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "never reconciled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(*seen.lock(), vec!["a".to_string()]);
        stop_tx.send(()).unwrap();
        running.await.unwrap();
        assert!(q.next().await.is_none(), "the queue was shut down");
    }

    #[tokio::test]
    async fn the_watches_stop_with_the_controller() {
        let watches = crate::watch::Watches::default();
        let watch = tokio::spawn(std::future::pending::<()>());
        watches.adopt(watch.abort_handle());
        Controller::new("test")
            .watches(&watches)
            .run(async {})
            .await;
        assert!(watch.await.unwrap_err().is_cancelled());
    }

    #[tokio::test]
    async fn a_stop_before_the_caches_sync_returns_without_starting() {
        let (reader, _writer) = store::<ConfigMap>();
        let started = Arc::new(AtomicUsize::new(0));
        let controller = Controller::new("test").wait_for(&reader).start_with({
            let started = started.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                true
            }
        });
        controller.run(async {}).await;
        assert_eq!(started.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn every_task_waiting_on_one_store_sees_it_synced() {
        // Controllers sharing a kind's cache each wait on it from a task of their own;
        // kube-runtime's `wait_until_ready` alone would wake only the last of them. Paused
        // time: the deadline passes only when nothing else can happen.
        let (reader, mut writer) = store::<ConfigMap>();
        let waiters: Vec<_> = (0..3).map(|_| tokio::spawn(reader.synced())).collect();
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiters {
            let done = tokio::time::timeout(Duration::from_secs(60), waiter).await;
            assert!(
                matches!(done, Ok(Ok(()))),
                "a waiter never saw the store synced"
            );
        }
    }
}
