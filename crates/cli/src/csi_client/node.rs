//! `volstack csi mount|unmount|stage|unstage|node-publish|node-unpublish|node-expand|stats`: the
//! node service, one RPC at a time or the way kubelet chains them.

use std::time::Duration;

use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use serde_json::{Value, json};
use sidecar_kit::csi::with_timeout;
use tonic::transport::Channel;

use super::{capability, grpc, node, quantity};

/// Where a volume is made visible on this machine.
#[derive(Debug, Clone, clap::Args)]
pub struct Placement {
    /// Volume id.
    pub volume_id: String,
    /// Block access type instead of mount.
    #[arg(long)]
    pub block: bool,
    /// Publish the volume read-only.
    #[arg(long)]
    pub readonly: bool,
}

/// `volstack csi` node commands.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Makes a volume usable at TARGET as the attacher and kubelet do: ControllerPublishVolume
    /// to this node (when the controller publishes), NodeStageVolume at the staging path (when
    /// the driver stages), then NodePublishVolume.
    Mount {
        #[command(flatten)]
        placement: Placement,
        /// Where the volume appears.
        #[arg(long)]
        target: String,
        /// Staging path (default: TARGET with `.staging` appended).
        #[arg(long)]
        staging_path: Option<String>,
    },
    /// Undoes `mount`: NodeUnpublishVolume, NodeUnstageVolume (when the driver stages), then
    /// ControllerUnpublishVolume from this node (when the controller publishes).
    Unmount {
        /// Volume id.
        volume_id: String,
        /// Where the volume appears.
        #[arg(long)]
        target: String,
        /// Staging path (default: TARGET with `.staging` appended).
        #[arg(long)]
        staging_path: Option<String>,
    },
    /// NodeStageVolume.
    Stage {
        #[command(flatten)]
        placement: Placement,
        /// Staging path.
        #[arg(long)]
        staging_path: String,
    },
    /// NodeUnstageVolume.
    Unstage {
        /// Volume id.
        volume_id: String,
        /// Staging path.
        #[arg(long)]
        staging_path: String,
    },
    /// NodePublishVolume.
    NodePublish {
        #[command(flatten)]
        placement: Placement,
        /// Target path.
        #[arg(long)]
        target: String,
        /// Staging path the volume was staged at (drivers with STAGE_UNSTAGE_VOLUME).
        #[arg(long, default_value = "")]
        staging_path: String,
    },
    /// NodeUnpublishVolume.
    NodeUnpublish {
        /// Volume id.
        volume_id: String,
        /// Target path.
        #[arg(long)]
        target: String,
    },
    /// NodeExpandVolume.
    NodeExpand {
        /// Volume id.
        volume_id: String,
        /// Where the volume is published or staged.
        #[arg(long)]
        path: String,
        /// Required size (Kubernetes quantity; default: whatever the volume has).
        #[arg(long, value_parser = quantity)]
        size: Option<i64>,
    },
    /// NodeGetVolumeStats: usage and condition.
    Stats {
        /// Volume id.
        volume_id: String,
        /// Where the volume is published or staged.
        #[arg(long)]
        path: String,
    },
}

fn staging_default(target: &str, given: Option<String>) -> String {
    given.unwrap_or_else(|| format!("{}.staging", target.trim_end_matches('/')))
}

async fn stages(channel: &Channel, timeout: Duration) -> anyhow::Result<bool> {
    let caps = grpc(
        node(channel)
            .node_get_capabilities(with_timeout(csi::NodeGetCapabilitiesRequest {}, timeout))
            .await,
    )?;
    Ok(caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(rpc))
            if rpc.r#type == NodeRpc::StageUnstageVolume as i32)
    }))
}

/// This node's id, when the controller publishes volumes to nodes (PUBLISH_UNPUBLISH_VOLUME);
/// None otherwise.
async fn publishing_node(channel: &Channel, timeout: Duration) -> anyhow::Result<Option<String>> {
    use csi::controller_service_capability::rpc::Type as Rpc;
    let caps = grpc(
        super::controller(channel)
            .controller_get_capabilities(with_timeout(
                csi::ControllerGetCapabilitiesRequest {},
                timeout,
            ))
            .await,
    )?;
    let publishes = caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::controller_service_capability::Type::Rpc(rpc))
            if rpc.r#type == Rpc::PublishUnpublishVolume as i32)
    });
    if !publishes {
        return Ok(None);
    }
    let info = grpc(
        node(channel)
            .node_get_info(with_timeout(csi::NodeGetInfoRequest {}, timeout))
            .await,
    )?;
    Ok(Some(info.node_id))
}

fn stage_request(p: &Placement, staging: &str) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: p.volume_id.clone(),
        staging_target_path: staging.to_string(),
        volume_capability: Some(capability(p.block, "", Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn publish_request(p: &Placement, staging: &str, target: &str) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: p.volume_id.clone(),
        staging_target_path: staging.to_string(),
        target_path: target.to_string(),
        volume_capability: Some(capability(p.block, "", Mode::SingleNodeWriter)),
        readonly: p.readonly,
        ..Default::default()
    }
}

/// Runs one node command.
pub async fn run(
    channel: &Channel,
    timeout: Duration,
    command: NodeCommand,
) -> anyhow::Result<Value> {
    let mut client = node(channel);
    Ok(match command {
        NodeCommand::Mount {
            placement,
            target,
            staging_path,
        } => {
            let mut context = std::collections::HashMap::new();
            if let Some(node_id) = publishing_node(channel, timeout).await? {
                let request = csi::ControllerPublishVolumeRequest {
                    volume_id: placement.volume_id.clone(),
                    node_id,
                    volume_capability: Some(capability(
                        placement.block,
                        "",
                        Mode::SingleNodeWriter,
                    )),
                    readonly: placement.readonly,
                    ..Default::default()
                };
                context = grpc(
                    super::controller(channel)
                        .controller_publish_volume(with_timeout(request, timeout))
                        .await,
                )?
                .publish_context;
            }
            let staging = if stages(channel, timeout).await? {
                let staging = staging_default(&target, staging_path);
                if !placement.block {
                    std::fs::create_dir_all(&staging)?;
                }
                let mut request = stage_request(&placement, &staging);
                request.publish_context = context.clone();
                grpc(
                    client
                        .node_stage_volume(with_timeout(request, timeout))
                        .await,
                )?;
                staging
            } else {
                String::new()
            };
            let mut request = publish_request(&placement, &staging, &target);
            request.publish_context = context;
            grpc(
                client
                    .node_publish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"volume_id": placement.volume_id, "target": target, "staging_path": staging})
        }
        NodeCommand::Unmount {
            volume_id,
            target,
            staging_path,
        } => {
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: target.clone(),
            };
            grpc(
                client
                    .node_unpublish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            let mut staging = String::new();
            if stages(channel, timeout).await? {
                staging = staging_default(&target, staging_path);
                let request = csi::NodeUnstageVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path: staging.clone(),
                };
                grpc(
                    client
                        .node_unstage_volume(with_timeout(request, timeout))
                        .await,
                )?;
            }
            if let Some(node_id) = publishing_node(channel, timeout).await? {
                let request = csi::ControllerUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    node_id,
                    secrets: Default::default(),
                };
                grpc(
                    super::controller(channel)
                        .controller_unpublish_volume(with_timeout(request, timeout))
                        .await,
                )?;
            }
            json!({"volume_id": volume_id, "unmounted": target, "unstaged": staging})
        }
        NodeCommand::Stage {
            placement,
            staging_path,
        } => {
            let request = stage_request(&placement, &staging_path);
            grpc(
                client
                    .node_stage_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"staged": placement.volume_id, "staging_path": staging_path})
        }
        NodeCommand::Unstage {
            volume_id,
            staging_path,
        } => {
            let request = csi::NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: staging_path,
            };
            grpc(
                client
                    .node_unstage_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"unstaged": volume_id})
        }
        NodeCommand::NodePublish {
            placement,
            target,
            staging_path,
        } => {
            let request = publish_request(&placement, &staging_path, &target);
            grpc(
                client
                    .node_publish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"published": placement.volume_id, "target": target})
        }
        NodeCommand::NodeUnpublish { volume_id, target } => {
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: target,
            };
            grpc(
                client
                    .node_unpublish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"unpublished": volume_id})
        }
        NodeCommand::NodeExpand {
            volume_id,
            path,
            size,
        } => {
            let request = csi::NodeExpandVolumeRequest {
                volume_id,
                volume_path: path,
                capacity_range: size.map(|bytes| csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                ..Default::default()
            };
            let r = grpc(
                client
                    .node_expand_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"capacity_bytes": r.capacity_bytes})
        }
        NodeCommand::Stats { volume_id, path } => {
            let request = csi::NodeGetVolumeStatsRequest {
                volume_id,
                volume_path: path,
                staging_target_path: String::new(),
            };
            let r = grpc(
                client
                    .node_get_volume_stats(with_timeout(request, timeout))
                    .await,
            )?;
            let usage: Vec<Value> = r
                .usage
                .iter()
                .map(|u| {
                    json!({
                        "unit": csi::volume_usage::Unit::try_from(u.unit)
                            .map_or("UNKNOWN", |unit| unit.as_str_name()),
                        "total": u.total,
                        "used": u.used,
                        "available": u.available,
                    })
                })
                .collect();
            json!({
                "usage": usage,
                "condition": r.volume_condition.map(|c| json!({"abnormal": c.abnormal, "message": c.message})),
            })
        }
    })
}
