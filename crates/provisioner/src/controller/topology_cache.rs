//! The topology requirement computed for a claim, kept so that its retries send identical
//! CreateVolume requests. An entry is keyed by the claim and dropped when the claim is
//! provisioned or gone, or its CreateVolume fails for good or is rescheduled (as upstream's
//! per-claim cache), so the cache holds only claims in progress.

use parking_lot::Mutex;
use std::collections::HashMap;

use crate::controller::ClaimKey;
use crate::decide::topology::Requirement;

struct Entry {
    uid: String,
    node: String,
    requirement: Option<Requirement>,
}

/// The cache.
#[derive(Default)]
pub(crate) struct TopologyCache {
    entries: Mutex<HashMap<ClaimKey, Entry>>,
}

impl TopologyCache {
    /// The requirement computed for this claim (UID) and selected node, if any.
    pub(crate) fn get(&self, key: &ClaimKey, uid: &str, node: &str) -> Option<Option<Requirement>> {
        self.entries
            .lock()
            .get(key)
            .filter(|e| e.uid == uid && e.node == node)
            .map(|e| e.requirement.clone())
    }

    /// Keeps a requirement (replacing one for an older UID or another node).
    pub(crate) fn insert(
        &self,
        key: ClaimKey,
        uid: &str,
        node: &str,
        requirement: Option<Requirement>,
    ) {
        self.entries.lock().insert(
            key,
            Entry {
                uid: uid.to_string(),
                node: node.to_string(),
                requirement,
            },
        );
    }

    /// Drops the claim's entry.
    pub(crate) fn forget(&self, key: &ClaimKey) {
        self.entries.lock().remove(key);
    }

    /// Claims with an entry.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_match_uid_and_node_and_are_dropped_by_claim() {
        let cache = TopologyCache::default();
        let key = ClaimKey::new(Some("ns"), "c");
        cache.insert(key.clone(), "uid-1", "node-a", None);
        assert_eq!(cache.get(&key, "uid-1", "node-a"), Some(None));
        assert_eq!(cache.get(&key, "uid-1", "node-b"), None, "another node");
        assert_eq!(
            cache.get(&key, "uid-2", "node-a"),
            None,
            "a new claim of the same name"
        );
        // A new node replaces the entry rather than adding one.
        cache.insert(key.clone(), "uid-1", "node-b", None);
        assert_eq!(cache.len(), 1);
        cache.forget(&key);
        assert_eq!(cache.len(), 0, "provisioned or gone: nothing left behind");
    }
}
