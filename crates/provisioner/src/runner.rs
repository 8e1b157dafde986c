//! Start-up of `csi-provisioner`: flags → driver → API client → controller.

use std::future::Future;

use sidecar_kit::events::Recorder;
use sidecar_kit::http::{self, Endpoint};
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
use sidecar_kit::leader::{ElectionConfig, Elector, lease_name, lease_namespace};
use sidecar_kit::metrics::Metrics;
use sidecar_kit::workqueue::Backoff;

use crate::controller::driver::{self, StartupError};
use crate::controller::{ControllerConfig, Provisioner};
use crate::decide::names::provisioner_identity;
use crate::decide::provision::ProvisionOptions;
use crate::flags::{FlagError, ProvisionerArgs};

/// Why the provisioner stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad flags.
    #[error(transparent)]
    Flags(#[from] FlagError),
    /// The driver failed a start-up call.
    #[error(transparent)]
    Driver(#[from] StartupError),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The HTTP endpoint could not start.
    #[error(transparent)]
    Http(#[from] sidecar_kit::http::HttpError),
    /// Leadership was lost; the process exits so that it restarts as a standby.
    #[error(transparent)]
    Election(#[from] sidecar_kit::leader::ElectionError),
    /// A flag that is accepted for compatibility but whose feature is missing.
    #[error("{0}")]
    Unsupported(String),
}

pub use sidecar_kit::vocabulary::hostname;

/// Runs until `shutdown` resolves.
pub async fn run(
    args: ProvisionerArgs,
    given: &[String],
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let settings = args.validate()?;
    for flag in args.inert_flags(given) {
        tracing::warn!(
            flag,
            "flag has no effect: its feature is not supported by this provisioner yet"
        );
    }
    let (channel, caps) = driver::start(&args.csi_address, args.timeout).await?;
    let user_agent = format!("csi-provisioner/{}", env!("CARGO_PKG_VERSION"));
    let client = build_client(&ClientOptions {
        kubeconfig: &args.kubeconfig,
        master: &args.master,
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        user_agent: &user_agent,
    })
    .await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let identity = provisioner_identity(now_ms, rand::random::<u32>(), &caps.name);
    let host = hostname();
    let component = format!("{}_{}_{}", caps.name, host, uuid::Uuid::new_v4());
    let recorder = Recorder::new(client.clone(), component, host);
    let caps_name = caps.name.clone();
    let config = ControllerConfig {
        options: ProvisionOptions {
            naming: settings.naming.clone(),
            default_fstype: args.default_fstype.clone(),
            extra_create_metadata: args.extra_create_metadata,
            controller_publish_readonly: args.controller_publish_readonly,
        },
        topology: settings.topology,
        volume_attributes_class: settings.volume_attributes_class,
        caps,
        timeout: args.timeout,
        workers: args.worker_threads as usize,
        backoff: Backoff {
            start: args.retry_interval_start,
            max: args.retry_interval_max,
        },
        strict_topology: args.strict_topology,
        immediate_topology: args.immediate_topology,
        cross_namespace: settings.cross_namespace,
        prevent_volume_mode_conversion: args.prevent_volume_mode_conversion,
        cloning_workers: args.cloning_protection_threads as usize,
        identity,
        intent_log: (
            lease_namespace(&args.leader_election_namespace),
            format!("{}-intents", lease_name(&caps_name)),
        ),
    };
    let driver_name = config.caps.name.clone();
    let metrics = Metrics::new()
        .map_err(|e| RunError::Unsupported(format!("failed to register metrics: {e}")))?;
    let provisioner = Provisioner::new(client.clone(), channel, config, recorder, metrics.clone());
    if !args.leader_election {
        if let Some(address) = &settings.http_address {
            http::serve(
                address,
                &args.metrics_path,
                Endpoint {
                    metrics,
                    leader: None,
                },
            )
            .await?;
        }
        provisioner.run(shutdown).await;
        return Ok(());
    }
    let election = ElectionConfig {
        namespace: lease_namespace(&args.leader_election_namespace),
        name: lease_name(&driver_name),
        identity: format!("{}_{}", hostname(), uuid::Uuid::new_v4()),
        lease_duration: args.leader_election_lease_duration,
        renew_deadline: args.leader_election_renew_deadline,
        retry_period: args.leader_election_retry_period,
        labels: args.leader_election_labels.iter().cloned().collect(),
        release_on_exit: settings.release_on_exit,
    };
    let lease_duration = election.lease_duration;
    let lease = election.name.clone();
    let elector = Elector::new(client, election);
    let status = elector.status();
    if let Some(address) = &settings.http_address {
        http::serve(
            address,
            &args.metrics_path,
            Endpoint {
                metrics: metrics.clone(),
                leader: Some((status.clone(), lease_duration)),
            },
        )
        .await?;
    }
    let gauge = metrics.leader.with_label_values(&[lease.as_str()]);
    tokio::spawn(async move {
        loop {
            gauge.set(i64::from(status.is_leader()));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    provisioner
        .controller()
        .run_as_leader(elector, shutdown)
        .await?;
    Ok(())
}
