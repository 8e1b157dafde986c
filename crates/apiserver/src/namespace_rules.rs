//! kube-apiserver's namespace lifecycle as rules over stored namespaces: every new namespace is
//! held by the `kubernetes` finalizer of its spec, which only the `finalize` subresource (and
//! the namespace's emptying, `server::namespaces`) changes; a namespace goes once its spec's
//! and its metadata's finalizers are all gone.

use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::store::Write2;

/// On create: the `kubernetes` finalizer added to the spec's list, whatever the body holds
/// (kube-apiserver's PrepareForCreate). A body whose spec is not an object is left to the
/// type's own check.
pub fn held_at_create(obj: &mut Value) {
    let Some(list) = spec_of(obj).map(|spec| {
        let list = spec.entry("finalizers").or_insert_with(|| json!([]));
        if list.is_null() {
            *list = json!([]);
        }
        list
    }) else {
        return;
    };
    if let Some(list) = list.as_array_mut()
        && !list.iter().any(|f| f == NAMESPACE_FINALIZER)
    {
        list.push(json!(NAMESPACE_FINALIZER));
    }
}

/// On update: the stored `spec.finalizers` kept (kube-apiserver's PrepareForUpdate), so an
/// update neither drops `kubernetes` nor brings it back once the emptying took it off.
pub fn keep_spec_finalizers(current: &Value, next: &mut Value) {
    let stored = current["spec"].get("finalizers").cloned();
    let Some(spec) = spec_of(next) else {
        return;
    };
    match stored {
        Some(list) => {
            spec.insert("finalizers".into(), list);
        }
        None => {
            spec.remove("finalizers");
        }
    }
}

/// The spec of namespace `obj` as a map, made when absent or null; None when `obj` or its
/// spec is something else.
fn spec_of(obj: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let spec = obj
        .as_object_mut()?
        .entry("spec")
        .or_insert_with(|| json!({}));
    if spec.is_null() {
        *spec = json!({});
    }
    spec.as_object_mut()
}

/// The finalizer of `spec.finalizers` that kube-apiserver puts on every namespace and its
/// namespace controller takes off once the namespace is empty.
pub const NAMESPACE_FINALIZER: &str = "kubernetes";

/// Whether an object written with `next` is removed instead: one being deleted that no
/// finalizer holds; a namespace also needs its `spec.finalizers` gone (kube-apiserver's
/// ShouldDeleteNamespaceDuringUpdate), so dropping its own finalizers while it still has
/// contents does not remove it.
pub fn gone_once_written(rt: &ResourceType, next: &Value) -> bool {
    let empty = |list: &Value| list.as_array().is_none_or(Vec::is_empty);
    let deleting = !next["metadata"]["deletionTimestamp"].is_null();
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    deleting
        && empty(&next["metadata"]["finalizers"])
        && (!is_namespace || empty(&next["spec"]["finalizers"]))
}

/// What an update of a namespace's `finalize` subresource writes into `next` (the update as
/// any other, status kept): the body's `spec.finalizers` (none when it has none), which a
/// plain update keeps as stored (kube-apiserver's finalize strategy keeps the status only).
pub fn finalize_update(incoming: &Value, next: &mut Value) {
    let wanted = incoming["spec"]["finalizers"]
        .as_array()
        .filter(|list| !list.is_empty())
        .cloned();
    if let Some(spec) = spec_of(next) {
        match wanted {
            Some(list) => {
                spec.insert("finalizers".into(), Value::Array(list));
            }
            None => {
                spec.remove("finalizers");
            }
        }
    }
}

/// The finalizers a namespace's spec may not hold, in kube-apiserver's words: each must be a
/// qualified name, and one without a prefix a standard finalizer (`kubernetes`, `orphan`,
/// `foregroundDeletion`).
pub fn spec_finalizer_errors(obj: &Value) -> Vec<String> {
    const STANDARD: [&str; 3] = [NAMESPACE_FINALIZER, "orphan", "foregroundDeletion"];
    let Some(list) = obj["spec"]["finalizers"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .filter_map(|(i, finalizer)| {
            let text = finalizer.as_str().unwrap_or_default();
            let why = crate::meta_rules::qualified_name_error(text).or_else(|| {
                (!text.contains('/') && !STANDARD.contains(&text)).then(|| {
                    "name is neither a standard finalizer name nor is it fully qualified"
                        .to_string()
                })
            })?;
            Some(format!(
                "spec.finalizers[{i}]: Invalid value: {text:?}: {why}"
            ))
        })
        .collect()
}

/// Whether stored namespace `stored` is for its emptying task: being deleted and still held by
/// the `kubernetes` finalizer.
pub fn needs_emptying(stored: Option<&Value>) -> bool {
    stored.is_some_and(|ns| {
        !ns["metadata"]["deletionTimestamp"].is_null()
            && ns["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == NAMESPACE_FINALIZER))
    })
}

/// What finalizing emptied namespace `stored` writes: the `kubernetes` finalizer taken off,
/// and the namespace removed when no other finalizer (of its spec or metadata) holds it.
pub fn finalized(stored: &Value) -> Write2 {
    let mut next = stored.clone();
    if let Some(list) = next["spec"]["finalizers"].as_array_mut() {
        list.retain(|f| f != NAMESPACE_FINALIZER);
    }
    let empty = |list: &Value| list.as_array().is_none_or(Vec::is_empty);
    if empty(&next["spec"]["finalizers"]) {
        if let Some(spec) = next["spec"].as_object_mut() {
            spec.remove("finalizers");
        }
        if empty(&next["metadata"]["finalizers"]) {
            return Write2::Delete;
        }
    }
    Write2::Put(next)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn rt(plural: &str) -> std::sync::Arc<ResourceType> {
        Registry::default().find("", "v1", plural).unwrap()
    }

    #[test]
    fn a_namespace_is_emptied_finalized_and_removed_as_kube_does() {
        let ns = |deleting: bool, spec: Value, meta: Value| {
            let mut ns = json!({"metadata": {"name": "n"}, "spec": {"finalizers": spec}});
            if deleting {
                ns["metadata"]["deletionTimestamp"] = json!("t");
            }
            if !meta.is_null() {
                ns["metadata"]["finalizers"] = meta;
            }
            ns
        };
        let held = json!(["kubernetes"]);
        let none = json!([]);
        let own = json!(["example.com/keep"]);
        // (namespace, needs its task, what finalizing writes, removed when written as is)
        let rows = [
            (ns(false, held.clone(), Value::Null), false, "delete", false),
            (ns(true, held.clone(), Value::Null), true, "delete", false),
            (ns(true, held.clone(), own.clone()), true, "put", false),
            (
                ns(true, json!(["kubernetes", "other"]), Value::Null),
                true,
                "put",
                false,
            ),
            (ns(true, none.clone(), Value::Null), false, "delete", true),
            (ns(true, none.clone(), own.clone()), false, "put", false),
            (ns(true, Value::Null, Value::Null), false, "delete", true),
        ];
        let namespaces = rt("namespaces");
        for (i, (stored, needs, finalizing, gone)) in rows.into_iter().enumerate() {
            assert_eq!(
                needs_emptying(Some(&stored)),
                needs,
                "row {i}: needs emptying"
            );
            let written = match finalized(&stored) {
                Write2::Delete => "delete",
                Write2::Put(next) => {
                    let left = next["spec"]["finalizers"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    assert!(!left.contains(&json!("kubernetes")), "row {i}: {next}");
                    "put"
                }
                Write2::Keep => "keep",
            };
            assert_eq!(written, finalizing, "row {i}: finalizing");
            assert_eq!(
                gone_once_written(&namespaces, &stored),
                gone,
                "row {i}: removed"
            );
        }
        assert!(!needs_emptying(None));
        // Any other kind goes with its last finalizer, whatever its spec holds.
        let map = json!({"metadata": {"deletionTimestamp": "t"}, "spec": {"finalizers": ["x"]}});
        assert!(gone_once_written(&rt("configmaps"), &map));
    }

    #[test]
    fn the_kubernetes_finalizer_is_added_at_create_and_spec_finalizers_kept_on_update() {
        // (body at create, spec.finalizers stored)
        let rows = [
            (json!({}), json!(["kubernetes"])),
            (json!({"spec": {}}), json!(["kubernetes"])),
            (json!({"spec": {"finalizers": []}}), json!(["kubernetes"])),
            (
                json!({"spec": {"finalizers": ["x"]}}),
                json!(["x", "kubernetes"]),
            ),
            (
                json!({"spec": {"finalizers": ["kubernetes"]}}),
                json!(["kubernetes"]),
            ),
        ];
        for (mut body, stored) in rows {
            held_at_create(&mut body);
            assert_eq!(body["spec"]["finalizers"], stored);
        }
        // Bodies of the wrong shape are left alone (the type's check refuses them), not a panic.
        for mut body in [
            json!({"spec": 5}),
            json!([1]),
            json!({"spec": {"finalizers": "x"}}),
        ] {
            let before = body.clone();
            held_at_create(&mut body);
            keep_spec_finalizers(&json!({"spec": {"finalizers": ["kubernetes"]}}), &mut body);
            if before["spec"].is_object() {
                assert_eq!(body["spec"]["finalizers"], json!(["kubernetes"]));
            } else {
                assert_eq!(body, before);
            }
        }
        // (stored, the update's body, written)
        let rows = [
            (
                json!({"spec": {"finalizers": ["kubernetes"]}}),
                json!({"spec": {}}),
                json!(["kubernetes"]),
            ),
            (
                json!({"spec": {}}),
                json!({"spec": {"finalizers": ["kubernetes"]}}),
                Value::Null,
            ),
            (
                json!({}),
                json!({"spec": {"finalizers": ["a"]}}),
                Value::Null,
            ),
        ];
        for (current, mut next, written) in rows {
            keep_spec_finalizers(&current, &mut next);
            assert_eq!(next["spec"]["finalizers"], written, "{current}");
        }
        // The finalize subresource writes the body's list.
        let body = json!({"spec": {"finalizers": ["example.com/x"]}});
        let mut next = json!({"metadata": {"name": "n"}, "spec": {"finalizers": ["kubernetes"]}});
        finalize_update(&body, &mut next);
        assert_eq!(next["spec"]["finalizers"], json!(["example.com/x"]));
        finalize_update(&json!({"spec": {}}), &mut next);
        assert!(next["spec"].get("finalizers").is_none());
        // Names as kube-apiserver checks them.
        let errors = spec_finalizer_errors(
            &json!({"spec": {"finalizers": ["kubernetes", "foo", "example.com/x", "a b/c"]}}),
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(
            errors[0],
            "spec.finalizers[1]: Invalid value: \"foo\": name is neither a standard finalizer name nor is it fully qualified"
        );
        assert!(
            errors[1].starts_with("spec.finalizers[3]: Invalid value: \"a b/c\": "),
            "{errors:?}"
        );
    }
}
