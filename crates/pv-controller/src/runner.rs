//! `volstack pv-controller`: the PV binder and reclaimer run on a cluster instead of
//! kube-controller-manager's `persistentvolume-binder-controller`. Its flags take
//! kube-controller-manager's names and defaults where it has them (the API rate, the binder's
//! sync period, leader election with its own lease, the recyclers of hostPath and NFS
//! volumes); `--workers` and `--http-endpoint` are ours.

use std::future::Future;
use std::time::Duration;

use sidecar_kit::flags::{go_bool, go_duration};
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
use sidecar_kit::leader::ElectionConfig;
use sidecar_kit::metrics::Metrics;
use sidecar_kit::process::{Serve, ServeError};

use crate::controller::{PvController, backoff_within};
use crate::decide::recycle::{PluginRecycler, RecyclerConfig, default_template, validate_template};

/// A recycler Pod template from a file (kube-controller-manager's `LoadPodFromFile` and
/// `ValidateRecyclerPodTemplate`): a Pod in YAML or JSON with at least one volume.
pub fn load_template(path: &str) -> Result<k8s_openapi::api::core::v1::Pod, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("failed to read file path {path}: {error}"))?;
    if text.trim().is_empty() {
        return Err(format!("file was empty: {path}"));
    }
    let first = sidecar_kit::yaml::objects(&text)
        .map_err(|error| format!("failed decoding file {path}: {error}"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("failed decoding file {path}: no object in it"))?;
    if first["kind"].as_str().is_some_and(|kind| kind != "Pod") {
        return Err(format!(
            "failed decoding file {path}: a {} is not a Pod",
            first["kind"]
        ));
    }
    let pod = serde_json::from_value(first)
        .map_err(|error| format!("failed decoding file {path}: {error}"))?;
    validate_template(&pod).map_err(|error| format!("pod specification ({path}): {error}"))?;
    Ok(pod)
}

/// The lease replicas elect a leader through (`--leader-elect-resource-name`).
pub const LEASE: &str = "volstack-pv-controller";

/// Flags of `volstack pv-controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct PvControllerArgs {
    /// Kubeconfig of the API server (empty: in-cluster configuration).
    #[arg(long, env = "KUBECONFIG", default_value = "")]
    pub kubeconfig: String,
    /// The API server's address, overriding the kubeconfig's.
    #[arg(long, default_value = "")]
    pub master: String,
    /// Requests per second to the API server (<= 0: unlimited). kube-controller-manager's
    /// default.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,
    /// Burst above `--kube-api-qps`.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,
    /// Concurrent claim workers, and as many volume workers (kube-controller-manager runs
    /// one of each) and recycles (each waits for its recycler Pod).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// How often volumes whose claim is missing are looked at again, whatever the events
    /// said; also the longest wait before a claim or volume that failed is tried again.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub pvclaimbinder_sync_period: Duration,
    /// Elect a leader among replicas through a Lease (one binds at a time).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub leader_elect: bool,
    /// Namespace of the Lease.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = LEASE)]
    pub leader_elect_resource_name: String,
    /// How long a leader's Lease stands without renewal.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader tries to renew before it stops leading.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often a standby tries to take the Lease.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub leader_elect_retry_period: Duration,
    /// Address of the HTTP endpoint: `/healthz` (and `/healthz/leader-election`) and the
    /// metrics (kube-controller-manager's `pv_collector_*` gauges and the `workqueue_*` series
    /// of the `claims` and `volumes` queues).
    #[arg(long, default_value = "")]
    pub http_endpoint: String,
    /// Path of the metrics on `--http-endpoint`.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,
    /// The shortest deadline (`activeDeadlineSeconds`) of a hostPath volume's recycler Pod.
    #[arg(long, default_value_t = 60)]
    pub pv_recycler_minimum_timeout_hostpath: i64,
    /// Seconds added to a hostPath recycler Pod's deadline per whole GiB of the volume.
    #[arg(long, default_value_t = 30)]
    pub pv_recycler_timeout_increment_hostpath: i64,
    /// The shortest deadline of an NFS volume's recycler Pod.
    #[arg(long, default_value_t = 300)]
    pub pv_recycler_minimum_timeout_nfs: i64,
    /// Seconds added to an NFS recycler Pod's deadline per whole GiB of the volume.
    #[arg(long, default_value_t = 30)]
    pub pv_recycler_increment_timeout_nfs: i64,
    /// A Pod (YAML or JSON) to recycle hostPath volumes with instead of the default one; its
    /// first volume becomes the volume's hostPath.
    #[arg(long, default_value = "")]
    pub pv_recycler_pod_template_filepath_hostpath: String,
    /// A Pod to recycle NFS volumes with; its first volume becomes the volume's NFS share.
    #[arg(long, default_value = "")]
    pub pv_recycler_pod_template_filepath_nfs: String,
}

/// Why the controller could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A flag's value is not usable.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Why.
        message: String,
    },
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The metrics could not be registered.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The HTTP endpoint could not start, or leadership was lost.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

impl PvControllerArgs {
    /// The flags' combined meaning, or the first flag that makes none.
    fn validate(&self) -> Result<(), RunError> {
        let flag = |flag, message: &str| {
            Err(RunError::Flag {
                flag,
                message: message.to_string(),
            })
        };
        if self.workers == 0 {
            return flag("--workers", "must be at least 1");
        }
        if self.kube_api_qps.is_nan() {
            return flag("--kube-api-qps", "must be a number");
        }
        if self.pvclaimbinder_sync_period.is_zero() {
            return flag("--pvclaimbinder-sync-period", "must be longer than 0");
        }
        if let Some(reason) = sidecar_kit::http::metrics_path_error(&self.metrics_path) {
            return flag("--metrics-path", reason);
        }
        // A deadline must be positive (kube-apiserver refuses a Pod with another).
        for (name, value, least) in [
            (
                "--pv-recycler-minimum-timeout-hostpath",
                self.pv_recycler_minimum_timeout_hostpath,
                1,
            ),
            (
                "--pv-recycler-timeout-increment-hostpath",
                self.pv_recycler_timeout_increment_hostpath,
                0,
            ),
            (
                "--pv-recycler-minimum-timeout-nfs",
                self.pv_recycler_minimum_timeout_nfs,
                1,
            ),
            (
                "--pv-recycler-increment-timeout-nfs",
                self.pv_recycler_increment_timeout_nfs,
                0,
            ),
        ] {
            if value < least {
                return flag(name, &format!("must be at least {least}"));
            }
        }
        if self.leader_elect {
            if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration {
                return flag(
                    "--leader-elect-renew-deadline",
                    "must be shorter than --leader-elect-lease-duration",
                );
            }
            if self.leader_elect_retry_period >= self.leader_elect_renew_deadline {
                return flag(
                    "--leader-elect-retry-period",
                    "must be shorter than --leader-elect-renew-deadline",
                );
            }
            if self.leader_elect_resource_namespace.is_empty()
                || self.leader_elect_resource_name.is_empty()
            {
                return flag(
                    "--leader-elect-resource-name",
                    "the Lease needs a namespace and a name",
                );
            }
        }
        Ok(())
    }

    /// The recyclers the flags describe; a template file that cannot serve names its flag
    /// (kube-controller-manager exits too).
    fn recycler(&self) -> Result<RecyclerConfig, RunError> {
        let plugin = |flag: &'static str, path: &str, minimum_timeout, timeout_increment| {
            let template = match path {
                "" => default_template(),
                path => load_template(path).map_err(|message| RunError::Flag { flag, message })?,
            };
            Ok::<_, RunError>(PluginRecycler {
                template,
                minimum_timeout,
                timeout_increment,
            })
        };
        Ok(RecyclerConfig {
            host_path: plugin(
                "--pv-recycler-pod-template-filepath-hostpath",
                &self.pv_recycler_pod_template_filepath_hostpath,
                self.pv_recycler_minimum_timeout_hostpath,
                self.pv_recycler_timeout_increment_hostpath,
            )?,
            nfs: plugin(
                "--pv-recycler-pod-template-filepath-nfs",
                &self.pv_recycler_pod_template_filepath_nfs,
                self.pv_recycler_minimum_timeout_nfs,
                self.pv_recycler_increment_timeout_nfs,
            )?,
            past_deadline: crate::decide::recycle::PAST_DEADLINE,
        })
    }

    fn election(&self) -> Option<ElectionConfig> {
        self.leader_elect.then(|| ElectionConfig {
            namespace: self.leader_elect_resource_namespace.clone(),
            name: self.leader_elect_resource_name.clone(),
            identity: format!(
                "{}_{}",
                sidecar_kit::vocabulary::hostname(),
                uuid::Uuid::new_v4()
            ),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            labels: Default::default(),
            release_on_exit: true,
            // The ClusterRole grants events.
            events: Some(self.leader_elect_resource_name.clone()),
            metric_name: self.leader_elect_resource_name.clone(),
        })
    }
}

/// Runs the controller until `shutdown` resolves (or leadership is lost).
pub async fn run(
    args: PvControllerArgs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    args.validate()?;
    let recycler = args.recycler()?;
    let user_agent = format!("volstack-pv-controller/{}", env!("CARGO_PKG_VERSION"));
    let client = build_client(&ClientOptions {
        kubeconfig: &args.kubeconfig,
        master: &args.master,
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        user_agent: &user_agent,
        in_flight: Some(sidecar_kit::kubeclient::SIDECAR_IN_FLIGHT),
    })
    .await?;
    let metrics = Metrics::new()?;
    let backoff = backoff_within(args.pvclaimbinder_sync_period);
    let controller = PvController::with_metrics(client.clone(), backoff, &metrics, Some(recycler));
    metrics
        .registry
        .register(Box::new(controller.collector()))?;
    let serve = Serve {
        http_address: (!args.http_endpoint.is_empty()).then(|| args.http_endpoint.clone()),
        metrics_path: args.metrics_path.clone(),
        metrics,
        election: args.election(),
    };
    sidecar_kit::process::serve(
        controller.controller(args.workers, args.pvclaimbinder_sync_period),
        client,
        serve,
        shutdown,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: PvControllerArgs,
    }

    fn parse(flags: &[&str]) -> PvControllerArgs {
        let argv = std::iter::once("pv-controller").chain(flags.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.args,
            Err(error) => panic!("{flags:?}: {error}"),
        }
    }

    #[test]
    fn defaults_are_kube_controller_managers_and_bad_values_name_their_flag() {
        let args = parse(&["--kubeconfig=k"]);
        assert_eq!((args.kube_api_qps, args.kube_api_burst), (20.0, 30));
        assert_eq!(args.pvclaimbinder_sync_period, Duration::from_secs(15));
        assert!(!args.leader_elect);
        assert!(args.election().is_none());
        let elected = parse(&["--kubeconfig=k", "--leader-elect"]);
        let election = elected
            .election()
            .map(|e| (e.namespace, e.name, e.retry_period));
        assert_eq!(
            election,
            Some(("kube-system".into(), LEASE.into(), Duration::from_secs(2)))
        );
        assert!(elected.validate().is_ok());
        let rows: [(&[&str], &str); 11] = [
            (&["--workers=0"], "--workers"),
            (&["--kube-api-qps=NaN"], "--kube-api-qps"),
            (&["--metrics-path=/healthz"], "--metrics-path"),
            (
                &["--pvclaimbinder-sync-period=0s"],
                "--pvclaimbinder-sync-period",
            ),
            (&["--metrics-path=metrics"], "--metrics-path"),
            (
                &["--leader-elect", "--leader-elect-renew-deadline=20s"],
                "--leader-elect-renew-deadline",
            ),
            (
                &["--leader-elect", "--leader-elect-retry-period=10s"],
                "--leader-elect-retry-period",
            ),
            (
                &["--pv-recycler-minimum-timeout-hostpath=0"],
                "--pv-recycler-minimum-timeout-hostpath",
            ),
            (
                &["--pv-recycler-timeout-increment-hostpath=-1"],
                "--pv-recycler-timeout-increment-hostpath",
            ),
            (
                &["--pv-recycler-minimum-timeout-nfs=-5"],
                "--pv-recycler-minimum-timeout-nfs",
            ),
            (
                &["--pv-recycler-increment-timeout-nfs=-1"],
                "--pv-recycler-increment-timeout-nfs",
            ),
        ];
        for (flags, named) in rows {
            let error = parse(flags).validate().err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.starts_with(named)),
                "{flags:?}: {error:?}"
            );
        }
    }

    #[test]
    fn the_recyclers_take_kube_controller_managers_defaults_and_template_files() {
        let args = parse(&["--kubeconfig=k"]);
        assert_eq!(args.recycler().unwrap(), RecyclerConfig::default());
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("scrub.yaml");
        std::fs::write(
            &yaml,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: ops\nspec:\n  containers:\n  - name: c\n    image: busybox\n  volumes:\n  - name: target\n    emptyDir: {}\n",
        )
        .unwrap();
        let yaml = yaml.to_string_lossy().to_string();
        let flags = [
            "--pv-recycler-minimum-timeout-nfs=100".to_string(),
            "--pv-recycler-timeout-increment-hostpath=10".to_string(),
            format!("--pv-recycler-pod-template-filepath-nfs={yaml}"),
        ];
        let args = parse(&flags.iter().map(String::as_str).collect::<Vec<_>>());
        let config = args.recycler().unwrap();
        assert_eq!(config.host_path.template, default_template());
        assert_eq!(
            (
                config.host_path.minimum_timeout,
                config.host_path.timeout_increment
            ),
            (60, 10)
        );
        assert_eq!(
            config.nfs.template.metadata.namespace.as_deref(),
            Some("ops")
        );
        assert_eq!(
            (config.nfs.minimum_timeout, config.nfs.timeout_increment),
            (100, 30)
        );

        let no_volume = dir.path().join("no-volume.json");
        std::fs::write(&no_volume, r#"{"kind": "Pod", "spec": {"containers": []}}"#).unwrap();
        let service = dir.path().join("service.yaml");
        std::fs::write(&service, "kind: Service\nmetadata:\n  name: s\n").unwrap();
        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "\n").unwrap();
        let missing = dir.path().join("missing.yaml");
        let rows = [
            (&no_volume, "does not contain any volume(s)"),
            (&service, "is not a Pod"),
            (&empty, "file was empty"),
            (&missing, "failed to read file path"),
        ];
        for (path, want) in rows {
            let flag = format!(
                "--pv-recycler-pod-template-filepath-hostpath={}",
                path.display()
            );
            let error = parse(&[&flag]).recycler().err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e
                    .starts_with("--pv-recycler-pod-template-filepath-hostpath")
                    && e.contains(want)),
                "{flag}: {error:?}"
            );
        }
    }
}
