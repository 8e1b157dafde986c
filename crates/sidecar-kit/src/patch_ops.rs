//! JSON patch (RFC 6902) operations as typed values: a path is built from its segments (each
//! escaped as RFC 6901 says), so no patch we send can be malformed and nothing has to parse our
//! own JSON back. Guarded writes combine a `test` with the change it guards.

use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// One operation.
pub type Op = PatchOperation;

/// The pointer to the field at `segments` (`["metadata", "finalizers", "-"]`).
pub fn path(segments: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(segments.iter().copied())
}

/// `test`: the value at `segments` is `value`.
pub fn test(segments: &[&str], value: impl Into<Value>) -> Op {
    PatchOperation::Test(TestOperation {
        path: path(segments),
        value: value.into(),
    })
}

/// `add`: sets the field (or inserts the list item) at `segments`.
pub fn add(segments: &[&str], value: impl Into<Value>) -> Op {
    PatchOperation::Add(AddOperation {
        path: path(segments),
        value: value.into(),
    })
}

/// `replace`: the field at `segments`, which must exist.
pub fn replace(segments: &[&str], value: impl Into<Value>) -> Op {
    PatchOperation::Replace(ReplaceOperation {
        path: path(segments),
        value: value.into(),
    })
}

/// `remove`: the field or list item at `segments`, which must exist.
pub fn remove(segments: &[&str]) -> Op {
    PatchOperation::Remove(RemoveOperation {
        path: path(segments),
    })
}

/// `test` that the object is still at the resourceVersion `meta` was read at: the patch
/// applies only to that version (a conflict otherwise).
pub fn test_version(meta: &ObjectMeta) -> Op {
    test(
        &["metadata", "resourceVersion"],
        meta.resource_version
            .clone()
            .map_or(Value::Null, Value::String),
    )
}

/// `patch`, a merge patch, made to apply only at the resourceVersion `meta` was read at (a
/// conflict otherwise): [`test_version`]'s guard for merge patches. What `patch` says of the
/// metadata stays.
pub fn merge_at_version(meta: &ObjectMeta, patch: &Value) -> Value {
    let mut patch = patch.clone();
    if let Some(object) = patch.as_object_mut() {
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert(
                "resourceVersion".into(),
                meta.resource_version
                    .clone()
                    .map_or(Value::Null, Value::String),
            );
        }
    }
    patch
}

/// The patch of `ops`, in order.
pub fn patch(ops: Vec<Op>) -> Patch {
    Patch(ops)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_patch_at_a_version_keeps_what_it_said_of_the_metadata() {
        let meta = ObjectMeta {
            resource_version: Some("7".into()),
            ..Default::default()
        };
        let patch =
            serde_json::json!({"metadata": {"annotations": {"a": "b"}}, "status": {"x": 1}});
        assert_eq!(
            merge_at_version(&meta, &patch),
            serde_json::json!({"metadata": {"annotations": {"a": "b"}, "resourceVersion": "7"}, "status": {"x": 1}})
        );
        assert_eq!(
            merge_at_version(&meta, &serde_json::json!({"status": {}})),
            serde_json::json!({"metadata": {"resourceVersion": "7"}, "status": {}})
        );
    }
    use serde_json::json;

    #[test]
    fn operations_are_written_as_rfc_6902_with_escaped_segments() {
        let meta = ObjectMeta {
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        };
        let ops = patch(vec![
            test_version(&meta),
            add(&["metadata", "annotations", "a/b~c"], "v"),
            replace(&["spec", "replicas"], 2),
            remove(&["metadata", "finalizers", "1"]),
            test(&["metadata", "finalizers"], json!(["f"])),
        ]);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/annotations/a~1b~0c", "value": "v"},
                {"op": "replace", "path": "/spec/replicas", "value": 2},
                {"op": "remove", "path": "/metadata/finalizers/1"},
                {"op": "test", "path": "/metadata/finalizers", "value": ["f"]},
            ])
        );
        assert_eq!(
            serde_json::to_value(test_version(&ObjectMeta::default())).unwrap(),
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": null})
        );
    }
}
