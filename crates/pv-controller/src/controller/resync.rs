//! The periodic passes (every `--pvclaimbinder-sync-period`, kube-controller-manager's
//! resync): volumes whose claim is missing, and unbound claims an unbound volume may fit.

use kube::runtime::reflector::ObjectRef;

use super::{PvController, claim_ref};
use crate::decide::binder::{claim_is_gone, may_take_unbound_volume};
use crate::index::claim_named_by;

impl PvController {
    /// Queues every volume whose claimRef names a claim that is missing or has another UID.
    /// A missed event must not leak a volume; kube-controller-manager re-syncs every 15 s.
    /// Uses [`WorkQueue::add`], so a volume waiting out a backoff keeps waiting.
    pub fn resync_orphans(&self) -> usize {
        if let Some(ops) = &self.operations {
            // Objects deleted while a watch was away got no delete event: their operations
            // end here (a volume's deletion is its delete operation's end).
            ops.sweep(
                |claim| self.claims.get(&claim_ref(claim)).is_some(),
                |volume| self.volumes.get(&ObjectRef::new(volume)).is_some(),
            );
        }
        let mut queued = 0;
        for pv in self.volumes.state() {
            let Some((ns, name)) = claim_named_by(&pv) else {
                continue;
            };
            let claim = self.claims.get(&ObjectRef::new(&name).within(&ns));
            if claim_is_gone(&pv, claim.as_deref())
                && let Some(pv_name) = &pv.metadata.name
            {
                self.volume_queue.add(pv_name.clone());
                queued += 1;
            }
        }
        queued
    }

    /// Queues the unbound claims a volume no claimRef names may fit (of its class, or of none
    /// for a class-less volume): kube-controller-manager looks at every claim at each resync,
    /// so a claim left to an external provisioner (which may never come, or refuse it) is bound
    /// to a volume an administrator makes meanwhile. The claims a binding just missed are
    /// queued by their own events; this pass costs nothing while no volume is unbound. Uses
    /// [`WorkQueue::add`], so a claim waiting out a backoff keeps waiting.
    pub fn resync_unbound(&self) -> usize {
        let classes: std::collections::HashSet<String> = self
            .index
            .unbound()
            .iter()
            .filter_map(|name| self.volumes.get(&ObjectRef::new(name)))
            .map(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone())
                    .unwrap_or_default()
            })
            .collect();
        if classes.is_empty() {
            return 0;
        }
        let mut queued = 0;
        for claim in self.claims.state() {
            if may_take_unbound_volume(&claim, &classes) {
                self.claim_queue.add(ObjectRef::from_obj(&*claim));
                queued += 1;
            }
        }
        queued
    }
}
