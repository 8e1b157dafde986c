//! Which of the node's Pods an event brings back: a claim's or a volume's event brings back the
//! Pods that name that claim (found in an index of the node's Pods by claim, not by looking at
//! every Pod of the node for every claim of the cluster); an event of another kind, or the end
//! of a re-list, every Pod that does not run yet.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use sidecar_kit::watch_index::ByReference;
use sidecar_kit::workqueue::WorkQueue;

use super::NodeKey;
use super::decide;

/// Brings Pods of the node back to its queue.
#[derive(Clone)]
pub(super) struct Waker {
    pub(super) pods: Store<Pod>,
    pub(super) by_claim: Arc<ByReference<Pod>>,
    pub(super) queue: WorkQueue<NodeKey>,
}

/// Whom a Pod naming a claim is brought back for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Whom {
    /// Pods that do not run yet (they may be waiting for the claim).
    Waiting,
    /// Running ones too (the claim's expansion awaits the node).
    All,
}

impl Waker {
    /// Every Pod of the node that does not run yet.
    pub(super) fn waiting(&self) {
        for pod in self.pods.state() {
            if !decide::running(&pod) {
                self.queue
                    .add(NodeKey::Pod(ObjectRef::from_obj(pod.as_ref())));
            }
        }
    }

    /// The node's Pods naming the claim `namespace/name`.
    pub(super) fn naming(&self, namespace: &str, name: &str, whom: Whom) {
        for pod in self.by_claim.of(namespace, name) {
            let key = ObjectRef::new(&pod).within(namespace);
            let brought = match whom {
                Whom::All => true,
                Whom::Waiting => self.pods.get(&key).is_some_and(|p| !decide::running(&p)),
            };
            if brought {
                self.queue.add(NodeKey::Pod(key));
            }
        }
    }

    /// A claim's event: the Pods naming it that wait, or all of them when its expansion
    /// awaits the node; a re-list's end, every waiting Pod.
    pub(super) fn on_claim(&self, event: &watcher::Event<PersistentVolumeClaim>) {
        match event {
            watcher::Event::Apply(claim)
            | watcher::Event::InitApply(claim)
            | watcher::Event::Delete(claim) => {
                let whom = match crate::resizer::decide::awaits_node(claim) {
                    true => Whom::All,
                    false => Whom::Waiting,
                };
                let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
                if let Some(name) = claim.metadata.name.as_deref() {
                    self.naming(namespace, name, whom);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => self.waiting(),
        }
    }

    /// A volume's event: the Pods naming the claim it is bound to, as [`Waker::on_claim`]
    /// for that claim (`awaits_node` says whether its expansion awaits the node); a re-list's
    /// end, every waiting Pod.
    pub(super) fn on_volume(
        &self,
        event: &watcher::Event<PersistentVolume>,
        awaits_node: impl Fn(&str, &str) -> bool,
    ) {
        match event {
            watcher::Event::Apply(pv)
            | watcher::Event::InitApply(pv)
            | watcher::Event::Delete(pv) => {
                let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                if let Some((Some(namespace), Some(name))) =
                    claim_ref.map(|r| (r.namespace.as_deref(), r.name.as_deref()))
                {
                    let whom = match awaits_node(namespace, name) {
                        true => Whom::All,
                        false => Whom::Waiting,
                    };
                    self.naming(namespace, name, whom);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => self.waiting(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimCondition, PersistentVolumeClaimStatus};
    use kube::runtime::reflector;
    use sidecar_kit::testing;
    use sidecar_kit::watch_index::Feed;
    use sidecar_kit::workqueue::Backoff;
    use std::time::Duration;

    /// A waker over `pods` (listed into its store and index), with an empty queue.
    fn waker(pods: Vec<Pod>) -> Waker {
        let (store, mut writer) = reflector::store();
        let (feed, by_claim) = (Feed::default(), Arc::new(ByReference::pods_by_claim()));
        let mut events = vec![watcher::Event::Init];
        events.extend(pods.into_iter().map(watcher::Event::InitApply));
        events.push(watcher::Event::InitDone);
        for event in &events {
            writer.apply_watcher_event(event);
            feed.event(event, &*by_claim);
        }
        Waker {
            pods: store,
            by_claim,
            queue: WorkQueue::new(Backoff {
                start: Duration::from_millis(1),
                max: Duration::from_millis(1),
            }),
        }
    }

    /// The Pods queued since the last call, by name, sorted.
    async fn queued(waker: &Waker) -> Vec<String> {
        let mut names = Vec::new();
        while !waker.queue.is_empty() {
            let key = waker.queue.next().await.unwrap();
            waker.queue.done(&key);
            match key {
                NodeKey::Pod(pod) => names.push(pod.name),
                other => panic!("only Pods are brought back, not {other:?}"),
            }
        }
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_claims_or_volumes_event_brings_back_the_pods_naming_that_claim() {
        let waker = waker(vec![
            testing::pod("waiting").claim("v", "data", false).build(),
            testing::pod("running")
                .phase("Running")
                .claim("v", "data", false)
                .build(),
            testing::pod("other").claim("v", "logs", false).build(),
            testing::pod("no-claims").build(),
        ]);
        let data = testing::claim("data", "pv-data");
        // (event, Pods brought back)
        waker.on_claim(&watcher::Event::Apply(data.clone()));
        assert_eq!(
            queued(&waker).await,
            ["waiting"],
            "the waiting Pod naming it"
        );
        waker.on_claim(&watcher::Event::Delete(data.clone()));
        assert_eq!(queued(&waker).await, ["waiting"], "gone: the same");
        let mut expanding = data.clone();
        expanding.status = Some(PersistentVolumeClaimStatus {
            conditions: Some(vec![PersistentVolumeClaimCondition {
                type_: crate::resizer::decide::FS_RESIZE_PENDING.into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        waker.on_claim(&watcher::Event::Apply(expanding));
        assert_eq!(
            queued(&waker).await,
            ["running", "waiting"],
            "its expansion awaits the node: running Pods too"
        );
        let logs = testing::volume("pv-logs")
            .claim_ref("default", "logs", None)
            .build();
        waker.on_volume(&watcher::Event::Apply(logs.clone()), |_, _| false);
        assert_eq!(queued(&waker).await, ["other"], "the claim it is bound to");
        waker.on_volume(
            &watcher::Event::Apply(testing::volume("free").build()),
            |_, _| true,
        );
        assert!(queued(&waker).await.is_empty(), "bound to no claim: none");
        let data_pv = testing::volume("pv-data")
            .claim_ref("default", "data", None)
            .build();
        waker.on_volume(&watcher::Event::Apply(data_pv), |ns, name| {
            (ns, name) == ("default", "data")
        });
        assert_eq!(queued(&waker).await, ["running", "waiting"]);
        // The end of a re-list: every Pod that does not run yet.
        waker.on_claim(&watcher::Event::InitDone);
        assert_eq!(queued(&waker).await, ["no-claims", "other", "waiting"]);
        waker.on_volume(&watcher::Event::InitDone, |_, _| false);
        assert_eq!(queued(&waker).await, ["no-claims", "other", "waiting"]);
    }
}
