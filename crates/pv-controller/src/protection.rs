//! The pvc-protection and pv-protection controllers on the shared runtime: they carry out
//! [`crate::decide::protection`] with guarded JSON patches.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use sidecar_kit::patch_ops::Op;
use sidecar_kit::runtime::Controller;
use sidecar_kit::watch::{Watches, each};
use sidecar_kit::watch_index::Feed;
use sidecar_kit::workqueue::{Backoff, Next, WorkQueue};

use crate::decide::protection::{self, Protection};
use crate::pods::PodsByClaim;

/// A failed write (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    /// Adding or removing a finalizer failed.
    #[error("failed to {action} the finalizer of {object}: {source}")]
    Write {
        /// add or remove.
        action: &'static str,
        /// The object.
        object: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The running controllers.
pub struct ProtectionController {
    client: kube::Client,
    watches: Watches,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    pods: Store<Pod>,
    /// The Pods naming each claim: a claim's sync reads those, not every Pod.
    users: Arc<PodsByClaim>,
    claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>>,
    volume_queue: WorkQueue<String>,
}

impl std::fmt::Debug for ProtectionController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionController")
            .finish_non_exhaustive()
    }
}

impl ProtectionController {
    /// Starts the watches on `watches` (its own, or [`Watches::sharing`] the watches of the
    /// controllers of its process).
    pub fn new(client: kube::Client, watches: Watches) -> Arc<Self> {
        let backoff = Backoff {
            start: Duration::from_millis(100),
            max: Duration::from_secs(30),
        };
        let claim_queue: WorkQueue<ObjectRef<PersistentVolumeClaim>> = WorkQueue::new(backoff);
        let volume_queue: WorkQueue<String> = WorkQueue::new(backoff);
        let q = claim_queue.clone();
        let claims = watches.reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |e| {
                each(e, |c| q.add(ObjectRef::from_obj(c)));
            },
        );
        let q = volume_queue.clone();
        let volumes = watches.reflect(Api::<PersistentVolume>::all(client.clone()), move |e| {
            each(e, |v| q.add(v.metadata.name.clone().unwrap_or_default()));
        });
        // A Pod that goes (or finishes) may free the claims it named.
        let (q, users, feed) = (
            claim_queue.clone(),
            Arc::new(crate::pods::PodsByClaim::pods_by_claim()),
            Feed::default(),
        );
        let index = users.clone();
        let pods = watches.reflect(Api::<Pod>::all(client.clone()), move |e| {
            feed.event(e, &*index);
            each(e, |pod| {
                let ns = pod.metadata.namespace.clone().unwrap_or_default();
                for claim in protection::claims_of(pod) {
                    q.add(ObjectRef::new(&claim).within(&ns));
                }
            });
        });
        Arc::new(ProtectionController {
            client,
            watches,
            claims,
            volumes,
            pods,
            users,
            claim_queue,
            volume_queue,
        })
    }

    /// The controllers on the shared runtime.
    pub fn controller(self: &Arc<Self>) -> Controller {
        let (claims, volumes) = (self.clone(), self.clone());
        Controller::new("pvc-protection-controller")
            .watches(&self.watches)
            .wait_for(&self.claims)
            .wait_for(&self.volumes)
            .wait_for(&self.pods)
            .reconcile("claim", self.claim_queue.clone(), 2, move |key| {
                let this = claims.clone();
                async move { this.sync_claim(&key).await }
            })
            .reconcile("volume", self.volume_queue.clone(), 2, move |key| {
                let this = volumes.clone();
                async move { this.sync_volume(&key).await }
            })
    }

    async fn sync_claim(
        &self,
        key: &ObjectRef<PersistentVolumeClaim>,
    ) -> Result<Next, ProtectionError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(Next::Done);
        };
        let namespace = key.namespace.as_deref().unwrap_or_default();
        let pods = self.users.cached(&self.pods, namespace, &key.name);
        let plan = protection::claim(&claim, pods.iter().map(AsRef::as_ref));
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        apply(api, &key.name, plan, &key.to_string()).await
    }

    async fn sync_volume(&self, name: &str) -> Result<Next, ProtectionError> {
        let Some(pv) = self.volumes.get(&ObjectRef::new(name)) else {
            return Ok(Next::Done);
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        apply(api, name, protection::volume(&pv), name).await
    }
}

async fn apply<K>(
    api: Api<K>,
    name: &str,
    plan: Protection,
    object: &str,
) -> Result<Next, ProtectionError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let (action, ops): (&'static str, Vec<Op>) = match plan {
        Protection::Keep => return Ok(Next::Done),
        Protection::Add(ops) => ("add", ops),
        Protection::Release(ops) => ("remove", ops),
    };
    let patch = sidecar_kit::patch_ops::patch(ops);
    match api
        .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(Next::Done),
        Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(Next::Done),
        // Changed meanwhile: the watch brings the new object.
        Err(error)
            if sidecar_kit::api_errors::after_write(
                &error,
                sidecar_kit::api_errors::Write::Tested,
            ) == sidecar_kit::api_errors::AfterWrite::Changed =>
        {
            Ok(Next::Retry)
        }
        Err(source) => Err(ProtectionError::Write {
            action,
            object: object.to_string(),
            source,
        }),
    }
}
