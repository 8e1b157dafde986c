//! What the embedded stack starts ([`StackOptions`]), and a CSI driver someone else runs in
//! place of the reference driver ([`ExternalDriver`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sidecar_kit::workqueue::Backoff;

/// What to start.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where state lives: the kubeconfig, the CSI socket and the driver's state; the API
    /// server's too when `durable`.
    pub dir: PathBuf,
    /// The API server's address (port 0: any free port).
    pub bind: SocketAddr,
    /// Whether the API server keeps its objects on disk (`<dir>/apiserver`).
    pub durable: bool,
    /// Flags for the driver besides its endpoint and state directory.
    pub driver_args: Vec<String>,
    /// Workers and backoff of the PV controller, if it runs.
    pub pv_controller: Option<(usize, Backoff)>,
    /// The PV controller's pass over volumes whose claim is missing.
    pub orphan_resync: Duration,
    /// Whether the snapshot.storage.k8s.io CRDs are installed and the snapshot controller
    /// runs for the driver.
    pub snapshots: bool,
    /// Whether the resizer runs for the driver (when it can expand or modify volumes).
    pub resizer: bool,
    /// Nodes besides the driver's own (`--nodeid`): each gets the driver's node service on a
    /// socket of its own and is registered as kubelet would.
    pub extra_nodes: Vec<String>,
    /// Whether the CSIDriver asks the scheduler to check capacity (`storageCapacity: true`).
    pub storage_capacity: bool,
    /// Whether the scheduler runs (Pods get nodes; their late-binding claims get volumes).
    pub scheduler: bool,
    /// Whether volumes need attaching: the driver serves ControllerPublishVolume, the
    /// CSIDriver says `attachRequired: true` and `csi-attacher` runs in-process.
    pub attach: bool,
    /// Whether the nodes' side runs: a node agent per node (kubelet's volume manager), the
    /// attach/detach controller and the pvc-/pv-protection controllers.
    pub kubelet: bool,
    /// The User-Agent of the stack's own client.
    pub user_agent: &'static str,
    /// Whether the API server, the driver and the controllers each run on a runtime of their
    /// own (threads named after them, so their CPU can be told apart): the API server's with
    /// this many threads, the others with one ([`Lanes::separate`]).
    pub separate_lanes: Option<usize>,
    /// A CSI driver someone else runs, in place of the reference driver (`driver_args` and
    /// `extra_nodes` are then not used).
    pub external: Option<ExternalDriver>,
    /// Parameters of the default StorageClass.
    pub class_parameters: std::collections::BTreeMap<String, String>,
    /// Changes the API server keeps for watches to resume from (None: its default). A watch
    /// away for longer than this many changes re-lists (tests make that happen).
    pub watch_history: Option<usize>,
    /// How soon the node agents look again at what no event brings back (waiting Pods, the
    /// sweep).
    pub node_rechecks: stack::node::Rechecks,
    /// The snapshot controller's retry backoff.
    pub snapshot_backoff: Backoff,
}

/// A CSI driver run by someone else: its controller service's socket, and the node services
/// by node name (none: the controller socket serves the one node, `node-1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalDriver {
    /// The controller service (also Identity).
    pub controller: String,
    /// (node name, node service socket), the stack's nodes in order.
    pub nodes: Vec<(String, String)>,
    /// Its name (GetPluginInfo).
    pub name: String,
    /// What its capabilities make of its CSIDriver and the stack.
    pub traits: crate::stack::DriverTraits,
}

impl ExternalDriver {
    /// The stack's nodes and the socket of each node's service.
    pub fn nodes(&self) -> Vec<(String, String)> {
        if self.nodes.is_empty() {
            vec![("node-1".to_string(), self.controller.clone())]
        } else {
            self.nodes.clone()
        }
    }
}

impl StackOptions {
    /// An in-memory API server on a free loopback port, the driver with default flags and the
    /// PV controller with its default backoff.
    pub fn new(dir: PathBuf, user_agent: &'static str) -> Self {
        StackOptions {
            dir,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            durable: false,
            driver_args: Vec::new(),
            pv_controller: Some((4, pv_controller::controller::default_backoff())),
            orphan_resync: pv_controller::controller::ORPHAN_RESYNC,
            snapshots: true,
            resizer: true,
            extra_nodes: Vec::new(),
            storage_capacity: false,
            scheduler: true,
            attach: false,
            kubelet: false,
            user_agent,
            separate_lanes: None,
            external: None,
            class_parameters: Default::default(),
            watch_history: None,
            node_rechecks: Default::default(),
            snapshot_backoff: Backoff {
                start: Duration::from_millis(100),
                max: Duration::from_secs(30),
            },
        }
    }
}
