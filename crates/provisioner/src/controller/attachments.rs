//! The VolumeAttachments naming each PV, fed by the attachment watch: a PV waits for its
//! attachments before its volume is deleted, and looking them up must not scan every
//! attachment for each of a mass deletion's volumes.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use parking_lot::Mutex;
use sidecar_kit::key::ObjectKey;
use sidecar_kit::watch_index::{WatchIndex, listed};

/// Attachment names by the PV they name.
#[derive(Debug, Default)]
pub(crate) struct AttachmentsByVolume {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_volume: HashMap<String, HashSet<String>>,
    volume_of: HashMap<String, String>,
    /// Volumes whose last attachment a re-list found gone (their PVs may be waiting for it).
    freed: Vec<String>,
}

impl Inner {
    /// Forgets an attachment; returns its volume when no attachment names it any more.
    fn unlink(&mut self, attachment: &str) -> Option<String> {
        let volume = self.volume_of.remove(attachment)?;
        let names = self.by_volume.get_mut(&volume)?;
        names.remove(attachment);
        if !names.is_empty() {
            return None;
        }
        self.by_volume.remove(&volume);
        Some(volume)
    }
}

impl AttachmentsByVolume {
    /// An attachment naming the PV `volume`, if any.
    pub(crate) fn naming(&self, volume: &str) -> Option<String> {
        self.inner
            .lock()
            .by_volume
            .get(volume)
            .and_then(|names| names.iter().next().cloned())
    }

    /// The volumes whose last attachment the last re-lists found deleted while the watch was
    /// away (a deletion event wakes its PV; these had none), once.
    pub(crate) fn take_freed(&self) -> Vec<String> {
        std::mem::take(&mut self.inner.lock().freed)
    }
}

impl WatchIndex<VolumeAttachment> for AttachmentsByVolume {
    fn apply(&self, va: &VolumeAttachment) {
        let Some(name) = va.metadata.name.clone() else {
            return;
        };
        let mut inner = self.inner.lock();
        // A volume it no longer names keeps its other attachments; one left with none gets
        // its PV's watch event of its own when that changes.
        let _ = inner.unlink(&name);
        if let Some(volume) = va.spec.source.persistent_volume_name.clone() {
            inner
                .by_volume
                .entry(volume.clone())
                .or_default()
                .insert(name.clone());
            inner.volume_of.insert(name, volume);
        }
    }

    fn delete(&self, va: &VolumeAttachment) {
        if let Some(name) = &va.metadata.name {
            // The watch's deletion event wakes the PV itself.
            let _ = self.inner.lock().unlink(name);
        }
    }

    fn reset(&self, keep: &HashSet<ObjectKey>) {
        let mut inner = self.inner.lock();
        let gone: Vec<String> = inner
            .volume_of
            .keys()
            .filter(|name| !listed(keep, None, name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(volume) = inner.unlink(&name) {
                inner.freed.push(volume);
            }
        }
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
