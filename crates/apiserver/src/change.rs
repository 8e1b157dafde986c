//! One change to the store, as watchers receive it: its kind, resourceVersion and object, the
//! object before it (for selectors), and the object's JSON, written once for every watcher.

use std::sync::{Arc, OnceLock};

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
#[derive(Debug)]
pub struct Change {
    /// Its resourceVersion.
    pub rv: u64,
    /// Kind.
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
    /// The object's JSON, written once for every watcher ([`Change::json`]): the log's record
    /// already holds it for a creation or an update.
    json: OnceLock<Bytes>,
}

impl Change {
    /// A change whose object's JSON is written when a watcher first asks for it.
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
            json: OnceLock::new(),
        }
    }

    /// Gives the object's JSON, when the writer already has it.
    pub(crate) fn set_json(&self, json: Bytes) {
        let _ = self.json.set(json);
    }

    /// The object's JSON. Writing a `Value` into memory cannot fail (its map keys are strings
    /// and a `Vec` takes every write); were it to, the object would be sent as `null`, which
    /// a client rejects as a broken event rather than misreads.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| {
            serde_json::to_vec(&*self.object)
                .map(Bytes::from)
                .unwrap_or_else(|_| Bytes::from_static(b"null"))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use crate::store::{HistoryLimits, Store, StoreError, Write2};

    fn parsed(change: &super::Change) -> serde_json::Value {
        serde_json::from_slice(change.json()).unwrap()
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
        let (changes, _) = store.watch_from(first - 1).unwrap();
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
