//! The embedded stack, assembled in one place for `volstack up`, the benchmark and the
//! scenario tests: our API server, the reference driver on a unix socket, the node registered
//! as kubelet would, and optionally the PV controller, all stopped by one signal. The
//! provisioner is left to the caller (in-process for `up`, a child process for the benchmark
//! and the tests).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod controllers;
pub mod identities;
pub mod lanes;
mod options;

pub use options::{ExternalDriver, StackOptions};

use lanes::{Lane, Lanes};

#[derive(Parser)]
struct DriverCli {
    #[command(flatten)]
    args: hostpath_driver::DriverArgs,
}

/// A running stack; [`Stack::shutdown`] stops it (dropping it stops it too, without waiting:
/// the stop signal resolves once its sender is gone).
pub struct Stack {
    /// The API server.
    pub server: apiserver::RunningServer,
    /// A client of it (no client-side throttling).
    pub client: kube::Client,
    /// The kubeconfig clients use.
    pub kubeconfig: PathBuf,
    /// The driver's socket path.
    pub socket: String,
    /// The driver's name.
    pub driver_name: String,
    /// The sockets of the extra nodes (in the order of `StackOptions::extra_nodes`).
    pub node_sockets: Vec<String>,
    /// Where its state lives.
    pub dir: PathBuf,
    stop: watch::Sender<bool>,
    /// The API server stops last, after everything that talks to it.
    server_stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Last field: dropped after everything running on it.
    lanes: Lanes,
}

impl Stack {
    /// Starts the API server, the driver and (if asked) the PV controller, and registers the
    /// node, its CSINode, the CSIDriver and the default class.
    pub async fn start(options: StackOptions) -> anyhow::Result<Stack> {
        let dir = &options.dir;
        let (socket, kubeconfig) = paths(dir);
        let (stop, _) = watch::channel(false);
        let (server_stop, _) = watch::channel(false);
        let lanes = match options.separate_lanes {
            Some(workers) => Lanes::separate(workers)?,
            None => Lanes::shared(),
        };
        let mut tasks = Vec::new();
        // The nodes, and the reference driver's configuration when it is ours to run.
        let (driver_config, nodes): (_, Vec<String>) = match &options.external {
            None => {
                let config = reference_driver_config(&options, &socket)?;
                // The driver's own node first, then the extra ones.
                let nodes = config.nodes.iter().map(|n| n.id.clone()).collect();
                (Some(config), nodes)
            }
            Some(external) => (None, external.nodes().into_iter().map(|(n, _)| n).collect()),
        };
        let static_tokens = identities::static_tokens(&nodes);
        let mut config = apiserver::Config {
            bind: options.bind,
            data_dir: options.durable.then(|| dir.join("apiserver")),
            kubeconfig_path: Some(kubeconfig.clone()),
            static_tokens: static_tokens.iter().map(|(_, t)| t.clone()).collect(),
            ..Default::default()
        };
        if let Some(changes) = options.watch_history {
            config.history = changes;
        }
        let server_stopped = signal(&server_stop);
        let server = lanes
            .run(Lane::ApiServer, async move {
                apiserver::serve(config, server_stopped)
                    .await
                    .context("start the API server")
            })
            .await?;
        // The protection controllers run with the nodes' side: admission then gives claims
        // and volumes their finalizers at creation, as kube-apiserver does.
        server.set_storage_protection(options.kubelet);
        // Every node's socket (its node service), in the order of `nodes`.
        let (socket, all_node_sockets, driver_name) = match (driver_config, &options.external) {
            (Some(config), _) => {
                let name = config.name.clone();
                let extra =
                    serve_reference_driver(config, &options, &socket, &lanes, &stop, &mut tasks)
                        .await?;
                let all: Vec<String> = std::iter::once(socket.clone()).chain(extra).collect();
                (socket, all, name)
            }
            (None, Some(external)) => (
                external.controller.clone(),
                external.nodes().into_iter().map(|(_, s)| s).collect(),
                external.name.clone(),
            ),
            (None, None) => anyhow::bail!("no CSI driver to run the stack around"),
        };
        let node_sockets: Vec<String> = all_node_sockets.iter().skip(1).cloned().collect();
        let client_options = (kubeconfig.display().to_string(), options.user_agent);
        let client = build_client(&client_options).await?;
        // Every component under its own identity, with the RBAC of deploy/kubernetes.
        let identities = identities::Identities::establish(&server, &client, dir, &static_tokens)
            .await
            .context("give the stack's components their identities")?;
        // The controllers live in this process: their requests go to the API server's handler
        // in process (no TCP, no TLS), each with its own token, counted under the stack's
        // User-Agent and served on its lane. The clients are built on their lane: their
        // queues are theirs.
        let clients =
            controllers::Clients::new(&server, &identities, &nodes, options.user_agent, &lanes)
                .await?;
        let traits = match &options.external {
            // Someone else's driver says what it is.
            Some(external) => external.traits,
            None => crate::stack::DriverTraits {
                storage_capacity: options.storage_capacity,
                attach_required: options.attach,
                ..Default::default()
            },
        };
        crate::stack::register_driver(&client, &driver_name, traits, &options.class_parameters)
            .await
            .context("register the driver")?;
        for (node_socket, node) in all_node_sockets.iter().zip(&nodes) {
            crate::stack::register_node(&client, node_socket, node)
                .await
                .with_context(|| format!("register the node behind {node_socket}"))?;
        }
        // PersistentVolumeSets: a provisioner with --enable-volume-sets keeps them.
        sidecar_kit::custom_resource::install(
            &client,
            [provisioner::volume_sets::crd::definition()],
        )
        .await
        .context("install the persistentvolumesets.storage.volstack.dev definition")?;
        if options.snapshots && traits.snapshots {
            stack::snapshots::crds::install(&client)
                .await
                .context("install the snapshot.storage.k8s.io definitions")?;
            stack::snapshots::crds::install_default_class(
                &client,
                "csi-hostpath-snapclass",
                &driver_name,
            )
            .await
            .context("create the default VolumeSnapshotClass")?;
        }
        // Built on their lane: the watches and connections they start at construction are
        // theirs, not the caller's.
        let parts = controllers::Parts {
            clients,
            options: options.clone(),
            socket: socket.clone(),
            node_sockets: all_node_sockets.clone(),
            driver_name: driver_name.clone(),
            stop: stop.subscribe(),
        };
        tasks.extend(
            lanes
                .run(Lane::Controllers, controllers::start(parts))
                .await?,
        );
        Ok(Stack {
            server,
            client,
            kubeconfig,
            socket,
            driver_name,
            node_sockets,
            dir: dir.clone(),
            stop,
            server_stop,
            tasks,
            lanes,
        })
    }

    /// The flags that point a provisioner at this stack (`--csi-address`, `--kubeconfig` of
    /// the ServiceAccount `kube-system/csi-provisioner`).
    pub fn provisioner_args(&self) -> Vec<String> {
        provisioner_args_for(&self.socket, &self.sidecar_kubeconfig("csi-provisioner"))
    }

    /// The flags that point an attacher at this stack (`--kubeconfig` of the ServiceAccount
    /// `kube-system/csi-attacher`).
    pub fn attacher_args(&self) -> Vec<String> {
        provisioner_args_for(&self.socket, &self.sidecar_kubeconfig("csi-attacher"))
    }

    /// The kubeconfig of a sidecar's ServiceAccount (`csi-provisioner`, `csi-attacher`).
    pub fn sidecar_kubeconfig(&self, sidecar: &str) -> PathBuf {
        identities::kubeconfig_path(&self.dir, sidecar)
    }

    /// Requests answered 403 so far, by (verb, resource, client): a component without a rule
    /// it needs.
    pub fn refusals(&self) -> Vec<(String, String, String, u64)> {
        self.server
            .request_counts()
            .into_iter()
            .filter(|((_, _, code, _), _)| *code == 403)
            .map(|((verb, resource, _, client), n)| (verb, resource, client, n))
            .collect()
    }

    /// Resolves when the stack is asked to stop (for what the caller runs beside it).
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        signal(&self.stop)
    }

    /// Stops everything and waits up to `grace` for it to finish.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown_with(grace, async {}).await;
    }

    /// Stops the controllers and the driver, waits for them and for `also` (what the caller
    /// runs beside the stack, stopped by [`Stack::stopped`]), then stops the API server: nothing
    /// is left talking to a server that is gone. Waits up to `grace` in all.
    pub async fn shutdown_with(self, grace: Duration, also: impl Future<Output = ()>) {
        let Stack {
            server,
            stop,
            server_stop,
            tasks,
            lanes,
            ..
        } = self;
        let _ = stop.send(true);
        let _ = tokio::time::timeout(grace, async {
            also.await;
            for task in tasks {
                let _ = task.await;
            }
            let _ = server_stop.send(true);
            server.join().await;
        })
        .await;
        drop(lanes);
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("server", &self.server)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// The reference driver's configuration from the stack's options.
fn reference_driver_config(
    options: &StackOptions,
    socket: &str,
) -> anyhow::Result<hostpath_driver::DriverConfig> {
    let mut argv = vec![
        "driver".to_string(),
        format!("--endpoint=unix://{socket}"),
        format!("--state-dir={}", options.dir.join("driver").display()),
    ];
    argv.extend(options.driver_args.iter().cloned());
    if options.attach && !argv.iter().any(|a| a == "--enable-attach") {
        argv.push("--enable-attach".to_string());
    }
    argv.extend(
        options
            .extra_nodes
            .iter()
            .map(|n| format!("--extra-node={n}")),
    );
    Ok(DriverCli::try_parse_from(argv)?.args.into_config()?)
}

/// Starts the reference driver on `socket` and a socket per extra node (all services; Node
/// answers as that node, on the same volume table); returns the extra nodes' sockets.
async fn serve_reference_driver(
    config: hostpath_driver::DriverConfig,
    options: &StackOptions,
    socket: &str,
    lanes: &Lanes,
    stop: &watch::Sender<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Vec<String>> {
    let dir = &options.dir;
    let driver = lanes
        .run(Lane::Driver, async move {
            hostpath_driver::Driver::open(config)
                .await
                .context("start the CSI driver")
        })
        .await?;
    let listener = bind_on(lanes, socket).await?;
    let mut node_sockets = Vec::new();
    for node in &options.extra_nodes {
        let view = driver
            .for_node(node)
            .with_context(|| format!("the driver does not know node {node:?}"))?;
        let path = dir.join("nodes").join(format!("{node}.sock"));
        durable_log::files::create_private_dir(&dir.join("nodes"))
            .context("create the node sockets' directory")?;
        let path = path.display().to_string();
        let node_listener = bind_on(lanes, &path).await?;
        let node_stop = signal(stop);
        let name = node.clone();
        tasks.push(lanes.spawn(Lane::Driver, async move {
            if let Err(error) = view.serve_on(node_listener, node_stop).await {
                tracing::error!(%error, node = %name, "the CSI node service stopped");
            }
        }));
        node_sockets.push(path);
    }
    let driver_stop = signal(stop);
    tasks.push(lanes.spawn(Lane::Driver, async move {
        if let Err(error) = driver.serve_on(listener, driver_stop).await {
            tracing::error!(%error, "the CSI driver stopped");
        }
    }));
    Ok(node_sockets)
}

/// The socket and kubeconfig of a stack whose state lives in `dir` (known before it starts).
pub fn paths(dir: &std::path::Path) -> (String, PathBuf) {
    (
        dir.join("csi.sock").display().to_string(),
        dir.join("kubeconfig"),
    )
}

/// The flags that point a sidecar at a stack's socket and kubeconfig, with its Leases (leader
/// election, the provisioner's intent log) in the namespace its Role grants them in (without
/// the flag, a sidecar outside a Pod uses `default`).
pub fn provisioner_args_for(socket: &str, kubeconfig: &std::path::Path) -> Vec<String> {
    vec![
        format!("--csi-address={socket}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--leader-election-namespace={}", identities::NAMESPACE),
    ]
}

/// The stack's client (no client-side throttling) from `(kubeconfig, user agent)`.
async fn build_client(options: &(String, &'static str)) -> anyhow::Result<kube::Client> {
    let (kubeconfig, user_agent) = options;
    Ok(
        sidecar_kit::kubeclient::build_client(
            &sidecar_kit::kubeclient::ClientOptions::unthrottled(kubeconfig, user_agent),
        )
        .await?,
    )
}

/// Binds a driver socket on the driver's lane (its connections are then served there).
async fn bind_on(lanes: &Lanes, path: &str) -> anyhow::Result<tokio::net::UnixListener> {
    let path = path.to_string();
    lanes
        .run(Lane::Driver, async move {
            Ok(hostpath_driver::bind_socket(&path).await?)
        })
        .await
}

/// The one stop signal: resolves once `true` is sent (or the sender is gone).
fn signal(stop: &watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
    signal_on(stop.subscribe())
}

/// [`signal`] from a receiver of the stop channel.
async fn signal_on(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_stack_starts_registers_the_node_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = StackOptions::new(dir.path().to_path_buf(), "stack-test/0.1");
        options.driver_args.push("--publish-mode=symlink".into());
        let stack = Stack::start(options).await.unwrap();
        assert_eq!(stack.driver_name, "hostpath.csi.volstack.dev");
        let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
            kube::Api::all(stack.client.clone());
        let class = classes.get("hostpath").await.unwrap();
        assert_eq!(class.provisioner, "hostpath.csi.volstack.dev");
        let stopped = stack.stopped();
        stack.shutdown(Duration::from_secs(10)).await;
        stopped.await;
    }

    /// With separate lanes, nothing of the controllers runs on the caller's runtime (else the
    /// benchmark counts their work as its own): with the caller's single thread blocked, the
    /// PV controller still binds a claim to a volume made for it.
    #[tokio::test(flavor = "current_thread")]
    async fn separate_lanes_leave_no_controller_work_on_the_callers_runtime() {
        use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
        let dir = tempfile::tempdir().unwrap();
        let mut options = StackOptions::new(dir.path().to_path_buf(), "stack-test/0.1");
        options.separate_lanes = Some(1);
        let stack = Stack::start(options).await.unwrap();
        let kubeconfig = stack.kubeconfig.display().to_string();
        // Blocks this runtime's only thread until the claim is Bound (60 s at most, requests
        // included: a hang fails instead of blocking the test run).
        let phase = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let bound = async {
                    let client = build_client(&(kubeconfig, "lanes-test/0.1"))
                        .await
                        .map_err(|e| e.to_string())?;
                    let pvs: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
                    let claims: kube::Api<PersistentVolumeClaim> =
                        kube::Api::namespaced(client, "default");
                    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": "made"},
                        "spec": {
                            "capacity": {"storage": "1Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": "",
                            "hostPath": {"path": "/tmp/made"},
                        }
                    }))
                    .map_err(|e| e.to_string())?;
                    pvs.create(&Default::default(), &pv)
                        .await
                        .map_err(|e| e.to_string())?;
                    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": "wants"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": "",
                            "volumeName": "made",
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }))
                    .map_err(|e| e.to_string())?;
                    claims
                        .create(&Default::default(), &claim)
                        .await
                        .map_err(|e| e.to_string())?;
                    loop {
                        let phase = claims
                            .get("wants")
                            .await
                            .map_err(|e| e.to_string())?
                            .status
                            .and_then(|s| s.phase);
                        if phase.as_deref() == Some("Bound") {
                            return Ok::<_, String>(phase);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                tokio::time::timeout(Duration::from_secs(60), bound)
                    .await
                    .map_err(|_| "the claim was not Bound within 60 s".to_string())?
            })
        })
        .join()
        .map_err(|_| "the client thread panicked")
        .unwrap()
        .unwrap();
        assert_eq!(phase.as_deref(), Some("Bound"));
        stack.shutdown(Duration::from_secs(10)).await;
    }
}
