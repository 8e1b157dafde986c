//! Volumes by the claim their claimRef names, so that every event of a claim requeues every
//! volume that names it, whether or not the claim names the volume back (a volume saved
//! pre-bound by a provisioner whose claim is deleted before binding completes). It also keeps
//! the volumes no claimRef names, so that a claim looking for a match reads those (and the ones
//! naming it) instead of every volume.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::key::ObjectKey;
use sidecar_kit::watch_index::{Referrers, WatchIndex, listed};

/// `namespace/name` of a claim.
pub type ClaimName = (String, String);

#[derive(Debug, Default)]
struct Maps {
    by_claim: Referrers<ClaimName>,
    unbound: BTreeSet<String>,
}

/// The index. Fed by the volume watch, read by claim events.
#[derive(Debug, Default)]
pub struct ClaimRefIndex {
    maps: Mutex<Maps>,
}

/// The claim a volume's claimRef names.
pub fn claim_named_by(pv: &PersistentVolume) -> Option<ClaimName> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((r.namespace.clone()?, r.name.clone()?))
}

impl ClaimRefIndex {
    fn unlink(maps: &mut Maps, volume: &str) {
        maps.unbound.remove(volume);
        // Claims are requeued by their own events, not when a volume stops naming them.
        let _ = maps.by_claim.unlink(volume);
    }

    /// Volumes whose claimRef names this claim.
    pub fn volumes_of(&self, namespace: &str, name: &str) -> Vec<String> {
        let key = (namespace.to_string(), name.to_string());
        self.maps.lock().by_claim.of(&key).cloned().collect()
    }

    /// The volumes a claim without `spec.volumeName` may be decided on: those whose claimRef
    /// names it, then every volume no claimRef names.
    pub fn candidates_for(&self, namespace: &str, name: &str) -> Vec<String> {
        let maps = self.maps.lock();
        let key = (namespace.to_string(), name.to_string());
        maps.by_claim
            .of(&key)
            .chain(maps.unbound.iter())
            .cloned()
            .collect()
    }

    /// The volumes no claimRef names.
    pub fn unbound(&self) -> Vec<String> {
        self.maps.lock().unbound.iter().cloned().collect()
    }

    /// Volumes indexed (for tests and metrics).
    pub fn len(&self) -> usize {
        self.maps.lock().by_claim.len()
    }

    /// Whether no volume names a claim.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WatchIndex<PersistentVolume> for ClaimRefIndex {
    /// A volume was added or changed.
    fn apply(&self, pv: &PersistentVolume) {
        let Some(name) = pv.metadata.name.clone() else {
            return;
        };
        let claim = claim_named_by(pv);
        let mut maps = self.maps.lock();
        Self::unlink(&mut maps, &name);
        match claim {
            Some(claim) => maps.by_claim.link(&name, claim),
            None => {
                maps.unbound.insert(name);
            }
        }
    }

    /// A volume was deleted.
    fn delete(&self, pv: &PersistentVolume) {
        if let Some(name) = &pv.metadata.name {
            Self::unlink(&mut self.maps.lock(), name);
        }
    }

    /// The end of a re-list: volumes it did not show are dropped.
    fn reset(&self, keep: &HashSet<ObjectKey>) {
        let mut maps = self.maps.lock();
        let gone: Vec<String> = maps
            .by_claim
            .names()
            .chain(maps.unbound.iter())
            .filter(|name| !listed(keep, None, name))
            .cloned()
            .collect();
        for name in gone {
            Self::unlink(&mut maps, &name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    fn pv(name: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
        let volume = sidecar_kit::testing::volume(name);
        match claim {
            Some((ns, n)) => volume.claim_ref(ns, n, Some("u")).build(),
            None => volume.build(),
        }
    }

    #[test]
    fn a_claim_is_missing_when_absent_or_replaced() {
        let named = pv("v", Some(("ns", "c1")));
        let claim = |uid: &str| -> PersistentVolumeClaim {
            let mut c = sidecar_kit::testing::claim("c1", "");
            c.metadata.namespace = Some("ns".into());
            c.metadata.uid = Some(uid.into());
            c
        };
        // Pre-bound by name only (no UID): waiting for its claim, never "missing".
        let pre_bound = sidecar_kit::testing::volume("p")
            .claim_ref("ns", "c1", None)
            .build();
        let cases = [
            (&named, None, true),
            (&named, Some(claim("u")), false),
            (&named, Some(claim("other")), true),
            (&pv("free", None), None, false),
            (&pre_bound, None, false),
            (&pre_bound, Some(claim("any")), false),
        ];
        for (volume, present, want) in cases {
            assert_eq!(
                crate::decide::binder::claim_is_gone(volume, present.as_ref()),
                want,
                "{present:?}"
            );
        }
    }

    #[test]
    fn volumes_follow_their_claim_ref_through_changes_and_deletion() {
        let index = ClaimRefIndex::default();
        index.apply(&pv("a", Some(("ns", "c1"))));
        index.apply(&pv("b", Some(("ns", "c1"))));
        index.apply(&pv("free", None));
        assert_eq!(index.volumes_of("ns", "c1"), vec!["a", "b"]);
        assert_eq!(index.candidates_for("ns", "c1"), vec!["a", "b", "free"]);
        assert_eq!(index.candidates_for("ns", "c9"), vec!["free"]);
        // Rebinding moves the volume; unbinding drops it.
        index.apply(&pv("a", Some(("other", "c2"))));
        index.apply(&pv("b", None));
        assert!(index.volumes_of("ns", "c1").is_empty());
        assert_eq!(index.candidates_for("ns", "c1"), vec!["b", "free"]);
        index.delete(&pv("b", None));
        index.apply(&pv("free", Some(("ns", "c9"))));
        assert_eq!(index.candidates_for("ns", "c1"), Vec::<String>::new());
        assert_eq!(index.volumes_of("other", "c2"), vec!["a"]);
        index.delete(&pv("a", Some(("other", "c2"))));
        index.delete(&pv("free", Some(("ns", "c9"))));
        assert!(index.is_empty());
        assert!(index.candidates_for("ns", "c9").is_empty());
    }

    #[test]
    fn a_relist_forgets_volumes_deleted_while_the_watch_was_away() {
        use kube::runtime::watcher::Event;
        let (feed, index) = (
            sidecar_kit::watch_index::Feed::default(),
            ClaimRefIndex::default(),
        );
        feed.event(&Event::Apply(pv("gone", Some(("ns", "c1")))), &index);
        feed.event(&Event::Apply(pv("gone-free", None)), &index);
        feed.event(&Event::Apply(pv("kept", Some(("ns", "c1")))), &index);
        feed.event(&Event::Init, &index);
        feed.event(&Event::InitApply(pv("kept", Some(("ns", "c1")))), &index);
        feed.event(&Event::InitDone, &index);
        assert_eq!(index.volumes_of("ns", "c1"), vec!["kept"]);
        assert_eq!(index.candidates_for("ns", "c1"), vec!["kept"]);
        assert_eq!(index.len(), 1);
    }
}
