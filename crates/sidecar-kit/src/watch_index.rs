//! Indexes a controller keeps by hand beside a reflector's store (volumes by the claim they
//! name, a set's labelled volumes, capacity objects by segment, what each object looked like
//! when last queued), fed from the same watch.
//!
//! A watch that restarts lists again, and an object deleted while it was away gets no delete
//! event: an index fed only by applies and deletes keeps it for ever. [`Feed`] gives every such
//! index the reflector's shape: objects applied and deleted one by one, and at the end of a
//! re-list a reset to exactly what the list showed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;

use kube::Resource;
use kube::runtime::watcher;
use parking_lot::Mutex;

use crate::key::ObjectKey;

/// An index fed from a watch of `K`.
pub trait WatchIndex<K> {
    /// `object` was added or changed; during a re-list, each object the list shows, as it
    /// arrives.
    fn apply(&self, object: &K);

    /// `object` was deleted.
    fn delete(&self, object: &K);

    /// A re-list ended. `listed` holds the key of every object it showed (each one applied
    /// already); whatever else the index holds was deleted while the watch was away.
    fn reset(&self, listed: &HashSet<ObjectKey>);
}

/// Feeds indexes from one watch's events: remembers the keys a re-list shows and resets each
/// index at its end. One feed per watch.
#[derive(Debug, Default)]
pub struct Feed {
    /// The keys of the re-list in progress.
    relist: Mutex<Option<HashSet<ObjectKey>>>,
}

impl Feed {
    /// Passes `event` to `index`.
    pub fn event<K: Resource>(&self, event: &watcher::Event<K>, index: &impl WatchIndex<K>) {
        match event {
            watcher::Event::Init => *self.relist.lock() = Some(HashSet::new()),
            watcher::Event::InitApply(object) => {
                if let Some(name) = object.meta().name.as_deref() {
                    let key = ObjectKey::new(object.meta().namespace.as_deref(), name);
                    self.relist.lock().get_or_insert_default().insert(key);
                }
                index.apply(object);
            }
            watcher::Event::InitDone => {
                let listed = self.relist.lock().take().unwrap_or_default();
                index.reset(&listed);
            }
            watcher::Event::Apply(object) => index.apply(object),
            watcher::Event::Delete(object) => index.delete(object),
        }
    }
}

/// Whether `listed` shows the object `namespace`/`name`.
pub fn listed(listed: &HashSet<ObjectKey>, namespace: Option<&str>, name: &str) -> bool {
    listed.contains(crate::key::key_text(namespace, name).as_ref())
}

/// Cluster-scoped objects by the key each one refers to (volumes by the claim their claimRef
/// names, attachments by their PV), kept both ways so that a change of reference unlinks the
/// old one. A plain map: its owner holds it under its own lock, with whatever else it keeps.
#[derive(Debug, Clone)]
pub struct Referrers<K> {
    by_key: HashMap<K, BTreeSet<String>>,
    key_of: HashMap<String, K>,
}

impl<K> Default for Referrers<K> {
    fn default() -> Self {
        Referrers {
            by_key: HashMap::new(),
            key_of: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Referrers<K> {
    /// `name` now refers to `key`.
    pub fn link(&mut self, name: &str, key: K) {
        self.unlink(name);
        self.by_key
            .entry(key.clone())
            .or_default()
            .insert(name.to_string());
        self.key_of.insert(name.to_string(), key);
    }

    /// `name` refers to nothing any more; returns its key when no name refers to it now.
    pub fn unlink(&mut self, name: &str) -> Option<K> {
        let key = self.key_of.remove(name)?;
        let names = self.by_key.get_mut(&key)?;
        names.remove(name);
        if !names.is_empty() {
            return None;
        }
        self.by_key.remove(&key);
        Some(key)
    }

    /// The names referring to `key`, in order.
    pub fn of(&self, key: &K) -> impl Iterator<Item = &String> {
        self.by_key.get(key).into_iter().flatten()
    }

    /// The names that refer to something.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.key_of.keys()
    }

    /// How many names refer to something.
    pub fn len(&self) -> usize {
        self.key_of.len()
    }

    /// Whether no name refers to anything.
    pub fn is_empty(&self) -> bool {
        self.key_of.is_empty()
    }

    /// The end of a re-list of cluster-scoped objects: names it did not show are unlinked.
    /// Returns the keys no name refers to any more.
    pub fn retain_listed(&mut self, keep: &HashSet<ObjectKey>) -> Vec<K> {
        let gone: Vec<String> = self
            .names()
            .filter(|name| !listed(keep, None, name))
            .cloned()
            .collect();
        gone.iter().filter_map(|name| self.unlink(name)).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use std::collections::BTreeSet;

    /// Names, as an index of the objects of one namespace.
    #[derive(Default)]
    struct Names(Mutex<BTreeSet<String>>);

    impl WatchIndex<ConfigMap> for Names {
        fn apply(&self, object: &ConfigMap) {
            self.0.lock().insert(object.metadata.name.clone().unwrap());
        }
        fn delete(&self, object: &ConfigMap) {
            self.0
                .lock()
                .remove(object.metadata.name.as_deref().unwrap());
        }
        fn reset(&self, keep: &HashSet<ObjectKey>) {
            self.0.lock().retain(|name| listed(keep, Some("ns"), name));
        }
    }

    fn map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(index: &Names) -> Vec<String> {
        index.0.lock().iter().cloned().collect()
    }

    #[test]
    fn a_relist_drops_what_was_deleted_while_the_watch_was_away() {
        let (feed, index) = (Feed::default(), Names::default());
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(map("a")),
            watcher::Event::InitApply(map("b")),
            watcher::Event::InitDone,
            watcher::Event::Apply(map("c")),
            watcher::Event::Delete(map("a")),
        ] {
            feed.event(&e, &index);
        }
        assert_eq!(names(&index), ["b", "c"]);
        // The watch restarts: b was deleted meanwhile, d created.
        feed.event(&watcher::Event::Init, &index);
        feed.event(&watcher::Event::InitApply(map("c")), &index);
        feed.event(&watcher::Event::InitApply(map("d")), &index);
        assert_eq!(
            names(&index),
            ["b", "c", "d"],
            "objects are applied as the list arrives"
        );
        feed.event(&watcher::Event::InitDone, &index);
        assert_eq!(names(&index), ["c", "d"]);
    }

    #[test]
    fn an_empty_relist_empties_the_index() {
        let (feed, index) = (Feed::default(), Names::default());
        feed.event(&watcher::Event::Apply(map("a")), &index);
        feed.event(&watcher::Event::Init, &index);
        feed.event(&watcher::Event::InitDone, &index);
        assert!(names(&index).is_empty());
    }

    #[test]
    fn referrers_relink_unlink_and_keep_what_a_relist_shows() {
        let mut refs: Referrers<&str> = Referrers::default();
        refs.link("a", "pv-1");
        refs.link("b", "pv-1");
        refs.link("c", "pv-2");
        assert_eq!(refs.of(&"pv-1").collect::<Vec<_>>(), ["a", "b"]);
        // A new reference unlinks the old one.
        refs.link("a", "pv-3");
        assert_eq!(refs.of(&"pv-1").collect::<Vec<_>>(), ["b"]);
        assert_eq!(refs.unlink("b"), Some("pv-1"), "its last referrer");
        assert_eq!(refs.unlink("b"), None, "once");
        assert_eq!(refs.of(&"pv-1").count(), 0);
        // A re-list showing only a: c goes, and pv-2 has no referrer left.
        let keep: HashSet<ObjectKey> = [ObjectKey::new(None, "a")].into();
        assert_eq!(refs.retain_listed(&keep), vec!["pv-2"]);
        assert_eq!(refs.len(), 1);
        assert_eq!(refs.names().collect::<Vec<_>>(), ["a"]);
    }
}
