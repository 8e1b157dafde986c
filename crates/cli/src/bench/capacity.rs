//! `volstack bench --scenarios=capacity`: storage-capacity tracking at scale. Many nodes
//! (registered as objects; one driver process stands for all of them with `--extra-node`) ×
//! several WaitForFirstConsumer classes. Two runs of the provisioner under test: with the
//! capacity QPS limits lifted (it publishes every object), then restarted at upstream's
//! default capacity QPS 1/burst 5 (it adopts the objects that exist). Each run reports the
//! GetCapacity calls and API writes per minute in steady state, and the delay from a volume
//! provisioned in a segment to that segment's updated object (p50/p99).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;

use super::background::{Background, watch};
use super::under_test::UnderTest;
use super::{BenchArgs, cpu_seconds, percentile, proc_status};
use crate::embedded::{Stack, StackOptions};

const KEY: &str = hostpath_driver::config::DEFAULT_TOPOLOGY_KEY;
const CLIENT: &str = "csi-provisioner";

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct CapacityReport {
    run: String,
    nodes: usize,
    classes: usize,
    objects: usize,
    /// Seconds from the provisioner's start until every object exists (lifted run), or until
    /// every object is adopted (no writes needed; default run).
    seconds_to_publish_all: f64,
    get_capacity_per_minute: f64,
    api_writes_per_minute: f64,
    provisions: usize,
    provisions_per_second: f64,
    update_delay_p50_ms: f64,
    update_delay_p99_ms: f64,
    updates_seen: usize,
    cpu_seconds: f64,
    rss_after_publish_mib: f64,
    peak_rss_mib: f64,
    problems: Vec<String>,
}

/// When each (class, node)'s capacity last changed, and when each node's PV appeared.
#[derive(Default)]
struct Seen {
    objects: HashMap<(String, String), (String, Instant)>,
    pv_at: HashMap<String, Instant>,
    updated_at: HashMap<String, Instant>,
}

fn node_of_object(o: &CSIStorageCapacity) -> String {
    o.node_topology
        .as_ref()
        .and_then(|t| t.match_labels.as_ref())
        .and_then(|l| l.get(KEY).cloned())
        .unwrap_or_default()
}

fn node_of_pv(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    terms
        .first()?
        .match_expressions
        .as_ref()?
        .iter()
        .find(|e| e.key == KEY)?
        .values
        .as_ref()?
        .first()
        .cloned()
}

fn watch_all(client: &kube::Client, seen: Arc<Mutex<Seen>>, measured_class: String) -> Background {
    let mut tasks = Background::default();
    let objects: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), "kube-system");
    let s = seen.clone();
    tasks.spawn(async move {
        let stream = watch(objects);
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    let node = node_of_object(&o);
                    let value = o.capacity.map(|q| q.0).unwrap_or_default();
                    let mut s = s.lock();
                    let key = (o.storage_class_name.clone(), node.clone());
                    let changed = s.objects.get(&key).is_some_and(|(v, _)| *v != value);
                    s.objects.insert(key, (value, Instant::now()));
                    if changed && o.storage_class_name == measured_class {
                        s.updated_at.insert(node, Instant::now());
                    }
                }
                watcher::Event::Delete(o) => {
                    s.lock()
                        .objects
                        .remove(&(o.storage_class_name.clone(), node_of_object(&o)));
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
        }
    });
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    tasks.spawn(async move {
        let stream = watch(pvs);
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let watcher::Event::Apply(pv) = item
                && let Some(node) = node_of_pv(&pv)
            {
                seen.lock().pv_at.entry(node).or_insert_with(Instant::now);
            }
        }
    });
    tasks
}

impl CapacityReport {
    pub(super) fn correct(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Runs the capacity scenario: both runs, one report each.
pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<Vec<CapacityReport>> {
    let nodes = args.capacity_nodes.max(1);
    let classes = args.capacity_classes.max(1);
    let dir = tempfile::tempdir()?;
    // VOLSTACK_BENCH_KEEP=1 keeps the provisioner's logs (and the stack's state).
    let keep = std::env::var_os("VOLSTACK_BENCH_KEEP").is_some();
    let mut driver_args = vec![
        "--capacity=1Ti".to_string(),
        "--publish-mode=symlink".to_string(),
    ];
    driver_args.extend((2..=nodes).map(|i| format!("--extra-node=node-{i}")));
    let stack = Stack::start(StackOptions {
        durable: true,
        driver_args,
        pv_controller: Some((4, pv_controller::controller::default_backoff())),
        snapshots: false,
        scheduler: false,
        ..StackOptions::new(dir.path().to_path_buf(), "volstack-bench/0.1")
    })
    .await?;
    register_nodes(&stack.client, nodes).await?;
    let class_api: Api<StorageClass> = Api::all(stack.client.clone());
    for c in 0..classes {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": format!("late-{c}")},
            "provisioner": stack.driver_name,
            "volumeBindingMode": "WaitForFirstConsumer",
        }))?;
        class_api.create(&PostParams::default(), &class).await?;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watchers = watch_all(&stack.client, seen.clone(), "late-0".into());
    let mut reports = Vec::new();
    let mut next_node = 1;
    for (run, lifted) in [("capacity-lifted", true), ("capacity-default-qps", false)] {
        let report = one_run(
            args,
            &stack,
            dir.path(),
            &seen,
            run,
            lifted,
            nodes,
            classes,
            &mut next_node,
        )
        .await?;
        print_capacity(&report);
        reports.push(report);
    }
    drop(watchers);
    stack.shutdown(Duration::from_secs(10)).await;
    if keep {
        let kept = dir.keep();
        println!("logs kept in {}", kept.display());
    }
    Ok(reports)
}

async fn register_nodes(client: &kube::Client, nodes: usize) -> anyhow::Result<()> {
    let node_api: Api<Node> = Api::all(client.clone());
    let csinode_api: Api<CSINode> = Api::all(client.clone());
    let names: Vec<String> = (2..=nodes).map(|i| format!("node-{i}")).collect();
    let mut tasks = Vec::new();
    for chunk in names.chunks(names.len().div_ceil(32).max(1)) {
        let (node_api, csinode_api, chunk) =
            (node_api.clone(), csinode_api.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for name in chunk {
                let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {KEY: name}}}))?;
                node_api.create(&PostParams::default(), &node).await?;
                let csinode: CSINode = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"drivers": [{"name": hostpath_driver::config::DEFAULT_DRIVER_NAME, "nodeID": name, "topologyKeys": [KEY]}]}
                }))?;
                csinode_api.create(&PostParams::default(), &csinode).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// GetCapacity calls so far, from the provisioner's `csi_sidecar_operations_seconds_count`.
async fn get_capacity_calls(port: u16) -> f64 {
    sidecar_kit::http::get_local(port, "/metrics")
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("csi_sidecar_operations_seconds_count") && l.contains("GetCapacity")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn capacity_writes(server: &apiserver::RunningServer) -> u64 {
    server
        .request_counts()
        .into_iter()
        .filter(|((verb, resource, _, client), _)| {
            client == CLIENT
                && resource.contains("csistoragecapacities")
                && matches!(verb.as_str(), "CREATE" | "UPDATE" | "PATCH" | "DELETE")
        })
        .map(|(_, n)| n)
        .sum()
}

fn start(
    args: &BenchArgs,
    stack: &Stack,
    dir: &std::path::Path,
    lifted: bool,
    port: u16,
    run: &str,
) -> anyhow::Result<UnderTest> {
    let (program, mut words, _) = super::provisioner_command(args, stack)?;
    words.extend(["--enable-capacity", "--capacity-ownerref-level=-1"].map(String::from));
    super::under_test::lift_limits(&mut words);
    words.push(format!("--http-endpoint=127.0.0.1:{port}"));
    if lifted {
        words.push("--kube-api-capacity-qps=10000".into());
        words.push("--kube-api-capacity-burst=10000".into());
    }
    let mut env = vec![("NAMESPACE", "kube-system".to_string())];
    if let Ok(log) = std::env::var("VOLSTACK_BENCH_PROVISIONER_LOG") {
        env.push(("RUST_LOG", log));
    }
    super::under_test::start_sidecar(
        "provisioner",
        &program,
        &words,
        &dir.join(format!("{run}.log")),
        &env,
    )
}

#[allow(clippy::too_many_arguments)]
async fn one_run(
    args: &BenchArgs,
    stack: &Stack,
    dir: &std::path::Path,
    seen: &Arc<Mutex<Seen>>,
    run: &str,
    lifted: bool,
    nodes: usize,
    classes: usize,
    next_node: &mut usize,
) -> anyhow::Result<CapacityReport> {
    let objects = nodes * classes;
    let port = free_port()?;
    let mut problems = Vec::new();
    let started = Instant::now();
    let child = start(args, stack, dir, lifted, port, run)?;
    let pid = child.id();
    // Published (lifted) or adopted (default: the objects exist; nothing to write): every
    // object present and the provisioner's gauge says so.
    let mut publish = None;
    while started.elapsed() < args.capacity_timeout {
        let have = seen.lock().objects.len();
        let goal_met =
            metric(port, "csistoragecapacities_desired_current").await == Some(objects as f64);
        if have == objects && goal_met {
            publish = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let publish = publish.unwrap_or_else(|| {
        problems.push(format!(
            "not every object published within {:?}",
            args.capacity_timeout
        ));
        started.elapsed()
    });
    let cpu_start = cpu_seconds(pid).unwrap_or(0.0);
    let rss_after_publish = proc_status(pid, "VmRSS:").unwrap_or(0.0);
    // Steady state: nothing changes; polls only.
    let (calls_before, writes_before) = (
        get_capacity_calls(port).await,
        capacity_writes(&stack.server),
    );
    tokio::time::sleep(args.capacity_window).await;
    let minutes = args.capacity_window.as_secs_f64() / 60.0;
    let calls_per_minute = (get_capacity_calls(port).await - calls_before) / minutes;
    let writes_per_minute = (capacity_writes(&stack.server) - writes_before) as f64 / minutes;
    // Provisions in distinct segments at a modest rate; delay to the segment's new object.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(stack.client.clone(), "default");
    let mut measured = Vec::new();
    let (count, rate) = if lifted {
        (args.capacity_provisions, args.capacity_rate)
    } else {
        (args.capacity_slow_provisions, args.capacity_slow_rate)
    };
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    for _ in 0..count {
        ticker.tick().await;
        let node = format!("node-{}", *next_node);
        *next_node = *next_node % nodes + 1;
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("{run}-{node}"), "annotations": {"volume.kubernetes.io/selected-node": node}},
            "spec": {"storageClassName": "late-0", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
        measured.push(node);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut delays = Vec::new();
    loop {
        delays.clear();
        {
            let s = seen.lock();
            for node in &measured {
                if let (Some(pv), Some(updated)) = (s.pv_at.get(node), s.updated_at.get(node)) {
                    delays.push(updated.saturating_duration_since(*pv).as_secs_f64() * 1000.0);
                }
            }
        }
        if delays.len() == measured.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if delays.len() < measured.len() {
        problems.push(format!(
            "{} of {} segments updated",
            delays.len(),
            measured.len()
        ));
    }
    delays.sort_by(f64::total_cmp);
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu_start;
    let peak = proc_status(pid, "VmHWM:").unwrap_or(0.0);
    child.stop().await;
    Ok(CapacityReport {
        run: run.to_string(),
        nodes,
        classes,
        objects,
        seconds_to_publish_all: publish.as_secs_f64(),
        get_capacity_per_minute: calls_per_minute,
        api_writes_per_minute: writes_per_minute,
        provisions: measured.len(),
        provisions_per_second: rate,
        update_delay_p50_ms: percentile(&delays, 0.5),
        update_delay_p99_ms: percentile(&delays, 0.99),
        updates_seen: delays.len(),
        cpu_seconds: cpu,
        rss_after_publish_mib: rss_after_publish,
        peak_rss_mib: peak,
        problems,
    })
}

/// One unlabelled metric's value.
async fn metric(port: u16, name: &str) -> Option<f64> {
    sidecar_kit::http::get_local(port, "/metrics")
        .await
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn print_capacity(r: &CapacityReport) {
    println!(
        "scenario {} ({} nodes × {} classes = {} objects)",
        r.run, r.nodes, r.classes, r.objects
    );
    println!(
        "  all published/adopted after {:>10.2} s",
        r.seconds_to_publish_all
    );
    println!(
        "  GetCapacity per minute      {:>10.0}",
        r.get_capacity_per_minute
    );
    println!(
        "  API writes per minute       {:>10.1}  (steady state)",
        r.api_writes_per_minute
    );
    println!(
        "  provision → object updated  p50 {:.0} ms, p99 {:.0} ms ({} of {} provisions, {}/s)",
        r.update_delay_p50_ms,
        r.update_delay_p99_ms,
        r.updates_seen,
        r.provisions,
        r.provisions_per_second
    );
    println!(
        "  provisioner CPU             {:>10.2} s, RSS {:.1} MiB after publishing, peak {:.1} MiB",
        r.cpu_seconds, r.rss_after_publish_mib, r.peak_rss_mib
    );
    if r.problems.is_empty() {
        println!("  correct");
    } else {
        println!("  WRONG: {}", r.problems.join("; "));
    }
}
