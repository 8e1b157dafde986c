//! The node agent: what kubelet's volume manager does for the Pods of one node, on the shared
//! runtime. For a Pod bound to the node it waits for its claims and (when the CSIDriver
//! requires attach) their VolumeAttachments, stages each volume at the global path when the
//! driver stages, publishes it into the Pod's volume directory and marks the Pod Running. For a
//! Pod being deleted it unpublishes, unstages what no other Pod uses, reports the volumes no
//! longer in use (`status.volumesInUse`, which the attach/detach controller waits for) and
//! finishes the deletion. What it set up is recorded on disk before each call (`disk`), so a
//! restart finds it again; a periodic sweep tears down what no Pod wants any more (Pods
//! deleted with no grace). No container runs: the volumes are the real part.

pub mod decide;
pub mod decide_expand;
pub mod decide_inline;
pub mod decide_recycle;
pub mod disk;
mod expand;
mod recycle;
pub mod registration;
mod setup;
mod wake;

#[cfg(test)]
mod decide_tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use parking_lot::Mutex;
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::events::Recorder;
use sidecar_kit::runtime::Controller;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::{ByReference, Feed};
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};
use tonic::transport::Channel;

use decide::Paths;

/// How often what is on disk is checked against what Pods want, and waiting Pods looked at.
const SWEEP: Duration = Duration::from_secs(5);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The node plugin's socket.
    #[error(transparent)]
    Connect(#[from] sidecar_kit::csi::ConnectError),
    /// NodeGetInfo, GetPluginInfo or NodeGetCapabilities.
    #[error(transparent)]
    Call(#[from] CallError),
}

/// Why a sync failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A record on disk.
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    /// A Secret a PV names.
    #[error(transparent)]
    Secret(#[from] sidecar_kit::secrets::SecretError),
    /// NodeStageVolume failed.
    #[error("MountVolume.MountDevice failed for volume {pv:?} : {source}")]
    Stage {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// NodePublishVolume failed.
    #[error("MountVolume.SetUp failed for volume {pv:?} : {source}")]
    Publish {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// NodeUnpublishVolume failed.
    #[error("UnmountVolume.TearDown failed for volume {pv:?} : {source}")]
    Unpublish {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// NodeExpandVolume failed.
    #[error("MountVolume.NodeExpandVolume failed for volume {pv:?} : {source}")]
    Expand {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// NodeUnstageVolume failed.
    #[error("UnmountDevice failed for volume {pv:?} : {source}")]
    Unstage {
        /// The PV.
        pv: String,
        /// The call's error.
        source: CallError,
    },
    /// An API write (Pod status, Pod deletion, Node status).
    #[error("failed to {action}: {source}")]
    Api {
        /// What was being written (as the message says it).
        action: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// Recycling a volume.
    #[error("failed to recycle volume {pv:?}: {source}")]
    Recycle {
        /// The PV.
        pv: String,
        /// The recycling step that failed.
        source: recycle::RecycleError,
    },
}

/// What the agent's queue holds: a Pod, or the sweep of what is on disk.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeKey {
    /// A Pod of this node.
    Pod(ObjectRef<Pod>),
    /// The sweep.
    Sweep,
    /// A volume that may need recycling.
    Recycle(String),
}

impl std::fmt::Display for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeKey::Pod(key) => write!(f, "{key}"),
            NodeKey::Sweep => f.write_str("sweep"),
            NodeKey::Recycle(pv) => write!(f, "recycle {pv}"),
        }
    }
}

/// Since when a Pod waits for its volumes, and the last reason reported.
type Waiting = (tokio::time::Instant, Option<String>);

/// Where the agent runs.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The node plugin's socket.
    pub socket: String,
    /// Root of kubelet's directories for all nodes (`<data-dir>/kubelet`); this node's are
    /// under `<root>/<node>`.
    pub root: PathBuf,
    /// How soon what no event brings back is looked at again.
    pub rechecks: Rechecks,
}

/// How soon the agent looks again at what no event brings back (tests lengthen both to see
/// that the events do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rechecks {
    /// A Pod waiting for its volumes, after each look.
    pub waiting: Duration,
    /// What is on disk against what Pods want, and every waiting Pod.
    pub sweep: Duration,
}

impl Default for Rechecks {
    fn default() -> Self {
        Rechecks {
            waiting: WAIT_RETRY,
            sweep: SWEEP,
        }
    }
}

/// The running agent of one node.
pub struct NodeAgent {
    client: kube::Client,
    channel: Channel,
    calls: Caller,
    /// The node (the driver's node id).
    pub node: String,
    driver: String,
    stage_unstage: bool,
    /// Whether the node service has NodeExpandVolume (EXPAND_VOLUME).
    expands: bool,
    paths: Paths,
    rechecks: Rechecks,
    recorder: Recorder,
    watches: Watches,
    queue: WorkQueue<NodeKey>,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    drivers: Store<CSIDriver>,
    attachments: Store<VolumeAttachment>,
    nodes: Store<Node>,
    /// Since when each waiting Pod waits, and the last reason reported.
    waiting: Mutex<HashMap<ObjectRef<Pod>, Waiting>>,
    /// The `volumesInUse` last written.
    in_use: Mutex<Option<Vec<String>>>,
}

impl std::fmt::Debug for NodeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAgent")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NodeAgent {
    /// Learns the node and the driver from the node plugin, then starts the watches.
    pub async fn start(
        client: kube::Client,
        settings: NodeSettings,
    ) -> Result<Arc<Self>, StartError> {
        let channel = sidecar_kit::csi::connect_with_retry(
            &settings.socket,
            Duration::from_millis(100),
            Some(Duration::from_secs(30)),
        )
        .await?;
        let calls = Caller::new("", Duration::from_secs(60), None);
        let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
        let info = calls
            .call(
                "/csi.v1.Identity/GetPluginInfo",
                identity.get_plugin_info(calls.request(csi::GetPluginInfoRequest {})),
            )
            .await?;
        let mut node_client = csi::node_client::NodeClient::new(channel.clone());
        let node = calls
            .call(
                "/csi.v1.Node/NodeGetInfo",
                node_client.node_get_info(calls.request(csi::NodeGetInfoRequest {})),
            )
            .await?
            .node_id;
        let caps = calls
            .call(
                "/csi.v1.Node/NodeGetCapabilities",
                node_client
                    .node_get_capabilities(calls.request(csi::NodeGetCapabilitiesRequest {})),
            )
            .await?;
        let has = |rpc: csi::node_service_capability::rpc::Type| {
            caps.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(r))
                    if r.r#type == rpc as i32)
            })
        };
        let stage_unstage = has(csi::node_service_capability::rpc::Type::StageUnstageVolume);
        let expands = has(csi::node_service_capability::rpc::Type::ExpandVolume);
        let watches = Watches::default();
        let queue: WorkQueue<NodeKey> = WorkQueue::new(Backoff {
            start: Duration::from_millis(200),
            max: Duration::from_secs(30),
        });
        let on_node = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (q, by_claim, feed) = (
            queue.clone(),
            Arc::new(ByReference::pods_by_claim()),
            Feed::default(),
        );
        let index = by_claim.clone();
        let pods = watches.reflect_with(
            Api::<Pod>::all(client.clone()),
            on_node,
            |_: &mut Pod| {},
            move |e| {
                feed.event(e, &*index);
                // A Pod deleted, or perhaps deleted while the watch was away (a re-list ended):
                // its volumes are torn down by the sweep.
                if matches!(e, watcher::Event::Delete(_) | watcher::Event::InitDone) {
                    q.add(NodeKey::Sweep);
                }
                each(e, |pod| q.add(NodeKey::Pod(ObjectRef::from_obj(pod))));
            },
        );
        // A claim's event brings back the waiting Pods naming it; when its expansion awaits
        // the node, the running ones too.
        let waker = wake::Waker {
            pods: pods.clone(),
            by_claim,
            queue: queue.clone(),
        };
        let on_claim = waker.clone();
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |e: &watcher::Event<PersistentVolumeClaim>| on_claim.on_claim(e),
        );
        let (q, claim_cache, on_volume) = (queue.clone(), claims.clone(), waker.clone());
        let volumes = watches.reflect(
            Api::<PersistentVolume>::all(client.clone()),
            move |e: &watcher::Event<PersistentVolume>| {
                // A PV grown for a claim awaiting the node brings back the running Pods using
                // it too (the claim's event may have come before the PV's).
                on_volume.on_volume(e, |ns, name| {
                    claim_cache
                        .get(&ObjectRef::new(name).within(ns))
                        .is_some_and(|c| crate::resizer::decide::awaits_node(&c))
                });
                each(e, |pv| {
                    if decide_recycle::may_recycle(pv)
                        && let Some(name) = &pv.metadata.name
                    {
                        q.add(NodeKey::Recycle(name.clone()));
                    }
                });
            },
        );
        // A driver's change may concern any waiting Pod.
        let on_driver = waker.clone();
        let drivers = watches.reflect(
            Api::<CSIDriver>::all(client.clone()),
            move |_: &watcher::Event<CSIDriver>| on_driver.waiting(),
        );
        // VolumeAttachments have no field selector on their node: all are watched, and only
        // this node's wake the waiting Pods.
        let this = node.clone();
        let attachments = watches.reflect(
            Api::<VolumeAttachment>::all(client.clone()),
            move |e: &watcher::Event<VolumeAttachment>| {
                let mut mine = false;
                each(e, |va| mine |= va.spec.node_name == this);
                if mine {
                    waker.waiting();
                }
            },
        );
        let this_node = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let nodes = watches.reflect_with(
            Api::<Node>::all(client.clone()),
            this_node,
            |_: &mut Node| {},
            |_| {},
        );
        let recorder = Recorder::on_host(client.clone(), "kubelet", node.clone());
        let paths = Paths {
            root: settings.root.join(&node),
        };
        tracing::info!(%node, driver = %info.name, stage_unstage, expands, root = %paths.root.display(), "node agent started");
        Ok(Arc::new(NodeAgent {
            client,
            channel,
            calls,
            node,
            driver: info.name,
            stage_unstage,
            expands,
            paths,
            rechecks: settings.rechecks,
            recorder,
            watches,
            queue,
            pods,
            claims,
            volumes,
            drivers,
            attachments,
            nodes,
            waiting: Mutex::new(HashMap::new()),
            in_use: Mutex::new(None),
        }))
    }

    /// The agent on the shared runtime (one worker: stage and unstage of a volume never race).
    pub fn controller(self: &Arc<Self>) -> Controller {
        let (sync, sweep) = (self.clone(), self.clone());
        Controller::new("kubelet-volume-manager")
            .watches(&self.watches)
            .wait_for(&self.pods)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.drivers)
            .wait_for(&self.attachments)
            .wait_for(&self.nodes)
            .start_with({
                let queue = self.queue.clone();
                async move {
                    queue.add(NodeKey::Sweep);
                    true
                }
            })
            .reconcile("volume-manager", self.queue.clone(), 1, move |key| {
                let this = sync.clone();
                async move {
                    match key {
                        NodeKey::Pod(pod) => this.sync_pod(&pod).await,
                        NodeKey::Sweep => this.sweep().await,
                        NodeKey::Recycle(pv) => this
                            .sync_recycle(&pv)
                            .await
                            .map_err(|source| NodeError::Recycle { pv, source }),
                    }
                }
            })
            .every(self.rechecks.sweep, move || {
                sweep.queue.add(NodeKey::Sweep);
                for pod in sweep.pods.state() {
                    if !decide::running(&pod) {
                        sweep
                            .queue
                            .add(NodeKey::Pod(ObjectRef::from_obj(pod.as_ref())));
                    }
                }
            })
    }

    fn node_client(&self) -> csi::node_client::NodeClient<Channel> {
        csi::node_client::NodeClient::new(self.channel.clone())
    }

    async fn secrets(
        &self,
        secret: Option<&decide::SecretRef>,
    ) -> Result<HashMap<String, String>, NodeError> {
        Ok(sidecar_kit::secrets::fetch_ref(&self.client, secret).await?)
    }

    /// The world a Pod's plan reads, from the caches.
    fn plan(&self, pod: &Pod) -> decide::PodPlan {
        // Only what this Pod names, from the caches by key (not a map of every object: the
        // sweep plans every Pod of the node).
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut claims = Vec::new();
        let mut volumes = Vec::new();
        let mut drivers = Vec::new();
        let mut attachments = Vec::new();
        for name in sidecar_kit::vocabulary::pod_claim_names(pod) {
            let Some(claim) = self.claims.get(&ObjectRef::new(&name).within(&namespace)) else {
                continue;
            };
            let pv_name = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
            claims.push(claim);
            let Some(pv) = pv_name.and_then(|n| self.volumes.get(&ObjectRef::new(&n))) else {
                continue;
            };
            let spec = sidecar_kit::migration::csi_spec(&pv);
            if let Some(csi) = spec.as_ref().and_then(|s| s.csi.as_ref()) {
                drivers.extend(self.drivers.get(&ObjectRef::new(&csi.driver)));
                let attachment = sidecar_kit::pv_csi::attachment_name(
                    &csi.volume_handle,
                    &csi.driver,
                    &self.node,
                );
                attachments.extend(self.attachments.get(&ObjectRef::new(&attachment)));
            }
            volumes.push(pv);
        }
        // Inline volumes name their driver themselves.
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            if let Some(inline) = &volume.csi {
                drivers.extend(self.drivers.get(&ObjectRef::new(&inline.driver)));
            }
        }
        use crate::scheduler::decide::{by_name, by_namespaced_name};
        let claims = by_namespaced_name(claims.iter().map(AsRef::as_ref));
        let volumes = by_name(volumes.iter().map(AsRef::as_ref));
        let drivers = by_name(drivers.iter().map(AsRef::as_ref));
        let attachments = by_name(attachments.iter().map(AsRef::as_ref));
        decide::plan_pod(
            pod,
            decide::World {
                node: &self.node,
                driver: &self.driver,
                claims: &claims,
                volumes: &volumes,
                drivers: &drivers,
                attachments: &attachments,
            },
        )
    }
}

/// Whether the node service behind `socket` has NodeExpandVolume (EXPAND_VOLUME).
pub async fn node_expands(socket: &str, timeout: Duration) -> Result<bool, StartError> {
    let channel = sidecar_kit::csi::connect_with_retry(
        socket,
        Duration::from_millis(100),
        Some(Duration::from_secs(30)),
    )
    .await?;
    let calls = Caller::new("", timeout, None);
    let mut node = csi::node_client::NodeClient::new(channel);
    let caps = calls
        .call(
            "/csi.v1.Node/NodeGetCapabilities",
            node.node_get_capabilities(calls.request(csi::NodeGetCapabilitiesRequest {})),
        )
        .await?;
    let expand = csi::node_service_capability::rpc::Type::ExpandVolume as i32;
    Ok(caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(r)) if r.r#type == expand)
    }))
}

/// Waiting Pods are looked at again this soon (a watch event usually comes first).
const WAIT_RETRY: Duration = Duration::from_secs(1);

impl NodeAgent {
    async fn sync_pod(&self, key: &ObjectRef<Pod>) -> Result<Next, NodeError> {
        let Some(pod) = self.pods.get(key) else {
            self.waiting.lock().remove(key);
            self.queue.add(NodeKey::Sweep);
            return Ok(Next::Done);
        };
        match self.plan(&pod) {
            decide::PodPlan::Skip => Ok(Next::Done),
            decide::PodPlan::Wait(reason) => {
                self.report_wait(&pod, key, reason).await;
                Ok(Next::After(self.rechecks.waiting))
            }
            decide::PodPlan::SetUp(volumes) => {
                self.waiting.lock().remove(key);
                self.set_up_pod(&pod, &volumes).await?;
                Ok(Next::Done)
            }
            decide::PodPlan::TearDown { finish_deletion } => {
                self.waiting.lock().remove(key);
                self.tear_down_pod(&pod, finish_deletion).await?;
                Ok(Next::Done)
            }
        }
    }

    async fn report_wait(&self, pod: &Pod, key: &ObjectRef<Pod>, reason: String) {
        let message = {
            let mut waiting = self.waiting.lock();
            let entry = waiting
                .entry(key.clone())
                .or_insert((tokio::time::Instant::now(), None));
            let message = decide::wait_report(entry.0.elapsed(), entry.1.as_deref(), &reason);
            if message.is_some() {
                entry.1 = Some(reason.clone());
            }
            message
        };
        tracing::debug!(pod = %key, %reason, "waiting for volumes");
        if let Some(message) = message {
            self.recorder.record(
                &sidecar_kit::vocabulary::reference(pod),
                sidecar_kit::events::EventType::Warning,
                "FailedMount",
                &message,
            );
        }
    }
}
