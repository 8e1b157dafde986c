//! The attach/detach controller on the shared runtime: per node, it carries out
//! [`crate::decide::attach_detach`] (creating and deleting VolumeAttachments) and tells the
//! Pods why an attach fails (`FailedAttachVolume`, from the attachment's `attachError`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSIDriver, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};

use crate::decide::attach_detach::{World, actions, attach_failures, wanted};
use crate::decide::protection::claims_of;
use crate::decide::reasons::Reason;

/// How often every node is looked at again whatever the events said.
const RESYNC: Duration = Duration::from_secs(10);

/// A failed write (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum AttachDetachError {
    /// Creating a VolumeAttachment failed.
    #[error("failed to create VolumeAttachment {name} for {volume} on {node}: {source}")]
    Create {
        /// Its name.
        name: String,
        /// The PV.
        volume: String,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Deleting one failed.
    #[error("failed to delete VolumeAttachment {name}: {source}")]
    Delete {
        /// Its name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The running controller.
pub struct AttachDetachController {
    client: kube::Client,
    recorder: Recorder,
    watches: Watches,
    queue: WorkQueue<String>,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    drivers: Store<CSIDriver>,
    nodes: Store<Node>,
    attachments: Store<VolumeAttachment>,
}

impl std::fmt::Debug for AttachDetachController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachDetachController")
            .finish_non_exhaustive()
    }
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

/// A watch handler that looks at every node with Pods again.
fn every_node<K>(
    pods: Store<Pod>,
    queue: WorkQueue<String>,
) -> impl Fn(&kube::runtime::watcher::Event<K>) + Send + 'static {
    move |_| {
        for pod in pods.state() {
            if let Some(node) = node_of(&pod) {
                queue.add(node);
            }
        }
    }
}

impl AttachDetachController {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process).
    pub fn new(client: kube::Client, watches: Watches) -> Arc<Self> {
        let queue: WorkQueue<String> = WorkQueue::new(Backoff {
            start: Duration::from_millis(100),
            max: Duration::from_secs(30),
        });
        let q = queue.clone();
        let pods = watches.reflect(Api::<Pod>::all(client.clone()), move |e| {
            each(e, |pod| {
                if let Some(node) = node_of(pod) {
                    q.add(node);
                }
            });
        });
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            every_node(pods.clone(), queue.clone()),
        );
        let volumes = watches.reflect(
            Api::<PersistentVolume>::all(client.clone()),
            every_node(pods.clone(), queue.clone()),
        );
        let drivers = watches.reflect(
            Api::<CSIDriver>::all(client.clone()),
            every_node(pods.clone(), queue.clone()),
        );
        let q = queue.clone();
        let nodes = watches.reflect(Api::<Node>::all(client.clone()), move |e| {
            each(e, |n| q.add(n.metadata.name.clone().unwrap_or_default()));
        });
        let q = queue.clone();
        let attachments = watches.reflect(Api::<VolumeAttachment>::all(client.clone()), move |e| {
            each(e, |va| q.add(va.spec.node_name.clone()));
        });
        let recorder = Recorder::new(client.clone(), "attachdetach-controller");
        Arc::new(AttachDetachController {
            client,
            recorder,
            watches,
            queue,
            pods,
            claims,
            volumes,
            drivers,
            nodes,
            attachments,
        })
    }

    /// The controller on the shared runtime.
    pub fn controller(self: &Arc<Self>) -> Controller {
        let (sync, resync) = (self.clone(), self.clone());
        Controller::new("attachdetach-controller")
            .watches(&self.watches)
            .wait_for(&self.pods)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.drivers)
            .wait_for(&self.nodes)
            .wait_for(&self.attachments)
            .reconcile("node", self.queue.clone(), 2, move |node| {
                let this = sync.clone();
                async move { this.sync_node(&node).await }
            })
            .every(RESYNC, move || {
                for node in resync.nodes.state() {
                    resync
                        .queue
                        .add(node.metadata.name.clone().unwrap_or_default());
                }
            })
    }

    async fn sync_node(&self, node: &str) -> Result<Next, AttachDetachError> {
        // Only what this node's Pods and attachments name, looked up by key (a pass per node
        // event must not cost a map of every claim and volume in the cluster).
        let pods = self.pods.state();
        let on_node: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| node_of(p).as_deref() == Some(node))
            .collect();
        let attachments = self.attachments.state();
        let here: Vec<&VolumeAttachment> = attachments
            .iter()
            .map(AsRef::as_ref)
            .filter(|va| va.spec.node_name == node)
            .collect();
        let mut claim_objects = Vec::new();
        for pod in &on_node {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            for name in claims_of(pod) {
                claim_objects.extend(self.claims.get(&ObjectRef::new(&name).within(ns)));
            }
        }
        let volume_names = claim_objects
            .iter()
            .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
            .chain(
                here.iter()
                    .filter_map(|va| va.spec.source.persistent_volume_name.clone()),
            );
        let volume_objects: Vec<_> = volume_names
            .filter_map(|n| self.volumes.get(&ObjectRef::new(&n)))
            .collect();
        let driver_objects: Vec<_> = volume_objects
            .iter()
            .filter_map(|v| v.spec.as_ref()?.csi.as_ref())
            .filter_map(|c| self.drivers.get(&ObjectRef::new(&c.driver)))
            .collect();
        let node_object = self.nodes.get(&ObjectRef::new(node));
        let claims: HashMap<(&str, &str), &PersistentVolumeClaim> = claim_objects
            .iter()
            .map(|c| {
                let meta = &c.metadata;
                let key = (
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default(),
                );
                (key, c.as_ref())
            })
            .collect();
        let volumes: HashMap<&str, &PersistentVolume> = volume_objects
            .iter()
            .map(|v| (v.metadata.name.as_deref().unwrap_or_default(), v.as_ref()))
            .collect();
        let drivers: HashMap<&str, &CSIDriver> = driver_objects
            .iter()
            .map(|d| (d.metadata.name.as_deref().unwrap_or_default(), d.as_ref()))
            .collect();
        let nodes: HashMap<&str, &Node> = node_object.iter().map(|n| (node, n.as_ref())).collect();
        let world = World {
            claims: &claims,
            volumes: &volumes,
            drivers: &drivers,
            nodes: &nodes,
        };
        let want = wanted(on_node.iter().copied(), world);
        let todo = actions(&want, here.iter().copied(), world);
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        for w in todo.create {
            let va = VolumeAttachment {
                metadata: ObjectMeta {
                    name: Some(w.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: VolumeAttachmentSpec {
                    attacher: w.driver.clone(),
                    node_name: w.node.clone(),
                    source: VolumeAttachmentSource {
                        persistent_volume_name: Some(w.volume.clone()),
                        ..VolumeAttachmentSource::default()
                    },
                },
                status: None,
            };
            match api.create(&PostParams::default(), &va).await {
                Ok(_) => {
                    tracing::info!(attachment = %w.name, volume = %w.volume, node = %w.node, "VolumeAttachment created")
                }
                Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
                Err(source) => {
                    return Err(AttachDetachError::Create {
                        name: w.name,
                        volume: w.volume,
                        node: w.node,
                        source,
                    });
                }
            }
        }
        for name in todo.delete {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(attachment = %name, node, "VolumeAttachment deleted: no Pod on the node uses the volume")
                }
                Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {}
                Err(source) => return Err(AttachDetachError::Delete { name, source }),
            }
        }
        // Pods whose volume fails to attach hear why.
        for (pod, message) in attach_failures(here.iter().copied(), &on_node, &claims) {
            self.recorder.record(
                &reference(pod),
                EventType::Warning,
                Reason::FailedAttachVolume.as_str(),
                &message,
            );
        }
        Ok(Next::Done)
    }
}
