//! `volstack conformance`: drives the embedded stack, around a CSI driver someone else runs,
//! through the capabilities the driver advertises with real Kubernetes objects (claims, Pods,
//! snapshots), and writes a report (terminal table, JSON, HTML; `report.rs`). Exits non-zero
//! when a capability fails.

mod checks;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;

pub use report::{Check, Outcome, Report};

/// Flags of `volstack conformance`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConformanceArgs {
    /// The driver's controller service (`unix:///path/controller.sock`).
    #[arg(long, value_parser = crate::stack::unix_socket)]
    pub driver_endpoint: String,
    /// A node and its node service (`NODE=unix:///path/node.sock`, repeatable); none: the
    /// controller endpoint serves node-1.
    #[arg(long = "node-endpoint", value_parser = crate::stack::node_endpoint)]
    pub node_endpoints: Vec<(String, String)>,
    /// A parameter of the class the volumes are made with (`KEY=VALUE`, repeatable).
    #[arg(long = "class-parameter", value_parser = crate::stack::key_value)]
    pub class_parameters: Vec<(String, String)>,
    /// A parameter of the VolumeAttributesClass `modify` moves a volume to (`KEY=VALUE`,
    /// repeatable; a mutable parameter the driver accepts). None: `modify` is skipped.
    #[arg(long = "modify-parameter", value_parser = crate::stack::key_value)]
    pub modify_parameters: Vec<(String, String)>,
    /// Run only these capabilities (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Do not run these capabilities (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Where the report (report.txt, report.json, report.html) and the stack's state go.
    #[arg(long, default_value = "conformance")]
    pub report_dir: PathBuf,
    /// The size of the volumes asked for.
    #[arg(long, default_value = "16Mi")]
    pub volume_size: String,
    /// How long each capability may take.
    #[arg(long, default_value = "120s", value_parser = sidecar_kit::flags::go_duration)]
    pub timeout: Duration,
}

/// A capability: its name, what it checks, the controller capability it needs (if any) and the
/// capabilities it builds on.
pub struct Capability {
    /// `--only`/`--skip` name.
    pub name: &'static str,
    /// What it checks.
    pub description: &'static str,
    /// The controller RPC the driver must advertise.
    pub needs: Option<Rpc>,
    /// Earlier capabilities whose objects it uses.
    pub after: &'static [&'static str],
}

/// Every capability, in the order they run.
pub const CAPABILITIES: [Capability; 17] = [
    Capability {
        name: "provision",
        description: "a claim of the driver's class is provisioned and Bound (CreateVolume)",
        needs: None,
        after: &[],
    },
    Capability {
        name: "access-modes",
        description: "claims of ReadWriteOncePod, ReadWriteMany and ReadOnlyMany are each Bound or refused with a ProvisioningFailed event (the report says which)",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "block",
        description: "a volumeMode: Block claim is provisioned and published into a Pod as a device",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "late-binding",
        description: "with WaitForFirstConsumer the volume is made on the scheduled Pod's node: its node affinity selects that node",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "capacity",
        description: "CSIStorageCapacity objects are published from GetCapacity and the scheduler turns away a claim larger than any",
        needs: Some(Rpc::GetCapacity),
        after: &["provision"],
    },
    Capability {
        name: "attach",
        description: "a Pod's volume is attached to its node (VolumeAttachment, ControllerPublishVolume)",
        needs: Some(Rpc::PublishUnpublishVolume),
        after: &["provision"],
    },
    Capability {
        name: "publish",
        description: "a Pod gets the volume (NodeStageVolume, NodePublishVolume) and a file is written into it",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "read-only",
        description: "a Pod mounting the claim read-only reads the file and cannot write (NodePublishVolume readonly)",
        needs: None,
        after: &["publish"],
    },
    Capability {
        name: "stats",
        description: "NodeGetVolumeStats gives the published volume's usage, and its condition when advertised",
        needs: None,
        after: &["publish"],
    },
    Capability {
        name: "republish",
        description: "after the Pod is gone (unpublished, unstaged), a new Pod reads the file back",
        needs: None,
        after: &["publish"],
    },
    Capability {
        name: "snapshot",
        description: "a VolumeSnapshot is taken and restored into a new claim holding the file",
        needs: Some(Rpc::CreateDeleteSnapshot),
        after: &["publish"],
    },
    Capability {
        name: "clone",
        description: "a claim cloned from the first holds the file",
        needs: Some(Rpc::CloneVolume),
        after: &["publish"],
    },
    Capability {
        name: "expansion",
        description: "claims grown to twice their size, one in use by a running Pod (online) and one not (offline, the node's part when a Pod mounts it): the claim's and the PV's capacity follow and the file stays (ControllerExpandVolume, NodeExpandVolume)",
        needs: None,
        after: &["publish"],
    },
    Capability {
        name: "modify",
        description: "a Bound claim moved to a VolumeAttributesClass of the --modify-parameter values: the claim's and the PV's class follow (ControllerModifyVolume)",
        needs: Some(Rpc::ModifyVolume),
        after: &["provision"],
    },
    Capability {
        name: "idempotency",
        description: "every call of a volume's lifecycle (CreateVolume to DeleteVolume, the advertised ones) made twice with the same arguments succeeds, naming one volume",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "restart",
        description: "claims made on the stack run as a `volstack up` process, the process killed with SIGKILL once a volume is made, and the stack started again on its data: each claim Bound to a volume of its own, and the driver lists none without a PV",
        needs: None,
        after: &["provision"],
    },
    Capability {
        name: "delete",
        description: "with the claims deleted every PV goes, and the driver lists none of the volumes (DeleteVolume, ListVolumes)",
        needs: None,
        after: &["provision"],
    },
];

/// Why a capability is not run, if it is not: not asked for (`only`, `skip`), not advertised by
/// the driver, or a capability it builds on did not pass (`done`: the results so far).
pub fn skip_reason(
    capability: &Capability,
    only: &[String],
    skip: &[String],
    info: &sidecar_kit::driver::DriverInfo,
    done: &[Check],
) -> Option<String> {
    let asked = (only.is_empty() || only.iter().any(|o| o == capability.name))
        && !skip.iter().any(|s| s == capability.name);
    if !asked {
        return Some("not asked for".to_string());
    }
    if let Some(rpc) = capability.needs.filter(|rpc| !info.has(*rpc)) {
        return Some(format!(
            "the driver does not advertise {}",
            rpc.as_str_name()
        ));
    }
    capability
        .after
        .iter()
        .find(|before| {
            !done
                .iter()
                .any(|r| r.capability == **before && r.outcome == Outcome::Passed)
        })
        .map(|before| format!("needs {before}, which did not pass"))
}

/// Runs the capabilities against the driver and writes the report; fails if one failed.
pub async fn run(args: ConformanceArgs) -> anyhow::Result<()> {
    for name in args.only.iter().chain(&args.skip) {
        if !CAPABILITIES.iter().any(|c| c.name == name) {
            let known: Vec<&str> = CAPABILITIES.iter().map(|c| c.name).collect();
            anyhow::bail!(
                "--only/--skip: unknown capability {name:?} (known: {})",
                known.join(", ")
            );
        }
    }
    // The sidecars wait for their driver for ever; a report run does not.
    let identified = tokio::time::timeout(
        args.timeout,
        sidecar_kit::driver::identify(&args.driver_endpoint, Duration::from_secs(30), None),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "--driver-endpoint: no CSI driver answered Probe at {} within {:?} (--timeout)",
            args.driver_endpoint,
            args.timeout
        )
    })?;
    let (_, info) =
        identified.with_context(|| format!("reach the CSI driver at {}", args.driver_endpoint))?;
    let report_dir = std::path::absolute(&args.report_dir).context("resolve --report-dir")?;
    let data_dir = report_dir.join("stack");
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir)
            .with_context(|| format!("remove the last run's {}", data_dir.display()))?;
    }
    durable_log::files::create_private_dir(&report_dir)
        .with_context(|| format!("create {}", report_dir.display()))?;
    let up = crate::stack::UpArgs {
        data_dir: data_dir.clone(),
        bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        capacity: "1Ti".into(),
        node: "node-1".into(),
        nodes: 1,
        attach: true,
        provisioner_args: Vec::new(),
        driver_endpoint: Some(args.driver_endpoint.clone()),
        node_endpoints: args.node_endpoints.clone(),
        class_parameters: args.class_parameters.clone(),
    };
    let first = crate::stack::start_with(up.clone(), Some(info.clone())).await?;
    let started_at = sidecar_kit::vocabulary::now_rfc3339();
    let mut world = checks::World::new(&first, &args, &info);
    let mut running = Some(first);
    let mut results: Vec<Check> = Vec::new();
    for capability in &CAPABILITIES {
        let skipped = skip_reason(capability, &args.only, &args.skip, &info, &results);
        let started = Instant::now();
        let stack_gone = running.is_none();
        let step: std::pin::Pin<Box<dyn Future<Output = Result<checks::Done, String>> + Send>> =
            match capability.name {
                "restart" => Box::pin(restart(
                    &mut running,
                    &up,
                    &info,
                    &mut world,
                    args.timeout * 3 / 4,
                )),
                name => Box::pin(world.check(name)),
            };
        let (outcome, detail, events) = match skipped {
            Some(why) => (Outcome::Skipped, why, Vec::new()),
            None if stack_gone => (
                Outcome::Failed,
                "the stack is not running: it did not start again at restart".to_string(),
                Vec::new(),
            ),
            None => match tokio::time::timeout(args.timeout, step).await {
                Ok(Ok(checks::Done::Passed(found))) => (Outcome::Passed, found, Vec::new()),
                Ok(Ok(checks::Done::Declined(why))) => (Outcome::Skipped, why, Vec::new()),
                Ok(Err(why)) => (Outcome::Failed, why, world.events().await),
                Err(_) => (
                    Outcome::Failed,
                    format!(
                        "not done after {:?}, waiting for {}",
                        args.timeout,
                        world.waiting()
                    ),
                    world.events().await,
                ),
            },
        };
        let check = Check {
            capability: capability.name.to_string(),
            description: capability.description.to_string(),
            outcome,
            seconds: started.elapsed().as_secs_f64(),
            detail,
            events,
        };
        eprintln!(
            "{}: {:?} in {:.2} s {}",
            check.capability, check.outcome, check.seconds, check.detail
        );
        results.push(check);
    }
    let report = Report {
        driver: info.name.clone(),
        version: info.vendor_version.clone(),
        started: started_at,
        checks: results,
    };
    if let Some(running) = running {
        running.shutdown(Duration::from_secs(10)).await;
    }
    let table = report.table();
    print!("{table}");
    std::fs::write(report_dir.join("report.txt"), &table).context("write report.txt")?;
    std::fs::write(
        report_dir.join("report.json"),
        serde_json::to_string_pretty(&report).context("encode the report")? + "\n",
    )
    .context("write report.json")?;
    std::fs::write(report_dir.join("report.html"), report.html()).context("write report.html")?;
    println!("report: {}", report_dir.join("report.html").display());
    if !report.passed() {
        anyhow::bail!("a capability failed");
    }
    Ok(())
}

/// `restart`: the in-process stack stopped, the same stack started on its data as a
/// `volstack up` process, claims made, the process killed with SIGKILL once the provisioner is
/// at work, and the stack started again on that data; the world then checks what the claims
/// became.
async fn restart(
    running: &mut Option<crate::stack::Running>,
    up: &crate::stack::UpArgs,
    info: &sidecar_kit::driver::DriverInfo,
    world: &mut checks::World,
    budget: Duration,
) -> Result<checks::Done, String> {
    if let Some(old) = running.take() {
        old.shutdown(Duration::from_secs(10)).await;
    }
    let mut process = checks::restart::UpProcess::start(up)?;
    // Bounded within the capability's timeout: the stack is started again whatever happens.
    let outcome = tokio::time::timeout(budget, async {
        let client = process.client().await?;
        world.reconnect_client(client);
        let before = world.before_restart().await?;
        let bound = world.provisioning_started().await?;
        process.kill()?;
        Ok::<_, String>((before, bound))
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "not done after {budget:?}, waiting for {}",
            world.waiting()
        ))
    });
    // Killed already, or killed now: nothing of it may run beside the stack started again,
    // which the later checks need whatever happened here.
    process.kill()?;
    let again = crate::stack::start_with(up.clone(), Some(info.clone()))
        .await
        .map_err(|e| format!("start the stack again: {e:#}"))?;
    world.reconnect(&again);
    *running = Some(again);
    let (before, bound) = outcome?;
    world.after_restart(before, bound).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(capability: &str, outcome: Outcome) -> Check {
        Check {
            capability: capability.into(),
            description: String::new(),
            outcome,
            seconds: 0.0,
            detail: String::new(),
            events: Vec::new(),
        }
    }

    #[test]
    fn a_capability_runs_when_asked_advertised_and_built_on_what_passed() {
        let by_name = |n: &str| {
            CAPABILITIES
                .iter()
                .find(|c| c.name == n)
                .unwrap_or(&CAPABILITIES[0])
        };
        let snapshots = sidecar_kit::driver::DriverInfo {
            rpcs: vec![Rpc::CreateDeleteSnapshot],
            ..Default::default()
        };
        let none = sidecar_kit::driver::DriverInfo::default();
        let published = [
            done("provision", Outcome::Passed),
            done("publish", Outcome::Passed),
        ];
        let failed = [
            done("provision", Outcome::Passed),
            done("publish", Outcome::Failed),
        ];
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (capability, only, skip, driver, done so far, reason or None to run)
        type Row<'a> = (
            &'a str,
            Vec<String>,
            Vec<String>,
            &'a sidecar_kit::driver::DriverInfo,
            &'a [Check],
            Option<&'a str>,
        );
        let table: Vec<Row> = vec![
            ("snapshot", vec![], vec![], &snapshots, &published, None),
            (
                "snapshot",
                vec![],
                vec![],
                &none,
                &published,
                Some("the driver does not advertise CREATE_DELETE_SNAPSHOT"),
            ),
            (
                "snapshot",
                vec![],
                vec![],
                &snapshots,
                &failed,
                Some("needs publish, which did not pass"),
            ),
            (
                "snapshot",
                s(&["provision"]),
                vec![],
                &snapshots,
                &published,
                Some("not asked for"),
            ),
            (
                "snapshot",
                vec![],
                s(&["snapshot"]),
                &snapshots,
                &published,
                Some("not asked for"),
            ),
            ("provision", s(&["provision"]), vec![], &none, &[], None),
        ];
        for (name, only, skip, info, so_far, want) in table {
            assert_eq!(
                skip_reason(by_name(name), &only, &skip, info, so_far).as_deref(),
                want,
                "{name}"
            );
        }
    }
}
