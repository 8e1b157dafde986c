//! The objects a controller wrote and its caches have not caught up with yet (client-go's
//! "assume cache", as kube-controller-manager's PV binder keeps one): after a write, the object
//! the API server answered with is remembered; reads prefer it while the cache holds an older
//! version, and forget it once the cache has it (or a newer one) or no longer has the object. A
//! claim looked at again
//! before its own binding reaches the cache is then seen bound, and is never pointed at a
//! second volume.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;
use parking_lot::Mutex;

/// Objects written and not yet seen in the cache, by key (`namespace/name` or `name`).
#[derive(Debug)]
pub struct Assumed<K> {
    written: Mutex<HashMap<String, Arc<K>>>,
}

impl<K> Default for Assumed<K> {
    fn default() -> Self {
        Assumed {
            written: Mutex::new(HashMap::new()),
        }
    }
}

/// A resourceVersion as a number (etcd's revision); `None` when it is not one.
fn version<K: Resource>(object: &K) -> Option<u64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

/// The key of an object: `namespace/name`, or `name` for a cluster-scoped one.
pub fn key_of<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{name}"),
        _ => name.to_string(),
    }
}

impl<K: Resource> Assumed<K> {
    /// Remembers what a write returned (an `Arc` the caller keeps is shared, not copied).
    pub fn assume(&self, written: impl Into<Arc<K>>) {
        let written = written.into();
        let key = key_of(written.as_ref());
        self.written.lock().insert(key, written);
    }

    /// The newer of `cached` and the object written under `key`: the written one while the
    /// cache is behind it; the cached one (and the written one forgotten) once the cache has
    /// caught up, or when either version is not a number.
    pub fn latest(&self, key: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut written = self.written.lock();
        let Some(mine) = written.get(key) else {
            return cached;
        };
        let behind = match cached.as_deref() {
            // Gone from the cache (deleted, perhaps while a re-list was under way, which sends
            // no delete event): the write is forgotten, never served for an object that is gone.
            None => false,
            Some(seen) => match (version(seen), version(mine.as_ref())) {
                (Some(seen), Some(mine)) => seen < mine,
                _ => false,
            },
        };
        if behind {
            return Some(mine.clone());
        }
        written.remove(key);
        cached
    }

    /// Forgets what was written under `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        self.written.lock().remove(key);
    }

    /// How many writes the cache has not caught up with.
    pub fn len(&self) -> usize {
        self.written.lock().len()
    }

    /// Whether the cache has caught up with every write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;

    fn pv(version: &str, claimed: bool) -> PersistentVolume {
        let mut pv = crate::testing::volume("pv-1").build();
        pv.metadata.resource_version = Some(version.into());
        if claimed {
            pv.spec.get_or_insert_with(Default::default).claim_ref = Some(Default::default());
        }
        pv
    }

    fn claimed(pv: &Option<Arc<PersistentVolume>>) -> Option<bool> {
        pv.as_ref()
            .map(|pv| pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some()))
    }

    #[test]
    fn a_write_is_read_back_until_the_cache_catches_up() {
        // (written version, cached version or none, read the write, still remembered)
        let table = [
            ("12", Some("10"), true, true),
            ("12", Some("12"), false, false),
            ("12", Some("15"), false, false),
            ("12", None, false, false),
            ("abc", Some("10"), false, false),
            ("12", Some("xyz"), false, false),
        ];
        for (mine, seen, reads_write, remembered) in table {
            let assumed = Assumed::default();
            assumed.assume(pv(mine, true));
            let cached = seen.map(|v| Arc::new(pv(v, false)));
            let got = assumed.latest("pv-1", cached.clone());
            assert_eq!(
                claimed(&got),
                if reads_write {
                    Some(true)
                } else {
                    claimed(&cached)
                },
                "written {mine}, cached {seen:?}"
            );
            assert_eq!(
                assumed.len(),
                usize::from(remembered),
                "written {mine}, cached {seen:?}"
            );
        }
        // Nothing written: the cache as it is.
        let assumed: Assumed<PersistentVolume> = Assumed::default();
        let cached = Some(Arc::new(pv("3", false)));
        assert_eq!(claimed(&assumed.latest("pv-1", cached)), Some(false));
        assert_eq!(assumed.latest("pv-1", None), None);
        // Forgotten when the object goes.
        assumed.assume(pv("20", true));
        assumed.forget("pv-1");
        assert!(assumed.is_empty());
        assert_eq!(key_of(&pv("1", false)), "pv-1");
    }
}
