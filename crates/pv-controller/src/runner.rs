//! `volstack pv-controller`: the PV binder and reclaimer run on a cluster instead of
//! kube-controller-manager's `persistentvolume-binder-controller`. Its flags take
//! kube-controller-manager's names and defaults where it has them (the API rate, the binder's
//! sync period, leader election with its own lease); `--workers` and `--http-endpoint` are
//! ours.

use std::future::Future;
use std::time::Duration;

use sidecar_kit::flags::{go_bool, go_duration};
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
use sidecar_kit::leader::ElectionConfig;
use sidecar_kit::metrics::Metrics;
use sidecar_kit::process::{Serve, ServeError};

use crate::controller::{PvController, backoff_within};

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
    /// one of each).
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
        if self.pvclaimbinder_sync_period.is_zero() {
            return flag("--pvclaimbinder-sync-period", "must be longer than 0");
        }
        if !self.metrics_path.starts_with('/') {
            return flag("--metrics-path", "must start with /");
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
    let controller = PvController::with_metrics(client.clone(), backoff, &metrics);
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
        let rows: [(&[&str], &str); 5] = [
            (&["--workers=0"], "--workers"),
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
        ];
        for (flags, named) in rows {
            let error = parse(flags).validate().err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.starts_with(named)),
                "{flags:?}: {error:?}"
            );
        }
    }
}
