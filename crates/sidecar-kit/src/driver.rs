//! Start-up against a CSI driver, as every sidecar does it: connect (retrying every second),
//! Probe until ready (a missing `ready` counts as ready), then GetPluginInfo,
//! GetPluginCapabilities and, when the plugin has a controller service,
//! ControllerGetCapabilities; any error in these is fatal, as upstream. Counted in the metrics
//! as upstream's sidecars count them: Probe and GetPluginInfo under `unknown-driver` (the name
//! is not known yet), the rest under the driver's.

use std::time::Duration;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::plugin_capability::service::Type as Service;
use csi_proto::v1 as csi;
use tonic::transport::Channel;

use crate::csi::{CallError, Caller, ConnectError, connect_with_retry};

/// A start-up failure; the process exits.
#[derive(Debug, thiserror::Error)]
pub enum IdentifyError {
    /// The address can never work.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// One of the identity or capability calls failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// GetPluginInfo returned no name.
    #[error("driver returned an empty name from GetPluginInfo")]
    NoName,
}

/// What a driver says it is and can do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// GetPluginInfo name.
    pub name: String,
    /// GetPluginInfo vendor version.
    pub vendor_version: String,
    /// Plugin services (GetPluginCapabilities).
    pub services: Vec<Service>,
    /// Controller RPCs (ControllerGetCapabilities; empty without a controller service).
    pub rpcs: Vec<Rpc>,
    /// GetPluginInfo manifest (driver-specific facts, such as the conventions it follows).
    pub manifest: std::collections::HashMap<String, String>,
}

impl DriverInfo {
    /// Whether the controller advertises `rpc`.
    pub fn has(&self, rpc: Rpc) -> bool {
        self.rpcs.contains(&rpc)
    }

    /// Whether the plugin advertises `service`.
    pub fn serves(&self, service: Service) -> bool {
        self.services.contains(&service)
    }
}

/// The driver name csi-lib-utils records calls under before the name is known.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// Probes every second until the driver says it is ready (a missing `ready` counts as ready).
async fn probe_until_ready(
    identity: &mut csi::identity_client::IdentityClient<Channel>,
    calls: &Caller,
) {
    let mut attempts: u64 = 0;
    loop {
        let probe = identity.probe(calls.request(csi::ProbeRequest {}));
        match calls.call("/csi.v1.Identity/Probe", probe).await {
            Ok(r) if r.ready != Some(false) => return,
            Ok(_) => tracing::info!("CSI driver is not ready yet"),
            Err(error) => {
                if attempts.is_multiple_of(10) {
                    tracing::warn!(%error, "CSI Probe failed; retrying");
                }
            }
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Connects to `address` and learns what the driver is and can do; each call has `timeout`
/// and is counted in `metrics` when given. A driver that stands in for an in-tree plugin gets
/// the metrics' `migrated` label and is probed again, as upstream's sidecars connect again
/// with a second metrics manager for it.
pub async fn identify(
    address: &str,
    timeout: Duration,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<(Channel, DriverInfo), IdentifyError> {
    let channel = connect_with_retry(address, Duration::from_secs(1), None).await?;
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let calls = Caller::new(UNKNOWN_DRIVER, timeout, metrics.cloned());
    probe_until_ready(&mut identity, &calls).await;
    let info = calls
        .call(
            "/csi.v1.Identity/GetPluginInfo",
            identity.get_plugin_info(calls.request(csi::GetPluginInfoRequest {})),
        )
        .await?;
    if info.name.is_empty() {
        return Err(IdentifyError::NoName);
    }
    let calls = Caller::new(&info.name, timeout, metrics.cloned());
    if let Some(metrics) = metrics
        && crate::migration::Plugin::from_csi_name(&info.name).is_some()
    {
        metrics.label_migration();
        probe_until_ready(&mut identity, &calls).await;
    }
    let plugin = calls
        .call(
            "/csi.v1.Identity/GetPluginCapabilities",
            identity.get_plugin_capabilities(calls.request(csi::GetPluginCapabilitiesRequest {})),
        )
        .await?;
    let services: Vec<Service> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Service::try_from(s.r#type).ok(),
            _ => None,
        })
        .collect();
    let mut rpcs = Vec::new();
    if services.contains(&Service::ControllerService) {
        let mut controller = csi::controller_client::ControllerClient::new(channel.clone());
        rpcs = calls
            .call(
                "/csi.v1.Controller/ControllerGetCapabilities",
                controller.controller_get_capabilities(
                    calls.request(csi::ControllerGetCapabilitiesRequest {}),
                ),
            )
            .await?
            .capabilities
            .iter()
            .filter_map(|c| {
                c.r#type
                    .as_ref()
                    .and_then(|csi::controller_service_capability::Type::Rpc(r)| {
                        Rpc::try_from(r.r#type).ok()
                    })
            })
            .collect();
    }
    Ok((
        channel,
        DriverInfo {
            name: info.name,
            vendor_version: info.vendor_version,
            services,
            rpcs,
            manifest: info.manifest,
        },
    ))
}
