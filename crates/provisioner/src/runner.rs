//! Start-up of `csi-provisioner`: flags → driver → API client → controller.

use std::future::Future;

use sidecar_kit::events::Recorder;
use sidecar_kit::kubeclient::{ClientError, ClientOptions, build_client};
use sidecar_kit::leader::{lease_name, lease_namespace};
use sidecar_kit::metrics::Metrics;
use sidecar_kit::process::Serve;
use sidecar_kit::workqueue::Backoff;

use crate::capacity::controller::CapacitySettings;
use crate::capacity::decide::Template;
use crate::controller::driver::{self, StartupError};
use crate::controller::node_deployment::NodeDeployment;
use crate::controller::{CapacityInput, ControllerConfig, Provisioner};
use crate::decide::names::provisioner_identity;
use crate::decide::provision::ProvisionOptions;
use crate::flags::{FlagError, ProvisionerArgs};

/// Why the provisioner stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad flags.
    #[error(transparent)]
    Flags(#[from] FlagError),
    /// The driver failed a start-up call.
    #[error(transparent)]
    Driver(#[from] StartupError),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The HTTP endpoint could not start, or leadership was lost (the process exits so
    /// that it restarts as a standby).
    #[error(transparent)]
    Serve(#[from] sidecar_kit::process::ServeError),
    /// A flag that is accepted for compatibility but whose feature is missing.
    #[error("{0}")]
    Unsupported(String),
    /// `--enable-capacity` cannot work: the driver, the environment or the owner.
    #[error("--enable-capacity: {0}")]
    Capacity(String),
    /// `--node-deployment` cannot work: the environment or the driver.
    #[error("--node-deployment: {0}")]
    NodeDeployment(String),
    /// `--enable-volume-sets` cannot work.
    #[error("--enable-volume-sets: {0}")]
    VolumeSets(String),
    /// `--in-flight-recovery=list-volumes` with a driver that does not follow the convention.
    #[error("{0}")]
    Recovery(String),
    /// The metrics could not be registered.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The owner of the CSIStorageCapacity objects could not be found.
    #[error("--capacity-ownerref-level: {0}")]
    Owner(#[from] crate::capacity::owner::OwnerError),
}

/// What the provisioner reads from its environment (set by the Pod's downward API upstream).
#[derive(Debug, Clone, Default)]
pub struct ProcessEnv {
    /// `NAMESPACE` (else `POD_NAMESPACE`): where CSIStorageCapacity objects go.
    pub namespace: Option<String>,
    /// `POD_NAME`: the start of the owner chain.
    pub pod_name: Option<String>,
    /// `NODE_NAME`: this node, in node deployment.
    pub node_name: Option<String>,
}

impl ProcessEnv {
    /// Reads the three variables (empty counts as unset).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The same from `get` (the environment, or a test's table).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        ProcessEnv {
            // The seed's deployment sets POD_NAMESPACE; upstream's code reads NAMESPACE.
            namespace: var("NAMESPACE").or_else(|| var("POD_NAMESPACE")),
            pod_name: var("POD_NAME"),
            node_name: var("NODE_NAME"),
        }
    }
}

/// Learns this node from NodeGetInfo (`--node-deployment`).
async fn local_node(
    args: &ProvisionerArgs,
    env: &ProcessEnv,
    channel: &tonic::transport::Channel,
    (driver, metrics): (&str, &Metrics),
) -> Result<Option<NodeDeployment>, RunError> {
    if !args.node_deployment {
        return Ok(None);
    }
    let name = env.node_name.clone().ok_or_else(|| {
        RunError::NodeDeployment(
            "the NODE_NAME environment variable must be set when using --node-deployment".into(),
        )
    })?;
    let calls = sidecar_kit::csi::Caller::new(driver, args.timeout, Some(metrics.clone()));
    let mut client = csi_proto::v1::node_client::NodeClient::new(channel.clone());
    let info = calls
        .call(
            "/csi.v1.Node/NodeGetInfo",
            client.node_get_info(calls.request(csi_proto::v1::NodeGetInfoRequest {})),
        )
        .await
        .map_err(|e| {
            RunError::NodeDeployment(format!("failed to get node info from CSI driver: {e}"))
        })?;
    let labels = info
        .accessible_topology
        .map(|t| t.segments.into_iter().collect())
        .unwrap_or_default();
    tracing::info!(node = %name, node_id = %info.node_id, ?labels, "node deployment: provisioning for this node only");
    Ok(Some(NodeDeployment {
        name,
        node_id: info.node_id,
        labels,
        immediate_binding: args.node_deployment_immediate_binding,
        base_delay: args.node_deployment_base_delay,
        max_delay: args.node_deployment_max_delay,
    }))
}

/// Checks that `--enable-volume-sets` can work: the definition of PersistentVolumeSets is
/// installed (without it the watch would wait forever).
async fn check_volume_sets(args: &ProvisionerArgs, client: &kube::Client) -> Result<(), RunError> {
    if !args.enable_volume_sets {
        return Ok(());
    }
    let api: kube::Api<crate::volume_sets::types::PersistentVolumeSet> =
        kube::Api::all(client.clone());
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Err(RunError::VolumeSets(
            "the CustomResourceDefinition persistentvolumesets.storage.volstack.dev is not installed (kubectl apply -f deploy/kubernetes/persistentvolumeset-crd.json)".into(),
        )),
        Err(error) => Err(RunError::VolumeSets(format!(
            "cannot list PersistentVolumeSets: {error}"
        ))),
    }
}

/// Prepares `--enable-capacity`: checks the driver and the environment, finds the owner and
/// builds the rate-limited client of the capacity writes.
async fn capacity_input(
    args: &ProvisionerArgs,
    env: &ProcessEnv,
    caps: &crate::decide::provision::DriverCapabilities,
    client: &kube::Client,
    node: Option<&NodeDeployment>,
    user_agent: &str,
) -> Result<Option<CapacityInput>, RunError> {
    if !args.capacity().on() {
        return Ok(None);
    }
    if !caps.get_capacity {
        return Err(RunError::Capacity(format!(
            "driver {:?} does not advertise the GET_CAPACITY controller capability",
            caps.name
        )));
    }
    let namespace = env
        .namespace
        .clone()
        .ok_or(crate::capacity::owner::OwnerError::NoNamespace)?;
    let owner = crate::capacity::owner::resolve(
        client,
        &namespace,
        env.pod_name.as_deref(),
        args.capacity_ownerref_level,
    )
    .await?;
    if let Some(owner) = &owner {
        tracing::info!(kind = %owner.kind, name = %owner.name, %namespace, "owner of CSIStorageCapacity objects");
    }
    let writer = build_client(&ClientOptions {
        kubeconfig: &args.common.kubeconfig,
        master: &args.common.master,
        qps: args.kube_api_capacity_qps,
        burst: args.kube_api_capacity_burst,
        user_agent,
        in_flight: Some(sidecar_kit::kubeclient::SIDECAR_IN_FLIGHT),
    })
    .await?;
    let managed_by = match node {
        Some(node) => managed_by_node(&node.name),
        None => "external-provisioner".to_string(),
    };
    Ok(Some(CapacityInput {
        writer,
        settings: CapacitySettings {
            template: Template {
                namespace,
                driver: caps.name.clone(),
                managed_by,
                owner,
            },
            poll_interval: args.capacity_poll_interval,
            workers: args.capacity_threads as usize,
            immediate_binding: args.capacity_for_immediate_binding(),
            timeout: args.timeout,
            backoff: Backoff {
                start: args.retry_interval_start,
                max: args.retry_interval_max,
            },
            fixed_segment: node.map(|n| n.labels.clone()),
        },
    }))
}

/// `external-provisioner-<node>`, at most 63 characters (a label value): a longer one keeps a
/// prefix and ends in a hash of the whole, as upstream.
pub fn managed_by_node(node: &str) -> String {
    let full = format!("external-provisioner-{node}");
    if full.len() <= 63 {
        return full;
    }
    // FNV-1a, 32 bits.
    let mut hash: u32 = 0x811c_9dc5;
    for b in full.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let suffix = format!("-{hash:08x}");
    let mut cut = 63 - suffix.len();
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &full[..cut])
}

pub use sidecar_kit::vocabulary::hostname;

/// Runs until `shutdown` resolves.
pub async fn run(
    args: ProvisionerArgs,
    given: &[String],
    env: &ProcessEnv,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let settings = args.validate()?;
    for flag in args.inert_flags(given) {
        tracing::warn!(
            flag,
            "flag has no effect: its feature is off or not supported by this provisioner"
        );
    }
    // Before the driver's start-up calls, which it counts.
    let metrics = Metrics::new()?;
    let (channel, mut caps) =
        driver::start(&args.common.csi_address, args.timeout, &metrics).await?;
    if !settings.csi_migration {
        caps.migrated_from = None;
    }
    if let Some(plugin) = caps.migrated_from {
        tracing::info!(
            plugin = plugin.in_tree_name(),
            "CSI migration: also serving the in-tree plugin's classes and volumes"
        );
    }
    let recovery = crate::decide::recovery::choose(args.in_flight_recovery, caps.recoverable)
        .map_err(RunError::Recovery)?;
    tracing::info!(
        ?recovery,
        "volumes in flight at a crash are found again by this way"
    );
    let user_agent = format!("csi-provisioner/{}", env!("CARGO_PKG_VERSION"));
    let client = build_client(&ClientOptions {
        kubeconfig: &args.common.kubeconfig,
        master: &args.common.master,
        qps: args.common.kube_api_qps,
        burst: args.common.kube_api_burst,
        user_agent: &user_agent,
        in_flight: Some(sidecar_kit::kubeclient::SIDECAR_IN_FLIGHT),
    })
    .await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let node = local_node(&args, env, &channel, (&caps.name, &metrics)).await?;
    let capacity = capacity_input(&args, env, &caps, &client, node.as_ref(), &user_agent).await?;
    check_volume_sets(&args, &client).await?;
    let mut identity = provisioner_identity(now_ms, rand::random::<u32>(), &caps.name);
    if let Some(node) = &node {
        identity.push_str(&format!("-{}", node.name));
    }
    let host = hostname();
    let component = format!("{}_{}_{}", caps.name, host, uuid::Uuid::new_v4());
    // Upstream's event source names no host.
    let recorder = Recorder::new(client.clone(), component);
    let caps_name = caps.name.clone();
    let config = ControllerConfig {
        options: ProvisionOptions {
            naming: settings.naming.clone(),
            default_fstype: args.default_fstype.clone(),
            extra_create_metadata: args.extra_create_metadata,
            controller_publish_readonly: args.controller_publish_readonly,
            topology: settings.topology,
            attributes_classes: settings.volume_attributes_class,
        },
        caps,
        timeout: args.timeout,
        workers: args.worker_threads as usize,
        backoff: Backoff {
            start: args.retry_interval_start,
            max: args.retry_interval_max,
        },
        strict_topology: args.strict_topology,
        immediate_topology: args.immediate_topology,
        cross_namespace: settings.cross_namespace,
        prevent_volume_mode_conversion: args.prevent_volume_mode_conversion,
        cloning_workers: args.cloning_protection_threads as usize,
        identity,
        intent_log: (
            lease_namespace(&args.common.leader_election_namespace),
            format!("{}-intents", lease_name(&caps_name)),
        ),
        // A per-node provisioner lists and marks its own node's volumes only: a Lease each.
        listed_lease: (
            lease_namespace(&args.common.leader_election_namespace),
            match &node {
                Some(node) => format!("{}-listed-{}", lease_name(&caps_name), node.name),
                None => format!("{}-listed", lease_name(&caps_name)),
            },
        ),
        recovery,
        node,
        volume_sets: args.enable_volume_sets,
        volume_set_creates: args.volume_set_creates as usize,
    };
    let driver_name = config.caps.name.clone();
    let provisioner = Provisioner::new(
        client.clone(),
        channel,
        config,
        recorder,
        metrics.clone(),
        capacity,
    )?;
    let serve = Serve {
        http_address: settings.http_address.clone(),
        metrics_path: args.common.metrics_path.clone(),
        metrics,
        election: args
            .common
            // Upstream's RBAC grants events: its LeaderElection events are written, from
            // csi-lib-utils' lock name (the driver's, `/` as `-`).
            .election(
                lease_name(&driver_name),
                settings.release_on_exit,
                Some(sidecar_kit::leader::lock_name(&driver_name)),
            ),
    };
    sidecar_kit::process::serve(provisioner.controller(), client, serve, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manager_of_a_node_is_named_after_it_within_63_characters() {
        assert_eq!(managed_by_node("node-1"), "external-provisioner-node-1");
        let long = "n".repeat(80);
        let name = managed_by_node(&long);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with("external-provisioner-nnn"));
        assert_ne!(
            name,
            managed_by_node(&"n".repeat(81)),
            "the hash tells them apart"
        );
    }

    #[test]
    fn the_namespace_comes_from_namespace_else_pod_namespace() {
        fn env(pairs: &[(&str, &str)]) -> ProcessEnv {
            ProcessEnv::from_lookup(|name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            })
        }
        // (variables, namespace)
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let rows: [(Vars, Option<&str>); 5] = [
            (&[("NAMESPACE", "a")], Some("a")),
            (&[("POD_NAMESPACE", "b")], Some("b")),
            (&[("NAMESPACE", "a"), ("POD_NAMESPACE", "b")], Some("a")),
            (&[("NAMESPACE", ""), ("POD_NAMESPACE", "b")], Some("b")),
            (&[], None),
        ];
        for (vars, want) in rows {
            assert_eq!(env(vars).namespace.as_deref(), want, "{vars:?}");
        }
    }
}
