//! One change to the store, as watchers receive it: its kind, resourceVersion and object, the
//! object before it (for selectors), and the object's JSON, written once for every live
//! watcher.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

/// Change kinds, as watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// ADDED.
    Added,
    /// MODIFIED.
    Modified,
    /// DELETED.
    Deleted,
}

impl ChangeKind {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One change.
#[derive(Debug, Clone)]
pub struct Change {
    /// Its resourceVersion.
    pub rv: u64,
    /// Added, modified or deleted, as a watch event says.
    pub kind: ChangeKind,
    /// Resource key (`group/plural`).
    pub resource: String,
    /// Namespace ("" for cluster scoped).
    pub namespace: String,
    /// The object (its last state for DELETED).
    pub object: Arc<Value>,
    /// The object before this change (None for ADDED), so a watch with a selector can tell an
    /// object that starts or stops matching.
    pub previous: Option<Arc<Value>>,
    /// The object's JSON, written once for every live watcher ([`Change::json`]). The store's
    /// watch history keeps its changes without it ([`Change::without_json`]): at 10,000 claims
    /// it would hold about 130 MB more.
    json: Option<Bytes>,
}

impl Change {
    /// A change without its object's JSON: each watcher that sends it writes it.
    pub fn new(
        rv: u64,
        kind: ChangeKind,
        resource: &str,
        namespace: &str,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) -> Self {
        Change {
            rv,
            kind,
            resource: resource.to_string(),
            namespace: namespace.to_string(),
            object,
            previous,
            json: None,
        }
    }

    /// The change carrying its object's JSON (which must be the object's).
    pub(crate) fn with_json(mut self, json: Bytes) -> Self {
        self.json = Some(json);
        self
    }

    /// The same change without the JSON, to be kept for watches that resume later.
    pub(crate) fn without_json(&self) -> Self {
        Change {
            json: None,
            ..self.clone()
        }
    }

    /// The object's JSON: the one it carries, else written now. Writing a `Value` into memory
    /// cannot fail (its map keys are strings and a `Vec` takes every write); were it to, the
    /// object would be sent as `null`, which a client rejects as a broken event rather than
    /// misreads.
    pub fn json(&self) -> Bytes {
        match &self.json {
            Some(json) => json.clone(),
            None => serde_json::to_vec(&*self.object)
                .map(Bytes::from)
                .unwrap_or_else(|_| Bytes::from_static(b"null")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use crate::store::{HistoryLimits, Store, StoreError, Write2};

    fn parsed(change: &super::Change) -> serde_json::Value {
        serde_json::from_slice(&change.json()).unwrap()
    }

    #[tokio::test]
    async fn watchers_get_the_json_of_the_object_as_stored_with_its_resource_version() {
        let limits = HistoryLimits {
            count: 100,
            bytes: 1 << 20,
        };
        let store = Store::open(None, limits, durable_log::Options::default()).unwrap();
        let write = |decision: Write2| {
            store
                .write("/configmaps", "ns", "a", |_, _| {
                    Ok::<_, StoreError>(decision)
                })
                .unwrap()
                .1
        };
        let first = write(Write2::Put(
            json!({"metadata": {"name": "a"}, "data": {"k": "é\n"}}),
        ));
        write(Write2::Put(
            json!({"metadata": {"name": "a"}, "data": {"k": "2"}}),
        ));
        let deleted = write(Write2::Delete);
        let (changes, mut live) = store.watch_from(first - 1).unwrap();
        // The history keeps its changes without their JSON; live watchers get it with them.
        assert!(changes.iter().all(|c| c.json.is_none()));
        write(Write2::Put(
            json!({"metadata": {"name": "a"}, "data": {"k": "3"}}),
        ));
        let sent = live.try_recv().unwrap();
        assert!(sent.json.is_some());
        assert_eq!(parsed(&sent), *sent.object);
        let seen: Vec<serde_json::Value> = changes.iter().map(|c| parsed(c)).collect();
        assert_eq!(seen.len(), 3);
        for (change, json) in changes.iter().zip(&seen) {
            assert_eq!(json, &*change.object);
            assert_eq!(json["metadata"]["resourceVersion"], change.rv.to_string());
        }
        assert_eq!(seen[0]["data"]["k"], "é\n");
        assert_eq!(seen[2]["data"]["k"], "2");
        assert_eq!(changes[2].rv, deleted);
    }
}
