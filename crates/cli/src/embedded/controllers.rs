//! The stack's in-process controllers: the attacher, the nodes' side (protection, attach/detach,
//! a node agent per node), the scheduler, the PV controller, the snapshot controller and the
//! resizer.
//! [`start`] runs on the controllers' lane, so what they start while being built (watches,
//! reflectors, the driver connection) runs there too and counts as theirs.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sidecar_kit::watch::{SharedWatches, Watches};
use sidecar_kit::workqueue::Backoff;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::identities::{self, Component, Identities};
use super::lanes::{Lane, Lanes};
use super::{StackOptions, provisioner_args_for, signal_on};

/// A client of each in-process controller, under its own identity.
pub(super) struct Clients {
    pv_controller: kube::Client,
    controller_manager: kube::Client,
    scheduler: kube::Client,
    snapshots: kube::Client,
    resizer: kube::Client,
    /// The node agents', in the order of the nodes (the driver's own first).
    nodes: Vec<kube::Client>,
}

impl Clients {
    /// Builds the clients on the controllers' lane (their queues are theirs) for the
    /// components' identities; `nodes` are the stack's nodes, the driver's own first.
    pub(super) async fn new(
        server: &apiserver::RunningServer,
        identities: &Identities,
        nodes: &[String],
        user_agent: &str,
        lanes: &Lanes,
    ) -> anyhow::Result<Clients> {
        let service = |component: &Component| -> anyhow::Result<apiserver::local::LocalService> {
            server
                .local_service_with(user_agent, identities.token(component)?)
                .with_context(|| format!("the in-process client of {component:?}"))
        };
        let services = (
            service(&Component::PvController)?,
            service(&Component::ControllerManager)?,
            service(&Component::Scheduler)?,
            service(&Component::SnapshotController)?,
            service(&Component::Resizer)?,
            nodes
                .iter()
                .map(|n| service(&Component::Node(n.clone())))
                .collect::<anyhow::Result<Vec<_>>>()?,
        );
        lanes
            .run(Lane::Controllers, async move {
                let (pv, manager, scheduler, snapshots, resizer, nodes) = services;
                let client = |s| kube::Client::new(s, identities::NAMESPACE);
                Ok(Clients {
                    pv_controller: client(pv),
                    controller_manager: client(manager),
                    scheduler: client(scheduler),
                    snapshots: client(snapshots),
                    resizer: client(resizer),
                    nodes: nodes.into_iter().map(client).collect(),
                })
            })
            .await
    }
}

/// What the controllers need from the stack (its socket and kubeconfig follow from
/// `options.dir`, [`paths`]).
pub(super) struct Parts {
    /// Their clients, built on their lane.
    pub clients: Clients,
    pub options: StackOptions,
    /// The driver's controller socket.
    pub socket: String,
    /// Every node's socket (its node service), in the order of the nodes.
    pub node_sockets: Vec<String>,
    pub driver_name: String,
    /// The stack's stop signal.
    pub stop: watch::Receiver<bool>,
}

impl Parts {
    /// Resolves once the stack is asked to stop (or its sender is gone).
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        signal_on(self.stop.clone())
    }
}

/// Builds and spawns the controllers `parts.options` asks for, on the current runtime; returns
/// their tasks.
pub(super) async fn start(parts: Parts) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let options = &parts.options;
    let clients = &parts.clients;
    let socket = parts.socket.clone();
    let mut tasks = Vec::new();
    if options.attach {
        let kubeconfig = identities::kubeconfig_path(&options.dir, "csi-attacher");
        let argv = [
            vec!["csi-attacher".to_string()],
            provisioner_args_for(&socket, &kubeconfig),
            vec!["--kube-api-qps=0".to_string()],
        ]
        .concat();
        let args = attacher::flags::AttacherArgs::try_parse_from(argv)
            .context("the embedded attacher's flags")?;
        let stopped = parts.stopped();
        tasks.push(tokio::spawn(async move {
            if let Err(error) = attacher::runner::run(args, stopped).await {
                tracing::error!(%error, "the attacher stopped");
            }
        }));
    }
    // What is awaited comes first (the node agents' registration, the driver's answers), so
    // the shared watches below start as soon as their controllers are built.
    if options.kubelet {
        for (node_socket, client) in parts.node_sockets.iter().zip(&clients.nodes) {
            let agent = stack::node::NodeAgent::start(
                client.clone(),
                stack::node::NodeSettings {
                    socket: node_socket.clone(),
                    root: options.dir.join("kubelet"),
                    rechecks: options.node_rechecks,
                },
            )
            .await
            .with_context(|| format!("start the node agent behind {node_socket}"))?;
            tasks.push(tokio::spawn(agent.controller().run(parts.stopped())));
        }
    }
    let snapshots = match options.snapshots {
        true => Some(
            sidecar_kit::csi::connect(&socket)
                .await
                .context("connect the snapshot controller to the driver")?,
        ),
        false => None,
    };
    let resizer_driver = match options.resizer {
        true => resizer_driver(&parts).await?,
        false => None,
    };
    // The controllers of the control plane share a watch per kind (as kube-controller-manager's
    // share informers), started once they all asked: at 100,000 claims each claim event is
    // decoded once instead of once per controller. A shared watch stops with the last of its
    // controllers. The node agents keep their own (a node's identity sees what its node may
    // see).
    let shared = SharedWatches::default();
    if options.kubelet {
        let manager = &clients.controller_manager;
        let protection = pv_controller::protection::ProtectionController::new(
            manager.clone(),
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(protection.controller().run(parts.stopped())));
        let ephemeral = pv_controller::ephemeral::EphemeralController::new(
            manager.clone(),
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(ephemeral.controller().run(parts.stopped())));
        let attach_detach = pv_controller::attach_detach::AttachDetachController::new(
            manager.clone(),
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(
            attach_detach.controller().run(parts.stopped()),
        ));
    }
    if options.scheduler {
        let scheduler =
            stack::scheduler::Scheduler::new(clients.scheduler.clone(), Watches::sharing(&shared));
        tasks.push(tokio::spawn(scheduler.controller().run(parts.stopped())));
    }
    if let Some((workers, backoff)) = options.pv_controller {
        // With the nodes' side, the node agents recycle CSI volumes.
        let controller = pv_controller::controller::PvController::new(
            clients.pv_controller.clone(),
            backoff,
            options.kubelet,
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(controller.run_with(
            workers,
            options.orphan_resync,
            parts.stopped(),
        )));
    }
    if let Some(channel) = snapshots {
        let controller = stack::snapshots::SnapshotController::new(
            clients.snapshots.clone(),
            channel,
            stack::snapshots::SnapshotSettings {
                driver: parts.driver_name.clone(),
                timeout: Duration::from_secs(60),
                backoff: options.snapshot_backoff,
                workers: 4,
            },
            None,
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(controller.controller().run(parts.stopped())));
    }
    if let Some((channel, settings)) = resizer_driver {
        let resizer = stack::resizer::Resizer::new(
            parts.clients.resizer.clone(),
            channel,
            settings,
            Watches::sharing(&shared),
        );
        tasks.push(tokio::spawn(resizer.controller().run(parts.stopped())));
    }
    shared.start();
    Ok(tasks)
}

/// The resizer's connection to the driver and its settings, when the driver can grow volumes
/// (ControllerExpandVolume, or only NodeExpandVolume on its first node) or modify them; None,
/// as external-resizer stays idle, when it can do neither.
async fn resizer_driver(
    parts: &Parts,
) -> anyhow::Result<Option<(tonic::transport::Channel, stack::resizer::ResizerSettings)>> {
    use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
    let timeout = Duration::from_secs(60);
    let (channel, info) = sidecar_kit::driver::identify(&parts.socket, timeout, None)
        .await
        .context("identify the driver for the resizer")?;
    let expands = info.has(Rpc::ExpandVolume);
    let modifies = info.has(Rpc::ModifyVolume);
    let node_expands = match parts.node_sockets.first() {
        Some(node) => stack::node::node_expands(node, timeout)
            .await
            .context("ask the node service whether it expands volumes")?,
        None => false,
    };
    if !(expands || node_expands || modifies) {
        tracing::info!(driver = %parts.driver_name, "the driver neither expands nor modifies volumes: no resizer");
        return Ok(None);
    }
    Ok(Some((
        channel,
        stack::resizer::ResizerSettings {
            driver: parts.driver_name.clone(),
            expands,
            node_expands,
            modifies,
            timeout,
            backoff: Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
            workers: 10,
        },
    )))
}
