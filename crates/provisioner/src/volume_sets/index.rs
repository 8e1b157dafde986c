//! The set manager's index of volumes: every labelled PV from the watch, decoded, and the
//! volumes the manager made whose PV the index does not show yet. A pass over a set reads its
//! candidates here instead of decoding every PV of the provisioner's compact cache (a pool is
//! most of its set's volumes, read on every pass).
//!
//! A volume the manager makes is counted in flight, then as made (noted before its PV is
//! written), then as a member once its PV is both in the index and in the compact cache (a
//! relist shows it to the index before the cache swaps in the new list). The last two are read
//! under one lock, so a pass sees a volume in one or the other, never in neither (which would
//! make one volume too many). A pass may see it both in flight and as made or a member: it
//! counts names ([`super::decide::being_made`]), not entries. A delete event ends the note.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;

use super::decide::candidates;
use super::types::PersistentVolumeSet;

/// How long a volume the manager made is counted before the index shows it (after that it is
/// taken to have been deleted before the watch saw it).
pub const UNSEEN_FOR: Duration = Duration::from_secs(60);

/// What a pass over a set reads ([`VolumeIndex::view`]).
#[derive(Debug)]
pub(crate) struct PassView {
    /// The volumes to read; `None`: every cached volume.
    pub(crate) volumes: Option<Vec<Arc<PersistentVolume>>>,
    /// The names of volumes made for the set that the index and the cache do not both show
    /// yet, sorted.
    pub(crate) unseen: Vec<String>,
}

/// The labelled volumes and the volumes made but not seen yet.
#[derive(Debug, Default)]
pub(crate) struct VolumeIndex {
    /// Every labelled volume, by name, as its last watch event showed it.
    labelled: HashMap<String, Arc<PersistentVolume>>,
    /// Volumes made, by name, with their set and when, until the index shows them.
    made: HashMap<String, (String, Instant)>,
}

impl VolumeIndex {
    /// A watch event for the volume `name`: a labelled volume is indexed, one that went or lost
    /// its labels is not.
    pub(crate) fn volume_changed(&mut self, name: &str, pv: &PersistentVolume, gone: bool) {
        // Made volumes are noted before their PV is written, so a delete follows the note.
        if gone {
            self.made.remove(name);
        }
        if !gone && pv.metadata.labels.as_ref().is_some_and(|l| !l.is_empty()) {
            self.labelled.insert(name.to_string(), Arc::new(pv.clone()));
        } else {
            self.labelled.remove(name);
        }
    }

    /// The end of a re-list: labelled volumes for which `kept` does not hold were deleted
    /// while the watch was away and are forgotten. Returns how many.
    pub(crate) fn reset(&mut self, kept: impl Fn(&str) -> bool) -> usize {
        let before = self.labelled.len();
        self.labelled.retain(|name, _| kept(name));
        before - self.labelled.len()
    }

    /// Notes a volume made for `set` at `now`, before its PV is written: it counts as the set's
    /// until a pass finds its PV in the index and the cache, or its delete event arrives.
    pub(crate) fn made(&mut self, set: &str, volume: &str, now: Instant) {
        self.made.insert(volume.to_string(), (set.to_string(), now));
    }

    /// Takes back the note of a volume whose PV could not be written (it is still in flight).
    pub(crate) fn unmade(&mut self, volume: &str) {
        self.made.remove(volume);
    }

    /// What a pass over the set `name` reads at `now`: the volumes it must read
    /// ([`candidates`]) of those `cached` still holds (a relist drops a volume deleted meanwhile
    /// without a delete event), `None` meaning every volume; and the volumes made for the set
    /// that the index and `cached` do not both show yet. Made volumes both show, or older than
    /// [`UNSEEN_FOR`], are forgotten.
    pub(crate) fn view(
        &mut self,
        name: &str,
        set: Option<&PersistentVolumeSet>,
        cached: impl Fn(&str) -> bool,
        now: Instant,
    ) -> PassView {
        let labelled = &self.labelled;
        self.made.retain(|volume, (_, at)| {
            !(labelled.contains_key(volume) && cached(volume))
                && now.saturating_duration_since(*at) < UNSEEN_FOR
        });
        let mut unseen: Vec<String> = self
            .made
            .iter()
            .filter(|(_, (of, _))| of == name)
            .map(|(volume, _)| volume.clone())
            .collect();
        unseen.sort();
        let volumes = candidates(
            name,
            set,
            labelled
                .iter()
                .filter_map(|(volume, pv)| Some((volume, pv.metadata.labels.as_ref()?))),
        )
        .map(|names| {
            names
                .iter()
                .filter(|volume| cached(volume))
                .filter_map(|volume| labelled.get(volume).cloned())
                .collect()
        });
        PassView { volumes, unseen }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume_sets::types::LABEL_SET;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn labelled(name: &str, set: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([(LABEL_SET.to_string(), set.to_string())])),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        }
    }

    fn names(view: &PassView) -> Vec<String> {
        let mut names: Vec<String> = view
            .volumes
            .iter()
            .flatten()
            .filter_map(|pv| pv.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    /// The watch shows `name`, labelled as made by `set`.
    fn watched(index: &mut VolumeIndex, name: &str, set: &str) {
        index.volume_changed(name, &labelled(name, set), false);
    }

    /// A pass over the set `fast` with the compact cache showing everything: the volumes it
    /// reads and the made ones it counts apart.
    fn pass(index: &mut VolumeIndex, now: Instant) -> (Vec<String>, usize) {
        let view = index.view("fast", None, |_| true, now);
        (names(&view), view.unseen.len())
    }

    #[test]
    fn a_made_volume_is_counted_once_before_and_after_its_pv_event() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        watched(&mut index, "fast-1", "fast");
        index.made("fast", "fast-2", now);
        // The compact cache already shows fast-2; the index does not: it is still unseen.
        assert_eq!(pass(&mut index, now), (vec!["fast-1".into()], 1));
        watched(&mut index, "fast-2", "fast");
        assert_eq!(
            pass(&mut index, now),
            (vec!["fast-1".into(), "fast-2".into()], 0)
        );
    }

    #[test]
    fn a_pv_event_before_the_volume_is_noted_as_made_counts_it_once() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        watched(&mut index, "fast-1", "fast");
        index.made("fast", "fast-1", now);
        assert_eq!(pass(&mut index, now), (vec!["fast-1".into()], 0));
    }

    #[test]
    fn made_volumes_are_counted_per_set_and_forgotten_after_a_while() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        index.made("fast", "fast-1", now);
        index.made("slow", "slow-1", now);
        assert_eq!(index.view("fast", None, |_| true, now).unseen, ["fast-1"]);
        assert_eq!(index.view("slow", None, |_| true, now).unseen, ["slow-1"]);
        let later = now + UNSEEN_FOR;
        assert!(index.view("fast", None, |_| true, later).unseen.is_empty());
        assert!(index.view("slow", None, |_| true, later).unseen.is_empty());
    }

    /// The race a loaded machine showed: the PV's events (made, then deleted by a pass that
    /// counted it twice) came before the create worker noted it as made. The note is now made
    /// before the PV is written, and its delete event ends it: a volume that is gone is not
    /// counted.
    #[test]
    fn a_made_volume_whose_pv_went_is_not_counted() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        index.made("fast", "fast-1", now);
        watched(&mut index, "fast-1", "fast");
        index.volume_changed("fast-1", &labelled("fast-1", "fast"), true);
        assert_eq!(pass(&mut index, now), (Vec::<String>::new(), 0));
    }

    /// During a relist the index sees the PV before the compact cache swaps in the new list:
    /// the note holds until both show it.
    #[test]
    fn a_made_volume_counts_until_the_cache_shows_it_too() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        index.made("fast", "fast-1", now);
        watched(&mut index, "fast-1", "fast");
        let view = index.view("fast", None, |volume| volume != "fast-1", now);
        assert_eq!((names(&view), view.unseen.len()), (Vec::<String>::new(), 1));
        assert_eq!(pass(&mut index, now), (vec!["fast-1".into()], 0));
    }

    #[test]
    fn a_note_taken_back_is_not_counted() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        index.made("fast", "fast-1", now);
        index.made("fast", "fast-2", now);
        assert_eq!(
            index.view("fast", None, |_| true, now).unseen,
            ["fast-1", "fast-2"]
        );
        index.unmade("fast-1");
        assert_eq!(index.view("fast", None, |_| true, now).unseen, ["fast-2"]);
    }

    #[test]
    fn volumes_gone_from_the_watch_or_the_cache_are_not_read() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        for name in ["fast-1", "fast-2", "fast-3"] {
            watched(&mut index, name, "fast");
        }
        index.volume_changed("fast-2", &labelled("fast-2", "fast"), true);
        let mut unlabelled = labelled("fast-3", "fast");
        unlabelled.metadata.labels = None;
        index.volume_changed("fast-3", &unlabelled, false);
        watched(&mut index, "other", "slow");
        assert_eq!(pass(&mut index, now).0, vec!["fast-1".to_string()]);
        let view = index.view("fast", None, |volume| volume != "fast-1", now);
        assert!(names(&view).is_empty());
    }

    #[test]
    fn a_relist_forgets_labelled_volumes_deleted_while_the_watch_was_away() {
        let now = Instant::now();
        let mut index = VolumeIndex::default();
        watched(&mut index, "fast-1", "fast");
        watched(&mut index, "fast-2", "fast");
        assert_eq!(index.reset(|name| name == "fast-2"), 1);
        // `view` also filters by the compact cache; here the cache shows everything, so only
        // the reset can have dropped fast-1.
        assert_eq!(pass(&mut index, now), (vec!["fast-2".into()], 0));
        assert_eq!(index.reset(|_| true), 0);
    }
}
