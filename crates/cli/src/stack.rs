//! `volstack up`: the whole system on one machine. The API server, the reference driver, the
//! provisioner and the PV controller run as tasks of this process but talk only through the
//! API server and the CSI socket, as they would in a cluster. State lives under `--data-dir`
//! and survives restarts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser as _;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, CSINode, CSINodeDriver, CSINodeSpec, StorageClass,
    VolumeNodeResources,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

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
    /// Capacity of the driver's default pool.
    #[arg(long, default_value = "1Ti")]
    pub capacity: String,
    /// Node name (and CSI node id).
    #[arg(long, default_value = "node-1")]
    pub node: String,
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
    let stack = Stack::start(StackOptions {
        bind: args.bind,
        durable: true,
        driver_args: vec![
            format!("--capacity={}", args.capacity),
            format!("--nodeid={}", args.node),
        ],
        pv_controller: Some((8, pv_controller::controller::default_backoff())),
        ..StackOptions::new(data_dir.clone(), "volstack-up/0.1")
    })
    .await?;

    let mut prov_argv = vec!["csi-provisioner".to_string()];
    prov_argv.extend(stack.provisioner_args());
    // Our own API server on loopback needs no client-side throttling; the flags still win.
    for (flag, value) in [("--kube-api-qps", "1000"), ("--kube-api-burst", "2000")] {
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
    let given: Vec<String> = prov_argv.iter().skip(1).cloned().collect();
    let provisioner_task = tokio::spawn({
        let stop = stack.stopped();
        async move { provisioner::runner::run(prov_args, &given, stop).await }
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

/// Registers the node as kubelet would: the Node with the driver's topology as labels, the
/// CSINode entry (node id, topology keys, volume limit), the CSIDriver, and the default class.
pub async fn register(client: &kube::Client, socket: &str) -> anyhow::Result<String> {
    let channel = sidecar_kit::csi::connect_with_retry(
        socket,
        Duration::from_millis(100),
        Some(Duration::from_secs(30)),
    )
    .await?;
    let info = csi::identity_client::IdentityClient::new(channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner();
    let node_info = csi::node_client::NodeClient::new(channel)
        .node_get_info(csi::NodeGetInfoRequest {})
        .await?
        .into_inner();
    let segments = node_info
        .accessible_topology
        .map(|t| t.segments)
        .unwrap_or_default();
    let mut labels: std::collections::BTreeMap<String, String> =
        segments.clone().into_iter().collect();
    labels.insert("kubernetes.io/hostname".into(), node_info.node_id.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(node_info.node_id.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    };
    create_or_keep(Api::<Node>::all(client.clone()), &node).await?;
    let mut keys: Vec<String> = segments.keys().cloned().collect();
    keys.sort();
    let csinode = CSINode {
        metadata: ObjectMeta {
            name: Some(node_info.node_id.clone()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: info.name.clone(),
                node_id: node_info.node_id.clone(),
                topology_keys: (!keys.is_empty()).then_some(keys),
                allocatable: (node_info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
                    count: i32::try_from(node_info.max_volumes_per_node).ok(),
                }),
            }],
        },
    };
    create_or_keep(Api::<CSINode>::all(client.clone()), &csinode).await?;
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some(info.name.clone()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(false),
            ..Default::default()
        },
    };
    create_or_keep(Api::<CSIDriver>::all(client.clone()), &driver).await?;
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
        provisioner: info.name.clone(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    };
    create_or_keep(Api::<StorageClass>::all(client.clone()), &class).await?;
    Ok(info.name)
}

async fn create_or_keep<K>(api: Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
