//! What a sync works from: the VolumeAttachment held against the other queue's worker, whether
//! it is ours and forced by the reconcile, and the plan the decisions make of it and the
//! objects it names (from the caches, read live when missing there).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::runtime::reflector::ObjectRef;

use super::Attacher;
use crate::decide::attach::{self, Plan, World};
use crate::decide::{self, reconcile};

/// Holds a VolumeAttachment's name in the busy set while a worker handles it.
pub(super) struct Busy<'a> {
    attacher: &'a Attacher,
    name: String,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.attacher.busy.lock().remove(&self.name);
    }
}

impl Attacher {
    /// Holds `name` for this worker; None when the other queue's worker has it.
    pub(super) fn hold(&self, name: &str) -> Option<Busy<'_>> {
        self.busy.lock().insert(name.to_string()).then(|| Busy {
            attacher: self,
            name: name.to_string(),
        })
    }

    /// The cached VolumeAttachment `name` when it is ours; when it is gone, its forced sync
    /// is forgotten.
    pub(super) fn ours(&self, name: &str) -> Option<Arc<VolumeAttachment>> {
        let Some(va) = self.attachment(name) else {
            self.forced.lock().remove(name);
            return None;
        };
        decide::ours(&va, &self.cfg.driver.name).then_some(va)
    }

    /// Whether this sync of `va` runs with the force the reconcile asked for; a judgement
    /// that no longer stands is dropped (the next pass judges again).
    pub(super) fn forced(&self, va: &VolumeAttachment) -> bool {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let pending = self.marked.lock().contains_key(name);
        let mut forced = self.forced.lock();
        let Some(judged) = forced.get(name) else {
            return false;
        };
        let current = va.metadata.resource_version.as_deref();
        if reconcile::force_stands(judged.as_deref(), current, pending) {
            return true;
        }
        tracing::debug!(attachment = %name, "the reconcile judged a version since replaced; syncing without force");
        forced.remove(name);
        false
    }

    /// The plan for `va` from the caches. A PV or CSINode the cache lacks is read live
    /// before the plan says it is missing: its watch event may simply be behind the
    /// VolumeAttachment's (a read, instead of an error written to the status and a retry).
    pub(super) async fn plan_for(&self, va: &VolumeAttachment, force: bool) -> Plan {
        let mut pv = match &va.spec.source.persistent_volume_name {
            Some(name) => self
                .volumes
                .get(&ObjectRef::new(name))
                .map(|p| (*p).clone()),
            None => None,
        };
        if pv.is_none()
            && let Some(name) = &va.spec.source.persistent_volume_name
        {
            pv = Api::<PersistentVolume>::all(self.client.clone())
                .get_opt(name)
                .await
                .ok()
                .flatten();
        }
        let mut csinode = self
            .csinodes
            .get(&ObjectRef::new(&va.spec.node_name))
            .map(|n| (*n).clone());
        if csinode.is_none() {
            csinode = Api::<CSINode>::all(self.client.clone())
                .get_opt(&va.spec.node_name)
                .await
                .ok()
                .flatten();
        }
        // The Node is read live, and only when the plan will look for the id there (its
        // CSINode has none and the plan calls the driver). Without `get` on nodes (upstream's
        // RBAC does not grant it), the Node counts as absent.
        let node = if attach::needs_node(va, csinode.as_ref(), &self.cfg.driver, force) {
            match Api::<Node>::all(self.client.clone())
                .get_opt(&va.spec.node_name)
                .await
            {
                Ok(node) => node,
                Err(error) => {
                    tracing::debug!(node = %va.spec.node_name, %error, "cannot read the Node for its node id annotation");
                    None
                }
            }
        } else {
            None
        };
        attach::plan(
            va,
            World {
                volume: pv.as_ref(),
                csinode: csinode.as_ref(),
                node: node.as_ref(),
                driver: &self.cfg.driver,
                options: &self.cfg.options,
            },
            force,
        )
    }
}
