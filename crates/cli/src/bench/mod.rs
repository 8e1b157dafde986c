//! `volstack bench`: measures a provisioner from the outside. It starts the API server
//! (durable), the reference driver and the PV controller, runs the provisioner under test as a
//! child process with the upstream flags, and reports throughput, latency, memory, CPU and the
//! API requests the provisioner made, checking the end state of every scenario.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

mod attach;
mod background;
mod capacity;
mod compare;
mod observe;
mod pool;
mod progress;
mod provisioning;
mod results;
mod summary;
mod under_test;
mod views;

use provisioning::{create_claims, delete_claims, driver_count, wait, warm_up};
use results::{Results, results_path, write_results};
use under_test::{provisioner_command, stack_options, start_provisioner};

/// The provisioning scenarios, run by [`provisioning::scenario_run`].
const PROVISIONING: [&str; 4] = ["storm", "defaults", "steady", "backlog"];

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
    /// backlog (every claim exists before the provisioner starts; timed from its start),
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
    /// The TrueType font of the charts' text (default: DejaVu Sans or Liberation Sans from
    /// /usr/share/fonts, else the first .ttf found there).
    #[arg(long)]
    pub chart_font: Option<PathBuf>,
    /// Runs of each provisioning scenario (storm, defaults, steady, backlog); the table
    /// gives the median and the spread (min to max) of each figure.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Compares two results files of earlier runs (`--output` of each) instead of running:
    /// prints each figure of both with their ratio and draws both runs of each scenario on one
    /// chart, `compare-<scenario>.png` in --chart-dir.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Claims created at once by the benchmark's clients.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Where to write the JSON results (default: bench-results.json, and each of attach, pool
    /// and capacity in its own default file). When the run has one kind of results they all go
    /// here; with several, the provisioning scenarios' go here and attach's, pool's and
    /// capacity's next to it, as F-attach.json and so on, unless their own flag names a file.
    #[arg(long)]
    pub output: Option<PathBuf>,
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
    /// capacity: where to write its JSON results (default: see --output, else
    /// bench-capacity.json).
    #[arg(long)]
    pub capacity_output: Option<PathBuf>,
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
    /// attach: where to write its JSON results (default: see --output, else bench-attach.json).
    #[arg(long)]
    pub attach_output: Option<PathBuf>,
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
    /// pool: where to write its JSON results (default: see --output, else bench-pool.json).
    #[arg(long)]
    pub pool_output: Option<PathBuf>,
}

/// The figures of one run of a provisioning scenario (what `--output` holds, one per run).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct Report {
    scenario: String,
    /// 1 to `--repeat`.
    run: usize,
    claims: usize,
    provisioner: String,
    seconds_to_all_bound: f64,
    volumes_per_second: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    seconds_to_all_deleted: f64,
    /// Claims Bound per second in the first and the second half of the claims (by count).
    bound_rate_halves: (f64, f64),
    /// PVs deleted per second in the first and the second half of the deletions.
    deleted_rate_halves: (f64, f64),
    peak_rss_mib: f64,
    rss_per_1000_volumes_mib: f64,
    /// The provisioner's, from the first claim to the last deletion.
    cpu_seconds: f64,
    /// The same window, by process: the provisioner, the API server, the driver, the
    /// controllers (PV controller, scheduler) and the benchmark's own clients.
    cpu_seconds_by_process: BTreeMap<String, f64>,
    /// By process, from the first claim to all Bound and 2 s more.
    cpu_seconds_provisioning: BTreeMap<String, f64>,
    /// By process, from then to the last deletion.
    cpu_seconds_deleting: BTreeMap<String, f64>,
    requests_per_provisioned_volume: BTreeMap<String, f64>,
    requests_per_deleted_volume: BTreeMap<String, f64>,
    writes_per_provisioned_volume: f64,
    writes_per_deleted_volume: f64,
    /// Every client's writes (creates, updates, patches, deletes) per volume while
    /// provisioning, by User-Agent, verb and resource: the benchmark's claims, the PV
    /// controller's bindings, ...
    writes_per_provisioned_volume_by_client: BTreeMap<String, f64>,
    /// The same while deleting.
    writes_per_deleted_volume_by_client: BTreeMap<String, f64>,
    correct: bool,
    problems: Vec<String>,
    /// (seconds since the first claim, or the provisioner's start in `backlog`; claims Bound).
    bound_over_time: Vec<(f64, f64)>,
    /// (the same seconds; PVs saved by the provisioner for benchmark claims).
    pvs_over_time: Vec<(f64, f64)>,
    /// The PNG drawn for this scenario.
    chart: String,
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
    crate::embedded::lanes::stat_cpu_seconds(&text)
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

/// Writes by `"<User-Agent> <VERB> <resource>"`.
fn writes_by_client(server: &apiserver::RunningServer) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((verb, resource, _code, client), n) in server.request_counts() {
        if matches!(verb.as_str(), "CREATE" | "UPDATE" | "PATCH" | "DELETE") {
            *out.entry(format!("{client} {verb} {resource}"))
                .or_default() += n;
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

/// Runs the scenarios (or compares two earlier runs) and prints the figures. Ctrl-C or SIGTERM
/// stops every process the benchmark started before it exits.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    check(&args)?;
    tokio::select! {
        result = run_checked(&args) => result,
        signal = interrupted() => {
            // Dropping the run above killed the process under test and stopped the stack.
            bail!("interrupted by {signal}: every process the benchmark started was stopped")
        }
    }
}

/// Resolves on SIGINT or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

fn check(args: &BenchArgs) -> anyhow::Result<()> {
    const KNOWN: &str = "storm, defaults, steady, backlog, capacity, attach, pool";
    if let Some(unknown) = args.scenarios.iter().find(|s| {
        !PROVISIONING.contains(&s.as_str()) && !matches!(s.as_str(), "capacity" | "attach" | "pool")
    }) {
        bail!("--scenarios: unknown scenario {unknown:?} (known: {KNOWN})");
    }
    if args.attachments == 0 {
        bail!("--attachments must be at least 1");
    }
    // Each provision of the capacity scenario is timed in a segment (node) of its own, in both
    // runs: names and measurements are per node.
    let provisions = args.capacity_provisions + args.capacity_slow_provisions;
    if args.scenarios.iter().any(|s| s == "capacity") && provisions > args.capacity_nodes {
        bail!(
            "--capacity-nodes ({}) must be at least --capacity-provisions plus --capacity-slow-provisions ({provisions}): each provision is timed on a node of its own",
            args.capacity_nodes
        );
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
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    Ok(())
}

async fn run_checked(args: &BenchArgs) -> anyhow::Result<()> {
    let chart_font = crate::chart::use_font(args.chart_font.as_deref());
    if let Some(files) = &args.compare {
        chart_font.context("--chart-font")?;
        return compare::run(args, files);
    }
    if let Err(error) = &chart_font {
        if args.chart_font.is_some() {
            bail!("--chart-font: {error}");
        }
        eprintln!("charts are not drawn: {error}");
    }
    let mut reports = Vec::new();
    let mut wrong = false;
    for scenario in &args.scenarios {
        if scenario == "attach" {
            let report = attach::run(args).await?;
            attach::print(&report);
            wrong |= !report.correct();
            write_results(&results_path(args, Results::Attach), &report)?;
            continue;
        }
        if scenario == "pool" {
            if args.pool_minimum == 0 {
                bail!("--pool-minimum must be at least 1");
            }
            if args.pool_creates == 0 {
                bail!("--pool-creates must be at least 1");
            }
            let report = pool::run(args).await?;
            pool::print(&report);
            wrong |= !report.correct();
            write_results(&results_path(args, Results::Pool), &report)?;
            continue;
        }
        if scenario == "capacity" {
            let reports = capacity::run(args).await?;
            wrong |= reports.iter().any(|r| !r.correct());
            write_results(&results_path(args, Results::Capacity), &reports)?;
            continue;
        }
        let mut runs = Vec::new();
        for run in 1..=args.repeat {
            let report = provisioning::scenario_run(args, scenario, run).await?;
            print_report(&report);
            runs.push(report);
        }
        let chart = if chart_font.is_ok() {
            draw_runs(args, scenario, &runs)?
        } else {
            String::new()
        };
        for report in &mut runs {
            report.chart.clone_from(&chart);
        }
        if runs.len() > 1 {
            summary::print(&runs);
        }
        reports.extend(runs);
    }
    if !reports.is_empty() {
        write_results(&results_path(args, Results::Provisioning), &reports)?;
    }
    if wrong || reports.iter().any(|r| !r.correct) {
        bail!("a scenario ended in a wrong state: its figures do not count");
    }
    Ok(())
}

/// The provisioner's name in titles and legends: its program's file name.
fn short_name(command: &str) -> String {
    let program = command.split_whitespace().next().unwrap_or(command);
    std::path::Path::new(program)
        .file_name()
        .map_or_else(|| program.to_string(), |n| n.to_string_lossy().into_owned())
}

/// `bench-<scenario>.png`: claims Bound over time, a line per run.
fn draw_runs(args: &BenchArgs, scenario: &str, runs: &[Report]) -> anyhow::Result<String> {
    let Some(first) = runs.first() else {
        return Ok(String::new());
    };
    std::fs::create_dir_all(&args.chart_dir)
        .with_context(|| format!("create {}", args.chart_dir.display()))?;
    let path = args.chart_dir.join(format!("bench-{scenario}.png"));
    // Claims Bound per run; with one run, also the PVs the provisioner saved, so a gap between
    // the two lines shows the PV controller's binding behind the provisioner.
    let mut lines: Vec<crate::chart::Line> = runs
        .iter()
        .map(|r| crate::chart::Line {
            label: format!(
                "run {}: claims Bound, all in {:.2} s",
                r.run, r.seconds_to_all_bound
            ),
            points: r.bound_over_time.clone(),
        })
        .collect();
    if let [only] = runs
        && !only.pvs_over_time.is_empty()
    {
        lines.push(crate::chart::Line {
            label: "PVs saved by the provisioner".into(),
            points: only.pvs_over_time.clone(),
        });
    }
    let title = format!(
        "{scenario}: {} claims, {}",
        first.claims,
        short_name(&first.provisioner)
    );
    crate::chart::write_png(
        &path,
        &crate::chart::Chart {
            title: &title,
            x_desc: time_axis(scenario),
            y_desc: "claims",
            lines: &lines,
        },
    )
    .with_context(|| format!("draw {}", path.display()))?;
    Ok(path.display().to_string())
}

/// The x axis of a scenario's chart.
fn time_axis(scenario: &str) -> &'static str {
    if scenario == "backlog" {
        "seconds since the provisioner started"
    } else {
        "seconds since the first claim was created"
    }
}

fn print_report(r: &Report) {
    println!(
        "scenario {} run {} ({} claims, provisioner: {})",
        r.scenario, r.run, r.claims, r.provisioner
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
        "  bound per second           first half {:.0}, second half {:.0}",
        r.bound_rate_halves.0, r.bound_rate_halves.1
    );
    println!(
        "  all deleted after          {:>10.2} s",
        r.seconds_to_all_deleted
    );
    println!(
        "  deleted per second         first half {:.0}, second half {:.0}",
        r.deleted_rate_halves.0, r.deleted_rate_halves.1
    );
    println!("  provisioner peak RSS       {:>10.1} MiB", r.peak_rss_mib);
    println!(
        "  RSS per 1000 volumes       {:>10.2} MiB",
        r.rss_per_1000_volumes_mib
    );
    println!("  provisioner CPU            {:>10.2} s", r.cpu_seconds);
    let by_process = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(name, s)| format!("{name} {s:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  CPU provisioning           {}",
        by_process(&r.cpu_seconds_provisioning)
    );
    println!(
        "  CPU deleting               {}",
        by_process(&r.cpu_seconds_deleting)
    );
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
        "  writes by client           provisioning {:?}, deleting {:?}",
        r.writes_per_provisioned_volume_by_client, r.writes_per_deleted_volume_by_client
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
