//! One change to the store, as watchers receive it: its kind, resourceVersion and object, the
//! object before it (for selectors), and its JSON watch event line, written once for every
//! live watcher (each sends the same bytes).

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
    /// The JSON watch event of this change (`{"type":KIND,"object":OBJECT}` and a newline),
    /// written once for every live watcher ([`Change::event_line`]); the object's JSON is a
    /// slice of it ([`Change::json`]). The store's watch history keeps its changes without it
    /// ([`Change::without_json`]): at 10,000 claims it would hold about 130 MB more.
    line: Option<Bytes>,
}

/// Where the object starts in the event line of a change of `kind`: after
/// `{"type":"KIND","object":` (the kinds are plain words, written between two quotes).
fn object_offset(kind: ChangeKind) -> usize {
    EVENT_TYPE.len() + kind.as_str().len() + 2 + EVENT_OBJECT.len()
}

const EVENT_TYPE: &[u8] = b"{\"type\":";
const EVENT_OBJECT: &[u8] = b",\"object\":";
const EVENT_END: &[u8] = b"}\n";

/// One JSON watch event line of type `kind` around an object's JSON.
pub(crate) fn event_line_of(kind: &str, object_json: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object_json.len() + kind.len() + 24);
    line.extend_from_slice(EVENT_TYPE);
    // The event types are plain words; written as a JSON string all the same.
    let _ = serde_json::to_writer(&mut line, kind);
    line.extend_from_slice(EVENT_OBJECT);
    line.extend_from_slice(object_json);
    line.extend_from_slice(EVENT_END);
    Bytes::from(line)
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
            line: None,
        }
    }

    /// The change carrying its event line, made from the object's JSON (which must be the
    /// object's).
    pub(crate) fn with_json(mut self, object_json: &[u8]) -> Self {
        self.line = Some(event_line_of(self.kind.as_str(), object_json));
        self
    }

    /// The same change without the JSON, to be kept for watches that resume later.
    pub(crate) fn without_json(&self) -> Self {
        Change {
            line: None,
            ..self.clone()
        }
    }

    /// Its watch event line as the change's own kind says (ADDED, MODIFIED, DELETED): the one
    /// it carries, else written now.
    pub fn event_line(&self) -> Bytes {
        match &self.line {
            Some(line) => line.clone(),
            None => event_line_of(self.kind.as_str(), &self.json()),
        }
    }

    /// The object's JSON: a slice of the event line it carries, else written now. Writing a
    /// `Value` into memory cannot fail (its map keys are strings and a `Vec` takes every
    /// write); were it to, the object would be sent as `null`, which a client rejects as a
    /// broken event rather than misreads.
    pub fn json(&self) -> Bytes {
        match &self.line {
            Some(line) => {
                line.slice(object_offset(self.kind)..line.len().saturating_sub(EVENT_END.len()))
            }
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
        let (changes, mut live) = store.watch_from("/configmaps", first - 1).unwrap();
        // The history keeps its changes without their JSON; live watchers get it with them.
        assert!(changes.iter().all(|c| c.line.is_none()));
        write(Write2::Put(
            json!({"metadata": {"name": "a"}, "data": {"k": "3"}}),
        ));
        let sent = live.try_recv().unwrap();
        assert!(sent.line.is_some());
        assert_eq!(parsed(&sent), *sent.object);
        // The event line is the watch event of the change (made anew after the deletion), and
        // ends the line.
        let line = sent.event_line();
        assert!(line.ends_with(b"}\n"));
        let event: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(event, json!({"type": "ADDED", "object": *sent.object}));
        // A change from the history writes its line anew.
        let modified: serde_json::Value = serde_json::from_slice(&changes[1].event_line()).unwrap();
        assert_eq!(
            modified,
            json!({"type": "MODIFIED", "object": *changes[1].object})
        );
        let replayed: serde_json::Value = serde_json::from_slice(&changes[2].event_line()).unwrap();
        assert_eq!(replayed["type"], "DELETED");
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
