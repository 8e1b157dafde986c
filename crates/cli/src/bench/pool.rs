//! `volstack bench --scenarios=pool`: claim-to-Bound latency from a warm pool
//! (PersistentVolumeSet) against dynamic provisioning, with our provisioner
//! (`--enable-volume-sets`, QPS limits lifted). One stack, two runs of the same claims arriving
//! at `--rate` for `--duration`: first with no pool (each claim waits for CreateVolume), then
//! with a set of `--pool-minimum` ready volumes (maximum: minimum + claims) filled before the
//! claims arrive. Reports p50/p99/max latency of each run, how many claims the pool served,
//! and how long filling the pool took.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use provisioner::volume_sets::types::PersistentVolumeSet;
use serde_json::json;

use super::observe::Observers;
use super::{BenchArgs, delete_claims, driver_count, percentile, wait};
use crate::embedded::Stack;

/// The set's name (its volumes are `<name>-<hex>`).
const SET: &str = "bench-pool";

/// Latency of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Latency {
    claims: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Claims bound to a volume of the pool.
    from_pool: usize,
}

/// The figures of the scenario.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct PoolReport {
    rate_per_second: f64,
    create_volume_latency_ms: u128,
    set_creates_in_flight: u32,
    pool_minimum: usize,
    pool_maximum: usize,
    seconds_to_fill_pool: f64,
    dynamic: Latency,
    pool: Latency,
    problems: Vec<String>,
}

impl PoolReport {
    pub(super) fn correct(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Claims to Bound, at `--rate`, and their latency; then they are deleted and waited for.
async fn one_run(
    args: &BenchArgs,
    stack: &Stack,
    pid: u32,
    n: usize,
    problems: &mut Vec<String>,
    what: &str,
) -> anyhow::Result<Latency> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(stack.client.clone(), "default");
    let observers = Observers::start(&stack.client, "default", pid);
    super::create_claims(args, "steady", n, &claims, &observers.created_at).await?;
    let timeout = Duration::from_secs(60 + (n as u64) * 2);
    if wait(timeout, || async { observers.bound_count() >= n })
        .await
        .is_err()
    {
        problems.push(format!(
            "{what}: only {} of {n} claims Bound",
            observers.bound_count()
        ));
    }
    let latencies = observers.bound_latencies_ms();
    let from_pool = claims
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| v.starts_with(&format!("{SET}-")))
        })
        .count();
    observers.stop();
    delete_claims(args, n, &claims).await;
    Ok(Latency {
        claims: latencies.len(),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        from_pool,
    })
}

/// Waits until only the pool's Available volumes are left (none when `keep` is 0, else at
/// least `keep`: the minimum is a floor), each with its driver volume.
async fn settle(stack: &Stack, keep: usize, what: &str, problems: &mut Vec<String>) {
    let pvs: Api<PersistentVolume> = Api::all(stack.client.clone());
    let settled = wait(Duration::from_secs(300), || async {
        let Ok(list) = pvs.list(&ListParams::default()).await else {
            return false;
        };
        let pool_only = list.items.iter().all(|pv| {
            pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
                && pv
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(SET))
        });
        let n = list.items.len();
        let right = if keep == 0 { n == 0 } else { n >= keep };
        pool_only && right && driver_count(&stack.socket).await.ok() == Some(n)
    })
    .await;
    if settled.is_err() {
        let left = pvs
            .list(&ListParams::default())
            .await
            .map_or(0, |l| l.items.len());
        let driver = driver_count(&stack.socket).await.unwrap_or(0);
        problems.push(format!(
            "{what}: {left} PVs and {driver} driver volumes after the claims were deleted, {keep} Available pool volumes wanted"
        ));
    }
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<PoolReport> {
    let n = (args.rate * args.duration.as_secs_f64()).round().max(1.0) as usize;
    let minimum = args.pool_minimum;
    let maximum = minimum + n;
    let dir = tempfile::tempdir()?;
    let mut options = super::stack_options(dir.path());
    // The driver's CreateVolume latency (--create-latency) is injected through its fault file.
    options.driver_args.push(format!(
        "--fault-file={}",
        dir.path().join("faults").display()
    ));
    let stack = Stack::start(options).await?;
    if !args.create_latency.is_zero() {
        let latency = format!(
            "CreateVolume=latency:{}ms\n",
            args.create_latency.as_millis()
        );
        std::fs::write(dir.path().join("faults"), latency)?;
    }
    let mut ours = args.clone();
    ours.provisioner_cmd = Some(format!(
        "{} --enable-volume-sets --volume-set-creates={}",
        std::env::current_exe()?
            .with_file_name("csi-provisioner")
            .display(),
        args.pool_creates
    ));
    let (child, _) = super::start_provisioner(&ours, "pool", &stack, dir.path())?;
    let pid = child.id();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(stack.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(stack.client.clone());
    super::warm_up(&claims, &pvs).await?;
    let mut problems = Vec::new();

    println!(
        "pool: {n} claims at {}/s, provisioned dynamically",
        args.rate
    );
    let dynamic = one_run(args, &stack, pid, n, &mut problems, "dynamic").await?;
    settle(&stack, 0, "dynamic", &mut problems).await;

    println!("pool: filling a pool of {minimum} volumes");
    let set: PersistentVolumeSet = serde_json::from_value(json!({
        "apiVersion": "storage.volstack.dev/v1alpha1",
        "kind": "PersistentVolumeSet",
        "metadata": {"name": SET},
        "spec": {
            "minimumReplicas": minimum,
            "maximumReplicas": maximum,
            "selector": {"matchLabels": {"pool": SET}},
            "template": {
                "metadata": {"labels": {"pool": SET}},
                "spec": {"storageClassName": "hostpath", "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"]},
            },
        },
    }))?;
    let sets: Api<PersistentVolumeSet> = Api::all(stack.client.clone());
    sets.create(&PostParams::default(), &set).await?;
    let fill_started = Instant::now();
    let available = || async {
        pvs.list(&ListParams::default().labels(&format!("pool={SET}")))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|pv| {
                        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    if wait(Duration::from_secs(60 + minimum as u64), || async {
        available().await >= minimum
    })
    .await
    .is_err()
    {
        problems.push(format!("the pool never held {minimum} Available volumes"));
    }
    let seconds_to_fill_pool = fill_started.elapsed().as_secs_f64();

    println!("pool: {n} claims at {}/s, served from the pool", args.rate);
    let pool = one_run(args, &stack, pid, n, &mut problems, "pool").await?;
    // Their volumes are deleted with the claims (Delete) and the set refills to its minimum.
    settle(&stack, minimum, "pool", &mut problems).await;
    sets.delete(SET, &DeleteParams::default()).await?;
    settle(&stack, 0, "pool deleted", &mut problems).await;

    child.stop().await;
    stack.shutdown(Duration::from_secs(10)).await;
    Ok(PoolReport {
        rate_per_second: args.rate,
        create_volume_latency_ms: args.create_latency.as_millis(),
        set_creates_in_flight: args.pool_creates,
        pool_minimum: minimum,
        pool_maximum: maximum,
        seconds_to_fill_pool,
        dynamic,
        pool,
        problems,
    })
}

pub(super) fn print(r: &PoolReport) {
    println!(
        "scenario pool ({} claims at {}/s; CreateVolume {} ms; pool of {} Available, at most {}, {} creates in flight)",
        r.dynamic.claims.max(r.pool.claims),
        r.rate_per_second,
        r.create_volume_latency_ms,
        r.pool_minimum,
        r.pool_maximum,
        r.set_creates_in_flight
    );
    println!("  filling the pool:  {:.2} s", r.seconds_to_fill_pool);
    for (what, l) in [("dynamic", &r.dynamic), ("from pool", &r.pool)] {
        println!(
            "  {what:<10} claim to Bound: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} of {} claims bound to pool volumes)",
            l.p50_ms, l.p99_ms, l.max_ms, l.from_pool, l.claims
        );
    }
    for p in &r.problems {
        println!("  PROBLEM: {p}");
    }
}
