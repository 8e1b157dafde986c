//! A scheduler for the embedded stack: what kube-scheduler does for Pods whose claims need
//! volumes, on the shared runtime. For a Pod not assigned yet it picks a node where the Pod's
//! late-binding claims fit (class `allowedTopologies`, CSIStorageCapacity of the node's segment
//! when the driver asks for capacity checks, the driver's volume limit in CSINode), puts the
//! node on those claims (`volume.kubernetes.io/selected-node`), waits for the provisioner and
//! the PV controller to bind them, and binds the Pod (`pods/binding`). When the provisioner
//! gives a claim back (it removes the annotation after RESOURCE_EXHAUSTED), the Pod is placed
//! again. A Pod that fits nowhere gets a `FailedScheduling` event saying why, and is looked at
//! again when claims, capacity or nodes change. Containers never run: Pods stay objects.

pub mod decide;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, CSIStorageCapacity, StorageClass};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use parking_lot::Mutex;
use serde_json::json;
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};

use decide::{ANN_SELECTED_NODE, Plan, World};

/// How often a Pod that cannot be placed, or waits for its claims, is looked at again even
/// without a change.
const RETRY: Duration = Duration::from_secs(10);

/// Why a step failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Setting the selected node on a claim failed.
    #[error("failed to select node {node:?} for claim {claim:?}: {source}")]
    SelectNode {
        /// The claim.
        claim: String,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Pre-binding a static volume to a claim failed.
    #[error("failed to pre-bind volume {volume:?} to claim {claim:?}: {source}")]
    PreBind {
        /// The claim.
        claim: String,
        /// The volume.
        volume: String,
        /// The API error.
        source: kube::Error,
    },
    /// Binding the Pod failed.
    #[error("failed to bind pod {pod:?} to node {node:?}: {source}")]
    Bind {
        /// The Pod.
        pod: String,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

type PodKey = ObjectRef<Pod>;

/// The running scheduler.
pub struct Scheduler {
    client: kube::Client,
    recorder: Recorder,
    watches: Watches,
    queue: WorkQueue<PodKey>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    capacities: Store<CSIStorageCapacity>,
    drivers: Store<CSIDriver>,
    csinodes: Store<CSINode>,
    /// The last FailedScheduling message per Pod (one event per new reason, not per pass).
    reported: Mutex<HashMap<PodKey, String>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}

/// A watch handler that looks at every unassigned Pod again.
fn wake<K>(
    pods: Store<Pod>,
    queue: WorkQueue<PodKey>,
) -> impl Fn(&kube::runtime::watcher::Event<K>) + Send + 'static {
    move |_| {
        for pod in pods.state() {
            if unassigned(&pod) && pod.metadata.deletion_timestamp.is_none() {
                queue.add_now(ObjectRef::from_obj(pod.as_ref()));
            }
        }
    }
}

fn unassigned(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(str::is_empty)
}

impl Scheduler {
    /// Pre-binds a static volume to a claim, as kube-scheduler's volume binding does (the
    /// claimRef and `pv.kubernetes.io/bound-by-controller`); the PV controller completes the
    /// binding. False when the volume changed meanwhile (the Pod is looked at again after
    /// its backoff: volume events do not wake the scheduler's Pods).
    async fn pre_bind(
        &self,
        namespace: &str,
        claim: &str,
        volume: &str,
    ) -> Result<bool, ScheduleError> {
        let (Some(pvc), Some(pv)) = (
            self.claims.get(&ObjectRef::new(claim).within(namespace)),
            self.volumes.get(&ObjectRef::new(volume)),
        ) else {
            return Ok(false);
        };
        let Some(bound) = decide::pre_bound(&pv, &pvc) else {
            return Ok(true);
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api
            .replace(volume, &kube::api::PostParams::default(), &bound)
            .await
        {
            Ok(_) => {
                tracing::info!(claim, volume, "static volume pre-bound to the claim");
                Ok(true)
            }
            Err(error) if sidecar_kit::api_errors::is_conflict(&error) => Ok(false),
            Err(source) => Err(ScheduleError::PreBind {
                claim: claim.to_string(),
                volume: volume.to_string(),
                source,
            }),
        }
    }

    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process).
    pub fn new(client: kube::Client, watches: Watches) -> Arc<Self> {
        let queue: WorkQueue<PodKey> = WorkQueue::new(Backoff {
            start: Duration::from_millis(100),
            max: Duration::from_secs(10),
        });
        let q = queue.clone();
        let pods = watches.reflect(Api::<Pod>::all(client.clone()), move |event| {
            each(event, |pod| {
                if unassigned(pod) {
                    q.add(ObjectRef::from_obj(pod));
                }
            });
        });
        // Any change that may let a waiting Pod move: every unassigned Pod is looked at again
        // (Pods waiting for volumes are few).
        let nodes = watches.reflect(
            Api::<Node>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let volumes = watches.reflect(Api::<PersistentVolume>::all(client.clone()), |_| {});
        let classes = watches.reflect(
            Api::<StorageClass>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let capacities = watches.reflect(
            Api::<CSIStorageCapacity>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let drivers = watches.reflect(
            Api::<CSIDriver>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let csinodes = watches.reflect(
            Api::<CSINode>::all(client.clone()),
            wake(pods.clone(), queue.clone()),
        );
        let recorder = Recorder::new(client.clone(), "default-scheduler");
        Arc::new(Scheduler {
            client,
            recorder,
            watches,
            queue,
            pods,
            nodes,
            claims,
            volumes,
            classes,
            capacities,
            drivers,
            csinodes,
            reported: Mutex::new(HashMap::new()),
        })
    }

    /// The scheduler as a controller of the shared runtime.
    pub fn controller(self: &Arc<Self>) -> Controller {
        let this = self.clone();
        Controller::new("default-scheduler")
            .watches(&self.watches)
            .wait_for(&self.pods)
            .wait_for(&self.nodes)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.classes)
            .wait_for(&self.capacities)
            .wait_for(&self.drivers)
            .wait_for(&self.csinodes)
            .reconcile("pod", self.queue.clone(), 2, move |key| {
                let this = this.clone();
                async move { this.schedule(&key).await }
            })
    }

    fn plan(&self, pod: &Pod) -> Plan {
        let nodes = self.nodes.state();
        let mut nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let (claims, volumes, classes) = (
            self.claims.state(),
            self.volumes.state(),
            self.classes.state(),
        );
        let (capacities, drivers, csinodes) = (
            self.capacities.state(),
            self.drivers.state(),
            self.csinodes.state(),
        );
        let claims = decide::by_namespaced_name(claims.iter().map(AsRef::as_ref));
        let volumes = decide::by_name(volumes.iter().map(AsRef::as_ref));
        let classes = decide::by_name(classes.iter().map(AsRef::as_ref));
        let capacities: Vec<&CSIStorageCapacity> = capacities.iter().map(AsRef::as_ref).collect();
        let drivers = decide::by_name(drivers.iter().map(AsRef::as_ref));
        let csinodes = decide::by_name(csinodes.iter().map(AsRef::as_ref));
        let pods = self.pods.state();
        let in_use = decide::volumes_in_use(pods.iter().map(AsRef::as_ref), &claims, &classes);
        decide::plan(
            &World {
                nodes: &nodes,
                claims: &claims,
                volumes: &volumes,
                classes: &classes,
                capacities: &capacities,
                drivers: &drivers,
                csinodes: &csinodes,
                in_use: &in_use,
            },
            pod,
        )
    }

    async fn schedule(&self, key: &PodKey) -> Result<Next, ScheduleError> {
        let Some(pod) = self.pods.get(key) else {
            self.reported.lock().remove(key);
            return Ok(Next::Done);
        };
        match self.plan(&pod) {
            Plan::Skip => {
                self.reported.lock().remove(key);
                Ok(Next::Done)
            }
            Plan::Unschedulable(message) => {
                let new = self.reported.lock().insert(key.clone(), message.clone())
                    != Some(message.clone());
                if new {
                    tracing::info!(pod = %key, %message, "pod cannot be scheduled");
                    self.recorder.record(
                        &reference(pod.as_ref()),
                        EventType::Warning,
                        "FailedScheduling",
                        &message,
                    );
                }
                Ok(Next::After(RETRY))
            }
            Plan::Select { node, claims, bind } => {
                let namespace = key.namespace.clone().unwrap_or_default();
                for (claim, volume) in bind {
                    if !self.pre_bind(&namespace, &claim, &volume).await? {
                        return Ok(Next::Retry);
                    }
                }
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.client.clone(), &namespace);
                for claim in claims {
                    let version = self
                        .claims
                        .get(&ObjectRef::new(&claim).within(&namespace))
                        .and_then(|c| c.metadata.resource_version.clone());
                    let patch = json!({"metadata": {
                        "resourceVersion": version,
                        "annotations": {ANN_SELECTED_NODE: node},
                    }});
                    match api
                        .patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {}
                        // Changed meanwhile: the watch brings the new claim and a new pass.
                        Err(error) if sidecar_kit::api_errors::is_conflict(&error) => {
                            return Ok(Next::Retry);
                        }
                        Err(source) => {
                            return Err(ScheduleError::SelectNode {
                                claim,
                                node,
                                source,
                            });
                        }
                    }
                }
                tracing::info!(pod = %key, node, "claims selected for a node; waiting for their volumes");
                Ok(Next::After(RETRY))
            }
            Plan::WaitForClaims(_) => Ok(Next::After(RETRY)),
            Plan::Bind(node) => {
                let api: Api<Pod> =
                    Api::namespaced(self.client.clone(), key.namespace.as_deref().unwrap_or(""));
                let binding = json!({
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": key.name, "uid": pod.metadata.uid},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                });
                match api
                    .create_subresource::<_, serde_json::Value>(
                        "binding",
                        &key.name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(error) if sidecar_kit::api_errors::is_conflict(&error) => {
                        return Ok(Next::Done);
                    }
                    Err(source) => {
                        return Err(ScheduleError::Bind {
                            pod: key.to_string(),
                            node,
                            source,
                        });
                    }
                }
                self.reported.lock().remove(key);
                let message = format!(
                    "Successfully assigned {}/{} to {node}",
                    key.namespace.as_deref().unwrap_or_default(),
                    key.name
                );
                tracing::info!(pod = %key, node, "pod scheduled");
                self.recorder.record(
                    &reference(pod.as_ref()),
                    EventType::Normal,
                    "Scheduled",
                    &message,
                );
                Ok(Next::Done)
            }
        }
    }
}
