//! Start-up of `csi-provisioner`: flags → driver → API client → controller.

use std::future::Future;

use sidecar_kit::events::Recorder;
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
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
    /// A flag that is accepted for compatibility but whose feature is missing.
    #[error("{0}")]
    Unsupported(String),
}

/// This machine's host name, for the event source and identities.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

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
    if args.leader_election {
        return Err(RunError::Unsupported(
            "--leader-election: leader election is not available in this build yet; run one replica".into(),
        ));
    }
    if settings.http_address.is_some() {
        return Err(RunError::Unsupported(
            "--http-endpoint/--metrics-address: the metrics endpoint is not available in this build yet".into(),
        ));
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
        identity,
    };
    let provisioner = Provisioner::new(client, channel, config, recorder);
    provisioner.run(shutdown).await;
    Ok(())
}
