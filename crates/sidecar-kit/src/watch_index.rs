//! Indexes a controller keeps by hand beside a reflector's store (volumes by the claim they
//! name, a set's labelled volumes, capacity objects by segment, what each object looked like
//! when last queued), fed from the same watch.
//!
//! A watch that restarts lists again, and an object deleted while it was away gets no delete
//! event: an index fed only by applies and deletes keeps it for ever. [`Feed`] gives every such
//! index the reflector's shape: objects applied and deleted one by one, and at the end of a
//! re-list a reset to exactly what the list showed.

use std::collections::HashSet;

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
}
