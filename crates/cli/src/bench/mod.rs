//! `volstack bench`: measures a provisioner from the outside. It starts the API server
//! (durable), the reference driver and the PV controller, runs the provisioner under test as a
//! child process with the upstream flags, and reports throughput, latency, memory, CPU and the
//! API requests the provisioner made, checking the end state of every scenario.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::embedded::Stack;
use observe::{Observers, Times};

mod attach;
mod capacity;
mod observe;
mod pool;
mod under_test;

use under_test::{provisioner_command, stack_options, start_provisioner};

/// Flags of `volstack bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Claims per scenario.
    #[arg(long, default_value_t = 1000)]
    pub claims: usize,
    /// The provisioner under test, as a command line (default: our csi-provisioner). The
    /// benchmark appends --csi-address, --kubeconfig and, for `storm`, the QPS flags.
    #[arg(long)]
    pub provisioner_cmd: Option<String>,
    /// Scenarios to run: storm (all claims at once, QPS limits lifted), defaults (the same with
    /// upstream's default QPS 5/burst 10), steady (a fixed arrival rate, limits lifted),
    /// capacity (CSIStorageCapacity publishing for --capacity-nodes × --capacity-classes; not
    /// in the default set: it takes minutes), attach (--attachments VolumeAttachments attached
    /// and detached at once by the attacher under test; not in the default set), pool
    /// (claim-to-Bound latency from a warm PersistentVolumeSet against dynamic provisioning,
    /// claims arriving at --rate for --duration; ours only; not in the default set).
    #[arg(long, value_delimiter = ',', default_value = "storm,defaults,steady")]
    pub scenarios: Vec<String>,
    /// Arrival rate of the steady scenario, claims per second.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Length of the steady scenario (Go duration).
    #[arg(long, default_value = "20s", value_parser = sidecar_kit::duration::parse_go_duration)]
    pub duration: Duration,
    /// Directory for the PNG charts of claims Bound over time (one per scenario).
    #[arg(long, default_value = ".")]
    pub chart_dir: PathBuf,
    /// Claims created at once by the benchmark's clients.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results.json")]
    pub output: PathBuf,
    /// capacity: nodes (registered as objects; one driver process stands for all).
    #[arg(long, default_value_t = 2000)]
    pub capacity_nodes: usize,
    /// capacity: WaitForFirstConsumer classes.
    #[arg(long, default_value_t = 5)]
    pub capacity_classes: usize,
    /// capacity: the steady-state window in which calls and writes are counted.
    #[arg(long, default_value = "1m", value_parser = sidecar_kit::duration::parse_go_duration)]
    pub capacity_window: Duration,
    /// capacity: volumes provisioned (each in another segment) to time the updates.
    #[arg(long, default_value_t = 100)]
    pub capacity_provisions: usize,
    /// capacity: provisions per second.
    #[arg(long, default_value_t = 2.0)]
    pub capacity_rate: f64,
    /// capacity: provisions timed in the run at the default capacity QPS (1 write/s: each
    /// provision changes an object per class in its segment).
    #[arg(long, default_value_t = 20)]
    pub capacity_slow_provisions: usize,
    /// capacity: provisions per second in the run at the default capacity QPS.
    #[arg(long, default_value_t = 0.2)]
    pub capacity_slow_rate: f64,
    /// capacity: how long publishing every object may take.
    #[arg(long, default_value = "10m", value_parser = sidecar_kit::duration::parse_go_duration)]
    pub capacity_timeout: Duration,
    /// capacity: where to write its JSON results.
    #[arg(long, default_value = "bench-capacity.json")]
    pub capacity_output: PathBuf,
    /// attach: the attacher under test, as a command line (default: our csi-attacher). The
    /// benchmark appends --csi-address, --kubeconfig and QPS flags that lift the limits.
    #[arg(long)]
    pub attacher_cmd: Option<String>,
    /// attach: leave the attacher at its default client QPS (5/burst 10) instead of lifting
    /// the limits (its writes per attach then set the pace).
    #[arg(long)]
    pub attach_default_qps: bool,
    /// attach: VolumeAttachments created (and deleted) at once.
    #[arg(long, default_value_t = 1000)]
    pub attachments: usize,
    /// attach: where to write its JSON results.
    #[arg(long, default_value = "bench-attach.json")]
    pub attach_output: PathBuf,
    /// pool: Available volumes the warm pool keeps (its maximum is this plus the claims).
    #[arg(long, default_value_t = 1000)]
    pub pool_minimum: usize,
    /// pool: how long the driver's CreateVolume takes (injected latency; a cloud disk takes
    /// seconds, the reference driver a few milliseconds).
    #[arg(long, default_value = "0s", value_parser = sidecar_kit::duration::parse_go_duration)]
    pub create_latency: Duration,
    /// pool: CreateVolume calls in flight for the set (`--volume-set-creates`).
    #[arg(long, default_value_t = 10)]
    pub pool_creates: u32,
    /// pool: where to write its JSON results.
    #[arg(long, default_value = "bench-pool.json")]
    pub pool_output: PathBuf,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Report {
    scenario: String,
    claims: usize,
    provisioner: String,
    seconds_to_all_bound: f64,
    volumes_per_second: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    seconds_to_all_deleted: f64,
    peak_rss_mib: f64,
    rss_per_1000_volumes_mib: f64,
    cpu_seconds: f64,
    requests_per_provisioned_volume: BTreeMap<String, f64>,
    requests_per_deleted_volume: BTreeMap<String, f64>,
    writes_per_provisioned_volume: f64,
    writes_per_deleted_volume: f64,
    correct: bool,
    problems: Vec<String>,
    chart: String,
    chart_scale: String,
}

fn proc_status(pid: u32, key: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Requests `client` made, by `"<VERB> <resource>"`.
fn counts(server: &apiserver::RunningServer, client: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((verb, resource, _code, c), n) in server.request_counts() {
        if c == client {
            *out.entry(format!("{verb} {resource}")).or_default() += n;
        }
    }
    out
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn writes(m: &BTreeMap<String, u64>) -> u64 {
    m.iter()
        .filter(|(key, _)| {
            let verb = key.split(' ').next().unwrap_or_default();
            matches!(verb, "CREATE" | "UPDATE" | "PATCH" | "DELETE")
        })
        .map(|(_, n)| n)
        .sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Runs the scenarios and prints a table.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(unknown) = args.scenarios.iter().find(|s| {
        !matches!(
            s.as_str(),
            "storm" | "defaults" | "steady" | "capacity" | "attach" | "pool"
        )
    }) {
        bail!(
            "--scenarios: unknown scenario {unknown:?} (known: storm, defaults, steady, capacity, attach, pool)"
        );
    }
    if args.attachments == 0 {
        bail!("--attachments must be at least 1");
    }
    for (flag, rate) in [
        ("--capacity-rate", args.capacity_rate),
        ("--capacity-slow-rate", args.capacity_slow_rate),
    ] {
        if !(rate > 0.0 && rate.is_finite()) {
            bail!("{flag} must be a positive number of provisions per second");
        }
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a positive number of claims per second");
    }
    if args.claims == 0 {
        bail!("--claims must be at least 1");
    }
    let mut reports = Vec::new();
    let mut wrong = false;
    for scenario in &args.scenarios {
        if scenario == "attach" {
            let report = attach::run(&args).await?;
            attach::print(&report);
            wrong |= !report.correct();
            std::fs::write(&args.attach_output, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("write {}", args.attach_output.display()))?;
            println!("results written to {}", args.attach_output.display());
            continue;
        }
        if scenario == "pool" {
            if args.pool_minimum == 0 {
                bail!("--pool-minimum must be at least 1");
            }
            if args.pool_creates == 0 {
                bail!("--pool-creates must be at least 1");
            }
            let report = pool::run(&args).await?;
            pool::print(&report);
            wrong |= !report.correct();
            std::fs::write(&args.pool_output, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("write {}", args.pool_output.display()))?;
            println!("results written to {}", args.pool_output.display());
            continue;
        }
        if scenario == "capacity" {
            let reports = capacity::run(&args).await?;
            wrong |= reports.iter().any(|r| !r.correct());
            std::fs::write(
                &args.capacity_output,
                serde_json::to_string_pretty(&reports)?,
            )
            .with_context(|| format!("write {}", args.capacity_output.display()))?;
            println!("results written to {}", args.capacity_output.display());
            continue;
        }
        let report = scenario_run(&args, scenario).await?;
        print_report(&report);
        reports.push(report);
    }
    if !reports.is_empty() {
        std::fs::write(&args.output, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("write {}", args.output.display()))?;
        println!("results written to {}", args.output.display());
    }
    if wrong || reports.iter().any(|r| !r.correct) {
        bail!("a scenario ended in a wrong state: its figures do not count");
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "scenario {} ({} claims, provisioner: {})",
        r.scenario, r.claims, r.provisioner
    );
    println!(
        "  all Bound after            {:>10.2} s  ({:.1} volumes/s)",
        r.seconds_to_all_bound, r.volumes_per_second
    );
    println!(
        "  claim-to-PV latency        p50 {:.0} ms, p99 {:.0} ms",
        r.latency_p50_ms, r.latency_p99_ms
    );
    println!(
        "  all deleted after          {:>10.2} s",
        r.seconds_to_all_deleted
    );
    println!("  provisioner peak RSS       {:>10.1} MiB", r.peak_rss_mib);
    println!(
        "  RSS per 1000 volumes       {:>10.2} MiB",
        r.rss_per_1000_volumes_mib
    );
    println!("  CPU                        {:>10.2} s", r.cpu_seconds);
    println!(
        "  requests per provisioned   {:?}",
        r.requests_per_provisioned_volume
    );
    println!(
        "  requests per deleted       {:?}",
        r.requests_per_deleted_volume
    );
    println!(
        "  writes per provisioned     {:>10.2}",
        r.writes_per_provisioned_volume
    );
    println!(
        "  writes per deleted         {:>10.2}",
        r.writes_per_deleted_volume
    );
    println!(
        "  chart                      {} ({})",
        r.chart, r.chart_scale
    );
    println!(
        "  end state                  {}",
        if r.correct {
            "correct".to_string()
        } else {
            format!("WRONG: {:?}", r.problems)
        }
    );
}

/// One scenario: a fresh stack, the provisioner under test as a child process, a warm-up
/// claim, then the claims, their deletion, and the figures.
async fn scenario_run(args: &BenchArgs, scenario: &str) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let stack = Stack::start(stack_options(dir.path())).await?;
    let (child, command) = start_provisioner(args, scenario, &stack, dir.path())?;
    let pid = child.id();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(stack.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(stack.client.clone());
    warm_up(&claims, &pvs).await?;

    let rss_before = proc_status(pid, "VmRSS:").unwrap_or(0.0);
    let cpu_before = cpu_seconds(pid).unwrap_or(0.0);
    let before = counts(&stack.server, PROVISIONER_CLIENT);
    let observers = Observers::start(&claims, &pvs, pid);
    let n = if scenario == "steady" {
        (args.rate * args.duration.as_secs_f64()).round().max(1.0) as usize
    } else {
        args.claims
    };
    let started = Instant::now();
    create_claims(args, scenario, n, &claims, &observers.created_at).await?;
    let timeout = Duration::from_secs(60 + (n as u64) * 2);
    let bound_ok = wait(timeout, || async { observers.bound_count() >= n })
        .await
        .is_ok();
    let to_bound = started.elapsed();
    let (chart, chart_scale) = draw_chart(args, scenario, &observers.bound_times(started))?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_rest = proc_status(pid, "VmRSS:").unwrap_or(0.0);
    let after_provision = counts(&stack.server, PROVISIONER_CLIENT);
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
    let latencies = observers.latencies_ms();

    let delete_started = Instant::now();
    delete_claims(args, n, &claims).await;
    let gone_ok = wait(timeout, || async {
        pvs.list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
            && driver_count(&stack.socket).await.unwrap_or(1) == 0
    })
    .await
    .is_ok();
    let to_deleted = delete_started.elapsed();
    if !gone_ok {
        problems.push("PVs or driver volumes left after deletion".into());
    }
    let after_delete = counts(&stack.server, PROVISIONER_CLIENT);
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
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
        claims: n,
        provisioner: command,
        seconds_to_all_bound: to_bound.as_secs_f64(),
        volumes_per_second: n as f64 / to_bound.as_secs_f64(),
        latency_p50_ms: percentile(&latencies, 0.5),
        latency_p99_ms: percentile(&latencies, 0.99),
        seconds_to_all_deleted: to_deleted.as_secs_f64(),
        peak_rss_mib: peak_rss,
        rss_per_1000_volumes_mib: (rss_rest - rss_before).max(0.0) / n.max(1) as f64 * 1000.0,
        cpu_seconds: cpu,
        requests_per_provisioned_volume: per(&provisioning),
        requests_per_deleted_volume: per(&deletion),
        writes_per_provisioned_volume: writes(&provisioning) as f64 / n.max(1) as f64,
        writes_per_deleted_volume: writes(&deletion) as f64 / n.max(1) as f64,
        correct: problems.is_empty(),
        problems,
        chart: chart.display().to_string(),
        chart_scale,
    })
}

/// The provisioner's client label in the API server's request counts.
const PROVISIONER_CLIENT: &str = "csi-provisioner";

/// The provisioner is ready when one claim gets its PV; the claim and its PV are then removed.
async fn warm_up(
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
async fn create_claims(
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
async fn delete_claims(args: &BenchArgs, n: usize, claims: &Api<PersistentVolumeClaim>) {
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    let mut deleters = Vec::new();
    for chunk in names.chunks(n.div_ceil(args.concurrency.max(1)).max(1)) {
        let (claims, chunk) = (claims.clone(), chunk.to_vec());
        deleters.push(tokio::spawn(async move {
            for name in chunk {
                let _ = claims.delete(&name, &DeleteParams::default()).await;
            }
        }));
    }
    for d in deleters {
        let _ = d.await;
    }
}

/// Draws claims Bound over time; returns the chart's path and its scale.
fn draw_chart(
    args: &BenchArgs,
    scenario: &str,
    times: &[f64],
) -> anyhow::Result<(std::path::PathBuf, String)> {
    let stride = (times.len() / 400).max(1);
    let series: crate::chart::Series = times
        .iter()
        .enumerate()
        .filter(|(i, _)| i % stride == 0 || *i + 1 == times.len())
        .map(|(i, t)| (*t, i + 1))
        .collect();
    std::fs::create_dir_all(&args.chart_dir)
        .with_context(|| format!("create {}", args.chart_dir.display()))?;
    let chart = args.chart_dir.join(format!("bench-{scenario}.png"));
    let (max_t, max_n) = crate::chart::write(&chart, &[series])
        .with_context(|| format!("write {}", chart.display()))?;
    Ok((
        chart,
        format!("x: 0 to {max_t:.1} s, y: 0 to {max_n} claims Bound, grid every 10%"),
    ))
}

async fn create_claim(claims: &Api<PersistentVolumeClaim>, name: &str) -> anyhow::Result<()> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}
    }))?;
    for attempt in 0..5 {
        match claims.create(&PostParams::default(), &pvc).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(e) if attempt == 4 => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(())
}

async fn bound_count(claims: &Api<PersistentVolumeClaim>) -> usize {
    claims
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .count()
        })
        .unwrap_or(0)
}

async fn driver_count(socket: &str) -> anyhow::Result<usize> {
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

async fn wait<F, Fut>(timeout: Duration, mut f: F) -> anyhow::Result<()>
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
