//! The driver's calls themselves: every call of a volume's lifecycle made twice with the same
//! arguments (the CSI spec asks each to be idempotent), and the node's volume statistics and
//! condition of a published volume.

use std::collections::HashMap;

use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::volume_capability::access_mode;
use csi_proto::v1 as csi;
use tonic::transport::Channel;

use super::{Done, Rpc, World};

type Controller = csi::controller_client::ControllerClient<Channel>;
type NodeClient = csi::node_client::NodeClient<Channel>;

/// Why a call failed; `repeated`: the second of two calls with the same arguments.
fn failed(call: &str, repeated: bool, status: tonic::Status) -> String {
    let when = if repeated {
        " repeated with the same arguments"
    } else {
        ""
    };
    format!("{call}{when}: {:?}: {}", status.code(), status.message())
}

/// A call made twice with the same request: both must succeed; gives both answers.
macro_rules! twice {
    ($call:expr, $client:ident . $method:ident ($request:expr)) => {{
        let first =
            ($client.$method($request.clone()).await).map_err(|s| failed($call, false, s))?;
        let second =
            ($client.$method($request.clone()).await).map_err(|s| failed($call, true, s))?;
        (first.into_inner(), second.into_inner())
    }};
}

fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability::mount("", access_mode::Mode::SingleNodeWriter)
}

impl World {
    pub(super) async fn channel(&self, socket: &str) -> Result<Channel, String> {
        sidecar_kit::csi::connect(socket)
            .await
            .map_err(|e| format!("connect to the driver at {socket}: {e}"))
    }

    pub(super) async fn node_rpcs(&self, node: &mut NodeClient) -> Result<Vec<NodeRpc>, String> {
        let answer = node
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
            .map_err(|s| format!("NodeGetCapabilities: {s}"))?
            .into_inner();
        Ok(answer
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(csi::node_service_capability::Type::Rpc(r)) => {
                    NodeRpc::try_from(r.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// CreateVolume, ControllerPublishVolume (when advertised), NodeStageVolume (when
    /// advertised), NodePublishVolume and their undoing, each made twice in a row with the same
    /// arguments: both answers succeed, and the two CreateVolume answers name one volume.
    pub(super) async fn idempotency(&mut self) -> Result<Done, String> {
        let mut controller = Controller::new(self.channel(&self.socket).await?);
        let mut node = NodeClient::new(self.channel(&self.node_socket).await?);
        let bytes = sidecar_kit::quantity::parse_bytes(&self.size)
            .map_err(|e| format!("--volume-size {}: {e}", self.size))?;
        let create = csi::CreateVolumeRequest {
            name: format!("conf-idempotency-{:016x}", rand::random::<u64>()),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability()],
            parameters: self.parameters.clone().into_iter().collect(),
            ..Default::default()
        };
        *self.waiting.lock() = "CreateVolume twice".into();
        let (first, second) = twice!("CreateVolume", controller.create_volume(create));
        let volume = first.volume.unwrap_or_default();
        let again = second.volume.unwrap_or_default();
        self.handles.insert(volume.volume_id.clone());
        if volume.volume_id != again.volume_id {
            self.handles.insert(again.volume_id.clone());
            for id in [&volume.volume_id, &again.volume_id] {
                let _ = controller
                    .delete_volume(csi::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        ..Default::default()
                    })
                    .await;
            }
            return Err(format!(
                "CreateVolume repeated made a second volume: {:?}, then {:?}",
                volume.volume_id, again.volume_id
            ));
        }
        let id = volume.volume_id.clone();
        let mut calls = vec!["CreateVolume"];
        let attach = self.info.has(Rpc::PublishUnpublishVolume);
        let root = self.kubelet.join("conformance-idempotency");
        let target = root.join("mount");
        let staging = root.join("globalmount");
        let node_id = node
            .node_get_info(csi::NodeGetInfoRequest {})
            .await
            .map_err(|s| format!("NodeGetInfo: {s}"))?
            .into_inner()
            .node_id;
        let stage = self
            .node_rpcs(&mut node)
            .await?
            .contains(&NodeRpc::StageUnstageVolume);
        let staging_target_path = match stage {
            true => staging.display().to_string(),
            false => String::new(),
        };
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        let unstage = csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging_target_path.clone(),
        };
        let detach = csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_id.clone(),
            ..Default::default()
        };
        let delete = csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        let steps: Result<(), String> = async {
            let mut publish_context = HashMap::new();
            if attach {
                let publish = csi::ControllerPublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: node_id.clone(),
                    volume_capability: Some(mount_capability()),
                    volume_context: volume.volume_context.clone(),
                    ..Default::default()
                };
                let (answer, _) = twice!(
                    "ControllerPublishVolume",
                    controller.controller_publish_volume(publish)
                );
                publish_context = answer.publish_context;
                calls.push("ControllerPublishVolume");
            }
            let dir = if stage { &staging } else { &root };
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            if stage {
                let request = csi::NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    publish_context: publish_context.clone(),
                    staging_target_path: staging_target_path.clone(),
                    volume_capability: Some(mount_capability()),
                    volume_context: volume.volume_context.clone(),
                    ..Default::default()
                };
                twice!("NodeStageVolume", node.node_stage_volume(request));
                calls.push("NodeStageVolume");
            }
            let request = csi::NodePublishVolumeRequest {
                volume_id: id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging_target_path.clone(),
                target_path: target.display().to_string(),
                volume_capability: Some(mount_capability()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            };
            twice!("NodePublishVolume", node.node_publish_volume(request));
            calls.push("NodePublishVolume");
            twice!("NodeUnpublishVolume", node.node_unpublish_volume(unpublish));
            calls.push("NodeUnpublishVolume");
            if stage {
                twice!("NodeUnstageVolume", node.node_unstage_volume(unstage));
                calls.push("NodeUnstageVolume");
            }
            if attach {
                twice!(
                    "ControllerUnpublishVolume",
                    controller.controller_unpublish_volume(detach)
                );
                calls.push("ControllerUnpublishVolume");
            }
            twice!("DeleteVolume", controller.delete_volume(delete));
            calls.push("DeleteVolume");
            Ok(())
        }
        .await;
        let undone = match &steps {
            Ok(()) => true,
            Err(_) => {
                // Undone as far as the driver lets, so that later checks (and `delete`'s
                // ListVolumes) see only this check's failure.
                let unpublished = node.node_unpublish_volume(unpublish).await.is_ok();
                let unstaged = !stage || node.node_unstage_volume(unstage).await.is_ok();
                if attach {
                    let _ = controller.controller_unpublish_volume(detach).await;
                }
                let _ = controller.delete_volume(delete).await;
                unpublished && unstaged
            }
        };
        // Never walked into while something may still be mounted there.
        if undone {
            let _ = std::fs::remove_dir_all(&root);
        }
        steps?;
        Ok(Done::Passed(format!("each twice: {}", calls.join(", "))))
    }

    /// NodeGetVolumeStats of the published volume gives its usage, and its condition when the
    /// node advertises VOLUME_CONDITION.
    pub(super) async fn stats(&mut self) -> Result<Done, String> {
        let mut node = NodeClient::new(self.channel(&self.node_socket).await?);
        let rpcs = self.node_rpcs(&mut node).await?;
        if !rpcs.contains(&NodeRpc::GetVolumeStats) {
            return Ok(Done::Declined(
                "the node service does not advertise GET_VOLUME_STATS".into(),
            ));
        }
        let path = self.published("conf-writer", "conf-data").await?;
        let pv = self.bound("conf-data").await?;
        let handle = pv
            .spec
            .clone()
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle)
            .unwrap_or_default();
        let stats = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: handle,
                volume_path: path.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .map_err(|s| format!("NodeGetVolumeStats: {:?}: {}", s.code(), s.message()))?
            .into_inner();
        if stats.usage.is_empty() {
            return Err("NodeGetVolumeStats gave no usage".into());
        }
        let usage: Vec<String> = stats
            .usage
            .iter()
            .map(|u| {
                format!(
                    "{} of {} used ({})",
                    u.used,
                    u.total,
                    u.unit().as_str_name()
                )
            })
            .collect();
        let mut found = usage.join(", ");
        if rpcs.contains(&NodeRpc::VolumeCondition) {
            let condition = stats
                .volume_condition
                .ok_or("the node advertises VOLUME_CONDITION but NodeGetVolumeStats gave none")?;
            if condition.abnormal {
                return Err(format!(
                    "NodeGetVolumeStats of {} at {}: volume_condition abnormal: {}",
                    pv.metadata.name.as_deref().unwrap_or_default(),
                    path.display(),
                    condition.message
                ));
            }
            found.push_str("; condition normal");
        }
        Ok(Done::Passed(found))
    }
}
