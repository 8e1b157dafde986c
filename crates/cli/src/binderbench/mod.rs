//! `volstack bench-binder`: on a real control plane (`../shared/kube`, started by `testbed`),
//! how long a backlog of claims takes to be Bound with kube-controller-manager's PV binder or
//! with `volstack pv-controller` in its place, the same csi-provisioner provisioning for both.
//! Every component runs under its ServiceAccount with the manifests of `deploy/kubernetes`. The
//! binder, either one, runs while the backlog is made; the clock starts with the provisioner.
//! Prints figures; asserts nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use testbed::{ControlPlane, Options, Process};

mod args;
mod cpu;
mod wait;

use self::args::qps_flags;
pub use self::args::{Binder, BinderBenchArgs};

use self::wait::{Unfinished, first_exited, wait_reporting};

const DRIVER: &str = "hostpath.csi.volstack.dev";
const NODE: &str = "node-1";

/// What one run measured.
#[derive(Debug)]
struct Run {
    binder: Binder,
    bound_after: Duration,
    bound: usize,
    /// When the first claim and half of them were Bound.
    first_bound: Duration,
    half_bound: Duration,
    /// When the volumes were made (seen by the volume watch): first, half, all.
    volumes: Progress,
    /// Writes to claims and to volumes seen by watches from the start until all were Bound
    /// (and 3 s more): each a new resourceVersion of an object, whoever wrote it.
    claim_writes: usize,
    volume_writes: usize,
    /// Events in the claims' namespace at the end, by reason: (objects, occurrences).
    events: std::collections::BTreeMap<String, (usize, i64)>,
    /// Each process's CPU from the clock's start until all were Bound.
    cpu: Vec<cpu::Used>,
}

/// Runs each binder's measurement and prints a line per run.
pub async fn run(args: BinderBenchArgs) -> anyhow::Result<()> {
    let bin = std::env::current_exe()
        .context("find volstack's own path")?
        .parent()
        .map(Path::to_path_buf)
        .context("volstack has no directory")?;
    let mut runs = Vec::new();
    for (i, &binder) in args.binders.iter().enumerate() {
        let run = once(&args, i + 1, binder, &bin).await?;
        println!(
            "{:?}: {} of {} claims Bound after {:.1} s ({:.0} claims/s; first {:.1} s, half {:.1} s), qps {}, pv-controller workers {}; writes per claim: {:.2} to claims, {:.2} to volumes (every writer's, from watches)",
            run.binder,
            run.bound,
            args.claims,
            run.bound_after.as_secs_f64(),
            run.bound as f64 / run.bound_after.as_secs_f64().max(1e-9),
            run.first_bound.as_secs_f64(),
            run.half_bound.as_secs_f64(),
            if args.default_qps {
                "each client's default".to_string()
            } else if args.qps <= 0.0 {
                "lifted".to_string()
            } else {
                args.qps.to_string()
            },
            args.workers,
            run.claim_writes as f64 / args.claims.max(1) as f64,
            run.volume_writes as f64 / args.claims.max(1) as f64,
        );
        let events: Vec<String> = run
            .events
            .iter()
            .map(|(reason, (objects, count))| format!("{reason} {objects} ({count})"))
            .collect();
        println!(
            "  volumes made: first {:.1} s, half {:.1} s, all {:.1} s",
            run.volumes.first.as_secs_f64(),
            run.volumes.half.as_secs_f64(),
            run.volumes.last.as_secs_f64(),
        );
        println!(
            "  events by reason, objects (occurrences): {}",
            events.join(", ")
        );
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        println!("  {}", cpu::line(&run.cpu, run.bound_after, cores));
        runs.push(run);
    }
    if let [kcm, ours] = runs.as_slice()
        && kcm.binder == Binder::Kcm
        && ours.binder == Binder::Ours
    {
        println!(
            "ours bound all {:.2}x sooner",
            kcm.bound_after.as_secs_f64() / ours.bound_after.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}

async fn once(
    args: &BinderBenchArgs,
    run: usize,
    binder: Binder,
    bin: &Path,
) -> anyhow::Result<Run> {
    let controllers = match binder {
        Binder::Kcm => "*,-node-lifecycle-controller",
        Binder::Ours => "*,-node-lifecycle-controller,-persistentvolume-binder-controller",
    };
    let plane = ControlPlane::start(Options {
        controllers: Some(controllers.into()),
        scheduler: false,
        controller_manager_args: qps_flags(args, 10_000.0),
        audit: args.audit_log,
        ..Options::default()
    })
    .await
    .context("start the control plane")?;
    let admin = plane.admin().await?;
    for (name, text) in [
        ("rbac.yaml", crate::manifests::PROVISIONER_RBAC),
        (
            "pv-controller-rbac.yaml",
            crate::manifests::PV_CONTROLLER_RBAC,
        ),
    ] {
        let path = plane.dir().join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        plane.kubectl(&["apply", "-f", &path.display().to_string()])?;
    }
    let socket = plane.dir().join("csi.sock").display().to_string();
    let volstack = bin.join("volstack");
    let mut processes = vec![Process::spawn(
        "driver",
        &volstack,
        &[
            "driver".to_string(),
            format!("--endpoint=unix://{socket}"),
            format!("--state-dir={}", plane.dir().join("driver").display()),
            format!("--nodeid={NODE}"),
            "--publish-mode=symlink".to_string(),
        ],
        &[],
        plane.dir(),
    )?];
    register(&admin).await?;
    // Ours runs from before the backlog is made, as kube-controller-manager's binder does.
    if binder == Binder::Ours {
        let kubeconfig = plane
            .service_account_kubeconfig("default", "pv-controller")
            .await?;
        let mut argv = vec![
            "pv-controller".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--workers={}", args.workers),
        ];
        argv.extend(qps_flags(args, 0.0));
        processes.push(Process::spawn(
            "pv-controller",
            &volstack,
            &argv,
            &[],
            plane.dir(),
        )?);
    }
    let measured = async {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
        // Every version of every claim and volume from before the claims are made: a binder that
        // runs during the backlog's creation (kube-controller-manager's) writes then too.
        // One watch of the claims both counts their writes and sees them Bound (each watch is
        // work for kube-apiserver, the busiest process here).
        let claim_versions = Versions::default();
        let volume_versions = Versions::default();
        let bound_claims = Arc::new(Reached::default());
        let made_volumes = Arc::new(Reached::default());
        let (seen, made) = (bound_claims.clone(), made_volumes.clone());
        let watching = [
            tokio::spawn(claim_versions.clone().follow(
                claims.clone(),
                move |claim: &PersistentVolumeClaim| {
                    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
                    if let (Some("Bound"), Some(name)) = (phase, &claim.metadata.name) {
                        seen.see(name);
                    }
                },
            )),
            tokio::spawn(volume_versions.clone().follow(
                Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(admin.clone()),
                move |volume| {
                    if let Some(name) = &volume.metadata.name {
                        made.see(name);
                    }
                },
            )),
        ];
        claim_versions.wait_listed().await;
        volume_versions.wait_listed().await;
        create_claims(&claims, args.claims).await?;
        // The backlog is in; the clock starts as the sidecars do.
        let meter = cpu::CpuMeter::start(&running(&plane, &processes));
        let started = Instant::now();
        bound_claims.start_clock(started);
        made_volumes.start_clock(started);
        let provisioner = plane
            .service_account_kubeconfig("default", "csi-provisioner")
            .await?;
        let mut argv = vec![
            format!("--csi-address={socket}"),
            format!("--kubeconfig={}", provisioner.display()),
            "--worker-threads=100".to_string(),
        ];
        argv.extend(qps_flags(args, 0.0));
        processes.push(Process::spawn(
            "csi-provisioner",
            &bin.join("csi-provisioner"),
            &argv,
            &[],
            plane.dir(),
        )?);
        let bound = wait_reporting(args.timeout, bound_claims.all(args.claims), || {
            eprintln!(
                "bench-binder: {binder:?}: {} of {} claims Bound, {} volumes made after {:.0} s",
                bound_claims.count(),
                args.claims,
                made_volumes.count(),
                started.elapsed().as_secs_f64()
            );
            first_exited(&mut processes)
        })
        .await;
        let bound_after = started.elapsed();
        let cpu = meter.since(&running(&plane, &processes));
        let bound = match bound {
            Ok(progress) => progress,
            Err(Unfinished::TimedOut) => {
                let logs: Vec<String> = processes.iter().map(|p| p.log()).collect();
                anyhow::bail!(
                    "not all Bound after {:?}; logs:\n{}",
                    args.timeout,
                    logs.join("\n")
                )
            }
            Err(Unfinished::Stopped(why)) => anyhow::bail!("not all Bound: {why}"),
        };
        // Every Bound claim has its volume: the volume watch sees them all soon.
        let volumes = tokio::time::timeout(Duration::from_secs(60), made_volumes.all(args.claims))
            .await
            .context("the volume watch did not see a volume for every claim within 60 s")?;
        // The writes that finish the last bindings reach the watches.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for task in watching {
            task.abort();
        }
        let mut events = std::collections::BTreeMap::<String, (usize, i64)>::new();
        let listed = Api::<k8s_openapi::api::core::v1::Event>::namespaced(admin.clone(), "default")
            .list(&Default::default())
            .await
            .context("list the events")?;
        for event in listed.items {
            let entry = events.entry(event.reason.unwrap_or_default()).or_default();
            entry.0 += 1;
            entry.1 += i64::from(event.count.unwrap_or(1));
        }
        Ok::<Run, anyhow::Error>(Run {
            binder,
            bound_after,
            bound: bound.count,
            first_bound: bound.first,
            half_bound: bound.half,
            volumes,
            // The claims' creations are the benchmark's.
            claim_writes: claim_versions.writes().saturating_sub(args.claims),
            volume_writes: volume_versions.writes(),
            events,
            cpu,
        })
    }
    .await;
    for process in &mut processes {
        process.terminate(Duration::from_secs(5));
    }
    // Kept whether the run succeeded or not (a failed run's logs are the ones wanted).
    if let Some(dir) = &args.logs {
        keep_logs(dir, &format!("{run}-{binder:?}"), &plane, &processes)?;
    }
    measured
}

/// The processes of a run, (name, pid): the control plane's, ours and this one.
fn running(plane: &ControlPlane, processes: &[Process]) -> Vec<(String, u32)> {
    let ours = processes.iter().filter_map(Process::name_and_id);
    plane
        .process_ids()
        .into_iter()
        .chain(ours)
        .chain([("bench-binder".to_string(), std::process::id())])
        .collect()
}

/// Copies the logs of the control plane (its audit log included, if it writes one) and of
/// `processes` into `dir`, each named `<label>-<file name>`.
fn keep_logs(
    dir: &Path,
    label: &str,
    plane: &ControlPlane,
    processes: &[Process],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let logs = plane
        .logs()
        .into_iter()
        .chain(processes.iter().map(Process::log_path));
    for from in logs {
        let name = from
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("process.log");
        let to = dir.join(format!("{label}-{name}").to_lowercase());
        std::fs::copy(from, &to)
            .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// The Node, its CSINode, the CSIDriver and an Immediate class, as kubelet and an operator
/// would make them: kubelet labels the Node with the driver's topology (the reference driver
/// reports its key with the node id as value) and lists the key in the CSINode. Without it
/// a provisioner of a topology-aware driver (upstream's v6 and ours) waits for a node with
/// topology: `no available topology found`.
async fn register(admin: &kube::Client) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let key = hostpath_driver::config::DEFAULT_TOPOLOGY_KEY;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, key: NODE}},
    }))?;
    let node = Api::<Node>::all(admin.clone()).create(&pp, &node).await?;
    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": NODE, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node.metadata.uid}]},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE, "topologyKeys": [key]}]},
    }))?;
    Api::<CSINode>::all(admin.clone())
        .create(&pp, &csinode)
        .await?;
    let driver: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": DRIVER}, "spec": {"attachRequired": false},
    }))?;
    Api::<CSIDriver>::all(admin.clone())
        .create(&pp, &driver)
        .await?;
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "fast"}, "provisioner": DRIVER, "volumeBindingMode": "Immediate",
    }))?;
    Api::<StorageClass>::all(admin.clone())
        .create(&pp, &class)
        .await?;
    Ok(())
}

/// Creates `n` claims from 32 clients at once.
async fn create_claims(claims: &Api<PersistentVolumeClaim>, n: usize) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..32).map(|_| {
        let (claims, next) = (claims.clone(), next.clone());
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": format!("claim-{i}")},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "1Mi"}}},
                }))?;
                claims.create(&PostParams::default(), &claim).await?;
            }
        }
    });
    for result in futures::future::join_all(workers).await {
        result?;
    }
    Ok(())
}

/// The versions of objects a watch saw after its first list: each is one write.
#[derive(Debug, Clone, Default)]
struct Versions(
    Arc<parking_lot::Mutex<std::collections::HashSet<(String, String)>>>,
    Arc<tokio::sync::Notify>,
    Arc<std::sync::atomic::AtomicBool>,
);

impl Versions {
    /// Records every new version until the watch ends (or the task is aborted). `seen` is
    /// shown every object the watch brings, those of a list made again after a broken watch
    /// included (a claim Bound meanwhile comes only so).
    async fn follow<K>(self, api: Api<K>, mut seen: impl FnMut(&K) + Send)
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        K::DynamicType: Default,
    {
        let stream = watcher::watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    self.2.store(true, Ordering::SeqCst);
                    self.1.notify_waiters();
                }
                Ok(watcher::Event::Apply(object)) => {
                    let meta = object.meta();
                    if let (Some(name), Some(version)) = (&meta.name, &meta.resource_version) {
                        self.0.lock().insert((name.clone(), version.clone()));
                    }
                    seen(&object);
                }
                Ok(watcher::Event::InitApply(object)) => seen(&object),
                Ok(watcher::Event::Init | watcher::Event::Delete(_)) => {}
                Err(error) => eprintln!("bench-binder: a watch failed ({error}); it starts again"),
            }
        }
    }

    fn writes(&self) -> usize {
        self.0.lock().len()
    }

    /// Waits until the watch's first list is in (what comes after is counted).
    async fn wait_listed(&self) {
        loop {
            let notified = self.1.notified();
            if self.2.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// How the objects came to a state.
#[derive(Debug)]
struct Progress {
    count: usize,
    first: Duration,
    half: Duration,
    /// When the `n`th, the last awaited, did.
    last: Duration,
}

/// The objects a watch saw reach a state (claims Bound, volumes made), and when after the
/// clock started.
#[derive(Default)]
struct Reached {
    clock: std::sync::OnceLock<Instant>,
    seen: parking_lot::Mutex<Seen>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct Seen {
    names: std::collections::HashSet<String>,
    /// When each object was first seen in the state, in that order.
    reached: Vec<Duration>,
}

impl Reached {
    fn start_clock(&self, started: Instant) {
        let _ = self.clock.set(started);
    }

    /// Records that the object `name` is in the state (the first time counts).
    fn see(&self, name: &str) {
        let elapsed = self.clock.get().map(Instant::elapsed).unwrap_or_default();
        let mut seen = self.seen.lock();
        if !seen.names.contains(name) {
            seen.names.insert(name.to_string());
            seen.reached.push(elapsed);
            drop(seen);
            self.changed.notify_waiters();
        }
    }

    /// How many objects are in the state so far.
    fn count(&self) -> usize {
        self.seen.lock().names.len()
    }

    /// Waits until `n` objects are in the state.
    async fn all(&self, n: usize) -> Progress {
        loop {
            let notified = self.changed.notified();
            {
                let seen = self.seen.lock();
                if seen.names.len() >= n {
                    let now = self.clock.get().map(Instant::elapsed).unwrap_or_default();
                    return Progress {
                        count: seen.names.len(),
                        last: seen
                            .reached
                            .get(n.saturating_sub(1))
                            .copied()
                            .unwrap_or(now),
                        first: seen.reached.first().copied().unwrap_or(now),
                        half: seen
                            .reached
                            .get(n.div_ceil(2).saturating_sub(1))
                            .copied()
                            .unwrap_or(now),
                    };
                }
            }
            notified.await;
        }
    }
}
