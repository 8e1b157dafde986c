//! Field sets in FieldsV1: building one from a configuration, its leaves, reading and removing
//! the value at a path, and writing a path as kube-apiserver's messages do.

use serde_json::{Map, Value, json};

use crate::patch::merge_key;

/// Metadata that is the server's, never owned by a manager.
const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// One path of a field set, as FieldsV1 keys.
pub type Path = Vec<String>;

/// The FieldsV1 set of an applied configuration.
pub fn field_set(config: &Value) -> Value {
    let Value::Object(map) = config else {
        return json!({});
    };
    let mut out = Map::new();
    for (k, v) in map {
        if k == "apiVersion" || k == "kind" || k.starts_with('$') {
            continue;
        }
        let inner = if k == "metadata" {
            let mut meta = v.clone();
            if let Some(m) = meta.as_object_mut() {
                m.retain(|key, _| !SYSTEM_METADATA.contains(&key.as_str()));
                if m.is_empty() {
                    continue;
                }
            }
            fields_of(&meta, k)
        } else {
            fields_of(v, k)
        };
        out.insert(format!("f:{k}"), inner);
    }
    Value::Object(out)
}

fn fields_of(value: &Value, name: &str) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if !k.starts_with('$') {
                    out.insert(format!("f:{k}"), fields_of(v, k));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Map::new();
            match merge_key(name) {
                Some(key) if items.iter().all(Value::is_object) => {
                    for item in items {
                        let Some(id) = item.get(key) else { continue };
                        let mut inner = match fields_of(item, name) {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        inner.insert(".".into(), json!({}));
                        out.insert(format!("k:{}", json!({ key: id })), Value::Object(inner));
                    }
                }
                _ if name == "finalizers" => {
                    for item in items {
                        out.insert(format!("v:{item}"), json!({}));
                    }
                }
                // Any other list is atomic: owned as a whole.
                _ => {}
            }
            Value::Object(out)
        }
        _ => json!({}),
    }
}

/// The leaves of a field set: paths to fields (and to list items, ending in `.`).
pub fn leaves(set: &Value) -> Vec<Path> {
    let mut out = Vec::new();
    collect(set, &mut Vec::new(), &mut out);
    out
}

fn collect(set: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
    let Value::Object(map) = set else { return };
    if map.is_empty() && !prefix.is_empty() {
        out.push(prefix.clone());
        return;
    }
    for (k, v) in map {
        prefix.push(k.clone());
        if k == "." {
            out.push(prefix.clone());
        } else {
            collect(v, prefix, out);
        }
        prefix.pop();
    }
}

/// The value at a path in an object, if it is there.
pub fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut current = object;
    for segment in path {
        current = step(current, segment)?;
    }
    Some(current)
}

fn step<'a>(value: &'a Value, segment: &str) -> Option<&'a Value> {
    if segment == "." {
        return Some(value);
    }
    if let Some(field) = segment.strip_prefix("f:") {
        return value.get(field);
    }
    let items = value.as_array()?;
    if let Some(key) = segment.strip_prefix("k:") {
        let key: Value = serde_json::from_str(key).ok()?;
        let key = key.as_object()?;
        return items
            .iter()
            .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)));
    }
    if let Some(member) = segment.strip_prefix("v:") {
        let member: Value = serde_json::from_str(member).ok()?;
        return items.iter().find(|item| **item == member);
    }
    None
}

/// Removes the field or list item at `path`.
pub(super) fn remove_at(object: &mut Value, path: &[String]) {
    let (last, parent_path) = match path {
        [parent @ .., last] if last == "." => match parent {
            [grand @ .., item] => (item.as_str(), grand),
            [] => return,
        },
        [parent @ .., last] => (last.as_str(), parent),
        [] => return,
    };
    let mut parent = object;
    for segment in parent_path {
        let next = if let Some(field) = segment.strip_prefix("f:") {
            parent.get_mut(field)
        } else {
            let found = step(parent, segment).cloned();
            parent
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|i| Some(&**i) == found.as_ref()))
        };
        let Some(next) = next else { return };
        parent = next;
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = parent.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(found) = step(parent, last).cloned()
        && let Some(items) = parent.as_array_mut()
    {
        items.retain(|i| *i != found);
    }
}

/// A path written as kube-apiserver writes it in conflicts (`.spec.containers[name="a"].image`).
pub fn describe(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if let Some(field) = segment.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = segment.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).unwrap_or(Value::Null);
            let parts: Vec<String> = key
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(member) = segment.strip_prefix("v:") {
            out.push_str(&format!("[={member}]"));
        }
    }
    out
}

pub(super) fn set_from_leaves(leaves: &[Path]) -> Value {
    let mut root = json!({});
    for path in leaves {
        let mut node = &mut root;
        for segment in path {
            node = match node {
                Value::Object(map) => map.entry(segment.clone()).or_insert(json!({})),
                _ => break,
            };
        }
    }
    root
}
