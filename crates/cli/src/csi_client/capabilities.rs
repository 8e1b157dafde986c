//! `volstack csi capabilities`: what the plugin, its controller and its node advertise.

use std::time::Duration;

use csi_proto::v1 as csi;
use serde_json::{Value, json};
use sidecar_kit::csi::{go_code_name, with_timeout};
use tonic::transport::Channel;

use super::{controller, grpc, identity, node};

pub(super) async fn capabilities(channel: &Channel, timeout: Duration) -> anyhow::Result<Value> {
    let plugin = grpc(
        identity(channel)
            .get_plugin_capabilities(with_timeout(csi::GetPluginCapabilitiesRequest {}, timeout))
            .await,
    )?;
    let plugin: Vec<String> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => {
                csi::plugin_capability::service::Type::try_from(s.r#type)
                    .ok()
                    .map(|t| t.as_str_name().to_string())
            }
            Some(csi::plugin_capability::Type::VolumeExpansion(e)) => {
                csi::plugin_capability::volume_expansion::Type::try_from(e.r#type)
                    .ok()
                    .map(|t| format!("VOLUME_EXPANSION_{}", t.as_str_name()))
            }
            None => None,
        })
        .collect();
    let controller_caps = controller(channel)
        .controller_get_capabilities(with_timeout(
            csi::ControllerGetCapabilitiesRequest {},
            timeout,
        ))
        .await;
    let controller_caps: Value = match controller_caps {
        Ok(r) => json!(
            r.into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::controller_service_capability::Type::Rpc(rpc)) =>
                        csi::controller_service_capability::rpc::Type::try_from(rpc.r#type)
                            .ok()
                            .map(|t| t.as_str_name()),
                    None => None,
                })
                .collect::<Vec<_>>()
        ),
        Err(status) => json!({"error": go_code_name(status.code())}),
    };
    let node_caps = node(channel)
        .node_get_capabilities(with_timeout(csi::NodeGetCapabilitiesRequest {}, timeout))
        .await;
    let node_caps: Value = match node_caps {
        Ok(r) => json!(
            r.into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::node_service_capability::Type::Rpc(rpc)) =>
                        csi::node_service_capability::rpc::Type::try_from(rpc.r#type)
                            .ok()
                            .map(|t| t.as_str_name()),
                    None => None,
                })
                .collect::<Vec<_>>()
        ),
        Err(status) => json!({"error": go_code_name(status.code())}),
    };
    Ok(json!({"plugin": plugin, "controller": controller_caps, "node": node_caps}))
}
