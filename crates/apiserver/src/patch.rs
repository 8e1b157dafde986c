//! Patches: which kind a request sends (its Content-Type), and applying JSON patches, JSON
//! merge patches and strategic merge patches to an object, as kube-apiserver does.
//!
//! A strategic merge patch merges lists of objects by their merge key (containers by name,
//! conditions by type...) instead of replacing them, and understands the directives
//! `$patch` (replace, delete, merge), `$setElementOrder/<list>`, `$retainKeys` and
//! `$deleteFromPrimitiveList/<list>`.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::status::ApiError;

/// What a PATCH body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 6902 (`application/json-patch+json`).
    Json,
    /// RFC 7386 (`application/merge-patch+json`).
    Merge,
    /// Kubernetes' strategic merge patch.
    Strategic,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
}

const PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml";

impl PatchKind {
    /// The kind of a Content-Type, or 415 naming the ones there are.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, ApiError> {
        let media = content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchKind::Apply),
            other => Err(ApiError::unsupported_media(format!(
                "the body of the request was in an unknown format ({other:?}) - accepted media types include: {PATCH_TYPES}"
            ))),
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not a patch of its kind.
    #[error("{0}")]
    Parse(String),
    /// The patch does not fit the object (a JSON patch test or path that fails).
    #[error("the patch could not be applied: {0}")]
    Apply(String),
    /// A JSON patch with more operations than kube-apiserver takes, or whose copies would
    /// grow the object past [`MAX_COPIED_BYTES`] (each `copy` can double it).
    #[error("{0}")]
    TooLarge(String),
}

/// The most operations a JSON patch may have (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes the `copy` operations of one JSON patch may copy in all: a request body's
/// limit. Without it, some 35 copies of a member into itself take a 2 KB body to terabytes.
pub const MAX_COPIED_BYTES: usize = crate::server::MAX_BODY;

/// The length of a value's JSON, counted without writing it anywhere.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Applies a JSON, merge or strategic merge patch to `target`.
pub fn apply(kind: PatchKind, target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let mut next = target.clone();
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| PatchError::Parse(format!("invalid JSON patch: {e}")))?;
            if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(PatchError::TooLarge(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    ops.0.len()
                )));
            }
            let mut copied = 0usize;
            for (index, op) in ops.0.into_iter().enumerate() {
                if let json_patch::PatchOperation::Copy(c) = &op {
                    copied =
                        copied.saturating_add(next.pointer(c.from.as_str()).map_or(0, json_len));
                    if copied > MAX_COPIED_BYTES {
                        return Err(PatchError::TooLarge(format!(
                            "operation {index}: the copies of this JSON patch are over {MAX_COPIED_BYTES} bytes"
                        )));
                    }
                }
                // kube-apiserver's JSON patch takes a missing member as null: `test` of a
                // missing path against null passes (clients guard "no finalizers yet" so).
                if let json_patch::PatchOperation::Test(t) = &op
                    && t.value.is_null()
                    && next.pointer(t.path.as_str()).is_none()
                {
                    continue;
                }
                json_patch::patch(&mut next, &[op])
                    .map_err(|e| PatchError::Apply(format!("operation {index}: {e}")))?;
            }
        }
        PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply if !patch.is_object() => {
            return Err(PatchError::Parse(
                "the patch must be a JSON object (a merge patch that is not an object would replace the whole object)".into(),
            ));
        }
        PatchKind::Merge => json_patch::merge(&mut next, patch),
        PatchKind::Strategic | PatchKind::Apply => strategic(&mut next, patch),
    }
    Ok(next)
}

/// The merge key of a list field (Kubernetes' `patchMergeKey`), by the field's name.
pub fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets"
        | "drivers"
        | "resourceClaims"
        | "schedulingGates"
        | "readinessGates"
        | "claims" => "name",
        "conditions" | "addresses" => "type",
        "ports" => "containerPort",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Lists of strings that merge as sets (`patchStrategy: merge` without a key).
fn merges_as_set(field: &str) -> bool {
    matches!(field, "finalizers")
}

fn directive(value: &Value) -> Option<&str> {
    value.get("$patch").and_then(Value::as_str)
}

/// The patch without its directives (what lands in the object).
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|i| directive(i).is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A strategic merge patch.
pub fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    match directive(patch) {
        Some("replace") => {
            *target = strip(patch);
            return;
        }
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Array(items) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                merge_list(slot, items, k);
            }
            Value::Object(_) if directive(v) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(_) => strategic(t.entry(k.clone()).or_insert(Value::Null), v),
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(list)), Value::Array(remove)) = (t.get_mut(field), v)
        {
            let remove: HashSet<String> = remove.iter().map(Value::to_string).collect();
            list.retain(|item| !remove.contains(&item.to_string()));
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$setElementOrder/")
            && let (Some(Value::Array(list)), Value::Array(order)) = (t.get_mut(field), v)
        {
            reorder(list, order, merge_key(field));
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        t.retain(|k, _| keep.iter().any(|kk| kk.as_str() == Some(k.as_str())));
    }
}

/// Merges a patch's list into the object's. Every step looks items up in an index (by merge
/// key, or by the whole item for sets), so a patch of m items against a list of n costs
/// about n + m, not n × m (a 3 MiB patch against a long list pinned a core).
fn merge_list(target: &mut Value, patch: &[Value], field: &str) {
    if patch.iter().any(|i| directive(i) == Some("replace")) {
        *target = strip(&Value::Array(patch.to_vec()));
        return;
    }
    let key = merge_key(field);
    let objects = patch.iter().all(Value::is_object);
    match key {
        Some(key) if objects => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let Value::Array(live) = target else {
                return;
            };
            merge_keyed(live, patch, key);
        }
        None if merges_as_set(field) => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let Value::Array(live) = target else {
                return;
            };
            let mut seen: HashSet<String> = live.iter().map(Value::to_string).collect();
            for item in patch {
                if seen.insert(item.to_string()) {
                    live.push(item.clone());
                }
            }
        }
        _ => *target = strip(&Value::Array(patch.to_vec())),
    }
}

/// Merges objects by `key`, in patch order: an item merges into the live item with its key, a
/// `$patch: delete` item removes it, any other is appended.
fn merge_keyed(live: &mut Vec<Value>, patch: &[Value], key: &str) {
    // The live position of each key (the first item with it, as a scan would find).
    let mut index: HashMap<String, usize> = HashMap::with_capacity(live.len() + patch.len());
    for (i, item) in live.iter().enumerate() {
        if let Some(id) = item.get(key) {
            index.entry(id.to_string()).or_insert(i);
        }
    }
    let mut deleted: HashSet<String> = HashSet::new();
    for item in patch {
        let id = item.get(key).map(Value::to_string);
        let position = id.as_ref().and_then(|id| index.get(id).copied());
        match (directive(item), position) {
            (Some("delete"), Some(_)) => {
                if let Some(id) = id {
                    index.remove(&id);
                    deleted.insert(id);
                }
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => strategic(&mut live[i], item),
            (_, None) => {
                if let Some(id) = id {
                    index.insert(id, live.len());
                }
                live.push(strip(item));
            }
        }
    }
    if !deleted.is_empty() {
        // Every item with a deleted key goes, but one appended after the deletion.
        let kept: HashSet<usize> = index.values().copied().collect();
        let mut position = 0;
        live.retain(|item| {
            let i = position;
            position += 1;
            let gone = item
                .get(key)
                .is_some_and(|id| deleted.contains(&id.to_string()));
            !gone || kept.contains(&i)
        });
    }
}

/// Orders `list` as `order` says; items `order` does not name keep their order, after.
fn reorder(list: &mut [Value], order: &[Value], key: Option<&str>) {
    let name = |item: &Value| match key {
        Some(k) => item.get(k).map(Value::to_string),
        None => Some(item.to_string()),
    };
    let mut rank: HashMap<String, usize> = HashMap::with_capacity(order.len());
    for (i, o) in order.iter().enumerate() {
        if let Some(name) = name(o) {
            rank.entry(name).or_insert(i);
        }
    }
    list.sort_by_key(|item| {
        name(item)
            .and_then(|n| rank.get(&n).copied())
            .unwrap_or(usize::MAX)
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn content_types_name_the_patch_kind() {
        let cases = [
            (Some("application/json-patch+json"), Some(PatchKind::Json)),
            (
                Some("application/merge-patch+json; charset=utf-8"),
                Some(PatchKind::Merge),
            ),
            (
                Some("application/strategic-merge-patch+json"),
                Some(PatchKind::Strategic),
            ),
            (Some("application/apply-patch+yaml"), Some(PatchKind::Apply)),
            (Some("application/json"), None),
            (None, None),
        ];
        for (content_type, expected) in cases {
            assert_eq!(
                PatchKind::from_content_type(content_type).ok(),
                expected,
                "{content_type:?}"
            );
        }
        let refused = PatchKind::from_content_type(Some("text/plain")).unwrap_err();
        assert_eq!(refused.code, 415);
        assert!(
            refused
                .message
                .contains("application/strategic-merge-patch+json")
        );
    }

    #[test]
    fn keyed_list_merges_keep_the_order_of_operations_of_a_scan() {
        let pod = |containers: Value| json!({"spec": {"containers": containers}});
        let apply_smp = |target: Value, patch: Value| {
            apply(PatchKind::Strategic, &target, &patch).unwrap()["spec"]["containers"].clone()
        };
        // A delete, then the same name added again, in one patch: the new one stays, last.
        let got = apply_smp(
            pod(json!([{"name": "a", "image": "1"}, {"name": "b"}, {"name": "c"}])),
            pod(
                json!([{"name": "a", "$patch": "delete"}, {"name": "a", "image": "2"}, {"name": "c", "image": "3"}]),
            ),
        );
        assert_eq!(
            got,
            json!([{"name": "b"}, {"name": "c", "image": "3"}, {"name": "a", "image": "2"}])
        );
        // Added, then deleted, in one patch: gone; a delete of a name not there: nothing.
        let got = apply_smp(
            pod(json!([{"name": "a"}])),
            pod(
                json!([{"name": "n"}, {"name": "n", "$patch": "delete"}, {"name": "z", "$patch": "delete"}]),
            ),
        );
        assert_eq!(got, json!([{"name": "a"}]));
        // Duplicated names in the object: a merge goes to the first.
        let got = apply_smp(
            pod(json!([{"name": "d", "v": 1}, {"name": "d", "v": 2}])),
            pod(json!([{"name": "d", "v": 3}])),
        );
        assert_eq!(got, json!([{"name": "d", "v": 3}, {"name": "d", "v": 2}]));
        // A long list merged item by item with a patch as long, and reordered.
        let n = 5_000;
        let live: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("c{i}"), "image": "old"}))
            .collect();
        let patch: Vec<Value> = (0..n)
            .rev()
            .map(|i| json!({"name": format!("c{i}"), "image": "new"}))
            .collect();
        let order: Vec<Value> = (0..n)
            .rev()
            .map(|i| json!({"name": format!("c{i}")}))
            .collect();
        let got = apply_smp(
            pod(Value::Array(live)),
            json!({"spec": {"containers": patch, "$setElementOrder/containers": order}}),
        );
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), n);
        assert_eq!(
            got[0],
            json!({"name": format!("c{}", n - 1), "image": "new"})
        );
        assert!(got.iter().all(|c| c["image"] == "new"));
        // Sets and primitive deletions by value.
        let finalizers = apply(
            PatchKind::Strategic,
            &json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            &json!({"metadata": {"finalizers": ["c", "d"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(finalizers["metadata"]["finalizers"], json!(["b", "c", "d"]));
    }

    #[test]
    fn strategic_merge_patches_merge_lists_by_key_and_follow_directives() {
        let deployment = json!({"spec": {"template": {"spec": {
            "containers": [{"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                           {"name": "sidecar", "image": "s:1"}],
            "volumes": [{"name": "v1", "emptyDir": {}}]}}},
            "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}});
        let cases = [
            (
                "a container merges by name; the other stays",
                json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "a:2"}]}}}}),
                json!({"spec": {"template": {"spec": {
                    "containers": [{"name": "app", "image": "a:2", "env": [{"name": "X", "value": "1"}]}, {"name": "sidecar", "image": "s:1"}],
                    "volumes": [{"name": "v1", "emptyDir": {}}]}}}, "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}}),
            ),
            (
                "a new container is appended, one is deleted by $patch",
                json!({"spec": {"template": {"spec": {"containers": [{"name": "new", "image": "n"}, {"name": "sidecar", "$patch": "delete"}]}}}}),
                json!({"spec": {"template": {"spec": {
                    "containers": [{"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]}, {"name": "new", "image": "n"}],
                    "volumes": [{"name": "v1", "emptyDir": {}}]}}}, "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}}),
            ),
            (
                "$patch: replace in a list replaces it; finalizers merge as a set; null deletes",
                json!({"spec": {"template": {"spec": {"volumes": [{"name": "v2"}, {"$patch": "replace"}]}}},
                       "metadata": {"finalizers": ["b", "a"], "labels": {"y": null}}}),
                json!({"spec": {"template": {"spec": {
                    "containers": [{"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]}, {"name": "sidecar", "image": "s:1"}],
                    "volumes": [{"name": "v2"}]}}}, "metadata": {"finalizers": ["a", "b"], "labels": {"x": "1"}}}),
            ),
            (
                "$setElementOrder, $deleteFromPrimitiveList, $patch: replace on a map",
                json!({"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}]}}},
                       "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"$patch": "replace", "z": "3"}}}),
                json!({"spec": {"template": {"spec": {
                    "containers": [{"name": "sidecar", "image": "s:1"}, {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]}],
                    "volumes": [{"name": "v1", "emptyDir": {}}]}}}, "metadata": {"finalizers": [], "labels": {"z": "3"}}}),
            ),
            (
                "$retainKeys keeps only the named fields",
                json!({"spec": {"template": {"spec": {"volumes": [{"name": "v1", "hostPath": {"path": "/x"}, "$retainKeys": ["name", "hostPath"]}]}}}}),
                json!({"spec": {"template": {"spec": {
                    "containers": [{"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]}, {"name": "sidecar", "image": "s:1"}],
                    "volumes": [{"name": "v1", "hostPath": {"path": "/x"}}]}}}, "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}}),
            ),
        ];
        for (what, patch, expected) in cases {
            let got = apply(PatchKind::Strategic, &deployment, &patch).unwrap();
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn json_patches_that_would_blow_up_are_refused_before_they_grow() {
        let target = json!({"data": {}});
        // Each copy of /data into itself doubles it: 40 of them from 1 KiB would be 1 TiB.
        let mut ops = vec![json!({"op": "add", "path": "/data/a", "value": "x".repeat(1024)})];
        ops.extend(
            (0..40).map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/b{i}")})),
        );
        let got = apply(PatchKind::Json, &target, &Value::Array(ops));
        assert!(
            matches!(&got, Err(PatchError::TooLarge(m)) if m.contains("copies")),
            "{got:?}"
        );
        // A few copies are fine.
        let few = json!([
            {"op": "add", "path": "/data/a", "value": "v"},
            {"op": "copy", "from": "/data/a", "path": "/data/b"},
        ]);
        assert_eq!(
            apply(PatchKind::Json, &target, &few).unwrap(),
            json!({"data": {"a": "v", "b": "v"}})
        );
        // kube-apiserver's cap on operations.
        let many: Vec<Value> = (0..=MAX_JSON_PATCH_OPERATIONS)
            .map(|_| json!({"op": "test", "path": "/data", "value": {}}))
            .collect();
        let got = apply(PatchKind::Json, &target, &Value::Array(many));
        assert!(
            matches!(&got, Err(PatchError::TooLarge(m)) if m.contains("maximum operations")),
            "{got:?}"
        );
        assert_eq!(json_len(&json!({"a": [1, "b"]})), r#"{"a":[1,"b"]}"#.len());
    }

    #[test]
    fn merge_patches_replace_lists_and_json_patches_fail_cleanly() {
        let target = json!({"a": [1, 2], "b": {"c": 1}});
        assert_eq!(
            apply(
                PatchKind::Merge,
                &target,
                &json!({"a": [3], "b": {"c": null}})
            )
            .unwrap(),
            json!({"a": [3], "b": {}})
        );
        assert!(matches!(
            apply(PatchKind::Merge, &target, &json!([1])),
            Err(PatchError::Parse(_))
        ));
        assert!(matches!(
            apply(
                PatchKind::Json,
                &target,
                &json!([{"op": "test", "path": "/a/0", "value": 9}])
            ),
            Err(PatchError::Apply(_))
        ));
        assert!(matches!(
            apply(PatchKind::Json, &target, &json!({"op": "add"})),
            Err(PatchError::Parse(_))
        ));
        // A missing member tests equal to null (the Go attacher's "no finalizers yet" guard);
        // a present one does not.
        let guarded = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
        ]);
        let obj = json!({"metadata": {"name": "x"}});
        assert_eq!(
            apply(PatchKind::Json, &obj, &guarded).unwrap(),
            json!({"metadata": {"name": "x", "finalizers": ["f"]}})
        );
        let has = json!({"metadata": {"name": "x", "finalizers": ["g"]}});
        assert!(matches!(
            apply(PatchKind::Json, &has, &guarded),
            Err(PatchError::Apply(_))
        ));
    }
}
