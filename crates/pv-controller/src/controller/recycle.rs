//! kube-controller-manager's recycler for hostPath and NFS volumes (`recycleVolumeOperation`):
//! a Released volume with policy `Recycle` is read again, left alone while Pods still use its
//! claim, then scrubbed by a Pod (`decide::recycle` makes it) watched to its end, with the
//! Pod's events passed on to the volume. Success makes the volume Available again; a failure
//! marks it Failed, and a later resync tries again. Each volume's recycle runs on the
//! `recycle` queue, one at a time per volume, so the volume workers never wait for a Pod.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;

use super::*;
use crate::decide::reasons::Reason;
use crate::decide::recycle::{
    OLD_POD_FOUND, POD_DELETED, failed_message, forwarded_message, pod_outcome, recycle_stands,
    recycler_pod, used_by_message, users_of, wait_limit,
};

/// Why a recycle could not be carried out; retried with backoff (the outcomes of the Pod are
/// not errors: they are written to the volume).
#[derive(Debug, thiserror::Error)]
pub enum RecycleError {
    /// The volume could not be read again before recycling.
    #[error("failed to read volume {volume} before recycling it: {source}")]
    ReadVolume {
        /// The volume.
        volume: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// The Pods that may use the volume could not be listed.
    #[error("failed to list the pods of namespace {namespace}: {source}")]
    ListPods {
        /// The claim's namespace.
        namespace: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// Writing the outcome to the volume failed.
    #[error("failed to write the recycle's outcome: {0}")]
    WriteOutcome(#[source] SyncError),
}

/// Why a recycler Pod did not do its work, in kube-controller-manager's words (they become the
/// volume's `Recycle failed: …`).
#[derive(Debug, thiserror::Error)]
pub enum RecyclerPodError {
    /// Its watches could not be opened (the error as it is).
    #[error("{0}")]
    Watch(#[source] kube::Error),
    /// A Pod of that name was there and could not be deleted.
    #[error("failed to delete old recycler pod {pod}: {source}")]
    DeleteOldPod {
        /// `namespace/name`.
        pod: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// A Pod of that name was there: deleted, the next try makes a new one.
    #[error("{}", OLD_POD_FOUND)]
    OldPodFound,
    /// The Pod could not be made.
    #[error("unexpected error creating recycler pod:  {0}")]
    CreatePod(#[source] kube::Error),
    /// The Pod did not succeed.
    #[error("failed to recycle volume: {0}")]
    Recycle(#[source] PodEnd),
    /// The Pod succeeded but could not be deleted (the next try deletes it as an old one).
    #[error("failed to delete recycler pod: {0}")]
    DeletePod(#[source] kube::Error),
}

/// How a recycler Pod ended short of success.
#[derive(Debug, thiserror::Error)]
pub enum PodEnd {
    /// It failed: its message, or kube-controller-manager's words for none.
    #[error("{0}")]
    Failed(String),
    /// It was deleted first.
    #[error("{}", POD_DELETED)]
    Deleted,
    /// It could not be listed again when its watch ended.
    #[error("recycler pod watcher failed")]
    WatchFailed(#[source] kube::Error),
    /// It did not end within its deadline and
    /// [`crate::decide::recycle::RecyclerConfig::past_deadline`].
    #[error("recycler pod did not finish within {seconds} s")]
    TimedOut {
        /// The wait, in seconds.
        seconds: u64,
    },
}

/// One of the recycler Pod's two watches (the Pod, its events), from a resourceVersion a list
/// gave: a watch from "now" (no version), as kube-controller-manager's recycler opens it, is
/// refused by kube-apiserver when etcd cannot report its progress (etcd before 3.4.31), and
/// kube-controller-manager's recycler then does not see its Pod end.
struct Follow<K> {
    api: Api<K>,
    params: WatchParams,
    stream: Option<BoxStream<'static, Result<WatchEvent<K>, kube::Error>>>,
    /// The version to go on from: the last this watch saw, or the list's it started from.
    version: String,
    /// The server said that version is gone (410): a list's newer one is needed.
    gone: bool,
}

impl<K> Follow<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    /// A watch of `api`'s objects whose field `field` is `value`, from `version`, not open yet.
    fn new(api: Api<K>, field: &str, value: &str, version: &str) -> Self {
        Follow {
            api,
            params: WatchParams::default().fields(&format!("{field}={value}")),
            stream: None,
            version: version.to_string(),
            gone: false,
        }
    }

    /// Opens the watch from its version.
    async fn open(&mut self) -> Result<(), kube::Error> {
        self.stream = Some(self.api.watch(&self.params, &self.version).await?.boxed());
        Ok(())
    }

    /// The next change; `None` when the watch ended (the server's timeout, an error, an
    /// expired version): it is to be opened again.
    async fn next(&mut self) -> Option<WatchEvent<K>> {
        let stream = self.stream.as_mut()?;
        let next = stream.next().await;
        if let Some(Ok(change)) = &next
            && let Some(version) = version_of(change)
        {
            self.version = version;
        }
        match next {
            Some(Ok(WatchEvent::Error(status))) => {
                tracing::debug!(code = status.code, message = %status.message, "recycler watch ended");
                self.gone = status.code == 410;
                self.stream = None;
                None
            }
            Some(Ok(event)) => Some(event),
            Some(Err(error)) => {
                tracing::debug!(%error, "recycler watch broke");
                self.stream = None;
                None
            }
            None => {
                self.stream = None;
                None
            }
        }
    }
}

/// The resourceVersion of a change, to go on from.
fn version_of<K: kube::Resource>(event: &WatchEvent<K>) -> Option<String> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
            o.meta().resource_version.clone()
        }
        WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
        WatchEvent::Error(_) => None,
    }
}

/// How long a watch that ended is left before it is opened again (a server refusing it is
/// not asked in a loop).
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// The Pods of a namespace are read this many at a time when looking for a volume's users: a
/// namespace of many Pods is never held whole.
pub(crate) const POD_PAGE: u32 = 500;

/// Every user `users` finds in the pages `page` gives (each asked for with the continue token
/// of the one before), sorted, each once.
async fn users_in_pages<P, F, E>(
    mut page: P,
    users: impl Fn(&[Pod]) -> Vec<String>,
) -> Result<Vec<String>, E>
where
    P: FnMut(Option<String>) -> F,
    F: std::future::Future<Output = Result<(Vec<Pod>, Option<String>), E>>,
{
    let mut found = std::collections::BTreeSet::new();
    let mut token = None;
    loop {
        let (pods, next) = page(token).await?;
        found.extend(users(&pods));
        match next {
            Some(next) => token = Some(next),
            None => return Ok(found.into_iter().collect()),
        }
    }
}

/// The recycler Pod as a list by its name says it is now, with the list's resourceVersion.
async fn list_pod(pods: &Api<Pod>, name: &str) -> Result<(Option<Pod>, String), kube::Error> {
    let list = pods
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await?;
    let version = list.metadata.resource_version.unwrap_or_default();
    Ok((list.items.into_iter().next(), version))
}

impl PvController {
    /// Recycles volume `name` if it is still to be (the `recycle` queue's reconcile).
    pub(super) async fn recycle(&self, name: &str) -> Result<(), RecycleError> {
        let Some(config) = self.recycler.clone() else {
            return Ok(());
        };
        let read = self.read_volume(name).await;
        let Some(live) = read.map_err(|source| RecycleError::ReadVolume {
            volume: name.to_string(),
            source,
        })?
        else {
            return Ok(());
        };
        let claim = claim_named_by(&live)
            .and_then(|(ns, claim)| self.claims.get(&ObjectRef::new(&claim).within(&ns)));
        if !recycle_stands(&live, claim.as_deref()) {
            return Ok(());
        }
        // With a claim of that name in the cache there are no users to look for (`users_of`).
        if let Some((namespace, _)) = claim_named_by(&live).filter(|_| claim.is_none()) {
            let pods = Api::<Pod>::namespaced(self.client.clone(), &namespace);
            let users = users_in_pages(
                |token| {
                    let params = ListParams::default().limit(POD_PAGE);
                    let params = match &token {
                        Some(token) => params.continue_token(token),
                        None => params,
                    };
                    let pods = pods.clone();
                    async move {
                        let page = pods.list(&params).await?;
                        let next = page.metadata.continue_.filter(|t| !t.is_empty());
                        Ok((page.items, next))
                    }
                },
                |page| users_of(&live, claim.as_deref(), page),
            )
            .await
            .map_err(|source| RecycleError::ListPods {
                namespace: namespace.clone(),
                source,
            })?;
            if !users.is_empty() {
                self.recorder.record(
                    &reference(&live),
                    EventType::Normal,
                    Reason::VolumeFailedRecycle.as_str(),
                    &used_by_message(&users),
                );
                return Ok(());
            }
        }
        let Some(pod) = recycler_pod(&live, &config) else {
            return self
                .fail(
                    &live,
                    Reason::VolumeFailedRecycle,
                    crate::decide::recycle::NO_RECYCLER,
                )
                .await
                .map_err(RecycleError::WriteOutcome);
        };
        tracing::info!(pv = name, "recycling the volume");
        match self
            .run_recycler_pod(&live, pod, config.past_deadline)
            .await
        {
            Ok(()) => self.recycled(&live).await,
            Err(error) => {
                tracing::warn!(pv = name, %error, "recycle failed");
                self.fail(
                    &live,
                    Reason::VolumeFailedRecycle,
                    &failed_message(&error.to_string()),
                )
                .await
                .map_err(RecycleError::WriteOutcome)
            }
        }
    }

    /// A recycled volume: the `VolumeRecycled` event, then unbound (`volume_unbound`) and
    /// Available. A write that conflicts (the volume changed while its Pod ran) is made again
    /// on the volume read anew while it still names the same claim, so a change elsewhere in it
    /// does not cost another scrub.
    async fn recycled(&self, pv: &PersistentVolume) -> Result<(), RecycleError> {
        self.recorder.record(
            &reference(pv),
            EventType::Normal,
            Reason::VolumeRecycled.as_str(),
            "Volume recycled",
        );
        let name = pv.metadata.name.clone().unwrap_or_default();
        let claim_uid = |v: &PersistentVolume| {
            v.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.clone())
        };
        let mut current = pv.clone();
        let mut tries = 0;
        let written = loop {
            tries += 1;
            match self
                .put_volume(
                    &volume_unbound(&current),
                    Part::Whole,
                    "unbind the recycled volume",
                )
                .await
            {
                Ok(written) => break written,
                Err(SyncError::Write { source, .. })
                    if tries < 5 && sidecar_kit::api_errors::is_conflict(&source) =>
                {
                    let live = self.read_volume(&name).await.map_err(|source| {
                        RecycleError::ReadVolume {
                            volume: name.clone(),
                            source,
                        }
                    })?;
                    match live {
                        Some(live) if claim_uid(&live) == claim_uid(pv) => current = live,
                        // Gone, or bound anew meanwhile: nothing of ours to undo.
                        _ => return Ok(()),
                    }
                }
                Err(error) => return Err(RecycleError::WriteOutcome(error)),
            }
        };
        let available = volume_in_phase(&written, "Available");
        self.put_volume(
            &available,
            Part::Status,
            "make the recycled volume Available",
        )
        .await
        .map_err(RecycleError::WriteOutcome)?;
        tracing::info!(pv = name, "volume recycled");
        Ok(())
    }

    /// Creates the recycler Pod, waits for its end and deletes it (whatever the end), as
    /// kube-controller-manager's recycler client; the error is the Pod's failure in its words.
    async fn run_recycler_pod(
        &self,
        pv: &PersistentVolume,
        pod: Pod,
        past_deadline: Duration,
    ) -> Result<(), RecyclerPodError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &namespace);
        let limit = wait_limit(&pod, past_deadline);
        // Both watches are open before the Pod exists, so nothing of it is missed.
        let (_, version) = list_pod(&pods, &name)
            .await
            .map_err(RecyclerPodError::Watch)?;
        let mut pod_watch = Follow::new(pods.clone(), "metadata.name", &name, &version);
        let mut event_watch = Follow::new(
            Api::<Event>::namespaced(self.client.clone(), &namespace),
            "involvedObject.name",
            &name,
            &version,
        );
        pod_watch.open().await.map_err(RecyclerPodError::Watch)?;
        event_watch.open().await.map_err(RecyclerPodError::Watch)?;
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {
                return match pods.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => Err(RecyclerPodError::OldPodFound),
                    Err(source) => Err(RecyclerPodError::DeleteOldPod {
                        pod: format!("{namespace}/{name}"),
                        source,
                    }),
                };
            }
            Err(error) => return Err(RecyclerPodError::CreatePod(error)),
        }
        let waited = tokio::time::timeout(
            limit,
            self.wait_for_recycler(pv, &name, &mut pod_watch, &mut event_watch),
        )
        .await
        .unwrap_or(Err(PodEnd::TimedOut {
            seconds: limit.as_secs(),
        }));
        let deleted = match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(()),
            Err(error) => {
                tracing::warn!(pod = %name, %error, "failed to delete the recycler pod");
                Err(error)
            }
        };
        waited.map_err(RecyclerPodError::Recycle)?;
        deleted.map_err(RecyclerPodError::DeletePod)
    }

    /// Follows the recycler Pod `name` to its end, passing its new events on to the volume. A
    /// watch that ends is opened again a second later: the Pod's after a list of it (which
    /// shows how it ended meanwhile), from the list's version; the events' from the last
    /// version it saw (a list's when that one is gone).
    async fn wait_for_recycler(
        &self,
        pv: &PersistentVolume,
        name: &str,
        pods: &mut Follow<Pod>,
        events: &mut Follow<Event>,
    ) -> Result<(), PodEnd> {
        let mut passed_on: HashSet<String> = HashSet::new();
        loop {
            // A watch that ended leaves its branch off; the next pass opens it again.
            tokio::select! {
                change = pods.next(), if pods.stream.is_some() => match change {
                    Some(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                        if let Some(outcome) = pod_outcome(&pod) {
                            return outcome.map_err(PodEnd::Failed);
                        }
                    }
                    Some(WatchEvent::Deleted(_)) => return Err(PodEnd::Deleted),
                    Some(WatchEvent::Bookmark(_) | WatchEvent::Error(_)) | None => {}
                },
                change = events.next(), if events.stream.is_some() => {
                    if let Some(WatchEvent::Added(event)) = change
                        && passed_on.insert(event.metadata.uid.clone().unwrap_or_default())
                    {
                        self.pass_on(pv, &event);
                    }
                }
                () = tokio::time::sleep(REOPEN_AFTER), if pods.stream.is_none() || events.stream.is_none() => {
                    if pods.stream.is_none() || events.gone {
                        let (now, listed) = list_pod(&pods.api, name)
                            .await
                            .map_err(PodEnd::WatchFailed)?;
                        if pods.stream.is_none() {
                            let Some(pod) = now else {
                                return Err(PodEnd::Deleted);
                            };
                            if let Some(outcome) = pod_outcome(&pod) {
                                return outcome.map_err(PodEnd::Failed);
                            }
                            pods.version = listed.clone();
                            if let Err(error) = pods.open().await {
                                tracing::debug!(%error, "recycler pod watch not open again yet");
                            }
                        }
                        if events.gone {
                            events.version = listed;
                            events.gone = false;
                        }
                    }
                    if events.stream.is_none()
                        && let Err(error) = events.open().await
                    {
                        tracing::debug!(%error, "recycler event watch not open again yet");
                    }
                }
                // Both watches ended at once: the next pass opens them again.
                else => {}
            }
        }
    }

    /// A recycler Pod's event, on the volume as kube-controller-manager's recorder words it.
    fn pass_on(&self, pv: &PersistentVolume, event: &Event) {
        let kind = match event.type_.as_deref() {
            Some("Warning") => EventType::Warning,
            _ => EventType::Normal,
        };
        self.recorder.record(
            &reference(pv),
            kind,
            Reason::RecyclerPod.as_str(),
            &forwarded_message(event.message.as_deref().unwrap_or_default()),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> Vec<Pod> {
        names
            .iter()
            .map(|name| sidecar_kit::testing::pod(name).build())
            .collect()
    }

    fn users(page: &[Pod]) -> Vec<String> {
        page.iter()
            .filter_map(|pod| pod.metadata.name.clone())
            .filter(|name| name.starts_with("user"))
            .collect()
    }

    #[tokio::test]
    async fn users_are_gathered_from_every_page_in_turn() {
        let pages = [
            (pods(&["user-b", "other"]), Some("one".to_string())),
            (pods(&["other-2"]), Some("two".to_string())),
            (pods(&["user-a", "user-b"]), None),
        ];
        let mut asked = Vec::new();
        let found = users_in_pages(
            |token| {
                asked.push(token.clone());
                let at = asked.len() - 1;
                let page = pages[at].clone();
                async move { Ok::<_, String>(page) }
            },
            users,
        )
        .await
        .unwrap();
        assert_eq!(found, ["user-a", "user-b"]);
        assert_eq!(asked, [None, Some("one".into()), Some("two".into())]);
        // A page that fails fails the whole look.
        let failed = users_in_pages(
            |token| async move {
                match token {
                    None => Ok((pods(&["user-x"]), Some("next".to_string()))),
                    Some(_) => Err("gone".to_string()),
                }
            },
            users,
        )
        .await;
        assert_eq!(failed, Err("gone".to_string()));
    }
}
