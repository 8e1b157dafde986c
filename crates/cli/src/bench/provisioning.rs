//! The provisioning scenarios (`storm`, `defaults`, `steady`, `backlog`): a fresh stack per
//! run, the provisioner under test as a child process, the claims, their deletion, and the
//! figures: times, latency, memory, CPU per process and the API requests per volume.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::observe::{Observers, Times};
use super::progress::Progress;
use super::under_test::{stack_options, start_provisioner};
use super::{
    BenchArgs, Report, counts, cpu_seconds, diff, percentile, proc_status, writes, writes_by_client,
};
use crate::embedded::Stack;
use crate::embedded::lanes::{Lane, cpu_by_thread, cpu_since};

/// The keys of [`Report::cpu_seconds_by_process`].
const CPU_PROVISIONER: &str = "provisioner under test";
/// The benchmark's own clients and watches, and whatever else runs in its process.
const CPU_BENCH: &str = "benchmark clients";

/// CPU seconds so far: the provisioner's process, each lane of the stack, and this process.
struct Cpu {
    provisioner: f64,
    threads: BTreeMap<u32, (String, f64)>,
    process: f64,
}

impl Cpu {
    fn now(provisioner_pid: u32) -> Self {
        Cpu {
            provisioner: cpu_seconds(provisioner_pid).unwrap_or(0.0),
            threads: cpu_by_thread(),
            process: cpu_seconds(std::process::id()).unwrap_or(0.0),
        }
    }

    /// CPU seconds used between `before` and `self`, by process (the stack's lanes apart).
    fn since(&self, before: &Cpu) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        out.insert(
            CPU_PROVISIONER.to_string(),
            self.provisioner - before.provisioner,
        );
        let by_lane = Lane::cpu_of(&cpu_since(&before.threads, &self.threads));
        let mut lanes_total = 0.0;
        for (lane, used) in by_lane {
            lanes_total += used;
            out.insert(lane.thread_name().to_string(), used);
        }
        out.insert(
            CPU_BENCH.to_string(),
            (self.process - before.process - lanes_total).max(0.0),
        );
        out
    }
}

/// One run of a provisioning scenario: a fresh stack, the provisioner under test, a warm-up
/// claim (except `backlog`), then the claims, their deletion, and the figures.
pub(super) async fn scenario_run(
    args: &BenchArgs,
    scenario: &str,
    run: usize,
) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let mut options = stack_options(dir.path());
    // Two threads for the API server, one for the driver and one for the controllers
    // (`Lanes::separate`; docs/bench, 2026-11-27).
    options.separate_lanes = Some(2);
    let stack = Stack::start(options).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(stack.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(stack.client.clone());
    let n = if scenario == "steady" {
        (args.rate * args.duration.as_secs_f64()).round().max(1.0) as usize
    } else {
        args.claims
    };
    let label = format!("{scenario} run {run}");
    let backlog = scenario == "backlog";

    // backlog: every claim exists before the provisioner starts; the clock starts with it.
    let early = if backlog {
        let observers = Observers::start(&stack.client, "default", 0);
        let _progress = Progress::start(label.clone(), n, observers.progress());
        create_claims(args, scenario, n, &claims, &observers.created_at).await?;
        // A backlog is claims the PV controller has already handed to the provisioner (the
        // storage-provisioner annotation), as in a cluster whose provisioner was down.
        wait(Duration::from_secs(60 + n as u64), || async {
            annotated_count(&claims).await >= n
        })
        .await
        .context("the PV controller never annotated every claim of the backlog")?;
        Some(observers)
    } else {
        None
    };
    let started_early = Instant::now();
    let (child, command) = start_provisioner(args, scenario, &stack, dir.path())?;
    let pid = child.id();
    if !backlog {
        warm_up(&claims, &pvs).await?;
    }
    let rss_before = if backlog {
        0.0
    } else {
        proc_status(pid, "VmRSS:").unwrap_or(0.0)
    };
    let cpu_before = Cpu::now(pid);
    let before = counts(&stack.server, PROVISIONER_CLIENT);
    let writes_before = writes_by_client(&stack.server);
    let observers = match early {
        Some(observers) => observers.watching(pid),
        None => Observers::start(&stack.client, "default", pid),
    };
    let progress = Progress::start(label, n, observers.progress());
    let started = if backlog {
        started_early
    } else {
        Instant::now()
    };
    if !backlog {
        create_claims(args, scenario, n, &claims, &observers.created_at).await?;
    }
    let timeout = Duration::from_secs(60 + (n as u64) * 2);
    let bound_ok = wait(timeout, || async { observers.bound_count() >= n })
        .await
        .is_ok();
    let bound_times = observers.bound_times(started);
    // The last binding as the watch saw it (the wait above polls every 100 ms).
    let to_bound = match bound_times.last() {
        Some(last) if bound_ok => Duration::from_secs_f64(*last),
        _ => started.elapsed(),
    };
    let bound_over_time = crate::chart::cumulative(&bound_times, 200);
    let pvs_over_time = crate::chart::cumulative(&observers.pv_times(started), 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_rest = proc_status(pid, "VmRSS:").unwrap_or(0.0);
    let after_provision = counts(&stack.server, PROVISIONER_CLIENT);
    let writes_provisioned = writes_by_client(&stack.server);
    let cpu_provisioned = Cpu::now(pid);
    let mut problems = Vec::new();
    if !bound_ok {
        problems.push(format!(
            "only {} of {n} claims Bound within {timeout:?}",
            bound_count(&claims).await
        ));
    }
    let pv_count = pvs.list(&ListParams::default()).await?.items.len();
    let driver_volumes = driver_count(&stack.socket).await?;
    if pv_count != n {
        problems.push(format!("{pv_count} PVs for {n} claims"));
    }
    if driver_volumes != n {
        problems.push(format!("{driver_volumes} driver volumes for {n} claims"));
    }
    // From the claim's creation; in `backlog`, from the provisioner's start.
    let latencies: Vec<f64> = if backlog {
        observers.latencies_since_ms(started)
    } else {
        observers.latencies_ms()
    };

    let delete_started = Instant::now();
    delete_claims(args, n, &claims).await;
    // Watched, not listed: listing 10,000 PVs ten times a second made the benchmark and the
    // API server the bottleneck of the deletion it measures. The end state is then checked.
    let gone_ok = wait(timeout, || async { observers.deleted_count() >= n })
        .await
        .is_ok()
        && wait(Duration::from_secs(30), || async {
            pvs.list(&ListParams::default())
                .await
                .map(|l| l.items.is_empty())
                .unwrap_or(false)
                && driver_count(&stack.socket).await.unwrap_or(1) == 0
        })
        .await
        .is_ok();
    let to_deleted = delete_started.elapsed();
    let deleted_rate_halves = super::summary::half_rates(&observers.deleted_times(delete_started));
    if !gone_ok {
        problems.push("PVs or driver volumes left after deletion".into());
    }
    let after_delete = counts(&stack.server, PROVISIONER_CLIENT);
    let writes_deleted = writes_by_client(&stack.server);
    let cpu_deleted = Cpu::now(pid);
    let cpu = cpu_deleted.since(&cpu_before);
    drop(progress);
    let peak_rss = proc_status(pid, "VmHWM:")
        .unwrap_or(0.0)
        .max(observers.stop());
    child.stop().await;
    stack.shutdown(Duration::from_secs(10)).await;

    let provisioning = diff(&after_provision, &before);
    let deletion = diff(&after_delete, &after_provision);
    let per = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| (k.clone(), *v as f64 / n.max(1) as f64))
            .collect()
    };
    Ok(Report {
        scenario: scenario.to_string(),
        run,
        claims: n,
        provisioner: command,
        seconds_to_all_bound: to_bound.as_secs_f64(),
        volumes_per_second: n as f64 / to_bound.as_secs_f64(),
        latency_p50_ms: percentile(&latencies, 0.5),
        latency_p99_ms: percentile(&latencies, 0.99),
        seconds_to_all_deleted: to_deleted.as_secs_f64(),
        bound_rate_halves: super::summary::half_rates(&bound_times),
        deleted_rate_halves,
        peak_rss_mib: peak_rss,
        rss_per_1000_volumes_mib: (rss_rest - rss_before).max(0.0) / n.max(1) as f64 * 1000.0,
        cpu_seconds: cpu.get(CPU_PROVISIONER).copied().unwrap_or(0.0),
        cpu_seconds_by_process: cpu,
        cpu_seconds_provisioning: cpu_provisioned.since(&cpu_before),
        cpu_seconds_deleting: cpu_deleted.since(&cpu_provisioned),
        requests_per_provisioned_volume: per(&provisioning),
        requests_per_deleted_volume: per(&deletion),
        writes_per_provisioned_volume: writes(&provisioning) as f64 / n.max(1) as f64,
        writes_per_deleted_volume: writes(&deletion) as f64 / n.max(1) as f64,
        writes_per_provisioned_volume_by_client: per(&diff(&writes_provisioned, &writes_before)),
        writes_per_deleted_volume_by_client: per(&diff(&writes_deleted, &writes_provisioned)),
        correct: problems.is_empty(),
        problems,
        bound_over_time,
        pvs_over_time,
        chart: String::new(),
    })
}

/// The provisioner's client label in the API server's request counts.
const PROVISIONER_CLIENT: &str = "csi-provisioner";

/// The provisioner is ready when one claim gets its PV; the claim and its PV are then removed.
pub(super) async fn warm_up(
    claims: &Api<PersistentVolumeClaim>,
    pvs: &Api<PersistentVolume>,
) -> anyhow::Result<()> {
    create_claim(claims, "warmup").await?;
    wait(Duration::from_secs(120), || async {
        bound_count(claims).await == 1
    })
    .await
    .context("the provisioner never provisioned the warm-up claim")?;
    claims.delete("warmup", &DeleteParams::default()).await?;
    wait(Duration::from_secs(120), || async {
        pvs.list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
    })
    .await
}

/// Creates the scenario's claims: `steady` at a fixed rate, one task per claim; the others
/// as fast as `--concurrency` clients can.
pub(super) async fn create_claims(
    args: &BenchArgs,
    scenario: &str,
    n: usize,
    claims: &Api<PersistentVolumeClaim>,
    created_at: &Times,
) -> anyhow::Result<()> {
    let mut creators = Vec::new();
    let record = |created_at: Times, name: String| {
        created_at.lock().insert(name, Instant::now());
    };
    if scenario == "steady" {
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
        for i in 0..n {
            ticker.tick().await;
            let (claims, created_at) = (claims.clone(), created_at.clone());
            creators.push(tokio::spawn(async move {
                let name = format!("bench-{i}");
                create_claim(&claims, &name).await?;
                record(created_at, name);
                Ok::<_, anyhow::Error>(())
            }));
        }
    } else {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..args.concurrency.max(1) {
            let (claims, next, created_at) = (claims.clone(), next.clone(), created_at.clone());
            creators.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let name = format!("bench-{i}");
                    create_claim(&claims, &name).await?;
                    record(created_at.clone(), name);
                }
            }));
        }
    }
    for c in creators {
        c.await??;
    }
    Ok(())
}

/// Deletes the scenario's claims with `--concurrency` clients.
pub(super) async fn delete_claims(args: &BenchArgs, n: usize, claims: &Api<PersistentVolumeClaim>) {
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    let mut deleters = Vec::new();
    for chunk in names.chunks(n.div_ceil(args.concurrency.max(1)).max(1)) {
        let (claims, chunk) = (claims.clone(), chunk.to_vec());
        deleters.push(tokio::spawn(async move {
            for name in chunk {
                let _ = send_unread(&claims, |request| {
                    request.delete(&name, &DeleteParams::default())
                })
                .await;
            }
        }));
    }
    for d in deleters {
        let _ = d.await;
    }
}

/// Creates claim `name` (an existing one counts as created), retrying four times.
pub(super) async fn create_claim(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
) -> anyhow::Result<()> {
    let body = serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}
    }))?;
    for attempt in 0..5 {
        match send_unread(claims, |request| {
            request.create(&PostParams::default(), body.clone())
        })
        .await
        {
            Ok(()) => return Ok(()),
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => return Ok(()),
            Err(e) if attempt == 4 => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(())
}

/// Sends the request `build` makes for `api`'s resource and reads its answer without decoding
/// it (an error's Status is decoded): the benchmark creates and deletes up to 100,000 claims
/// on the cores it measures, and needs nothing of the claim each answer holds.
async fn send_unread(
    api: &Api<PersistentVolumeClaim>,
    build: impl FnOnce(
        kube::core::Request,
    ) -> Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<(), kube::Error> {
    let request =
        build(kube::core::Request::new(api.resource_url())).map_err(kube::Error::BuildRequest)?;
    api.clone().into_client().request_text(request).await?;
    Ok(())
}

/// Claims for which `matches` holds (0 when the list fails: callers wait and ask again).
async fn count_claims(
    claims: &Api<PersistentVolumeClaim>,
    matches: impl Fn(&PersistentVolumeClaim) -> bool,
) -> usize {
    claims
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter(|c| matches(c)).count())
        .unwrap_or(0)
}

/// Claims the PV controller has annotated for the provisioner.
async fn annotated_count(claims: &Api<PersistentVolumeClaim>) -> usize {
    count_claims(claims, |c| {
        c.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("volume.kubernetes.io/storage-provisioner"))
    })
    .await
}

/// Claims Bound.
pub(super) async fn bound_count(claims: &Api<PersistentVolumeClaim>) -> usize {
    count_claims(claims, |c| {
        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    })
    .await
}

pub(super) async fn driver_count(socket: &str) -> anyhow::Result<usize> {
    let channel = sidecar_kit::csi::connect(socket).await?;
    let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
    let mut total = 0;
    let mut token = String::new();
    loop {
        let r = client
            .list_volumes(csi_proto::v1::ListVolumesRequest {
                max_entries: 1000,
                starting_token: token,
            })
            .await?
            .into_inner();
        total += r.entries.len();
        if r.next_token.is_empty() {
            return Ok(total);
        }
        token = r.next_token;
    }
}

pub(super) async fn wait<F, Fut>(timeout: Duration, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !f().await {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
