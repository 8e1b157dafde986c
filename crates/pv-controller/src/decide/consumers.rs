//! The Pods a claim of a WaitForFirstConsumer class waits for, as kube-controller-manager
//! reports them (`emitEventForUnboundDelayBindingClaim`): with no Pod waiting for the scheduler
//! the claim waits for its first consumer; with some, for them to be scheduled (the scheduler
//! picks the node, then the binder or the provisioner goes on).

use crate::decide::reasons::Reason;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Whether a Pod has terminated as kube-controller-manager's volume code counts it
/// (`IsPodTerminated`): phase Failed or Succeeded, or being deleted with no container running
/// (init, regular and ephemeral alike; a container with no state counts as running).
pub fn pod_terminated(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return true;
    }
    let not_running = |statuses: Option<&Vec<ContainerStatus>>| {
        statuses.into_iter().flatten().all(|c| {
            c.state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some() || s.waiting.is_some())
        })
    };
    pod.metadata.deletion_timestamp.is_some()
        && status.is_none_or(|s| {
            not_running(s.init_container_statuses.as_ref())
                && not_running(s.container_statuses.as_ref())
                && not_running(s.ephemeral_container_statuses.as_ref())
        })
}

/// Whether the scheduler has put the Pod on a node.
pub fn on_node(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Whether a Pod waits for the scheduler: not on a node yet, and not terminated.
pub fn awaits_scheduling(pod: &Pod) -> bool {
    !on_node(pod) && !pod_terminated(pod)
}

/// The Normal event of a claim waiting for its consumer: `WaitForFirstConsumer`, or
/// `WaitForPodScheduled` naming the Pods (of the claim's namespace) that wait for the
/// scheduler, in kube-controller-manager's words. `waiting` in the order to name them.
pub fn first_consumer_event(waiting: &[String]) -> (Reason, String) {
    match waiting {
        [] => (
            Reason::WaitForFirstConsumer,
            "waiting for first consumer to be created before binding".to_string(),
        ),
        [pod] => (
            Reason::WaitForPodScheduled,
            format!("waiting for pod {pod} to be scheduled"),
        ),
        pods => (
            Reason::WaitForPodScheduled,
            format!("waiting for pods {} to be scheduled", pods.join(",")),
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    };
    use sidecar_kit::testing;

    fn container(state: Option<ContainerState>) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            state,
            ..Default::default()
        }
    }

    fn running() -> Option<ContainerState> {
        Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        })
    }

    fn waiting() -> Option<ContainerState> {
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        })
    }

    fn terminated() -> Option<ContainerState> {
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        })
    }

    fn deleted(mut pod: Pod, init: Vec<ContainerStatus>, main: Vec<ContainerStatus>) -> Pod {
        pod.metadata.deletion_timestamp = Some(sidecar_kit::vocabulary::now());
        let status = pod.status.get_or_insert_default();
        status.init_container_statuses = Some(init);
        status.container_statuses = Some(main);
        pod
    }

    #[test]
    fn pods_waiting_for_the_scheduler_are_unscheduled_and_not_terminated() {
        let pending = || testing::pod("p");
        let rows: Vec<(&str, Pod, bool, bool)> = vec![
            // (case, pod, terminated, awaits scheduling)
            ("new", pending().build(), false, true),
            ("on a node", pending().node("n1").build(), false, false),
            ("empty node name", pending().node("").build(), false, true),
            ("failed", pending().phase("Failed").build(), true, false),
            (
                "succeeded",
                pending().phase("Succeeded").build(),
                true,
                false,
            ),
            (
                "deleted, no container ran",
                deleted(pending().build(), vec![], vec![]),
                true,
                false,
            ),
            (
                "deleted, containers waiting or terminated",
                deleted(
                    pending().build(),
                    vec![container(terminated())],
                    vec![container(waiting())],
                ),
                true,
                false,
            ),
            (
                "deleted, a container running",
                deleted(pending().build(), vec![], vec![container(running())]),
                false,
                true,
            ),
            (
                "deleted, an init container running",
                deleted(pending().build(), vec![container(running())], vec![]),
                false,
                true,
            ),
            (
                "deleted, a container without a state",
                deleted(pending().build(), vec![], vec![container(None)]),
                false,
                true,
            ),
        ];
        for (case, pod, terminated, awaits) in rows {
            assert_eq!(pod_terminated(&pod), terminated, "{case}: terminated");
            assert_eq!(awaits_scheduling(&pod), awaits, "{case}: awaits scheduling");
        }
    }

    #[test]
    fn the_event_names_the_pods_that_wait_in_kube_controller_managers_words() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rows: [(&[&str], Reason, &str); 3] = [
            (
                &[],
                Reason::WaitForFirstConsumer,
                "waiting for first consumer to be created before binding",
            ),
            (
                &["web-0"],
                Reason::WaitForPodScheduled,
                "waiting for pod web-0 to be scheduled",
            ),
            (
                &["a", "b"],
                Reason::WaitForPodScheduled,
                "waiting for pods a,b to be scheduled",
            ),
        ];
        for (pods, reason, message) in rows {
            assert_eq!(
                first_consumer_event(&names(pods)),
                (reason, message.to_string()),
                "{pods:?}"
            );
        }
    }
}
