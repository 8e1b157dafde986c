//! The VolumeAttachments naming each PV, fed by the attachment watch: a PV waits for its
//! attachments before its volume is deleted, and looking them up must not scan every
//! attachment for each of a mass deletion's volumes.

use std::collections::HashSet;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use parking_lot::Mutex;
use sidecar_kit::key::ObjectKey;
use sidecar_kit::watch_index::{Referrers, WatchIndex};

/// Attachment names by the PV they name.
#[derive(Debug, Default)]
pub(crate) struct AttachmentsByVolume {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    attachments: Referrers<String>,
    /// Volumes whose last attachment a re-list found gone (their PVs may be waiting for it).
    freed: Vec<String>,
}

impl AttachmentsByVolume {
    /// An attachment naming the PV `volume`, if any.
    pub(crate) fn naming(&self, volume: &str) -> Option<String> {
        let inner = self.inner.lock();
        inner.attachments.of(&volume.to_string()).next().cloned()
    }

    /// The volumes whose last attachment the last re-lists found deleted while the watch was
    /// away (a deletion event wakes its PV; these had none), once.
    pub(crate) fn take_freed(&self) -> Vec<String> {
        std::mem::take(&mut self.inner.lock().freed)
    }
}

impl WatchIndex<VolumeAttachment> for AttachmentsByVolume {
    fn apply(&self, va: &VolumeAttachment) {
        let Some(name) = va.metadata.name.as_deref() else {
            return;
        };
        // A volume it no longer names gets its PV's own events; one left with no attachment
        // is not waited for by a PV whose deletion started after this.
        let mut inner = self.inner.lock();
        match &va.spec.source.persistent_volume_name {
            Some(volume) => inner.attachments.link(name, volume.clone()),
            None => {
                let _ = inner.attachments.unlink(name);
            }
        }
    }

    fn delete(&self, va: &VolumeAttachment) {
        if let Some(name) = &va.metadata.name {
            // The watch's deletion event wakes the PV itself.
            let _ = self.inner.lock().attachments.unlink(name);
        }
    }

    fn reset(&self, keep: &HashSet<ObjectKey>) {
        let mut inner = self.inner.lock();
        let freed = inner.attachments.retain_listed(keep);
        inner.freed.extend(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use sidecar_kit::testing::attachment;
    use sidecar_kit::watch_index::Feed;

    #[test]
    fn attachments_are_found_by_their_volume_until_deleted_or_gone_from_a_relist() {
        let (feed, index) = (Feed::default(), AttachmentsByVolume::default());
        let va = |name: &str, pv: &str| attachment(name, "d", "n1", pv).build();
        feed.event(&Event::Apply(va("a", "pv-1")), &index);
        feed.event(&Event::Apply(va("b", "pv-2")), &index);
        assert_eq!(index.naming("pv-1").as_deref(), Some("a"));
        // An attachment that names another volume now.
        feed.event(&Event::Apply(va("a", "pv-3")), &index);
        assert_eq!(index.naming("pv-1"), None);
        assert_eq!(index.naming("pv-3").as_deref(), Some("a"));
        feed.event(&Event::Delete(va("a", "pv-3")), &index);
        assert_eq!(index.naming("pv-3"), None);
        // b is deleted while the watch is away: the re-list drops it.
        feed.event(&Event::Init, &index);
        feed.event(&Event::InitDone, &index);
        assert_eq!(index.naming("pv-2"), None);
        assert_eq!(
            index.take_freed(),
            vec!["pv-2".to_string()],
            "its PV is woken"
        );
        assert!(index.take_freed().is_empty(), "once");
    }
}
