//! Where the stack's parts run. Shared: all on the caller's runtime (`volstack up`). Separate:
//! the API server, the driver and the controllers each on a runtime of their own whose threads
//! carry its name (their logs' writers and compaction threads too), so the benchmark can tell
//! their CPU apart
//! ([`cpu_by_thread`], [`Lane::cpu_of`]).

use std::collections::BTreeMap;
use std::future::Future;

use anyhow::Context;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// A part of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// The API server.
    ApiServer,
    /// The reference CSI driver.
    Driver,
    /// The in-process controllers: PV controller, scheduler, attacher, node agents, snapshots.
    Controllers,
}

impl Lane {
    /// Every lane.
    pub const ALL: [Lane; 3] = [Lane::ApiServer, Lane::Driver, Lane::Controllers];

    /// The name its threads carry (at most 15 bytes: Linux keeps no more).
    pub fn thread_name(self) -> &'static str {
        match self {
            Lane::ApiServer => "apiserver",
            Lane::Driver => "csi-driver",
            Lane::Controllers => "controllers",
        }
    }

    /// The thread that writes the lane's durable log, outside its runtime (named by the part
    /// that owns the log).
    pub fn log_thread_name(self) -> Option<&'static str> {
        match self {
            Lane::ApiServer => Some(apiserver::LOG_THREAD),
            Lane::Driver => Some(hostpath_driver::driver::LOG_THREAD),
            Lane::Controllers => None,
        }
    }

    /// CPU seconds by lane from CPU seconds by thread name ([`cpu_since`]): its runtime's
    /// threads and its log's writer and compaction thread.
    pub fn cpu_of(by_name: &BTreeMap<String, f64>) -> BTreeMap<Lane, f64> {
        Lane::ALL
            .iter()
            .map(|lane| {
                let used = std::iter::once(lane.thread_name())
                    .chain(lane.log_thread_name())
                    .filter_map(|name| by_name.get(name))
                    .sum();
                (*lane, used)
            })
            .collect()
    }
}

/// The runtimes, if separate.
pub struct Lanes {
    runtimes: Option<[Option<Runtime>; 3]>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("separate", &self.runtimes.is_some())
            .finish()
    }
}

impl Lanes {
    /// Everything on the caller's runtime.
    pub fn shared() -> Self {
        Lanes { runtimes: None }
    }

    /// A runtime per lane: the API server's with `workers` threads, the driver's and the
    /// controllers' with one each. Runtimes of several threads on a small machine wake one
    /// another across runtimes (in a 100,000-claim storm on 2 cores the controllers used about
    /// a sixth less CPU on one thread), while the API server's lane needs more than a core at
    /// times (deleting that storm on one thread took longer).
    pub fn separate(workers: usize) -> anyhow::Result<Self> {
        let build = |lane: Lane| {
            let threads = match lane {
                Lane::ApiServer => workers.max(1),
                Lane::Driver | Lane::Controllers => 1,
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name(lane.thread_name())
                // Blocking threads that exit take their CPU figure with them: keep them.
                .thread_keep_alive(std::time::Duration::from_secs(3600))
                .enable_all()
                .build()
                .with_context(|| format!("start the {} runtime", lane.thread_name()))
                .map(Some)
        };
        Ok(Lanes {
            runtimes: Some([
                build(Lane::ApiServer)?,
                build(Lane::Driver)?,
                build(Lane::Controllers)?,
            ]),
        })
    }

    fn handle(&self, lane: Lane) -> Option<&tokio::runtime::Handle> {
        let index = Lane::ALL.iter().position(|l| *l == lane)?;
        let runtime = self.runtimes.as_ref()?[index].as_ref()?;
        Some(runtime.handle())
    }

    /// Spawns `task` on `lane`'s runtime (the caller's when shared).
    pub fn spawn<F>(&self, lane: Lane, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle(lane) {
            Some(handle) => handle.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Runs `task` on `lane` and waits for it: what it creates (listeners, clients, the tasks
    /// it spawns) belongs to that lane.
    pub async fn run<F, T>(&self, lane: Lane, task: F) -> anyhow::Result<T>
    where
        F: Future<Output = anyhow::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(lane, task)
            .await
            .with_context(|| format!("the {} lane", lane.thread_name()))?
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async context forbids: let them go in the
        // background (their tasks have been stopped by then, or are abandoned).
        if let Some(runtimes) = self.runtimes.as_mut() {
            for runtime in runtimes.iter_mut().filter_map(Option::take) {
                runtime.shutdown_background();
            }
        }
    }
}

/// CPU seconds (user + system) each live thread of this process has used: thread id to (name,
/// seconds).
pub fn cpu_by_thread() -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let Some(tid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        if let Some(seconds) = stat_cpu_seconds(&stat) {
            out.insert(tid, (name.trim().to_string(), seconds));
        }
    }
    out
}

/// CPU seconds used between two [`cpu_by_thread`] snapshots, summed by thread name, counting
/// only threads alive at the second (a thread that ended in between, such as one of a stack
/// stopped earlier, is not taken away from the others of its name).
pub fn cpu_since(
    before: &BTreeMap<u32, (String, f64)>,
    after: &BTreeMap<u32, (String, f64)>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (tid, (name, seconds)) in after {
        let earlier = before
            .get(tid)
            .filter(|(n, _)| n == name)
            .map_or(0.0, |(_, s)| *s);
        *out.entry(name.clone()).or_default() += (seconds - earlier).max(0.0);
    }
    out
}

/// User + system CPU seconds from a `/proc/.../stat` line (clock ticks of 1/100 s).
pub fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_read_past_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(stat_cpu_seconds(stat), Some(3.0));
        assert_eq!(stat_cpu_seconds("garbage"), None);
    }

    #[test]
    fn a_lane_counts_its_runtime_and_the_writer_of_its_log() {
        let by_name: BTreeMap<String, f64> = [
            ("apiserver", 1.0),
            ("apiserver-log", 0.5),
            ("csi-driver-log", 0.25),
            ("tokio-rt-worker", 3.0),
            ("durable-log", 2.0),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
        let by_lane = Lane::cpu_of(&by_name);
        assert_eq!(by_lane[&Lane::ApiServer], 1.5);
        assert_eq!(by_lane[&Lane::Driver], 0.25);
        assert_eq!(by_lane[&Lane::Controllers], 0.0);
    }

    #[test]
    fn threads_that_ended_are_not_taken_from_the_others_of_their_name() {
        let thread = |name: &str, s: f64| (name.to_string(), s);
        let before = BTreeMap::from([
            (1, thread("apiserver", 10.0)),
            (2, thread("apiserver", 4.0)),
            (3, thread("main", 1.0)),
        ]);
        // Thread 1 ended; 2 used 1.5 s; 4 is new; 3's id now belongs to another thread.
        let after = BTreeMap::from([
            (2, thread("apiserver", 5.5)),
            (4, thread("apiserver", 0.5)),
            (3, thread("csi-driver", 0.25)),
        ]);
        let used = cpu_since(&before, &after);
        assert_eq!(used.get("apiserver"), Some(&2.0));
        assert_eq!(used.get("csi-driver"), Some(&0.25));
        assert_eq!(used.get("main"), None);
    }

    #[tokio::test]
    async fn the_api_servers_lane_gets_the_threads_asked_for_and_the_others_one() {
        let lanes = Lanes::separate(2).unwrap();
        let mut threads = Vec::new();
        for lane in Lane::ALL {
            let workers = lanes
                .run(lane, async {
                    Ok(tokio::runtime::Handle::current().metrics().num_workers())
                })
                .await
                .unwrap();
            threads.push((lane, workers));
        }
        assert_eq!(
            threads,
            [
                (Lane::ApiServer, 2),
                (Lane::Driver, 1),
                (Lane::Controllers, 1)
            ]
        );
    }

    #[tokio::test]
    async fn separate_lanes_run_on_threads_named_after_them() {
        let lanes = Lanes::separate(1).unwrap();
        let name = lanes
            .run(Lane::Driver, async {
                // Burn some CPU so the lane shows up with a non-zero figure.
                let start = std::time::Instant::now();
                let mut x = 0_u64;
                while start.elapsed() < std::time::Duration::from_millis(50) {
                    x = x.wrapping_add(1);
                }
                std::hint::black_box(x);
                Ok(std::thread::current().name().map(str::to_string))
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("csi-driver"));
        assert!(cpu_by_thread().values().any(|(n, _)| n == "csi-driver"));
        let shared = Lanes::shared();
        let here = shared
            .run(Lane::Driver, async {
                Ok(std::thread::current().name().map(str::to_string))
            })
            .await
            .unwrap();
        assert_ne!(here.as_deref(), Some("csi-driver"));
    }
}
