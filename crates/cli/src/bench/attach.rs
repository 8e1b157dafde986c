//! `volstack bench --scenarios=attach`: attach and detach throughput of the attacher under
//! test (ours by default, or `--attacher-cmd`). `--attachments` volumes are made at the driver
//! (`--enable-attach`) with their PVs; then as many VolumeAttachments are created at once and
//! timed until every one is attached, and deleted at once and timed until every one is gone.
//! Reports the API writes per attach and per detach, the attacher's CPU and peak RSS, and
//! checks the driver's published state after each phase.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_proto::v1 as csi;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;

use super::background::{Background, watch};
use super::under_test::UnderTest;
use super::{BenchArgs, cpu_seconds, proc_status};
use crate::embedded::{Stack, StackOptions};

const CLIENT: &str = "csi-attacher";

/// The figures of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct AttachReport {
    attacher: String,
    default_qps: bool,
    attachments: usize,
    seconds_to_all_attached: f64,
    attaches_per_second: f64,
    api_writes_per_attach: f64,
    seconds_to_all_detached: f64,
    detaches_per_second: f64,
    api_writes_per_detach: f64,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    problems: Vec<String>,
}

impl AttachReport {
    pub(super) fn correct(&self) -> bool {
        self.problems.is_empty()
    }
}

fn writes(stack: &Stack) -> u64 {
    stack
        .server
        .request_counts()
        .into_iter()
        .filter(|((verb, _, _, client), _)| {
            client == CLIENT && matches!(verb.as_str(), "CREATE" | "UPDATE" | "PATCH" | "DELETE")
        })
        .map(|(_, n)| n)
        .sum()
}

async fn published(socket: &str) -> anyhow::Result<usize> {
    let channel = sidecar_kit::csi::connect(socket).await?;
    let mut client = csi::controller_client::ControllerClient::new(channel);
    let list = client
        .list_volumes(csi::ListVolumesRequest::default())
        .await?
        .into_inner();
    Ok(list
        .entries
        .iter()
        .filter(|e| {
            e.status
                .as_ref()
                .is_some_and(|s| !s.published_node_ids.is_empty())
        })
        .count())
}

/// Makes `n` volumes at the driver and their PVs.
async fn volumes(stack: &Stack, n: usize, concurrency: usize) -> anyhow::Result<()> {
    let channel = sidecar_kit::csi::connect(&stack.socket).await?;
    let pvs: Api<PersistentVolume> = Api::all(stack.client.clone());
    all_at_once(n, concurrency, |i| {
        let (channel, pvs) = (channel.clone(), pvs.clone());
        async move {
            let mut client = csi::controller_client::ControllerClient::new(channel);
            let cap = csi::VolumeCapability::mount(
                "",
                csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            );
            let id = client
                .create_volume(csi::CreateVolumeRequest {
                    name: format!("bench-{i:05}"),
                    volume_capabilities: vec![cap],
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 1 << 20,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .volume
                .context("CreateVolume returned no volume")?
                .volume_id;
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": format!("bench-{i:05}")},
                "spec": {
                    "capacity": {"storage": "1Mi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "csi": {"driver": stack.driver_name, "volumeHandle": id},
                },
            }))?;
            pvs.create(&PostParams::default(), &pv).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok(())
}

fn start(
    args: &BenchArgs,
    stack: &Stack,
    dir: &std::path::Path,
) -> anyhow::Result<(UnderTest, String)> {
    let (program, mut words, command) = super::under_test::command_line(
        args.attacher_cmd.as_deref(),
        "csi-attacher",
        "--attacher-cmd",
        stack,
    )?;
    if !args.attach_default_qps {
        super::under_test::lift_limits(&mut words);
    }
    let child = super::under_test::start_sidecar(
        "attacher",
        &program,
        &words,
        &dir.join("attacher.log"),
        &[],
    )?;
    Ok((child, command))
}

/// Runs `one(i)` for every i below `n`, `concurrency` at a time; the first error wins.
async fn all_at_once<F, Fut>(n: usize, concurrency: usize, one: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    futures::stream::iter(0..n)
        .map(one)
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// Counts attached VolumeAttachments and those that exist, from a watch.
#[derive(Default)]
struct Seen {
    attached: BTreeSet<String>,
    existing: BTreeSet<String>,
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<AttachReport> {
    let n = args.attachments;
    let tmp = tempfile::tempdir()?;
    let dir = if std::env::var_os("VOLSTACK_BENCH_KEEP").is_some() {
        tmp.keep()
    } else {
        tmp.path().to_path_buf()
    };
    let stack = Stack::start(StackOptions {
        driver_args: vec!["--enable-attach".into(), "--publish-mode=symlink".into()],
        pv_controller: None,
        snapshots: false,
        scheduler: false,
        ..StackOptions::new(dir.clone(), "volstack-bench/0.1")
    })
    .await?;
    println!("attach: making {n} volumes and PVs");
    volumes(&stack, n, args.concurrency).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let vas: Api<VolumeAttachment> = Api::all(stack.client.clone());
    let mut background = Background::default();
    background.spawn({
        let (seen, vas) = (seen.clone(), vas.clone());
        async move {
            let stream = watch(vas);
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let mut s = seen.lock();
                match event {
                    watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                        let name = va.metadata.name.clone().unwrap_or_default();
                        if va.status.as_ref().is_some_and(|s| s.attached) {
                            s.attached.insert(name.clone());
                        }
                        s.existing.insert(name);
                    }
                    watcher::Event::Delete(va) => {
                        s.existing.remove(&va.metadata.name.unwrap_or_default());
                    }
                    _ => {}
                }
            }
        }
    });
    let (attacher, command) = start(args, &stack, &dir)?;
    let pid = attacher.id();
    let mut problems = Vec::new();
    let timeout = Duration::from_secs(600);

    let before = writes(&stack);
    let started = Instant::now();
    all_at_once(n, args.concurrency, |i| {
        let vas = vas.clone();
        let driver = stack.driver_name.clone();
        async move {
            let va: VolumeAttachment = serde_json::from_value(json!({
                "metadata": {"name": format!("bench-{i:05}")},
                "spec": {"attacher": driver, "nodeName": "node-1", "source": {"persistentVolumeName": format!("bench-{i:05}")}},
            }))?;
            vas.create(&PostParams::default(), &va).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    while seen.lock().attached.len() < n {
        if started.elapsed() > timeout {
            bail!(
                "attach: only {} of {n} attached after {timeout:?}",
                seen.lock().attached.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let attach_seconds = started.elapsed().as_secs_f64();
    let attach_writes = writes(&stack) - before;
    let on_driver = published(&stack.socket).await?;
    if on_driver != n {
        problems.push(format!(
            "after attach the driver publishes {on_driver} volumes, not {n}"
        ));
    }
    println!("attach: {n} attached in {attach_seconds:.2} s");

    let before = writes(&stack);
    let started = Instant::now();
    all_at_once(n, args.concurrency, |i| {
        let vas = vas.clone();
        async move {
            vas.delete(&format!("bench-{i:05}"), &DeleteParams::default())
                .await?;
            anyhow::Ok(())
        }
    })
    .await?;
    while !seen.lock().existing.is_empty() {
        if started.elapsed() > timeout {
            bail!(
                "detach: {} attachments left after {timeout:?}",
                seen.lock().existing.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let detach_seconds = started.elapsed().as_secs_f64();
    let detach_writes = writes(&stack) - before;
    let left = published(&stack.socket).await?;
    if left != 0 {
        problems.push(format!(
            "after detach the driver still publishes {left} volumes"
        ));
    }
    let remaining = vas.list(&ListParams::default()).await?.items.len();
    if remaining != 0 {
        problems.push(format!("{remaining} VolumeAttachments left"));
    }
    let cpu = cpu_seconds(pid).unwrap_or(0.0);
    let peak = proc_status(pid, "VmHWM:").unwrap_or(0.0);
    attacher.stop().await;
    drop(background);
    stack.shutdown(Duration::from_secs(5)).await;
    let per = |w: u64| w as f64 / n as f64;
    Ok(AttachReport {
        attacher: command,
        default_qps: args.attach_default_qps,
        attachments: n,
        seconds_to_all_attached: attach_seconds,
        attaches_per_second: n as f64 / attach_seconds,
        api_writes_per_attach: per(attach_writes),
        seconds_to_all_detached: detach_seconds,
        detaches_per_second: n as f64 / detach_seconds,
        api_writes_per_detach: per(detach_writes),
        cpu_seconds: cpu,
        peak_rss_mib: peak,
        problems,
    })
}

pub(super) fn print(r: &AttachReport) {
    let qps = if r.default_qps {
        "default QPS 5/10"
    } else {
        "QPS limits lifted"
    };
    println!(
        "scenario attach ({} VolumeAttachments, {qps}, attacher: {})",
        r.attachments, r.attacher
    );
    println!(
        "  all attached after         {:>10.2} s  ({:.1} attaches/s, {:.2} API writes each)",
        r.seconds_to_all_attached, r.attaches_per_second, r.api_writes_per_attach
    );
    println!(
        "  all detached after         {:>10.2} s  ({:.1} detaches/s, {:.2} API writes each)",
        r.seconds_to_all_detached, r.detaches_per_second, r.api_writes_per_detach
    );
    println!("  attacher CPU               {:>10.2} s", r.cpu_seconds);
    println!("  attacher peak RSS          {:>10.1} MiB", r.peak_rss_mib);
    for p in &r.problems {
        println!("  PROBLEM: {p}");
    }
}
