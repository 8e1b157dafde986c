//! Reads of the store: one object, lists (now and at an earlier resourceVersion), watches
//! from a version or from now, and a namespace's contents.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::{Change, Compacted, Inner, Resume, ResumeError, Store, object_key};

impl Store {
    /// One object.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.core
            .inner
            .lock()
            .objects
            .get(&object_key(resource, namespace, name))
            .map(|s| s.object.clone())
    }

    /// Objects of a resource (in one namespace, or all), in key order, with the list's rv.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.core.inner.lock();
        let items = objects_of(&inner, resource, namespace);
        (items, inner.visible_rv)
    }

    /// Objects of a resource as they were at `rv` (a continued list's snapshot), in key order:
    /// today's objects with every later change undone. `Gone` when the history no longer
    /// reaches back to `rv`.
    pub fn list_at(
        &self,
        resource: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<Vec<Arc<Value>>, ResumeError> {
        let inner = self.core.inner.lock();
        if rv < inner.compacted {
            return Err(ResumeError::Gone(inner.compacted));
        }
        if rv > inner.visible_rv {
            return Err(ResumeError::TooLarge(inner.visible_rv));
        }
        let key_of = |object: &Value, ns: &str| {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            object_key(resource, ns, name)
        };
        let mut objects: BTreeMap<String, Arc<Value>> = objects_of(&inner, resource, namespace)
            .into_iter()
            .map(|o| {
                let ns = o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                (key_of(&o, &ns), o)
            })
            .collect();
        let newer = inner.history.iter().rev().map(|(c, _)| c).filter(|c| {
            c.rv > rv && c.resource == resource && namespace.is_none_or(|ns| c.namespace == ns)
        });
        for change in newer {
            let key = key_of(&change.object, &change.namespace);
            match &change.previous {
                Some(previous) => {
                    objects.insert(key, previous.clone());
                }
                None => {
                    objects.remove(&key);
                }
            }
        }
        Ok(objects.into_values().collect())
    }

    /// Changes of `resource` after `rv` plus a live subscription to them, with no gap
    /// between them. A version newer than the store's has no backlog: the changes after it
    /// come live (the subscription also carries those up to `rv`, which the watcher skips), as
    /// kube-apiserver keeps such a watch open. Err: the history no longer reaches back to `rv`.
    pub fn watch_from(&self, resource: &str, rv: u64) -> Result<Resume, Compacted> {
        let mut inner = self.core.inner.lock();
        if rv < inner.compacted {
            return Err(Compacted {
                oldest: inner.compacted,
            });
        }
        let backlog = inner
            .history
            .iter()
            .filter(|(c, _)| c.rv > rv && c.resource == resource)
            .map(|(c, _)| c.clone())
            .collect();
        Ok((backlog, inner.subscribe(resource, self.core.feed_capacity)))
    }

    /// Current objects of a resource plus a live subscription, atomically.
    pub fn snapshot_and_watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
    ) -> (Vec<Arc<Value>>, u64, broadcast::Receiver<Arc<Change>>) {
        let mut inner = self.core.inner.lock();
        let items = objects_of(&inner, resource, namespace);
        let rx = inner.subscribe(resource, self.core.feed_capacity);
        (items, inner.visible_rv, rx)
    }

    /// Every object in a namespace (for namespace deletion), as (resource, name), in key order.
    /// Keys are ordered by resource first, so each resource's part for the namespace is one
    /// range, and the next resource is found by skipping past the last one's keys: a lookup a
    /// resource instead of a pass over every stored key under the store's lock (a terminating
    /// namespace asks once a round, beside 200,000 objects of a storm).
    pub fn in_namespace(&self, namespace: &str) -> Vec<(String, String)> {
        use std::ops::Bound;
        let inner = self.core.inner.lock();
        let mut found = Vec::new();
        let mut from = String::new();
        while let Some(key) = inner
            .objects
            .range::<str, _>((Bound::Included(from.as_str()), Bound::Unbounded))
            .next()
            .map(|(k, _)| k)
        {
            let resource = key.split('\u{0}').next().unwrap_or(key);
            let prefix = format!("{resource}\u{0}{namespace}\u{0}");
            found.extend(
                inner
                    .objects
                    .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
                    .map(|(k, _)| k)
                    .take_while(|k| k.starts_with(&prefix))
                    .map(|k| (resource.to_string(), k[prefix.len()..].to_string())),
            );
            // Past every key of this resource: `resource` then a byte above the separator.
            from = format!("{resource}\u{1}");
        }
        found
    }
}

/// Objects of a resource (in one namespace, or all), in key order.
fn objects_of(inner: &Inner, resource: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
    let prefix = match namespace {
        Some(ns) => format!("{resource}\u{0}{ns}\u{0}"),
        None => format!("{resource}\u{0}"),
    };
    inner
        .objects
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| v.object.clone())
        .collect()
}
