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
}

/// Runs the stack until Ctrl-C.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let data_dir = std::path::absolute(&args.data_dir).context("resolve --data-dir")?;
    // 0700: it holds the kubeconfig with the token and the driver's socket.
    durable_log::files::create_private_dir(&data_dir)
        .with_context(|| format!("create {}", data_dir.display()))?;
    let (first, extra_nodes) = node_names(&args.node, args.nodes);
    let (socket, _) = crate::embedded::paths(&data_dir);
    // The provisioner runs as its ServiceAccount, with the RBAC of deploy/kubernetes.
    let kubeconfig = crate::embedded::identities::kubeconfig_path(&data_dir, "csi-provisioner");
    let mut prov_argv = vec!["csi-provisioner".to_string()];
    prov_argv.extend(crate::embedded::provisioner_args_for(&socket, &kubeconfig));
    // Capacity is published per node for WaitForFirstConsumer classes; the scheduler reads it.
    // The objects have no owner: no Pod runs the provisioner here.
    let mut defaults = vec![
        ("--enable-capacity", "true"),
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
        attach: args.attach,
        kubelet: true,
        ..StackOptions::new(data_dir.clone(), "volstack-up/0.1")
    })
    .await?;
    let given: Vec<String> = prov_argv.iter().skip(1).cloned().collect();
    let env = provisioner::runner::ProcessEnv {
        namespace: Some(crate::embedded::identities::NAMESPACE.into()),
        ..Default::default()
    };
    let provisioner_task = tokio::spawn({
        let stop = stack.stopped();
        async move { provisioner::runner::run(prov_args, &given, &env, stop).await }
    });

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
    stack
        .shutdown_with(Duration::from_secs(10), async {
            let _ = provisioner_task.await;
        })
        .await;
    println!("volstack stopped");
    Ok(())
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

/// What the CSIDriver object says of the driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct DriverTraits {
    /// The scheduler checks capacity (`storageCapacity`).
    pub storage_capacity: bool,
    /// Volumes need a VolumeAttachment (`attachRequired`).
    pub attach_required: bool,
}

/// Registers the driver's own node (see [`register_node`]), the CSIDriver with `traits`, and
/// the default class.
pub async fn register(
    client: &kube::Client,
    socket: &str,
    node: &str,
    traits: DriverTraits,
) -> anyhow::Result<String> {
    let DriverTraits {
        storage_capacity,
        attach_required,
    } = traits;
    let driver_name = register_node(client, socket, node).await?;
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some(driver_name.clone()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(attach_required),
            storage_capacity: Some(storage_capacity),
            // The reference driver serves inline volumes too; the Pod's info is what tells
            // it a publish is for one (as csi-driver-host-path is deployed).
            pod_info_on_mount: Some(true),
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            ..Default::default()
        },
    };
    let drivers = Api::<CSIDriver>::all(client.clone());
    match drivers.create(&PostParams::default(), &driver).await {
        Ok(_) => {}
        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {
            // storageCapacity may change (an earlier `up` without it); attachRequired is
            // immutable, so a stack made without attach keeps it.
            let patch = serde_json::json!({"spec": {"storageCapacity": storage_capacity}});
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
        ..Default::default()
    };
    create_or_keep(Api::<StorageClass>::all(client.clone()), &class).await?;
    Ok(driver_name)
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
