//! The periodic reconcile against the driver (LIST_VOLUMES_PUBLISHED_NODES): attachments whose
//! `status.attached` the driver contradicts are synced again with force.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;

use kube::runtime::reflector::ObjectRef;

use super::Attacher;
use crate::decide::reconcile::drift;

impl Attacher {
    /// One pass, bounded by `--timeout`.
    pub(super) async fn reconcile_pass(self: &Arc<Self>) {
        // Taken before the listing: an attach or detach that ends while the driver lists
        // changes its attachment's version, and the forced sync of that version then does not
        // stand.
        let attachments = self.attachments.state();
        let published = match tokio::time::timeout(self.cfg.timeout, self.driver.published()).await
        {
            Ok(Ok(published)) => published,
            Ok(Err(error)) => {
                tracing::warn!(%error, "reconcile: failed to ListVolumes");
                return;
            }
            Err(_) => {
                tracing::warn!(timeout = ?self.cfg.timeout, "reconcile: ListVolumes took longer than --timeout");
                return;
            }
        };
        let volumes: Vec<_> = attachments
            .iter()
            .filter_map(|va| va.spec.source.persistent_volume_name.as_ref())
            .filter_map(|name| self.volumes.get(&ObjectRef::new(name)))
            .collect();
        let volumes: HashMap<&str, &PersistentVolume> = volumes
            .iter()
            .map(|pv| (pv.metadata.name.as_deref().unwrap_or_default(), pv.as_ref()))
            .collect();
        let csinodes = self.csinodes.state();
        let csinodes: HashMap<&str, &CSINode> = csinodes
            .iter()
            .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n.as_ref()))
            .collect();
        let found = drift(
            attachments.iter().map(AsRef::as_ref),
            |name| volumes.get(name).copied(),
            |node| csinodes.get(node).copied(),
            &self.cfg.driver.name,
            &published,
        );
        let judged: HashMap<&str, Option<String>> = attachments
            .iter()
            .map(|va| {
                let name = va.metadata.name.as_deref().unwrap_or_default();
                (name, va.metadata.resource_version.clone())
            })
            .collect();
        for name in found {
            tracing::info!(attachment = %name, "reconcile: the driver disagrees with status.attached; syncing again");
            let version = judged.get(name.as_str()).cloned().flatten();
            self.forced.lock().insert(name.clone(), version);
            if let Some(va) = self.attachment(&name) {
                self.route(&va, true);
            }
        }
    }
}
