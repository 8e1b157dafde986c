//! What the benchmark watches while a scenario runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use parking_lot::Mutex;

use super::background::{Background, watch};
use super::proc_status;
use super::views::{ClaimView, VolumeView};

pub(super) type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// What the benchmark watches while a scenario runs: when each claim was created, when its PV
/// appeared and when it became Bound (from watches: listing 10,000 claims ten times a second
/// would make the benchmark its own bottleneck), and the provisioner's peak RSS.
pub(super) struct Observers {
    pub(super) created_at: Times,
    seen_at: Times,
    bound: Times,
    /// When each benchmark PV's delete event came.
    deleted_at: Arc<Mutex<Vec<Instant>>>,
    peak: Arc<Mutex<f64>>,
    tasks: Background,
}

impl Observers {
    pub(super) fn start(client: &kube::Client, namespace: &str, pid: u32) -> Self {
        let claims: Api<ClaimView> = Api::namespaced(client.clone(), namespace);
        let pvs: Api<VolumeView> = Api::all(client.clone());
        let mut o = Observers {
            created_at: Arc::default(),
            seen_at: Arc::default(),
            bound: Arc::default(),
            deleted_at: Arc::default(),
            peak: Arc::new(Mutex::new(0.0)),
            tasks: Background::default(),
        };
        let (seen, deleted_at) = (o.seen_at.clone(), o.deleted_at.clone());
        o.tasks.spawn(async move {
            let stream = watch(pvs);
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => {
                        if let Some(name) = pv.claim() {
                            let mut seen = seen.lock();
                            if !seen.contains_key(name) {
                                seen.insert(name.to_string(), Instant::now());
                            }
                        }
                    }
                    watcher::Event::Delete(pv) => {
                        if pv.claim().is_some_and(|n| n.starts_with("bench-")) {
                            deleted_at.lock().push(Instant::now());
                        }
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        });
        let bound = o.bound.clone();
        o.tasks.spawn(async move {
            let stream = watch(claims);
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                if let watcher::Event::Apply(pvc) | watcher::Event::InitApply(pvc) = event
                    && pvc.bound()
                    && let Some(name) = pvc.metadata.name
                {
                    bound.lock().entry(name).or_insert_with(Instant::now);
                }
            }
        });
        o.watching(pid)
    }

    /// Samples the RSS of process `pid` (0: none) from now on.
    pub(super) fn watching(mut self, pid: u32) -> Self {
        if pid == 0 {
            return self;
        }
        let peak = self.peak.clone();
        self.tasks.spawn(async move {
            loop {
                if let Some(rss) = proc_status(pid, "VmRSS:") {
                    let mut p = peak.lock();
                    *p = p.max(rss);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        self
    }

    /// Benchmark claims Bound so far.
    pub(super) fn bound_count(&self) -> usize {
        count_bench(&self.bound)
    }

    /// PVs of benchmark claims deleted so far.
    pub(super) fn deleted_count(&self) -> usize {
        self.deleted_at.lock().len()
    }

    /// What the progress line shows: claims created, Bound, and their PVs deleted so far.
    pub(super) fn progress(&self) -> impl Fn() -> (usize, usize, usize) + Send + 'static {
        let (created, bound, deleted) = (
            self.created_at.clone(),
            self.bound.clone(),
            self.deleted_at.clone(),
        );
        move || {
            (
                count_bench(&created),
                count_bench(&bound),
                deleted.lock().len(),
            )
        }
    }

    /// Seconds from `started` to each benchmark claim's binding, sorted.
    pub(super) fn bound_times(&self, started: Instant) -> Vec<f64> {
        since(&self.bound, started)
    }

    /// Seconds from `started` to each benchmark PV's deletion, sorted.
    pub(super) fn deleted_times(&self, started: Instant) -> Vec<f64> {
        let mut out: Vec<f64> = self
            .deleted_at
            .lock()
            .iter()
            .map(|t| t.saturating_duration_since(started).as_secs_f64())
            .collect();
        out.sort_by(|a, b| a.total_cmp(b));
        out
    }

    /// Seconds from `started` to each benchmark claim's PV appearing, sorted.
    pub(super) fn pv_times(&self, started: Instant) -> Vec<f64> {
        since(&self.seen_at, started)
    }

    /// Milliseconds from each claim's creation to its PV, sorted.
    pub(super) fn latencies_ms(&self) -> Vec<f64> {
        from_creation_ms(&self.created_at, &self.seen_at)
    }

    /// Milliseconds from `started` to each claim's PV, sorted (claims created before it).
    pub(super) fn latencies_since_ms(&self, started: Instant) -> Vec<f64> {
        since(&self.seen_at, started)
            .into_iter()
            .map(|s| s * 1000.0)
            .collect()
    }

    /// Milliseconds from each claim's creation to its phase Bound, sorted.
    pub(super) fn bound_latencies_ms(&self) -> Vec<f64> {
        from_creation_ms(&self.created_at, &self.bound)
    }

    /// Stops watching (the tasks go with `self`); returns the peak RSS seen (MiB).
    pub(super) fn stop(self) -> f64 {
        *self.peak.lock()
    }
}

fn count_bench(times: &Times) -> usize {
    times
        .lock()
        .keys()
        .filter(|k| k.starts_with("bench-"))
        .count()
}

fn since(times: &Times, started: Instant) -> Vec<f64> {
    let mut out: Vec<f64> = times
        .lock()
        .iter()
        .filter(|(k, _)| k.starts_with("bench-"))
        .map(|(_, t)| t.saturating_duration_since(started).as_secs_f64())
        .collect();
    out.sort_by(|a, b| a.total_cmp(b));
    out
}

/// Milliseconds from each claim's creation to the instant `then` holds for it, sorted.
fn from_creation_ms(created: &Times, then: &Times) -> Vec<f64> {
    let created = created.lock().clone();
    let then = then.lock();
    let mut out: Vec<f64> = created
        .iter()
        .filter_map(|(k, t)| {
            then.get(k)
                .map(|s| s.saturating_duration_since(*t).as_secs_f64() * 1000.0)
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}
