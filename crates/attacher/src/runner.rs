//! Start-up of `csi-attacher`: flags → driver → API client → controller.

use std::future::Future;

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::driver::{DriverInfo, IdentifyError, identify};
use sidecar_kit::events::Recorder;
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
use sidecar_kit::metrics::Metrics;
use sidecar_kit::process::{Serve, ServeError};
use sidecar_kit::workqueue::Backoff;

use crate::controller::{Attacher, Settings};
use crate::decide::{DriverView, Options};
use crate::flags::{AttacherArgs, FlagError};

/// Why the attacher stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad flags.
    #[error(transparent)]
    Flags(#[from] FlagError),
    /// The driver failed a start-up call.
    #[error(transparent)]
    Driver(#[from] IdentifyError),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Metrics could not be registered.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The HTTP endpoint, or leadership lost.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// What the attacher needs of what the driver advertises.
pub fn driver_view(info: &DriverInfo) -> DriverView {
    DriverView {
        name: info.name.clone(),
        publish_unpublish: info.serves(Service::ControllerService)
            && info.has(Rpc::PublishUnpublishVolume),
        publish_readonly: info.has(Rpc::PublishReadonly),
        single_node_multi_writer: info.has(Rpc::SingleNodeMultiWriter),
        list_published: info.has(Rpc::ListVolumes) && info.has(Rpc::ListVolumesPublishedNodes),
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(args: AttacherArgs, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let settings = args.validate()?;
    if args.automaxprocs {
        tracing::warn!(
            flag = "--automaxprocs",
            "flag has no effect: it sizes Go's scheduler; this attacher's threads already follow the cgroup CPU quota"
        );
    }
    // Before the driver's start-up calls, which it counts.
    let metrics = Metrics::new()?;
    let (channel, info) = identify(&args.common.csi_address, args.timeout, Some(&metrics)).await?;
    let driver = driver_view(&info);
    if driver.publish_unpublish {
        tracing::info!(driver = %driver.name, version = %info.vendor_version, reconcile = driver.list_published, "CSI driver supports ControllerPublishUnpublish, using real CSI handler");
    } else {
        tracing::info!(driver = %driver.name, version = %info.vendor_version, "CSI driver does not support ControllerPublishUnpublish, using trivial handler");
    }
    let user_agent = format!("csi-attacher/{}", env!("CARGO_PKG_VERSION"));
    let client = build_client(&ClientOptions {
        kubeconfig: &args.common.kubeconfig,
        master: &args.common.master,
        qps: args.common.kube_api_qps,
        burst: args.common.kube_api_burst,
        user_agent: &user_agent,
        in_flight: Some(sidecar_kit::kubeclient::SIDECAR_IN_FLIGHT),
    })
    .await?;
    // As the other sidecars' event sources: no host.
    let recorder = Recorder::new(client.clone(), "csi-attacher");
    let election = args
        .common
        // Upstream's RBAC grants no events: the Go attacher's LeaderElection events are
        // refused, and ours are not asked for.
        .election(
            crate::decide::lease(&driver.name),
            settings.release_on_exit,
            None,
        );
    let attacher = Attacher::new(
        client.clone(),
        channel,
        Settings {
            driver,
            options: Options {
                default_fstype: args.default_fstype.clone(),
                error_codes: settings.error_codes,
            },
            timeout: args.timeout,
            workers: args.worker_threads as usize,
            backoff: Backoff {
                start: args.retry_interval_start,
                max: args.retry_interval_max,
            },
            resync: args.resync,
            reconcile_sync: args.reconcile_sync,
            max_entries: args.max_entries,
            max_log_length: args.max_grpc_log_length,
        },
        recorder,
        &metrics,
    );
    let serve = Serve {
        http_address: settings.http_address,
        metrics_path: args.common.metrics_path.clone(),
        metrics,
        election,
    };
    sidecar_kit::process::serve(attacher.controller(), client, serve, shutdown).await?;
    Ok(())
}
