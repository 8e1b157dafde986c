//! Start-up against the CSI driver: connect (retrying every second), Probe until ready, then
//! GetPluginInfo, GetPluginCapabilities and ControllerGetCapabilities, any error in which is
//! fatal, as upstream.

use std::time::Duration;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::plugin_capability::service::Type as Service;
use csi_proto::v1 as csi;
use sidecar_kit::csi::{CallError, Caller, ConnectError, connect_with_retry};
use tonic::transport::Channel;

use crate::decide::provision::DriverCapabilities;

/// A start-up failure; the process exits.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The address can never work.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// One of the identity or capability calls failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The driver cannot provision.
    #[error("driver {0:?} does not advertise CREATE_DELETE_VOLUME")]
    NoCreateDelete(String),
    /// GetPluginInfo returned no name.
    #[error("driver returned an empty name from GetPluginInfo")]
    NoName,
}

/// Connects and learns what the driver is and can do.
pub async fn start(
    address: &str,
    timeout: Duration,
) -> Result<(Channel, DriverCapabilities), StartupError> {
    let channel = connect_with_retry(address, Duration::from_secs(1), None).await?;
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let calls = Caller::new("", timeout, None);
    let mut attempts: u64 = 0;
    loop {
        let probe = identity.probe(calls.request(csi::ProbeRequest {}));
        match calls.call("/csi.v1.Identity/Probe", probe).await {
            Ok(r) if r.ready != Some(false) => break,
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
    let info = calls
        .call(
            "/csi.v1.Identity/GetPluginInfo",
            identity.get_plugin_info(calls.request(csi::GetPluginInfoRequest {})),
        )
        .await?;
    if info.name.is_empty() {
        return Err(StartupError::NoName);
    }
    let plugin = calls
        .call(
            "/csi.v1.Identity/GetPluginCapabilities",
            identity.get_plugin_capabilities(calls.request(csi::GetPluginCapabilitiesRequest {})),
        )
        .await?;
    let services: Vec<i32> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    let mut controller = csi::controller_client::ControllerClient::new(channel.clone());
    let rpcs: Vec<i32> = calls
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
                .map(|csi::controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    if !rpcs.contains(&(Rpc::CreateDeleteVolume as i32)) {
        return Err(StartupError::NoCreateDelete(info.name));
    }
    let caps = DriverCapabilities {
        name: info.name,
        accessibility: services.contains(&(Service::VolumeAccessibilityConstraints as i32)),
        single_node_multi_writer: rpcs.contains(&(Rpc::SingleNodeMultiWriter as i32)),
        publish_unpublish: rpcs.contains(&(Rpc::PublishUnpublishVolume as i32)),
        get_capacity: rpcs.contains(&(Rpc::GetCapacity as i32)),
        clone_volume: rpcs.contains(&(Rpc::CloneVolume as i32)),
        create_delete_snapshot: rpcs.contains(&(Rpc::CreateDeleteSnapshot as i32)),
    };
    tracing::info!(driver = %caps.name, version = %info.vendor_version, ?caps, "CSI driver ready");
    Ok((channel, caps))
}
