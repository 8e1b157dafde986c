//! `volstack up`: the whole system on one machine. The API server, the reference driver, the
//! provisioner, the attacher, the PV controller, the scheduler and the node agents run as
//! tasks of this process but talk only through the
//! API server and the CSI socket, as they would in a cluster. State lives under `--data-dir`
//! and survives restarts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser as _;
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::embedded::{Stack, StackOptions};

/// Flags of `volstack up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where state lives (API objects, volumes, kubeconfig, CSI socket).
    #[arg(long, default_value = ".volstack")]
    pub data_dir: PathBuf,
    /// API server address (loopback by default).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub bind: SocketAddr,
    /// Capacity of the driver's default pool on each node.
    #[arg(long, default_value = "1Ti")]
    pub capacity: String,
    /// Node name (and CSI node id) of a one-node stack.
    #[arg(long, default_value = "node-1", conflicts_with = "nodes")]
    pub node: String,
    /// Number of nodes, named node-1 … node-N; each gets the driver's node service and is
    /// registered as kubelet would. Capacity is tracked per node.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub nodes: u16,
    /// Whether volumes need attaching: the CSIDriver says `attachRequired`, the driver serves
    /// ControllerPublishVolume and csi-attacher runs (false: Pods get volumes without
    /// VolumeAttachments).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub attach: bool,
    /// Extra flags for the provisioner (repeatable), e.g. --provisioner-arg=--kube-api-qps=50.
    #[arg(long = "provisioner-arg", allow_hyphen_values = true)]
    pub provisioner_args: Vec<String>,
    /// A CSI driver you run, instead of the reference driver: its controller service
    /// (`unix:///path/controller.sock`). Its name, capabilities and topology are read from it.
    #[arg(long, value_parser = unix_socket, conflicts_with_all = ["capacity", "nodes"])]
    pub driver_endpoint: Option<String>,
    /// A node of that driver and its node service (`NODE=unix:///path/node.sock`, repeatable);
    /// none: the controller endpoint serves the one node, node-1.
    #[arg(long = "node-endpoint", value_parser = node_endpoint, requires = "driver_endpoint")]
    pub node_endpoints: Vec<(String, String)>,
    /// A parameter of the default StorageClass (`KEY=VALUE`, repeatable).
    #[arg(long = "class-parameter", value_parser = key_value)]
    pub class_parameters: Vec<(String, String)>,
}

/// A `unix://` endpoint's socket path.
pub(crate) fn unix_socket(value: &str) -> Result<String, String> {
    match value.strip_prefix("unix://") {
        Some(path) if path.starts_with('/') => Ok(path.to_string()),
        _ => Err(format!(
            "{value:?} is not a unix:// endpoint with an absolute path (unix:///path/to.sock)"
        )),
    }
}

/// `NODE=unix:///path`.
pub(crate) fn node_endpoint(value: &str) -> Result<(String, String), String> {
    let (node, endpoint) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not NODE=unix:///path/to.sock"))?;
    if node.is_empty() {
        return Err(format!("{value:?} names no node"));
    }
    Ok((node.to_string(), unix_socket(endpoint)?))
}

/// `KEY=VALUE`.
pub(crate) fn key_value(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((key, v)) if !key.is_empty() => Ok((key.to_string(), v.to_string())),
        _ => Err(format!("{value:?} is not KEY=VALUE")),
    }
}

/// A stack `up` started: the stack and the provisioner running beside it.
pub struct Running {
    /// The stack.
    pub stack: Stack,
    /// The provisioner's task (it stops with the stack).
    pub provisioner: tokio::task::JoinHandle<Result<(), provisioner::runner::RunError>>,
    /// The data directory.
    pub data_dir: PathBuf,
}

impl Running {
    /// Stops the provisioner and the stack, waiting up to `grace`.
    pub async fn shutdown(self, grace: Duration) {
        let Running {
            stack, provisioner, ..
        } = self;
        stack
            .shutdown_with(grace, async {
                let _ = provisioner.await;
            })
            .await;
    }
}

/// Runs the stack until Ctrl-C.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let running = start(args).await?;
    let Running {
        stack, data_dir, ..
    } = &running;
    println!(
        "volstack is up: API server {}, driver {}, data in {}",
        stack.server.url(),
        stack.driver_name,
        data_dir.display()
    );
    println!();
    println!("  export KUBECONFIG={}", stack.kubeconfig.display());
    println!("  kubectl apply -f examples/claim.yaml");
    println!("  kubectl get pvc,pv");
    println!(
        "  kubectl apply -f examples/late-binding.yaml   # a Pod and its claim, placed by capacity"
    );
    println!("  kubectl get pod,pvc,csistoragecapacities -A -o wide");
    println!(
        "  kubectl apply -f examples/pod.yaml   # a Pod whose volume is published on its node"
    );
    println!();
    println!(
        "Pods' volumes are under {}/kubelet/<node>/pods/<pod-uid>/volumes/kubernetes.io~csi/<pv>/mount",
        data_dir.display()
    );
    println!();
    println!("Ctrl-C stops everything; the next `up` resumes the same state.");

    crate::shutdown_signal().await;
    running.shutdown(Duration::from_secs(10)).await;
    println!("volstack stopped");
    Ok(())
}

/// Starts the stack and its provisioner as `up` does, and returns them running.
pub async fn start(args: UpArgs) -> anyhow::Result<Running> {
    start_with(args, None).await
}

/// Like [`start`], with what the external driver (`--driver-endpoint`) already said of itself.
pub async fn start_with(
    args: UpArgs,
    info: Option<sidecar_kit::driver::DriverInfo>,
) -> anyhow::Result<Running> {
    let data_dir = std::path::absolute(&args.data_dir).context("resolve --data-dir")?;
    // 0700: it holds the kubeconfig with the token and the driver's socket.
    durable_log::files::create_durable_private_dir(&data_dir)
        .with_context(|| format!("create {}", data_dir.display()))?;
    let (first, extra_nodes) = node_names(&args.node, args.nodes);
    let external = match (&args.driver_endpoint, info) {
        (None, _) => None,
        (Some(controller), known) => {
            // Someone else's driver says what it is (read once).
            let info = match known {
                Some(info) => info,
                None => {
                    sidecar_kit::driver::identify(controller, Duration::from_secs(30), None)
                        .await
                        .with_context(|| format!("read the CSI driver at {controller}"))?
                        .1
                }
            };
            Some(crate::embedded::ExternalDriver {
                controller: controller.clone(),
                nodes: args.node_endpoints.clone(),
                name: info.name.clone(),
                traits: DriverTraits::from_info(&info),
            })
        }
    };
    let traits = external.as_ref().map(|e| e.traits);
    let socket = match &external {
        Some(external) => external.controller.clone(),
        None => crate::embedded::paths(&data_dir).0,
    };
    // The provisioner runs as its ServiceAccount, with the RBAC of deploy/kubernetes.
    let kubeconfig = crate::embedded::identities::kubeconfig_path(&data_dir, "csi-provisioner");
    let mut prov_argv = vec!["csi-provisioner".to_string()];
    prov_argv.extend(crate::embedded::provisioner_args_for(&socket, &kubeconfig));
    // Capacity is published per node for WaitForFirstConsumer classes; the scheduler reads it.
    // The objects have no owner: no Pod runs the provisioner here.
    let capacity = traits.is_none_or(|t| t.storage_capacity);
    let mut defaults = vec![
        ("--enable-capacity", if capacity { "true" } else { "false" }),
        ("--capacity-ownerref-level", "-1"),
        // Pools of ready volumes (PersistentVolumeSets).
        ("--enable-volume-sets", "true"),
    ];
    // Our own API server on loopback needs no client-side throttling; the flags still win.
    defaults.extend([("--kube-api-qps", "1000"), ("--kube-api-burst", "2000")]);
    for (flag, value) in defaults {
        if !args
            .provisioner_args
            .iter()
            .any(|a| a.trim_start_matches('-').starts_with(&flag[2..]))
        {
            prov_argv.push(format!("{flag}={value}"));
        }
    }
    prov_argv.extend(args.provisioner_args.iter().cloned());
    let prov_argv = sidecar_kit::goflags::normalize_args(prov_argv);
    let prov_args = provisioner::flags::ProvisionerArgs::try_parse_from(&prov_argv)?;
    let stack = Stack::start(StackOptions {
        bind: args.bind,
        durable: true,
        driver_args: vec![
            format!("--capacity={}", args.capacity),
            format!("--nodeid={first}"),
        ],
        pv_controller: Some((8, pv_controller::controller::default_backoff())),
        extra_nodes,
        // The scheduler checks capacity only when the provisioner publishes it.
        storage_capacity: prov_args.capacity().on(),
        attach: traits.map_or(args.attach, |t| t.attach_required),
        kubelet: true,
        external,
        class_parameters: args.class_parameters.iter().cloned().collect(),
        ..StackOptions::new(data_dir.clone(), "volstack-up/0.1")
    })
    .await?;
    let given: Vec<String> = prov_argv.iter().skip(1).cloned().collect();
    let env = provisioner::runner::ProcessEnv {
        namespace: Some(crate::embedded::identities::NAMESPACE.into()),
        ..Default::default()
    };
    let provisioner = tokio::spawn({
        let stop = stack.stopped();
        async move { provisioner::runner::run(prov_args, &given, &env, stop).await }
    });
    Ok(Running {
        stack,
        provisioner,
        data_dir,
    })
}

/// The nodes of a stack: `node` alone, or node-1 … node-N. Returns the driver's own node and
/// the others.
fn node_names(node: &str, nodes: u16) -> (String, Vec<String>) {
    if nodes <= 1 {
        return (node.to_string(), Vec::new());
    }
    let extra = (2..=nodes).map(|i| format!("node-{i}")).collect();
    ("node-1".to_string(), extra)
}

/// What the CSIDriver object says of the driver, and what the stack makes for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverTraits {
    /// The scheduler checks capacity (`storageCapacity`).
    pub storage_capacity: bool,
    /// Volumes need a VolumeAttachment (`attachRequired`).
    pub attach_required: bool,
    /// The Pod's info on NodePublishVolume (`podInfoOnMount`).
    pub pod_info_on_mount: bool,
    /// `Ephemeral` among `volumeLifecycleModes` (CSI inline volumes).
    pub ephemeral: bool,
    /// A VolumeSnapshotClass is made for it (CREATE_DELETE_SNAPSHOT).
    pub snapshots: bool,
    /// Its default class allows expansion (EXPAND_VOLUME).
    pub expansion: bool,
}

impl Default for DriverTraits {
    /// The reference driver's.
    fn default() -> Self {
        DriverTraits {
            storage_capacity: false,
            attach_required: false,
            pod_info_on_mount: true,
            ephemeral: true,
            snapshots: true,
            expansion: true,
        }
    }
}

impl DriverTraits {
    /// What a driver someone else runs says it can do: attach from PUBLISH_UNPUBLISH_VOLUME,
    /// capacity from GET_CAPACITY, snapshots from CREATE_DELETE_SNAPSHOT; the Pod's info and
    /// inline volumes as the reference driver (csi-driver-host-path is deployed so).
    pub fn from_info(info: &sidecar_kit::driver::DriverInfo) -> DriverTraits {
        use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
        DriverTraits {
            storage_capacity: info.has(Rpc::GetCapacity),
            attach_required: info.has(Rpc::PublishUnpublishVolume),
            snapshots: info.has(Rpc::CreateDeleteSnapshot),
            expansion: info.has(Rpc::ExpandVolume),
            ..DriverTraits::default()
        }
    }
}

/// Registers the CSIDriver `driver_name` with `traits`, and the default class (`hostpath`, with
/// `parameters`).
pub async fn register_driver(
    client: &kube::Client,
    driver_name: &str,
    traits: DriverTraits,
    parameters: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let driver_name = driver_name.to_string();
    let mut modes = vec!["Persistent".to_string()];
    if traits.ephemeral {
        modes.push("Ephemeral".into());
    }
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some(driver_name.clone()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(traits.attach_required),
            storage_capacity: Some(traits.storage_capacity),
            pod_info_on_mount: Some(traits.pod_info_on_mount),
            volume_lifecycle_modes: Some(modes),
            ..Default::default()
        },
    };
    let drivers = Api::<CSIDriver>::all(client.clone());
    match drivers.create(&PostParams::default(), &driver).await {
        Ok(_) => {}
        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {
            // storageCapacity may change (an earlier `up` without it); attachRequired is
            // immutable, so a stack made without attach keeps it.
            let patch = serde_json::json!({"spec": {"storageCapacity": traits.storage_capacity}});
            drivers
                .patch(&driver_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(error) => return Err(error.into()),
    }
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some("hostpath".into()),
            annotations: Some(
                [(
                    "storageclass.kubernetes.io/is-default-class".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        provisioner: driver_name.clone(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        allow_volume_expansion: Some(traits.expansion),
        parameters: (!parameters.is_empty()).then(|| parameters.clone()),
        ..Default::default()
    };
    create_or_keep(Api::<StorageClass>::all(client.clone()), &class).await?;
    Ok(())
}

/// Registers the node `node` behind a node plugin socket as kubelet does (see
/// [`stack::node::registration`]). Returns the driver's name.
pub async fn register_node(
    client: &kube::Client,
    socket: &str,
    node: &str,
) -> anyhow::Result<String> {
    let channel = sidecar_kit::csi::connect_with_retry(
        socket,
        Duration::from_millis(100),
        Some(Duration::from_secs(30)),
    )
    .await?;
    Ok(stack::node::registration::register(client, channel, node).await?)
}

async fn create_or_keep<K>(api: Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod endpoint_tests {
    use super::*;

    #[test]
    fn endpoints_and_class_parameters_are_read_or_refused_naming_the_value() {
        assert_eq!(
            unix_socket("unix:///run/csi.sock").unwrap(),
            "/run/csi.sock"
        );
        for bad in ["/run/csi.sock", "unix://relative.sock", "tcp://127.0.0.1:1"] {
            assert!(unix_socket(bad).unwrap_err().contains(bad), "{bad}");
        }
        assert_eq!(
            node_endpoint("node-2=unix:///n2.sock").unwrap(),
            ("node-2".to_string(), "/n2.sock".to_string())
        );
        assert!(node_endpoint("unix:///n2.sock").is_err());
        assert!(node_endpoint("=unix:///n2.sock").is_err());
        assert_eq!(
            key_value("type=gp3").unwrap(),
            ("type".to_string(), "gp3".to_string())
        );
        assert_eq!(key_value("kind=").unwrap().1, "");
        assert!(key_value("=x").is_err());
        assert!(key_value("novalue").is_err());
    }
}

#[cfg(test)]
mod traits_tests {
    use super::*;
    use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;

    #[test]
    fn a_drivers_capabilities_say_what_its_csidriver_and_the_stack_are() {
        let info = |rpcs: Vec<Rpc>| sidecar_kit::driver::DriverInfo {
            rpcs,
            ..Default::default()
        };
        let bare = DriverTraits::from_info(&info(vec![]));
        assert!(!bare.attach_required && !bare.storage_capacity && !bare.snapshots);
        assert!(bare.pod_info_on_mount && bare.ephemeral);
        let all = DriverTraits::from_info(&info(vec![
            Rpc::PublishUnpublishVolume,
            Rpc::GetCapacity,
            Rpc::CreateDeleteSnapshot,
        ]));
        assert!(all.attach_required && all.storage_capacity && all.snapshots);
    }
}
