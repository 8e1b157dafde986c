//! Generic ephemeral volumes in the embedded stack: the claims of Pods' ephemeral volumes are
//! made (kube-controller-manager's ephemeral-volume controller) and deleted once their Pod is
//! gone (its garbage collector, for claims). Decisions in [`crate::decide::ephemeral`]; a
//! claim is deleted only after its Pod is read live and found gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use sidecar_kit::events::{EventType, Recorder};
use sidecar_kit::runtime::Controller;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};

use crate::decide::ephemeral::{EphemeralAction, claim_orphaned, ephemeral_claims, owning_pod};
use crate::decide::reasons::Reason;

/// A failed API call (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum EphemeralError {
    /// Creating a Pod's claim failed.
    #[error("failed to create the ephemeral claim {claim}: {source}")]
    Create {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading the Pod that owns a claim failed.
    #[error("failed to read Pod {pod}, the owner of a claim: {source}")]
    ReadOwner {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        source: kube::Error,
    },
    /// Deleting a claim whose Pod is gone failed.
    #[error("failed to delete the claim {claim} of a Pod that is gone: {source}")]
    Delete {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The running controller.
pub struct EphemeralController {
    client: kube::Client,
    recorder: Recorder,
    watches: Watches,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    pod_queue: WorkQueue<ObjectRef<Pod>>,
    claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>>,
}

impl std::fmt::Debug for EphemeralController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EphemeralController")
            .finish_non_exhaustive()
    }
}

/// The claim names of a Pod's ephemeral volumes.
fn ephemeral_names(pod: &Pod) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter(|v| v.ephemeral.is_some())
        .map(|v| format!("{pod_name}-{}", v.name))
        .collect()
}

impl EphemeralController {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process).
    pub fn new(client: kube::Client, watches: Watches) -> Arc<Self> {
        let backoff = Backoff {
            start: Duration::from_millis(100),
            max: Duration::from_secs(30),
        };
        let pod_queue: WorkQueue<ObjectRef<Pod>> = WorkQueue::new(backoff);
        let claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>> = WorkQueue::new(backoff);
        let (pq, cq) = (pod_queue.clone(), claim_queue.clone());
        let pods = watches.reflect(Api::<Pod>::all(client.clone()), move |event| {
            each(event, |pod| {
                let names = ephemeral_names(pod);
                if names.is_empty() {
                    return;
                }
                if let watcher::Event::Delete(_) = event {
                    // Its claims may go now.
                    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
                    for name in names {
                        cq.add(ObjectRef::new(&name).within(ns));
                    }
                } else {
                    pq.add(ObjectRef::from_obj(pod));
                }
            });
        });
        let (pq, cq) = (pod_queue.clone(), claim_queue.clone());
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |event| {
                each(event, |claim| {
                    let Some((pod, _)) = owning_pod(claim) else {
                        return;
                    };
                    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
                    if let watcher::Event::Delete(_) = event {
                        // A Pod that still runs gets its claim again.
                        pq.add(ObjectRef::new(pod).within(ns));
                    } else {
                        cq.add(ObjectRef::from_obj(claim));
                    }
                });
            },
        );
        let recorder = Recorder::new(client.clone(), "ephemeral-volume-controller");
        Arc::new(EphemeralController {
            client,
            recorder,
            watches,
            pods,
            claims,
            pod_queue,
            claim_queue,
        })
    }

    /// The controller on the shared runtime.
    pub fn controller(self: &Arc<Self>) -> Controller {
        let (pods, claims) = (self.clone(), self.clone());
        Controller::new("ephemeral-volume-controller")
            .watches(&self.watches)
            .wait_for(&self.pods)
            .wait_for(&self.claims)
            .reconcile("pod", self.pod_queue.clone(), 2, move |key| {
                let this = pods.clone();
                async move { this.sync_pod(&key).await }
            })
            .reconcile("claim", self.claim_queue.clone(), 2, move |key| {
                let this = claims.clone();
                async move { this.sync_claim(&key).await }
            })
    }

    async fn sync_pod(&self, key: &ObjectRef<Pod>) -> Result<Next, EphemeralError> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(Next::Done);
        };
        let ns = key.namespace.clone().unwrap_or_default();
        let existing: HashMap<String, Arc<PersistentVolumeClaim>> = ephemeral_names(&pod)
            .into_iter()
            .filter_map(|name| {
                let claim = self.claims.get(&ObjectRef::new(&name).within(&ns))?;
                Some((name, claim))
            })
            .collect();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        for action in ephemeral_claims(&pod, |name| existing.get(name).map(AsRef::as_ref)) {
            match action {
                EphemeralAction::Create(claim) => {
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    match claims.create(&PostParams::default(), &claim).await {
                        Ok(_) => {
                            tracing::info!(pod = %key, claim = %name, "ephemeral claim created")
                        }
                        // The cache is behind: its event brings the Pod back.
                        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
                        Err(source) => {
                            return Err(EphemeralError::Create {
                                claim: format!("{ns}/{name}"),
                                source,
                            });
                        }
                    }
                }
                EphemeralAction::NotOwned { claim } => {
                    // The Pod waits until that claim goes (or is the Pod's).
                    self.recorder.record(
                        &reference(&*pod),
                        EventType::Warning,
                        Reason::FailedBinding.as_str(),
                        &format!("PVC {claim} was not created for the pod"),
                    );
                }
            }
        }
        Ok(Next::Done)
    }

    async fn sync_claim(
        &self,
        key: &ObjectRef<PersistentVolumeClaim>,
    ) -> Result<Next, EphemeralError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(Next::Done);
        };
        let Some((pod_name, _)) = owning_pod(&claim) else {
            return Ok(Next::Done);
        };
        let ns = key.namespace.clone().unwrap_or_default();
        let cached = self.pods.get(&ObjectRef::new(pod_name).within(&ns));
        if !claim_orphaned(&claim, cached.as_deref()) {
            return Ok(Next::Done);
        }
        // The cache may be behind the Pod: only the server says it is gone.
        let live = Api::<Pod>::namespaced(self.client.clone(), &ns)
            .get_opt(pod_name)
            .await
            .map_err(|source| EphemeralError::ReadOwner {
                pod: format!("{ns}/{pod_name}"),
                source,
            })?;
        if !claim_orphaned(&claim, live.as_ref()) {
            return Ok(Next::Done);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        match claims.delete(&key.name, &params).await {
            Ok(_) => {
                tracing::info!(claim = %key, pod = pod_name, "claim of a Pod that is gone deleted");
                Ok(Next::Done)
            }
            Err(error)
                if sidecar_kit::api_errors::is_not_found(&error)
                    || sidecar_kit::api_errors::is_conflict(&error) =>
            {
                // Gone already, or another claim of the name now: its own events decide.
                Ok(Next::Done)
            }
            Err(source) => Err(EphemeralError::Delete {
                claim: key.to_string(),
                source,
            }),
        }
    }
}
