//! `--node-deployment`: one provisioner per node, each provisioning only for its node. A claim
//! whose selected node (`volume.kubernetes.io/selected-node`) is this node is ours; one
//! selected for another node is not. An Immediate claim has no selected node: with
//! `--node-deployment-immediate-binding` the provisioners race to claim it by setting the
//! annotation to their node, each after a random delay that grows with its failed attempts,
//! and only if its node has room for the claim.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use super::claim::selected_node;

/// What a per-node provisioner does with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChoice {
    /// Selected for this node: provision it.
    Ours,
    /// Selected for another node, or waiting for the scheduler: leave it.
    NotOurs,
    /// Immediate and not taken yet: try to take it.
    TryToTake,
}

/// Decides whether a claim is this node's.
pub fn choose(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    node: &str,
    immediate_binding: bool,
) -> NodeChoice {
    match selected_node(claim) {
        Some(selected) if selected == node => NodeChoice::Ours,
        Some(_) => NodeChoice::NotOurs,
        None => {
            let immediate = class
                .is_some_and(|c| c.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer"));
            if immediate && immediate_binding {
                NodeChoice::TryToTake
            } else {
                NodeChoice::NotOurs
            }
        }
    }
}

/// How long to wait before an attempt to take a claim: `base` doubled per earlier failed
/// attempt, at most `max`, minus a random part of `base` (`jitter` in 0..1), so provisioners on
/// different nodes rarely try at the same instant and the first attempt comes within `base`.
pub fn take_delay(failures: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let doubled = base.saturating_mul(2u32.saturating_pow(failures.min(30)));
    let delay = doubled.min(max);
    let jitter = base.mul_f64(jitter.clamp(0.0, 1.0));
    delay.saturating_sub(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::{claim, class};

    fn selected(node: Option<&str>) -> PersistentVolumeClaim {
        let c = claim("data");
        match node {
            Some(node) => c.selected_node(node).build(),
            None => c.build(),
        }
    }

    #[test]
    fn a_node_takes_its_own_claims_and_races_for_immediate_ones() {
        let immediate = class("fast", "driver").build();
        let mut late = class("late", "driver").build();
        late.volume_binding_mode = Some("WaitForFirstConsumer".into());
        let cases = [
            (Some("node-a"), Some(&late), true, NodeChoice::Ours),
            (Some("node-a"), Some(&immediate), false, NodeChoice::Ours),
            (Some("node-b"), Some(&late), true, NodeChoice::NotOurs),
            (Some("node-b"), Some(&immediate), true, NodeChoice::NotOurs),
            (None, Some(&late), true, NodeChoice::NotOurs),
            (None, Some(&immediate), true, NodeChoice::TryToTake),
            (None, Some(&immediate), false, NodeChoice::NotOurs),
            (None, None, true, NodeChoice::NotOurs),
        ];
        for (node, class, immediate_binding, want) in cases {
            assert_eq!(
                choose(&selected(node), class, "node-a", immediate_binding),
                want,
                "{node:?} {:?} {immediate_binding}",
                class.and_then(|c| c.volume_binding_mode.clone())
            );
        }
    }

    #[test]
    fn attempts_back_off_up_to_the_maximum_with_jitter_below_the_base() {
        let (base, max) = (Duration::from_secs(20), Duration::from_secs(60));
        let cases = [
            (0, 0.0, 20),
            (0, 0.5, 10),
            (0, 1.0, 0),
            (1, 0.0, 40),
            (2, 0.0, 60),
            (2, 0.25, 55),
            (40, 0.0, 60),
        ];
        for (failures, jitter, want) in cases {
            assert_eq!(
                take_delay(failures, base, max, jitter),
                Duration::from_secs(want),
                "{failures} {jitter}"
            );
        }
    }
}
