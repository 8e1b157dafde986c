//! The key of an object in a queue or a cache: `namespace/name`, or `name` when the object is
//! cluster-scoped, in one shared allocation.
//!
//! kube's `ObjectRef` is 96 bytes before its strings (name, namespace, and the
//! resourceVersion and UID it may carry), and each clone copies its strings. A storm of 10,000
//! claims keeps every claim's key in the work queue's map and its order at once, so the key's
//! size counts: an `ObjectKey` is 16 bytes, and its clones share the text.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `namespace/name` (namespaced) or `name` (cluster-scoped). Kubernetes allows no `/` in a
/// name or a namespace, so the text splits back unambiguously.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    /// The key of `name` in `namespace` (none or empty: cluster-scoped).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey(Arc::from(&*key_text(namespace, name)))
    }

    /// The key of a cluster-scoped object.
    pub fn cluster(name: &str) -> Self {
        ObjectKey(name.into())
    }

    /// The key of the object `meta` describes (a missing name is the empty name).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        match self.0.split_once('/') {
            Some((_, name)) => name,
            None => &self.0,
        }
    }

    /// The object's namespace; `None` when it is cluster-scoped.
    pub fn namespace(&self) -> Option<&str> {
        self.0.split_once('/').map(|(namespace, _)| namespace)
    }

    /// The key as text: `namespace/name` or `name`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The text of a key: `namespace/name`, or `name` (borrowed) when `namespace` is none or empty.
pub fn key_text<'a>(namespace: Option<&str>, name: &'a str) -> Cow<'a, str> {
    match namespace.filter(|ns| !ns.is_empty()) {
        Some(namespace) => Cow::Owned(format!("{namespace}/{name}")),
        None => Cow::Borrowed(name),
    }
}

impl std::borrow::Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn splits_back_into_namespace_and_name() {
        let cases = [
            (Some("ns"), "claim", "ns/claim", Some("ns"), "claim"),
            (None, "pv-1", "pv-1", None, "pv-1"),
            (Some(""), "pv-2", "pv-2", None, "pv-2"),
            (Some("a"), "", "a/", Some("a"), ""),
        ];
        for (namespace, name, text, want_ns, want_name) in cases {
            let key = ObjectKey::new(namespace, name);
            assert_eq!(key.as_str(), text);
            assert_eq!(key.to_string(), text);
            assert_eq!(key.namespace(), want_ns, "{text}");
            assert_eq!(key.name(), want_name, "{text}");
        }
    }

    #[test]
    fn key_text_borrows_a_cluster_scoped_name() {
        assert!(matches!(key_text(None, "pv"), Cow::Borrowed("pv")));
        assert!(matches!(key_text(Some(""), "pv"), Cow::Borrowed("pv")));
        assert_eq!(key_text(Some("ns"), "c"), "ns/c");
    }

    #[test]
    fn of_metadata_matches_new() {
        let meta = ObjectMeta {
            name: Some("c".into()),
            namespace: Some("ns".into()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        };
        assert_eq!(ObjectKey::of(&meta), ObjectKey::new(Some("ns"), "c"));
        assert_eq!(
            ObjectKey::of(&ObjectMeta::default()),
            ObjectKey::cluster("")
        );
    }

    #[test]
    fn is_small_and_looked_up_by_text() {
        assert_eq!(std::mem::size_of::<ObjectKey>(), 16);
        let mut map = HashMap::new();
        map.insert(ObjectKey::new(Some("ns"), "c"), 1);
        assert_eq!(map.get("ns/c"), Some(&1));
        assert_eq!(map.get("c"), None);
        let clone = ObjectKey::new(Some("ns"), "c");
        assert!(map.contains_key(&clone));
    }
}
