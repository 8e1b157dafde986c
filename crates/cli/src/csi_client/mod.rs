//! `volstack csi`: a command-line client for any CSI driver, for operators debugging a driver
//! and for our tests and benchmarks. Every answer is printed as one JSON document.

use std::collections::HashMap;

use std::time::Duration;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use serde_json::{Value, json};
use sidecar_kit::csi::{go_code_name, with_timeout};
use sidecar_kit::duration::parse_go_duration;
use sidecar_kit::quantity::parse_bytes;
use tonic::transport::Channel;

mod capabilities;
mod node;
mod roundtrip;
mod snapshots;

use capabilities::capabilities;
use roundtrip::roundtrip;

/// Flags of `volstack csi`.
#[derive(Debug, clap::Args)]
pub struct CsiArgs {
    /// The driver's socket: unix:///path or /path.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///tmp/volstack-csi.sock"
    )]
    pub endpoint: String,
    /// Deadline of each call (Go duration).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: CsiCommand,
}

/// One CSI operation.
#[derive(Debug, clap::Subcommand)]
pub enum CsiCommand {
    /// Probe the plugin (Identity.Probe).
    Probe,
    /// Plugin name and version (Identity.GetPluginInfo).
    Info,
    /// Plugin, controller and node capabilities.
    Capabilities,
    /// NodeGetInfo: node id, topology, volume limit.
    NodeInfo,
    /// CreateVolume.
    Create(CreateArgs),
    /// DeleteVolume.
    Delete {
        /// Volume id.
        volume_id: String,
        /// Secret KEY=VALUE passed to the driver (repeatable).
        #[arg(long = "secret", value_parser = key_value)]
        secrets: Vec<(String, String)>,
    },
    /// ListVolumes, one page or all pages.
    List {
        #[command(flatten)]
        paging: Paging,
    },
    /// GetCapacity.
    Capacity {
        /// Parameter KEY=VALUE (repeatable), as a StorageClass would pass it.
        #[arg(long = "param", value_parser = key_value)]
        parameters: Vec<(String, String)>,
        /// Topology segment as KEY=VALUE[,KEY=VALUE..].
        #[arg(long, value_parser = segment)]
        topology: Option<HashMap<String, String>>,
    },
    /// ControllerPublishVolume.
    Publish {
        /// Volume id.
        volume_id: String,
        /// Node id.
        node_id: String,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        /// Block access type instead of mount.
        #[arg(long)]
        block: bool,
    },
    /// ControllerUnpublishVolume.
    Unpublish {
        /// Volume id.
        volume_id: String,
        /// Node id (empty: every node).
        #[arg(default_value = "")]
        node_id: String,
    },
    /// ControllerGetVolume: the volume, where it is published, its condition.
    Get {
        /// Volume id.
        volume_id: String,
    },
    /// ControllerExpandVolume.
    Expand {
        /// Volume id.
        volume_id: String,
        /// New size (Kubernetes quantity).
        #[arg(long, value_parser = quantity)]
        size: i64,
    },
    /// ControllerModifyVolume: set mutable parameters.
    Modify {
        /// Volume id.
        volume_id: String,
        /// Mutable parameter KEY=VALUE (repeatable).
        #[arg(long = "mutable", value_parser = key_value, required = true)]
        mutable_parameters: Vec<(String, String)>,
    },
    /// Snapshots: create, delete, list, get.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCommand),
    /// Group snapshots (the group controller service): create, delete, get.
    #[command(subcommand)]
    Group(snapshots::GroupCommand),
    /// The node service: mount/unmount as kubelet does, or one RPC at a time.
    #[command(flatten)]
    Node(node::NodeCommand),
    /// Measure CreateVolume+DeleteVolume round trips per second.
    Roundtrip {
        /// Number of create+delete pairs.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Pairs in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Size of each volume.
        #[arg(long, default_value = "1Mi", value_parser = quantity)]
        size: i64,
    },
}

/// Flags of `volstack csi create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Volume name (the idempotency key).
    pub name: String,
    /// Required size (Kubernetes quantity).
    #[arg(long, default_value = "1Gi", value_parser = quantity)]
    pub size: i64,
    /// Size limit (Kubernetes quantity; default none).
    #[arg(long, value_parser = quantity)]
    pub limit: Option<i64>,
    /// Block volume instead of a mounted filesystem.
    #[arg(long)]
    pub block: bool,
    /// Filesystem type for mount volumes.
    #[arg(long, default_value = "")]
    pub fs_type: String,
    /// Access mode (repeatable): single-node-writer, single-node-reader-only,
    /// multi-node-reader-only, multi-node-single-writer, multi-node-multi-writer,
    /// single-node-single-writer, single-node-multi-writer.
    #[arg(long = "access-mode", value_parser = access_mode)]
    pub access_modes: Vec<Mode>,
    /// Parameter KEY=VALUE (repeatable).
    #[arg(long = "param", value_parser = key_value)]
    pub parameters: Vec<(String, String)>,
    /// Secret KEY=VALUE (repeatable).
    #[arg(long = "secret", value_parser = key_value)]
    pub secrets: Vec<(String, String)>,
    /// Restore this snapshot into the new volume.
    #[arg(long, conflicts_with = "from_volume")]
    pub from_snapshot: Option<String>,
    /// Clone this volume into the new volume.
    #[arg(long)]
    pub from_volume: Option<String>,
    /// Mutable parameter KEY=VALUE (repeatable).
    #[arg(long = "mutable", value_parser = key_value)]
    pub mutable_parameters: Vec<(String, String)>,
    /// Requisite topology segment KEY=VALUE[,..] (repeatable).
    #[arg(long, value_parser = segment)]
    pub requisite: Vec<HashMap<String, String>>,
    /// Preferred topology segment KEY=VALUE[,..] (repeatable).
    #[arg(long, value_parser = segment)]
    pub preferred: Vec<HashMap<String, String>>,
}

fn quantity(text: &str) -> Result<i64, String> {
    match parse_bytes(text) {
        Ok(bytes) if bytes >= 0 => Ok(bytes),
        Ok(_) => Err(format!("{text:?} is negative")),
        Err(error) => Err(error.to_string()),
    }
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{text:?}: expected KEY=VALUE"))
}

fn segment(text: &str) -> Result<HashMap<String, String>, String> {
    text.split(',').map(key_value).collect()
}

fn access_mode(text: &str) -> Result<Mode, String> {
    let name = text.replace('-', "_").to_ascii_uppercase();
    match Mode::from_str_name(&name) {
        Some(Mode::Unknown) | None => Err(format!("unknown access mode {text:?}")),
        Some(mode) => Ok(mode),
    }
}

/// Runs one client command and prints its answer.
pub async fn run(args: CsiArgs) -> anyhow::Result<()> {
    let channel = sidecar_kit::csi::connect(&args.endpoint).await?;
    let timeout = args.timeout;
    let output = match args.command {
        CsiCommand::Probe => {
            let r = identity(&channel)
                .probe(with_timeout(csi::ProbeRequest {}, timeout))
                .await;
            let r = grpc(r)?;
            json!({"ready": r.ready})
        }
        CsiCommand::Info => {
            let r = grpc(
                identity(&channel)
                    .get_plugin_info(with_timeout(csi::GetPluginInfoRequest {}, timeout))
                    .await,
            )?;
            json!({"name": r.name, "vendor_version": r.vendor_version, "manifest": r.manifest})
        }
        CsiCommand::Capabilities => capabilities(&channel, timeout).await?,
        CsiCommand::NodeInfo => {
            let r = grpc(
                node(&channel)
                    .node_get_info(with_timeout(csi::NodeGetInfoRequest {}, timeout))
                    .await,
            )?;
            json!({
                "node_id": r.node_id,
                "max_volumes_per_node": r.max_volumes_per_node,
                "accessible_topology": r.accessible_topology.map(|t| t.segments),
            })
        }
        CsiCommand::Create(create) => {
            let request = create_request(&create);
            let r = grpc(
                controller(&channel)
                    .create_volume(with_timeout(request, timeout))
                    .await,
            )?;
            r.volume.as_ref().map(volume_json).unwrap_or(Value::Null)
        }
        CsiCommand::Delete { volume_id, secrets } => {
            let request = csi::DeleteVolumeRequest {
                volume_id: volume_id.clone(),
                secrets: secrets.into_iter().collect(),
            };
            grpc(
                controller(&channel)
                    .delete_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"deleted": volume_id})
        }
        CsiCommand::List { paging } => list(&channel, timeout, paging).await?,
        CsiCommand::Capacity {
            parameters,
            topology,
        } => {
            let request = csi::GetCapacityRequest {
                volume_capabilities: Vec::new(),
                parameters: parameters.into_iter().collect(),
                accessible_topology: topology.map(|segments| csi::Topology { segments }),
            };
            let r = grpc(
                controller(&channel)
                    .get_capacity(with_timeout(request, timeout))
                    .await,
            )?;
            json!({
                "available_capacity": r.available_capacity,
                "maximum_volume_size": r.maximum_volume_size,
                "minimum_volume_size": r.minimum_volume_size,
            })
        }
        CsiCommand::Publish {
            volume_id,
            node_id,
            readonly,
            block,
        } => {
            let request = csi::ControllerPublishVolumeRequest {
                volume_id,
                node_id,
                volume_capability: Some(capability(block, "", Mode::SingleNodeWriter)),
                readonly,
                ..Default::default()
            };
            let r = grpc(
                controller(&channel)
                    .controller_publish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"publish_context": r.publish_context})
        }
        CsiCommand::Unpublish { volume_id, node_id } => {
            let request = csi::ControllerUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                node_id,
                ..Default::default()
            };
            grpc(
                controller(&channel)
                    .controller_unpublish_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"unpublished": volume_id})
        }
        CsiCommand::Get { volume_id } => {
            let request = csi::ControllerGetVolumeRequest { volume_id };
            let r = grpc(
                controller(&channel)
                    .controller_get_volume(with_timeout(request, timeout))
                    .await,
            )?;
            let mut v = r.volume.as_ref().map(volume_json).unwrap_or(Value::Null);
            if let (Some(status), Some(obj)) = (&r.status, v.as_object_mut()) {
                obj.insert(
                    "published_node_ids".into(),
                    json!(status.published_node_ids),
                );
                obj.insert(
                    "condition".into(),
                    json!(
                        status
                            .volume_condition
                            .as_ref()
                            .map(|c| json!({"abnormal": c.abnormal, "message": c.message}))
                    ),
                );
            }
            v
        }
        CsiCommand::Expand { volume_id, size } => {
            let request = csi::ControllerExpandVolumeRequest {
                volume_id,
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: size,
                    limit_bytes: 0,
                }),
                ..Default::default()
            };
            let r = grpc(
                controller(&channel)
                    .controller_expand_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({
                "capacity_bytes": r.capacity_bytes,
                "node_expansion_required": r.node_expansion_required,
            })
        }
        CsiCommand::Modify {
            volume_id,
            mutable_parameters,
        } => {
            let request = csi::ControllerModifyVolumeRequest {
                volume_id: volume_id.clone(),
                mutable_parameters: mutable_parameters.into_iter().collect(),
                ..Default::default()
            };
            grpc(
                controller(&channel)
                    .controller_modify_volume(with_timeout(request, timeout))
                    .await,
            )?;
            json!({"modified": volume_id})
        }
        CsiCommand::Snapshot(command) => snapshots::snapshot(&channel, timeout, command).await?,
        CsiCommand::Group(command) => snapshots::group(&channel, timeout, command).await?,
        CsiCommand::Node(command) => node::run(&channel, timeout, command).await?,
        CsiCommand::Roundtrip {
            count,
            concurrency,
            size,
        } => roundtrip(channel, timeout, count, concurrency, size).await?,
    };
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

fn identity(channel: &Channel) -> csi::identity_client::IdentityClient<Channel> {
    csi::identity_client::IdentityClient::new(channel.clone())
}

fn controller(channel: &Channel) -> csi::controller_client::ControllerClient<Channel> {
    csi::controller_client::ControllerClient::new(channel.clone())
}

fn node(channel: &Channel) -> csi::node_client::NodeClient<Channel> {
    csi::node_client::NodeClient::new(channel.clone())
}

/// Turns a gRPC status into an error that names the code as Go does.
fn grpc<T>(result: Result<tonic::Response<T>, tonic::Status>) -> anyhow::Result<T> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| anyhow::anyhow!("{}: {}", go_code_name(status.code()), status.message()))
}

fn capability(block: bool, fs_type: &str, mode: Mode) -> csi::VolumeCapability {
    match block {
        true => csi::VolumeCapability::block(mode),
        false => csi::VolumeCapability::mount(fs_type, mode),
    }
}

fn create_request(args: &CreateArgs) -> csi::CreateVolumeRequest {
    let (required, limit) = (args.size, args.limit.unwrap_or(0));
    let modes = if args.access_modes.is_empty() {
        vec![Mode::SingleNodeWriter]
    } else {
        args.access_modes.clone()
    };
    let topology = (!args.requisite.is_empty() || !args.preferred.is_empty()).then(|| {
        csi::TopologyRequirement {
            requisite: args
                .requisite
                .iter()
                .map(|s| csi::Topology {
                    segments: s.clone(),
                })
                .collect(),
            preferred: args
                .preferred
                .iter()
                .map(|s| csi::Topology {
                    segments: s.clone(),
                })
                .collect(),
        }
    });
    csi::CreateVolumeRequest {
        name: args.name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: modes
            .into_iter()
            .map(|m| capability(args.block, &args.fs_type, m))
            .collect(),
        parameters: args.parameters.iter().cloned().collect(),
        secrets: args.secrets.iter().cloned().collect(),
        accessibility_requirements: topology,
        volume_content_source: content_source(args),
        mutable_parameters: args.mutable_parameters.iter().cloned().collect(),
    }
}

fn content_source(args: &CreateArgs) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let source = match (&args.from_snapshot, &args.from_volume) {
        (Some(id), _) => Type::Snapshot(SnapshotSource {
            snapshot_id: id.clone(),
        }),
        (None, Some(id)) => Type::Volume(VolumeSource {
            volume_id: id.clone(),
        }),
        (None, None) => return None,
    };
    Some(csi::VolumeContentSource {
        r#type: Some(source),
    })
}

fn volume_json(v: &csi::Volume) -> Value {
    let source = v
        .content_source
        .as_ref()
        .and_then(|s| s.r#type.as_ref())
        .map(|t| match t {
            csi::volume_content_source::Type::Snapshot(s) => json!({"snapshot": s.snapshot_id}),
            csi::volume_content_source::Type::Volume(v) => json!({"volume": v.volume_id}),
        });
    json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": v.volume_context,
        "accessible_topology": v.accessible_topology.iter().map(|t| &t.segments).collect::<Vec<_>>(),
        "content_source": source,
    })
}

/// Which page of a list to ask for, and whether to follow the pages after it.
#[derive(Debug, Clone, clap::Args)]
pub struct Paging {
    /// max_entries (0: driver's choice).
    #[arg(long, default_value_t = 0)]
    max_entries: i32,
    /// starting_token from a previous page.
    #[arg(long, default_value = "")]
    starting_token: String,
    /// Follow next_token until the last page.
    #[arg(long)]
    all: bool,
}

impl Paging {
    /// Asks for pages with `page(max_entries, token)` (its entries and next token) from the
    /// starting token, one page or, with `--all`, until the last; returns the entries and the
    /// token after the last page asked for.
    async fn collect<F, Fut>(self, mut page: F) -> anyhow::Result<(Vec<Value>, String)>
    where
        F: FnMut(i32, String) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<(Vec<Value>, String)>>,
    {
        let (mut entries, mut token) = (Vec::new(), self.starting_token);
        loop {
            let (more, next) = page(self.max_entries, token).await?;
            entries.extend(more);
            token = next;
            if !self.all || token.is_empty() {
                return Ok((entries, token));
            }
        }
    }
}

async fn list(channel: &Channel, timeout: Duration, paging: Paging) -> anyhow::Result<Value> {
    let (volumes, token) = paging
        .collect(|max_entries, starting_token| async move {
            let request = csi::ListVolumesRequest {
                max_entries,
                starting_token,
            };
            let r = grpc(
                controller(channel)
                    .list_volumes(with_timeout(request, timeout))
                    .await,
            )?;
            let entries = r.entries.iter().map(|entry| {
                let mut v = entry
                    .volume
                    .as_ref()
                    .map(volume_json)
                    .unwrap_or(Value::Null);
                if let (Some(status), Some(obj)) = (&entry.status, v.as_object_mut()) {
                    obj.insert(
                        "published_node_ids".into(),
                        json!(status.published_node_ids),
                    );
                }
                v
            });
            Ok((entries.collect(), r.next_token))
        })
        .await?;
    Ok(json!({"entries": volumes, "next_token": token}))
}
