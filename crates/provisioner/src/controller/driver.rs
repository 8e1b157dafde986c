//! Start-up against the CSI driver (sidecar-kit's [`identify`]) and what the provisioner learns
//! of it. A driver without CREATE_DELETE_VOLUME (or without a controller service) does not stop
//! the process, as upstream's does not: each claim and deletion fails, saying why.

use std::time::Duration;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi::plugin_capability::service::Type as Service;
use csi_proto::v1 as csi;
use sidecar_kit::driver::{IdentifyError, identify};
use tonic::transport::Channel;

use crate::decide::provision::{DriverCapabilities, no_dynamic_provisioning};

/// A start-up failure; the process exits.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// Connecting or one of the identity or capability calls failed.
    #[error(transparent)]
    Identify(#[from] IdentifyError),
}

/// Connects and learns what the driver is and can do.
pub async fn start(
    address: &str,
    timeout: Duration,
    metrics: &sidecar_kit::metrics::Metrics,
) -> Result<(Channel, DriverCapabilities), StartupError> {
    let (channel, info) = identify(address, timeout, Some(metrics)).await?;
    let no_dynamic = no_dynamic_provisioning(
        info.serves(Service::ControllerService),
        info.has(Rpc::CreateDeleteVolume),
    );
    if let Some(why) = no_dynamic {
        tracing::warn!(driver = %info.name, "{why}: every claim and every deletion will fail with it until the provisioner is restarted against a driver that reports it");
    }
    let caps = DriverCapabilities {
        no_dynamic_provisioning: no_dynamic,
        name: info.name.clone(),
        accessibility: info.serves(Service::VolumeAccessibilityConstraints),
        single_node_multi_writer: info.has(Rpc::SingleNodeMultiWriter),
        publish_unpublish: info.has(Rpc::PublishUnpublishVolume),
        get_capacity: info.has(Rpc::GetCapacity),
        clone_volume: info.has(Rpc::CloneVolume),
        create_delete_snapshot: info.has(Rpc::CreateDeleteSnapshot),
        modify_volume: info.has(Rpc::ModifyVolume),
        recoverable: info.has(Rpc::ListVolumes)
            && sidecar_kit::recoverable::follows(&info.manifest),
        // CSI migration: a driver that stands in for an in-tree plugin also serves its classes
        // and volumes (the runner turns it off with the CSIMigration gate).
        migrated_from: sidecar_kit::migration::Plugin::from_csi_name(&info.name),
    };
    tracing::info!(driver = %caps.name, version = %info.vendor_version, ?caps, "CSI driver ready");
    Ok((channel, caps))
}
