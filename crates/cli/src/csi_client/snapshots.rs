//! `volstack csi snapshot ...` and `volstack csi group ...`: the snapshot RPCs and the group
//! controller service.

use std::time::Duration;

use csi_proto::v1 as csi;
use serde_json::{Value, json};
use sidecar_kit::csi::with_timeout;
use tonic::transport::Channel;

use super::{controller, grpc, key_value};

/// `volstack csi snapshot`.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// CreateSnapshot of a volume.
    Create {
        /// Snapshot name (the idempotency key).
        name: String,
        /// The volume to snapshot.
        #[arg(long)]
        source: String,
        /// Parameter KEY=VALUE (repeatable).
        #[arg(long = "param", value_parser = key_value)]
        parameters: Vec<(String, String)>,
    },
    /// DeleteSnapshot.
    Delete {
        /// Snapshot id.
        snapshot_id: String,
    },
    /// ListSnapshots, one page or all pages, optionally filtered.
    List {
        /// Only snapshots of this volume.
        #[arg(long, default_value = "")]
        source: String,
        /// Only this snapshot.
        #[arg(long, default_value = "")]
        snapshot_id: String,
        #[command(flatten)]
        paging: super::Paging,
    },
    /// GetSnapshot.
    Get {
        /// Snapshot id.
        snapshot_id: String,
    },
}

/// `volstack csi group`.
#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// CreateVolumeGroupSnapshot of several volumes at once.
    Create {
        /// Group snapshot name (the idempotency key).
        name: String,
        /// A volume of the group (repeatable).
        #[arg(long = "volume", required = true)]
        volumes: Vec<String>,
    },
    /// DeleteVolumeGroupSnapshot.
    Delete {
        /// Group snapshot id.
        group_snapshot_id: String,
        /// The group's snapshot ids, as the CO passes them (repeatable; optional).
        #[arg(long = "snapshot")]
        snapshots: Vec<String>,
    },
    /// GetVolumeGroupSnapshot.
    Get {
        /// Group snapshot id.
        group_snapshot_id: String,
    },
}

fn groups(channel: &Channel) -> csi::group_controller_client::GroupControllerClient<Channel> {
    csi::group_controller_client::GroupControllerClient::new(channel.clone())
}

/// A snapshot as JSON.
pub fn snapshot_json(s: &csi::Snapshot) -> Value {
    json!({
        "snapshot_id": s.snapshot_id,
        "source_volume_id": s.source_volume_id,
        "size_bytes": s.size_bytes,
        "ready_to_use": s.ready_to_use,
        "creation_time": s.creation_time.as_ref().map(|t| t.seconds),
        "group_snapshot_id": s.group_snapshot_id,
    })
}

fn group_json(g: &csi::VolumeGroupSnapshot) -> Value {
    json!({
        "group_snapshot_id": g.group_snapshot_id,
        "ready_to_use": g.ready_to_use,
        "creation_time": g.creation_time.as_ref().map(|t| t.seconds),
        "snapshots": g.snapshots.iter().map(snapshot_json).collect::<Vec<_>>(),
    })
}

/// Runs one snapshot command.
pub async fn snapshot(
    channel: &Channel,
    timeout: Duration,
    command: SnapshotCommand,
) -> anyhow::Result<Value> {
    let mut client = controller(channel);
    Ok(match command {
        SnapshotCommand::Create {
            name,
            source,
            parameters,
        } => {
            let request = csi::CreateSnapshotRequest {
                source_volume_id: source,
                name,
                parameters: parameters.into_iter().collect(),
                ..Default::default()
            };
            let r = grpc(client.create_snapshot(with_timeout(request, timeout)).await)?;
            r.snapshot
                .as_ref()
                .map(snapshot_json)
                .unwrap_or(Value::Null)
        }
        SnapshotCommand::Delete { snapshot_id } => {
            let request = csi::DeleteSnapshotRequest {
                snapshot_id: snapshot_id.clone(),
                ..Default::default()
            };
            grpc(client.delete_snapshot(with_timeout(request, timeout)).await)?;
            json!({"deleted": snapshot_id})
        }
        SnapshotCommand::List {
            source,
            snapshot_id,
            paging,
        } => {
            let (snapshots, token) = paging
                .collect(|max_entries, starting_token| {
                    let mut client = client.clone();
                    let request = csi::ListSnapshotsRequest {
                        max_entries,
                        starting_token,
                        source_volume_id: source.clone(),
                        snapshot_id: snapshot_id.clone(),
                        ..Default::default()
                    };
                    async move {
                        let r = grpc(client.list_snapshots(with_timeout(request, timeout)).await)?;
                        let entries = r.entries.iter().filter_map(|e| e.snapshot.as_ref());
                        Ok((entries.map(snapshot_json).collect(), r.next_token))
                    }
                })
                .await?;
            json!({"entries": snapshots, "next_token": token})
        }
        SnapshotCommand::Get { snapshot_id } => {
            let request = csi::GetSnapshotRequest {
                snapshot_id,
                ..Default::default()
            };
            let r = grpc(client.get_snapshot(with_timeout(request, timeout)).await)?;
            r.snapshot
                .as_ref()
                .map(snapshot_json)
                .unwrap_or(Value::Null)
        }
    })
}

/// Runs one group snapshot command.
pub async fn group(
    channel: &Channel,
    timeout: Duration,
    command: GroupCommand,
) -> anyhow::Result<Value> {
    let mut client = groups(channel);
    Ok(match command {
        GroupCommand::Create { name, volumes } => {
            let request = csi::CreateVolumeGroupSnapshotRequest {
                name,
                source_volume_ids: volumes,
                ..Default::default()
            };
            let r = grpc(
                client
                    .create_volume_group_snapshot(with_timeout(request, timeout))
                    .await,
            )?;
            r.group_snapshot
                .as_ref()
                .map(group_json)
                .unwrap_or(Value::Null)
        }
        GroupCommand::Delete {
            group_snapshot_id,
            snapshots,
        } => {
            let request = csi::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: group_snapshot_id.clone(),
                snapshot_ids: snapshots,
                ..Default::default()
            };
            grpc(
                client
                    .delete_volume_group_snapshot(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"deleted": group_snapshot_id})
        }
        GroupCommand::Get { group_snapshot_id } => {
            let request = csi::GetVolumeGroupSnapshotRequest {
                group_snapshot_id,
                ..Default::default()
            };
            let r = grpc(
                client
                    .get_volume_group_snapshot(with_timeout(request, timeout))
                    .await,
            )?;
            r.group_snapshot
                .as_ref()
                .map(group_json)
                .unwrap_or(Value::Null)
        }
    })
}
