//! Fields an object's kind does not have, as kube-apiserver's `fieldValidation` treats them:
//! `Strict` (what kubectl asks for) refuses the write naming every one, `Warn` drops them and
//! says so in `Warning` headers, `Ignore` drops them. Built-in kinds are read against their
//! Kubernetes types' schemas (k8s-openapi's, the ones `kubectl explain` reads), custom
//! resources against their definition's `openAPIV3Schema` (honouring
//! `x-kubernetes-preserve-unknown-fields`).
//!
//! Unlike kube-apiserver, a write that does not name `fieldValidation` is not read for unknown
//! fields at all (kube-apiserver drops them then, with a warning): the stack's own clients
//! write typed objects, and reading every write against its schema would cost every write.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::http::Method;
use serde_json::{Map, Value};

use crate::registry::ResourceType;
use crate::status::ApiError;

/// What a write asks to be done with unknown fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Not named: nothing is checked here.
    Unset,
    /// Dropped.
    Ignore,
    /// Dropped, each named in a `Warning` header.
    Warn,
    /// The write is refused.
    Strict,
}

/// The `fieldValidation` of a request; any other value than the four kube-apiserver knows is
/// its 422 naming the verb's options.
pub fn field_validation(method: &Method, value: Option<&str>) -> Result<FieldValidation, ApiError> {
    let options = match method.as_str() {
        "POST" => "CreateOptions",
        "PUT" => "UpdateOptions",
        "PATCH" => "PatchOptions",
        _ => return Ok(FieldValidation::Unset),
    };
    match value.unwrap_or("") {
        "" => Ok(FieldValidation::Unset),
        "Ignore" => Ok(FieldValidation::Ignore),
        "Warn" => Ok(FieldValidation::Warn),
        "Strict" => Ok(FieldValidation::Strict),
        other => Err(ApiError::invalid_options(
            options,
            &format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
            ),
        )),
    }
}

/// A kind's schema: the root and the definitions its `$ref`s name.
#[derive(Debug)]
pub struct KindSchema {
    root: Value,
    definitions: Map<String, Value>,
}

/// The schema of `rt`'s objects (made once per built-in kind), if there is one.
pub fn schema_of(rt: &ResourceType) -> Option<Arc<KindSchema>> {
    if let Some(schema) = &rt.schema {
        return Some(Arc::new(KindSchema {
            root: (**schema).clone(),
            definitions: Map::new(),
        }));
    }
    static BUILTIN: OnceLock<parking_lot::Mutex<HashMap<String, Option<Arc<KindSchema>>>>> =
        OnceLock::new();
    let key = format!("{}/{}", rt.api_version(), rt.kind);
    BUILTIN
        .get_or_init(Default::default)
        .lock()
        .entry(key)
        .or_insert_with(|| {
            let (name, definitions) =
                crate::openapi::kind_definitions(&rt.api_version(), &rt.kind)?;
            let root = definitions.get(&name)?.clone();
            Some(Arc::new(KindSchema { root, definitions }))
        })
        .clone()
}

/// Removes from `object` the fields `schema` does not have; their paths as kube-apiserver
/// names them (`spec.containers[0].bogus`), in the order met.
pub fn drop_unknown(schema: &KindSchema, object: &mut Value) -> Vec<String> {
    let mut unknown = Vec::new();
    walk(schema, &schema.root, object, "", &mut unknown);
    unknown
}

/// `schema` with its `$ref` followed (through at most a few references), also one wrapped in
/// a single `allOf` (how a described field refers to its type).
fn resolved<'a>(kind: &'a KindSchema, mut schema: &'a Value) -> &'a Value {
    for _ in 0..8 {
        let reference = schema.get("$ref").or_else(|| match schema.get("allOf") {
            Some(Value::Array(all)) if all.len() == 1 => all[0].get("$ref"),
            _ => None,
        });
        let Some(name) = reference
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next())
        else {
            break;
        };
        match kind.definitions.get(name) {
            Some(next) => schema = next,
            None => break,
        }
    }
    schema
}

fn walk(
    kind: &KindSchema,
    schema: &Value,
    value: &mut Value,
    path: &str,
    unknown: &mut Vec<String>,
) {
    let schema = resolved(kind, schema);
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if properties.is_none() && additional.is_none() {
                // A free-form object (raw JSON, an extension): anything goes.
                return;
            }
            let mut dropped = Vec::new();
            for (key, field) in fields.iter_mut() {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                // Strategic-merge-patch directives are not fields, and every object has its
                // type and metadata (a custom resource's schema need not say so).
                if key.starts_with('$')
                    || (path.is_empty()
                        && matches!(key.as_str(), "apiVersion" | "kind" | "metadata"))
                        && properties.is_none_or(|p| !p.contains_key(key))
                {
                    continue;
                }
                match properties.and_then(|p| p.get(key)).or(additional) {
                    Some(field_schema) => walk(kind, field_schema, field, &child, unknown),
                    None => {
                        unknown.push(child);
                        dropped.push(key.clone());
                    }
                }
            }
            for key in dropped {
                fields.remove(&key);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(kind, item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// kube-apiserver's words for unknown fields: `unknown field "a", unknown field "b"`.
pub fn listed(unknown: &[String]) -> String {
    unknown
        .iter()
        .map(|path| format!("unknown field {path:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `Warning` header values for unknown fields (`299 - "unknown field \"a\""`).
pub fn warnings(unknown: &[String]) -> Vec<String> {
    unknown
        .iter()
        .map(|path| {
            let text = format!("unknown field {path:?}");
            format!("299 - {text:?}")
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rt(group: &str, plural: &str) -> Arc<ResourceType> {
        crate::registry::Registry::default()
            .find(group, "v1", plural)
            .unwrap()
    }

    #[test]
    fn unknown_fields_of_built_in_kinds_are_found_and_dropped() {
        let claims = schema_of(&rt("", "persistentvolumeclaims")).unwrap();
        let mut claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "bogus": 1, "labels": {"any": "key"}},
            "spec": {"storageClass": "x", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}, "extra": 2},
                     "dataSourceRef": {"kind": "K", "name": "n", "namespace": "o"}},
            "status": {"junk": 1, "phase": "Pending"},
        });
        let unknown = drop_unknown(&claims, &mut claim);
        let mut sorted = unknown.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "metadata.bogus",
                "spec.resources.extra",
                "spec.storageClass",
                "status.junk"
            ]
        );
        assert_eq!(
            claim,
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "c", "labels": {"any": "key"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                         "dataSourceRef": {"kind": "K", "name": "n", "namespace": "o"}},
                "status": {"phase": "Pending"},
            })
        );
        let pods = schema_of(&rt("", "pods")).unwrap();
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "b", "resources": {"limits": {"cpu": "1"}}},
            {"name": "c", "image": "d", "bogus": true},
        ], "nodeSelector": {"any": "thing"}}});
        assert_eq!(drop_unknown(&pods, &mut pod), ["spec.containers[1].bogus"]);
        // A strategic merge patch's directives are not fields.
        let mut patch = json!({"spec": {"$retainKeys": ["a"], "containers": [{"name": "a", "$patch": "delete"}]}});
        assert!(drop_unknown(&pods, &mut patch).is_empty(), "{patch}");
    }

    #[test]
    fn custom_resources_follow_their_schema_and_keep_what_it_preserves() {
        let mut pool = (*rt("", "configmaps")).clone();
        // Its type and metadata go unsaid, as in most definitions.
        pool.schema = Some(Arc::new(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "size": {"type": "integer"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }},
            },
        })));
        let schema = schema_of(&pool).unwrap();
        let mut object = json!({"apiVersion": "example.dev/v1", "kind": "Pool", "metadata": {"name": "p", "anything": 1},
            "spec": {"size": 1, "sise": 2, "free": {"x": {"y": 1}}}});
        assert_eq!(drop_unknown(&schema, &mut object), ["spec.sise"]);
    }

    #[test]
    fn field_validation_takes_kube_apiservers_four_values() {
        assert_eq!(
            field_validation(&Method::POST, Some("Strict")).unwrap(),
            FieldValidation::Strict
        );
        assert_eq!(
            field_validation(&Method::PUT, None).unwrap(),
            FieldValidation::Unset
        );
        assert_eq!(
            field_validation(&Method::DELETE, Some("nonsense")).unwrap(),
            FieldValidation::Unset
        );
        let refused = field_validation(&Method::POST, Some("bogus")).unwrap_err();
        assert_eq!(
            refused.message,
            r#"CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "bogus": supported values: "", "Ignore", "Strict", "Warn""#
        );
        assert_eq!(
            listed(&["a".into(), "b.c".into()]),
            r#"unknown field "a", unknown field "b.c""#
        );
        assert_eq!(warnings(&["a".into()]), [r#"299 - "unknown field \"a\"""#]);
    }
}
