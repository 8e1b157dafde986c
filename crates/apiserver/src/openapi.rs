//! The schemas of the OpenAPI v3 documents, which `kubectl explain` reads: for each built-in
//! kind of a group version, the schema of its Kubernetes type (fields, types, descriptions:
//! k8s-openapi's, named as Kubernetes names them, `io.k8s.api.core.v1.PersistentVolumeClaim`)
//! marked with its group, version and kind (`x-kubernetes-group-version-kind`, how kubectl
//! finds it); for a custom resource, its definition's `openAPIV3Schema`.

use std::collections::HashMap;
use std::sync::OnceLock;

use k8s_openapi::api::{
    apps, authentication, authorization, coordination, core, events, rbac, storage,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::registry::ResourceType;
use std::sync::Arc;

/// The schema of a built-in kind, added to `generator`'s definitions; its definition's name,
/// or None for a kind without one.
fn define(generator: &mut SchemaGenerator, api_version: &str, kind: &str) -> Option<String> {
    fn add<T: JsonSchema>(generator: &mut SchemaGenerator) -> Option<String> {
        generator.subschema_for::<T>();
        Some(T::schema_name().into_owned())
    }
    match (api_version, kind) {
        ("v1", "Namespace") => add::<core::v1::Namespace>(generator),
        ("v1", "Node") => add::<core::v1::Node>(generator),
        ("v1", "PersistentVolume") => add::<core::v1::PersistentVolume>(generator),
        ("v1", "PersistentVolumeClaim") => add::<core::v1::PersistentVolumeClaim>(generator),
        ("v1", "Pod") => add::<core::v1::Pod>(generator),
        ("v1", "Secret") => add::<core::v1::Secret>(generator),
        ("v1", "ConfigMap") => add::<core::v1::ConfigMap>(generator),
        ("v1", "Event") => add::<core::v1::Event>(generator),
        ("v1", "ServiceAccount") => add::<core::v1::ServiceAccount>(generator),
        ("storage.k8s.io/v1", "StorageClass") => add::<storage::v1::StorageClass>(generator),
        ("storage.k8s.io/v1", "CSIDriver") => add::<storage::v1::CSIDriver>(generator),
        ("storage.k8s.io/v1", "CSINode") => add::<storage::v1::CSINode>(generator),
        ("storage.k8s.io/v1", "CSIStorageCapacity") => {
            add::<storage::v1::CSIStorageCapacity>(generator)
        }
        ("storage.k8s.io/v1", "VolumeAttachment") => {
            add::<storage::v1::VolumeAttachment>(generator)
        }
        ("storage.k8s.io/v1", "VolumeAttributesClass") => {
            add::<storage::v1::VolumeAttributesClass>(generator)
        }
        ("coordination.k8s.io/v1", "Lease") => add::<coordination::v1::Lease>(generator),
        ("events.k8s.io/v1", "Event") => add::<events::v1::Event>(generator),
        ("authentication.k8s.io/v1", "SelfSubjectReview") => {
            add::<authentication::v1::SelfSubjectReview>(generator)
        }
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            add::<authorization::v1::SelfSubjectAccessReview>(generator)
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            add::<authorization::v1::SelfSubjectRulesReview>(generator)
        }
        ("authorization.k8s.io/v1", "SubjectAccessReview") => {
            add::<authorization::v1::SubjectAccessReview>(generator)
        }
        ("apps/v1", "Deployment") => add::<apps::v1::Deployment>(generator),
        ("apps/v1", "StatefulSet") => add::<apps::v1::StatefulSet>(generator),
        ("apps/v1", "DaemonSet") => add::<apps::v1::DaemonSet>(generator),
        ("apps/v1", "ReplicaSet") => add::<apps::v1::ReplicaSet>(generator),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            add::<apiextensions::CustomResourceDefinition>(generator)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => add::<rbac::v1::Role>(generator),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => add::<rbac::v1::ClusterRole>(generator),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => add::<rbac::v1::RoleBinding>(generator),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            add::<rbac::v1::ClusterRoleBinding>(generator)
        }
        _ => None,
    }
}

/// The schema of a built-in kind by its `apiVersion` and kind: its definition's name and every
/// definition it refers to (by `$ref`, `#/components/schemas/<name>`).
pub(crate) fn kind_definitions(
    api_version: &str,
    kind: &str,
) -> Option<(String, Map<String, Value>)> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let name = define(&mut generator, api_version, kind)?;
    Some((name, generator.take_definitions(true)))
}

fn gvk(rt: &ResourceType) -> Value {
    json!([{"group": rt.group, "version": rt.version, "kind": rt.kind}])
}

/// The built-in kinds' schemas of a group version, made once per group version.
fn builtin(types: &[Arc<ResourceType>]) -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let named: Vec<(String, &ResourceType)> = types
        .iter()
        .filter_map(|rt| define(&mut generator, &rt.api_version(), &rt.kind).map(|n| (n, &**rt)))
        .collect();
    let mut schemas = generator.take_definitions(true);
    for (name, rt) in named {
        if let Some(schema) = schemas.get_mut(&name).and_then(Value::as_object_mut) {
            schema.insert("x-kubernetes-group-version-kind".into(), gvk(rt));
        }
    }
    schemas
}

/// The `components.schemas` of the document of `group/version`, whose kinds are `types`.
pub fn schemas(group: &str, version: &str, types: &[Arc<ResourceType>]) -> Map<String, Value> {
    static BUILTIN: OnceLock<parking_lot::Mutex<HashMap<String, Map<String, Value>>>> =
        OnceLock::new();
    let key = format!("{group}/{version}");
    let builtins: Vec<Arc<ResourceType>> = types
        .iter()
        .filter(|t| t.schema.is_none())
        .cloned()
        .collect();
    let mut out = {
        let cache = BUILTIN.get_or_init(Default::default);
        let mut cache = cache.lock();
        cache
            .entry(key)
            .or_insert_with(|| builtin(&builtins))
            .clone()
    };
    // A custom resource: its definition's schema, named as kube-apiserver names it.
    for rt in types {
        if let Some(schema) = &rt.schema {
            let reversed: Vec<&str> = rt.group.split('.').rev().collect();
            let name = format!("{}.{}.{}", reversed.join("."), rt.version, rt.kind);
            let mut schema = (**schema).clone();
            if let Some(object) = schema.as_object_mut() {
                object.insert("x-kubernetes-group-version-kind".into(), gvk(rt));
            }
            out.insert(name, schema);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_kinds_schema_is_found_by_its_group_version_kind_and_its_fields_by_reference() {
        let registry = crate::registry::Registry::default();
        let core: Vec<Arc<ResourceType>> = registry
            .all()
            .into_iter()
            .filter(|t| t.group.is_empty())
            .collect();
        let schemas = schemas("", "v1", &core);
        let claim = schemas
            .values()
            .find(|s| {
                s["x-kubernetes-group-version-kind"]
                    == json!([{"group": "", "version": "v1", "kind": "PersistentVolumeClaim"}])
            })
            .unwrap();
        assert!(claim["description"].as_str().is_some_and(|d| !d.is_empty()));
        // spec → PersistentVolumeClaimSpec → dataSourceRef, as kubectl explain walks them.
        let reference = |v: &Value| -> String {
            let r = v["$ref"]
                .as_str()
                .or_else(|| v["allOf"][0]["$ref"].as_str())
                .unwrap_or_default();
            r.trim_start_matches("#/components/schemas/").to_string()
        };
        let spec = &schemas[&reference(&claim["properties"]["spec"])];
        let source = &spec["properties"]["dataSourceRef"];
        assert!(!reference(source).is_empty(), "{source}");
        assert!(schemas.contains_key(&reference(source)));
    }
}
