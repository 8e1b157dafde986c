//! Pods by the claims they name, as kube-controller-manager indexes them (its Pod index by
//! claim): those that wait for the scheduler (for the `WaitForPodScheduled` event of a
//! WaitForFirstConsumer claim), or every Pod naming a claim (for pvc-protection, which would
//! otherwise look at every Pod for each claim). The index keeps names only: the binder keeps no
//! Pod cache (its Pods are shrunk on arrival to what deciding "waiting" reads), pvc-protection
//! reads the named Pods from its Pod cache.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, Pod, PodSpec, PodStatus, Volume,
};
use sidecar_kit::vocabulary::pod_claim_names;
use sidecar_kit::watch_index::ByReference;

use crate::decide::consumers::awaits_scheduling;

/// Pods by the claims they name. Fed by a Pod watch.
pub type PodsByClaim = ByReference<Pod>;

/// The Pods that wait for the scheduler (the binder's, read when a claim waits for its
/// consumer).
pub fn waiting_pods() -> PodsByClaim {
    ByReference::new(|pod| match awaits_scheduling(pod) {
        true => pod_claim_names(pod),
        false => Vec::new(),
    })
}

/// Keeps of a Pod only what [`awaits_scheduling`] and the claims it names read: its name and
/// deletion, its claim volumes, its node, its phase and its containers' states.
pub fn shrink(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.labels = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.generate_name = None;
    if let Some(spec) = pod.spec.as_mut() {
        let volumes = spec.volumes.take().map(|volumes| {
            volumes
                .into_iter()
                .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
                .map(|v| Volume {
                    name: v.name,
                    persistent_volume_claim: v.persistent_volume_claim,
                    ephemeral: v.ephemeral.map(|_| Default::default()),
                    ..Default::default()
                })
                .collect()
        });
        *spec = PodSpec {
            volumes,
            node_name: spec.node_name.take(),
            ..Default::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        let states = |statuses: Option<Vec<ContainerStatus>>| {
            statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        // Which state, not its reason, message or times.
                        state: c.state.map(|s| ContainerState {
                            running: s.running.map(|_| Default::default()),
                            terminated: s.terminated.map(|_| Default::default()),
                            waiting: s.waiting.map(|_| Default::default()),
                        }),
                        ..Default::default()
                    })
                    .collect()
            })
        };
        *status = PodStatus {
            phase: status.phase.take(),
            init_container_statuses: states(status.init_container_statuses.take()),
            container_statuses: states(status.container_statuses.take()),
            ephemeral_container_statuses: states(status.ephemeral_container_statuses.take()),
            ..Default::default()
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EphemeralVolumeSource;
    use kube::runtime::watcher::Event;
    use sidecar_kit::testing;
    use sidecar_kit::watch_index::Feed;
    use sidecar_kit::watch_index::WatchIndex;

    fn pending(name: &str, claims: &[&str]) -> Pod {
        claims
            .iter()
            .enumerate()
            .fold(testing::pod(name), |pod, (i, claim)| {
                pod.claim(&format!("v{i}"), claim, false)
            })
            .build()
    }

    #[test]
    fn pods_are_indexed_under_their_claims_while_they_wait_for_the_scheduler() {
        let index = waiting_pods();
        index.apply(&pending("b", &["data"]));
        index.apply(&pending("a", &["data", "logs"]));
        index.apply(&pending("no-claims", &[]));
        assert_eq!(index.of("default", "data"), ["a", "b"]);
        assert_eq!(index.of("default", "logs"), ["a"]);
        assert!(index.of("other", "data").is_empty(), "another namespace");
        assert_eq!(index.len(), 2);
        // Scheduled, finished, changed volumes, deleted: each leaves the index as it should.
        let mut scheduled = pending("b", &["data"]);
        scheduled.spec.as_mut().unwrap().node_name = Some("n1".into());
        index.apply(&scheduled);
        assert_eq!(index.of("default", "data"), ["a"]);
        index.apply(&pending("a", &["logs"]));
        assert!(index.of("default", "data").is_empty());
        index.apply(
            &testing::pod("a")
                .phase("Failed")
                .claim("v", "logs", false)
                .build(),
        );
        assert!(index.of("default", "logs").is_empty());
        index.apply(&pending("c", &["data"]));
        index.delete(&pending("c", &["data"]));
        assert!(index.is_empty());
    }

    #[test]
    fn pvc_protection_indexes_every_pod_naming_a_claim_whatever_its_state() {
        let index = PodsByClaim::pods_by_claim();
        let mut scheduled = pending("scheduled", &["data"]);
        scheduled.spec.as_mut().unwrap().node_name = Some("n1".into());
        index.apply(&scheduled);
        index.apply(&pending("waiting", &["data"]));
        index.apply(
            &testing::pod("done")
                .phase("Succeeded")
                .claim("v", "data", false)
                .build(),
        );
        index.apply(&pending("no-claims", &[]));
        // Whether each still holds the claim is pvc-protection's decision, not the index's.
        assert_eq!(
            index.of("default", "data"),
            ["done", "scheduled", "waiting"]
        );
        assert_eq!(index.len(), 3);
        index.apply(&pending("scheduled", &["logs"]));
        assert_eq!(index.of("default", "data"), ["done", "waiting"]);
        assert_eq!(index.of("default", "logs"), ["scheduled"]);
        index.delete(&pending("done", &["data"]));
        assert_eq!(index.of("default", "data"), ["waiting"]);
    }

    #[test]
    fn a_generic_ephemeral_volume_names_its_claim_after_the_pod() {
        let index = waiting_pods();
        let mut pod = pending("web", &[]);
        pod.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "scratch".into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Default::default()
        }]);
        index.apply(&pod);
        assert_eq!(index.of("default", "web-scratch"), ["web"]);
    }

    #[test]
    fn a_relist_forgets_pods_deleted_while_the_watch_was_away() {
        let (feed, index) = (Feed::default(), waiting_pods());
        feed.event(&Event::Apply(pending("gone", &["data"])), &index);
        feed.event(&Event::Apply(pending("kept", &["data"])), &index);
        feed.event(&Event::Init, &index);
        feed.event(&Event::InitApply(pending("kept", &["data"])), &index);
        feed.event(&Event::InitDone, &index);
        assert_eq!(index.of("default", "data"), ["kept"]);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn a_shrunk_pod_decides_alike_and_keeps_no_containers_or_labels() {
        let mut pod = testing::pod("p")
            .claim("v", "data", false)
            .empty_dir("tmp")
            .node("n1")
            .phase("Running")
            .build();
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let before = (awaits_scheduling(&pod), pod_claim_names(&pod));
        shrink(&mut pod);
        assert_eq!((awaits_scheduling(&pod), pod_claim_names(&pod)), before);
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.containers.is_empty());
        assert_eq!(
            spec.volumes.as_ref().map(Vec::len),
            Some(1),
            "the emptyDir goes"
        );
        assert_eq!(pod.metadata.labels, None);
        assert_eq!(pod.status.and_then(|s| s.phase), Some("Running".into()));
        // Being deleted, one container done (with its message) and one still running: the
        // states decide, and only which state each is stays.
        let mut going = testing::pod("g").claim("v", "data", false).build();
        going.metadata.deletion_timestamp = Some(sidecar_kit::vocabulary::now());
        let state = |running: bool| k8s_openapi::api::core::v1::ContainerState {
            running: running.then(Default::default),
            terminated: (!running).then(|| k8s_openapi::api::core::v1::ContainerStateTerminated {
                message: Some("x".repeat(4096)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let statuses = [false, true].map(|running| ContainerStatus {
            name: format!("c{running}"),
            state: Some(state(running)),
            ..Default::default()
        });
        going.status.get_or_insert_default().container_statuses = Some(statuses.to_vec());
        for running in [true, false] {
            let mut pod = going.clone();
            if !running {
                pod.status
                    .as_mut()
                    .unwrap()
                    .container_statuses
                    .as_mut()
                    .unwrap()
                    .pop();
            }
            let before = awaits_scheduling(&pod);
            assert_eq!(before, running, "a running container keeps it waiting");
            shrink(&mut pod);
            assert_eq!(awaits_scheduling(&pod), before);
            let kept = serde_json::to_string(&pod).unwrap();
            assert!(!kept.contains("xxxx"), "the message goes: {kept}");
        }
    }
}
