//! Indexes a controller keeps by hand beside a reflector's store (volumes by the claim they
//! name, a set's labelled volumes, capacity objects by segment, what each object looked like
//! when last queued, attachments by PV, and through [`ByReference`] Pods by the claims they
//! name, snapshots by source claim, claims by the snapshot they restore from), fed from the
//! same watch.
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

/// `(namespace, name)`.
type Named = (String, String);

/// Namespaced objects by the names (in their own namespace) each refers to: Pods by the claims
/// they name, snapshots by their source claim, claims by the snapshot they restore from. An
/// object's references are whatever `refers_to` reads from it as it now is (none: it is not
/// indexed), so a changed object moves and a deleted one goes.
pub struct ByReference<K> {
    maps: Mutex<NamedMaps>,
    refers_to: fn(&K) -> Vec<String>,
}

#[derive(Debug, Default)]
struct NamedMaps {
    /// The objects referring to each name, by their names.
    by_target: HashMap<Named, BTreeSet<String>>,
    /// The names each indexed object refers to.
    targets_of: HashMap<Named, Vec<String>>,
}

impl NamedMaps {
    fn unlink(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        for target in self.targets_of.remove(&key).into_iter().flatten() {
            let target_key = (namespace.to_string(), target);
            if let Some(referrers) = self.by_target.get_mut(&target_key) {
                referrers.remove(name);
                if referrers.is_empty() {
                    self.by_target.remove(&target_key);
                }
            }
        }
    }
}

impl ByReference<k8s_openapi::api::core::v1::Pod> {
    /// Pods by the claims they name, whatever their state: their claim volumes and their
    /// generic ephemeral volumes' claims ([`crate::vocabulary::pod_claim_names`]).
    pub fn pods_by_claim() -> Self {
        ByReference::new(crate::vocabulary::pod_claim_names)
    }
}

impl<K> std::fmt::Debug for ByReference<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByReference")
            .field("indexed", &self.len())
            .finish_non_exhaustive()
    }
}

impl<K> ByReference<K> {
    /// An empty index of what `refers_to` reads.
    pub fn new(refers_to: fn(&K) -> Vec<String>) -> Self {
        ByReference {
            maps: Mutex::default(),
            refers_to,
        }
    }

    /// The objects of `namespace` that refer to `target`, by name, in order.
    pub fn of(&self, namespace: &str, target: &str) -> Vec<String> {
        let key = (namespace.to_string(), target.to_string());
        let maps = self.maps.lock();
        maps.by_target
            .get(&key)
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The objects of `namespace` that refer to `target`, as `store` holds them (an indexed
    /// object the store no longer holds is left out).
    pub fn cached(
        &self,
        store: &kube::runtime::reflector::Store<K>,
        namespace: &str,
        target: &str,
    ) -> Vec<std::sync::Arc<K>>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        self.of(namespace, target)
            .iter()
            .filter_map(|name| {
                store.get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
            })
            .collect()
    }

    /// How many objects are indexed.
    pub fn len(&self) -> usize {
        self.maps.lock().targets_of.len()
    }

    /// Whether no object is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Resource> WatchIndex<K> for ByReference<K> {
    fn apply(&self, object: &K) {
        let meta = object.meta();
        let Some(name) = meta.name.as_deref() else {
            return;
        };
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let targets = (self.refers_to)(object);
        let mut maps = self.maps.lock();
        // Most objects of an index's kind refer to nothing (claims that clone none): with
        // nothing indexed there is nothing to unlink, and no key is built.
        if targets.is_empty() && maps.targets_of.is_empty() {
            return;
        }
        maps.unlink(namespace, name);
        if targets.is_empty() {
            return;
        }
        for target in &targets {
            maps.by_target
                .entry((namespace.to_string(), target.clone()))
                .or_default()
                .insert(name.to_string());
        }
        maps.targets_of
            .insert((namespace.to_string(), name.to_string()), targets);
    }

    fn delete(&self, object: &K) {
        let meta = object.meta();
        if let Some(name) = meta.name.as_deref() {
            let namespace = meta.namespace.as_deref().unwrap_or_default();
            let mut maps = self.maps.lock();
            if !maps.targets_of.is_empty() {
                maps.unlink(namespace, name);
            }
        }
    }

    fn reset(&self, keep: &HashSet<ObjectKey>) {
        let mut maps = self.maps.lock();
        let gone: Vec<Named> = maps
            .targets_of
            .keys()
            .filter(|(namespace, name)| !listed(keep, Some(namespace.as_str()), name))
            .cloned()
            .collect();
        for (namespace, name) in gone {
            maps.unlink(&namespace, &name);
        }
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

    /// A config map's references: its data's values.
    fn values(map: &ConfigMap) -> Vec<String> {
        map.data.iter().flatten().map(|(_, v)| v.clone()).collect()
    }

    fn referring(name: &str, namespace: &str, to: &[&str]) -> ConfigMap {
        let mut m = map(name);
        m.metadata.namespace = Some(namespace.into());
        m.data = Some(
            to.iter()
                .enumerate()
                .map(|(i, t)| (format!("k{i}"), t.to_string()))
                .collect(),
        );
        m
    }

    #[test]
    fn objects_are_found_by_what_they_refer_to_in_their_namespace() {
        let (feed, index) = (Feed::default(), ByReference::new(values));
        feed.event(&watcher::Event::Apply(referring("b", "ns", &["x"])), &index);
        feed.event(
            &watcher::Event::Apply(referring("a", "ns", &["x", "y"])),
            &index,
        );
        feed.event(
            &watcher::Event::Apply(referring("c", "other", &["x"])),
            &index,
        );
        feed.event(&watcher::Event::Apply(referring("none", "ns", &[])), &index);
        assert_eq!(index.of("ns", "x"), ["a", "b"]);
        assert_eq!(index.of("ns", "y"), ["a"]);
        assert_eq!(index.of("other", "x"), ["c"]);
        assert_eq!(
            index.len(),
            3,
            "an object referring to nothing is not indexed"
        );
        // A changed object moves; a deleted one goes.
        feed.event(&watcher::Event::Apply(referring("a", "ns", &["y"])), &index);
        assert_eq!(index.of("ns", "x"), ["b"]);
        feed.event(
            &watcher::Event::Delete(referring("b", "ns", &["x"])),
            &index,
        );
        assert!(index.of("ns", "x").is_empty());
        // A re-list that shows only a: c, deleted while the watch was away, goes.
        feed.event(&watcher::Event::Init, &index);
        feed.event(
            &watcher::Event::InitApply(referring("a", "ns", &["y"])),
            &index,
        );
        feed.event(&watcher::Event::InitDone, &index);
        assert!(index.of("other", "x").is_empty());
        assert_eq!(index.of("ns", "y"), ["a"]);
        assert_eq!(index.len(), 1);
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
