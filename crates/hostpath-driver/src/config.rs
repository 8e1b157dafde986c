//! Command-line configuration of the reference driver.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sidecar_kit::quantity::parse_bytes;

use crate::faults::FaultSet;
use crate::features::{Feature, Features};

/// The default driver name (CSI `GetPluginInfo.name`).
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi.volstack.dev";
/// The default topology key the driver reports (`NodeGetInfo.accessible_topology`).
pub const DEFAULT_TOPOLOGY_KEY: &str = "topology.hostpath.csi.volstack.dev/node";

/// Flags of `volstack driver`.
#[derive(Debug, Clone, clap::Args)]
pub struct DriverArgs {
    /// CSI endpoint to serve: unix:///path/to/csi.sock (a plain absolute path also works).
    #[arg(long, default_value = "unix:///tmp/volstack-csi.sock")]
    pub endpoint: String,
    /// Driver name reported by GetPluginInfo.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub drivername: String,
    /// Node id reported by NodeGetInfo; also the first node the controller can place volumes on.
    #[arg(long, default_value = "node-1")]
    pub nodeid: String,
    /// Directory holding the volume table and one directory per volume.
    #[arg(long, default_value = "/tmp/volstack-csi-state")]
    pub state_dir: PathBuf,
    /// Capacity of a storage "kind" on each node, as KIND=QUANTITY (repeatable). A bare QUANTITY
    /// sets the capacity of the default kind (claims whose class has no `kind` parameter).
    /// Without this flag capacity is unlimited and GET_CAPACITY is not advertised.
    #[arg(long = "capacity", value_name = "KIND=QUANTITY", value_parser = parse_capacity)]
    pub capacity: Vec<(String, i64)>,
    /// Largest volume CreateVolume accepts (OUT_OF_RANGE above it), e.g. 100Gi.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_size)]
    pub max_volume_size: Option<i64>,
    /// Do not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS and report no topology.
    #[arg(long)]
    pub disable_topology: bool,
    /// Topology key reported for every node.
    #[arg(long, default_value = DEFAULT_TOPOLOGY_KEY)]
    pub topology_key: String,
    /// Topology value of this node (default: the node id).
    #[arg(long)]
    pub topology_value: Option<String>,
    /// Another node the controller can place volumes on and publish to, as ID or ID=TOPOLOGYVALUE
    /// (repeatable). Lets one driver process stand for a multi-node cluster in tests.
    #[arg(long = "extra-node", value_name = "ID[=VALUE]")]
    pub extra_nodes: Vec<String>,
    /// NodeGetInfo.max_volumes_per_node, and the number of volumes ControllerPublishVolume
    /// attaches to one node before it answers RESOURCE_EXHAUSTED (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: i64,
    /// Serve ControllerPublishVolume/ControllerUnpublishVolume (PUBLISH_UNPUBLISH_VOLUME).
    #[arg(long)]
    pub enable_attach: bool,
    /// Refuse block volumes (access type Block) with INVALID_ARGUMENT.
    #[arg(long)]
    pub disable_block: bool,
    /// Advertise SINGLE_NODE_MULTI_WRITER (accepting SINGLE_NODE_SINGLE_WRITER and
    /// SINGLE_NODE_MULTI_WRITER access modes).
    #[arg(long)]
    pub single_node_multi_writer: bool,
    /// How NodePublishVolume exposes a volume: bind (mount --bind, needs root), symlink, or auto
    /// (bind when running as root and `mount` works, else symlink).
    #[arg(long, value_enum, default_value_t = PublishMode::Auto)]
    pub publish_mode: PublishMode,
    /// Fault to inject, METHOD=RULE[,RULE..] with RULE one of latency:DURATION,
    /// error:CODE[:PROBABILITY][:after], hang (repeatable; METHOD `*` matches every method);
    /// `seed=N` seeds the draws of the probabilities: the same calls in the same order draw
    /// the same faults.
    #[arg(long = "fault", value_name = "METHOD=RULES")]
    pub faults: Vec<String>,
    /// A secret a method requires, METHOD:KEY=VALUE (repeatable): calls of METHOD whose
    /// secrets lack KEY with VALUE fail with INVALID_ARGUMENT. Lets tests check that the
    /// sidecars and the node pass the Secrets a PV names.
    #[arg(long = "require-secret", value_name = "METHOD:KEY=VALUE")]
    pub require_secrets: Vec<String>,
    /// Control file for faults, re-read whenever it changes; while it exists its lines (same
    /// syntax as --fault) replace the --fault flags. Lets a test switch faults mid-run.
    #[arg(long)]
    pub fault_file: Option<PathBuf>,
    /// Turn an optional feature off (repeatable): snapshots, clones, expansion, stage-unstage,
    /// volume-stats, volume-condition, modify, group-snapshots. Its capability is then not
    /// advertised and its RPCs answer UNIMPLEMENTED.
    #[arg(long = "disable", value_enum, value_name = "FEATURE")]
    pub disable: Vec<Feature>,
    /// Journal records kept before the volume table is compacted into a snapshot.
    #[arg(long, default_value_t = 4096, hide = true)]
    pub compact_after: usize,
}

/// How NodePublishVolume makes a volume visible at the target path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishMode {
    /// Bind mount when running as root, else symlink.
    Auto,
    /// Always bind mount (fails with an error when not permitted).
    Bind,
    /// Symlink the target path to the volume directory (no root needed; read-only is not
    /// enforced by the kernel).
    Symlink,
}

fn parse_size(text: &str) -> Result<i64, String> {
    let bytes = parse_bytes(text).map_err(|e| e.to_string())?;
    if bytes <= 0 {
        return Err(format!("{text:?} must be greater than zero"));
    }
    Ok(bytes)
}

fn parse_capacity(text: &str) -> Result<(String, i64), String> {
    let (kind, quantity) = match text.split_once('=') {
        Some((k, q)) => (k.trim().to_string(), q),
        None => (String::new(), text),
    };
    let bytes = parse_bytes(quantity).map_err(|e| e.to_string())?;
    if bytes < 0 {
        return Err(format!("capacity {text:?} is negative"));
    }
    Ok((kind, bytes))
}

/// One node the controller knows: its CSI node id and its topology value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownNode {
    /// CSI node id.
    pub id: String,
    /// Value of the topology key on this node.
    pub topology_value: String,
}

/// The validated configuration the driver runs with.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Socket path (without `unix://`).
    pub socket_path: String,
    /// Plugin name.
    pub name: String,
    /// This node.
    pub node: KnownNode,
    /// Every node the controller can place volumes on (this node first).
    pub nodes: Vec<KnownNode>,
    /// Topology key, or None when topology is disabled.
    pub topology_key: Option<String>,
    /// Capacity of each kind per node; empty = unlimited.
    pub capacity: BTreeMap<String, i64>,
    /// Largest volume size.
    pub max_volume_size: Option<i64>,
    /// Attach limit per node (0: none).
    pub max_volumes_per_node: i64,
    /// ControllerPublish/Unpublish served.
    pub enable_attach: bool,
    /// Block volumes refused.
    pub disable_block: bool,
    /// SINGLE_NODE_MULTI_WRITER advertised.
    pub single_node_multi_writer: bool,
    /// NodePublish mode.
    pub publish_mode: PublishMode,
    /// State directory.
    pub state_dir: PathBuf,
    /// Faults from flags.
    pub faults: FaultSet,
    /// Secrets methods require: (method, key, value).
    pub required_secrets: Vec<(String, String, String)>,
    /// Fault control file.
    pub fault_file: Option<PathBuf>,
    /// Journal length that triggers compaction.
    pub compact_after: usize,
    /// Default size when CreateVolume gives no capacity range.
    pub default_volume_size: i64,
    /// Poll interval while a method hangs.
    pub hang_poll: Duration,
    /// Optional features that are on.
    pub features: Features,
}

/// A flag combination the driver cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// --endpoint is not a unix socket address.
    #[error("--endpoint: {0}")]
    Endpoint(#[from] sidecar_kit::csi::ConnectError),
    /// A --fault rule does not parse.
    #[error("--fault: {0}")]
    Fault(#[from] crate::faults::FaultParseError),
    /// An empty or repeated value.
    #[error("{0}")]
    Invalid(String),
}

impl DriverArgs {
    /// Validates the flags.
    pub fn into_config(self) -> Result<DriverConfig, ConfigError> {
        let socket_path = sidecar_kit::csi::socket_path(&self.endpoint)?;
        if self.drivername.is_empty() {
            return Err(ConfigError::Invalid(
                "--drivername must not be empty".into(),
            ));
        }
        if self.nodeid.is_empty() {
            return Err(ConfigError::Invalid("--nodeid must not be empty".into()));
        }
        if self.max_volumes_per_node < 0 {
            return Err(ConfigError::Invalid(
                "--max-volumes-per-node must not be negative".into(),
            ));
        }
        let node = KnownNode {
            id: self.nodeid.clone(),
            topology_value: self
                .topology_value
                .clone()
                .unwrap_or_else(|| self.nodeid.clone()),
        };
        let mut nodes = vec![node.clone()];
        for spec in &self.extra_nodes {
            let (id, value) = match spec.split_once('=') {
                Some((id, value)) => (id.to_string(), value.to_string()),
                None => (spec.clone(), spec.clone()),
            };
            if id.is_empty() || value.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "--extra-node {spec:?}: empty id or value"
                )));
            }
            if nodes.iter().any(|n| n.id == id) {
                return Err(ConfigError::Invalid(format!(
                    "--extra-node {spec:?}: node id repeated"
                )));
            }
            nodes.push(KnownNode {
                id,
                topology_value: value,
            });
        }
        let mut capacity = BTreeMap::new();
        for (kind, bytes) in &self.capacity {
            if capacity.insert(kind.clone(), *bytes).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "--capacity for kind {kind:?} given twice"
                )));
            }
        }
        let faults = FaultSet::parse_lines(self.faults.iter().map(String::as_str))?;
        let mut required_secrets = Vec::new();
        for rule in &self.require_secrets {
            let parsed = rule.split_once(':').and_then(|(method, pair)| {
                let (key, value) = pair.split_once('=')?;
                (!method.is_empty() && !key.is_empty())
                    .then(|| (method.to_string(), key.to_string(), value.to_string()))
            });
            required_secrets.push(parsed.ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "--require-secret {rule:?}: expected METHOD:KEY=VALUE"
                ))
            })?);
        }
        Ok(DriverConfig {
            required_secrets,
            socket_path,
            name: self.drivername,
            node,
            nodes,
            topology_key: (!self.disable_topology).then_some(self.topology_key),
            capacity,
            max_volume_size: self.max_volume_size,
            max_volumes_per_node: self.max_volumes_per_node,
            enable_attach: self.enable_attach,
            disable_block: self.disable_block,
            single_node_multi_writer: self.single_node_multi_writer,
            publish_mode: self.publish_mode,
            state_dir: self.state_dir,
            faults,
            fault_file: self.fault_file,
            compact_after: self.compact_after.max(16),
            default_volume_size: 1 << 30,
            hang_poll: Duration::from_millis(50),
            features: Features::without(&self.disable),
        })
    }
}

/// A configuration for unit tests: two nodes in two zones, capacity per kind, attach on.
#[cfg(test)]
pub(crate) fn test_config() -> DriverConfig {
    DriverConfig {
        socket_path: "/tmp/unused.sock".into(),
        name: "test.csi".into(),
        node: KnownNode {
            id: "n1".into(),
            topology_value: "zone-a".into(),
        },
        nodes: vec![
            KnownNode {
                id: "n1".into(),
                topology_value: "zone-a".into(),
            },
            KnownNode {
                id: "n2".into(),
                topology_value: "zone-b".into(),
            },
        ],
        topology_key: Some("topology.test/node".into()),
        capacity: BTreeMap::from([(String::new(), 10 << 30), ("fast".into(), 2 << 30)]),
        max_volume_size: Some(8 << 30),
        max_volumes_per_node: 2,
        enable_attach: true,
        disable_block: false,
        single_node_multi_writer: false,
        publish_mode: PublishMode::Symlink,
        state_dir: "/tmp/unused".into(),
        faults: FaultSet::default(),
        required_secrets: Vec::new(),
        fault_file: None,
        compact_after: 100,
        default_volume_size: 1 << 30,
        hang_poll: Duration::from_millis(10),
        features: Features::default(),
    }
}

impl DriverConfig {
    /// Refuses a call of `method` whose secrets lack one `--require-secret` asks for.
    pub fn check_secrets(
        &self,
        method: &'static str,
        secrets: &std::collections::HashMap<String, String>,
    ) -> Result<(), crate::error::Error> {
        for (m, key, value) in &self.required_secrets {
            if m == method && secrets.get(key) != Some(value) {
                return Err(crate::error::Error::SecretRequired {
                    method,
                    key: key.clone(),
                });
            }
        }
        Ok(())
    }
}
