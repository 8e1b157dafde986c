//! The manifests of `deploy/kubernetes`, as the embedded stack applies them: YAML documents
//! read into objects, the optional rules a feature needs uncommented as their comments tell a
//! user to, moved to the namespace the stack runs its components in, and created or updated
//! in the API server. `volstack up` runs every component under the identities and the RBAC these
//! manifests give, so a rule they lack fails there as it would on a real cluster.

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

/// `deploy/kubernetes/rbac.yaml`: csi-provisioner.
pub const PROVISIONER_RBAC: &str = include_str!("../../../deploy/kubernetes/rbac.yaml");
/// `deploy/kubernetes/rbac-volume-sets.yaml`: csi-provisioner --enable-volume-sets.
pub const VOLUME_SETS_RBAC: &str = include_str!("../../../deploy/kubernetes/rbac-volume-sets.yaml");
/// `deploy/kubernetes/attacher-rbac.yaml`: csi-attacher.
pub const ATTACHER_RBAC: &str = include_str!("../../../deploy/kubernetes/attacher-rbac.yaml");
/// `deploy/kubernetes/pv-controller-rbac.yaml`: volstack pv-controller.
pub const PV_CONTROLLER_RBAC: &str =
    include_str!("../../../deploy/kubernetes/pv-controller-rbac.yaml");
/// The roles of the embedded stack's own components (scheduler, node agents, snapshot
/// controller), which a real cluster has from kube-scheduler, kubelet and the snapshot
/// controller.
pub const EMBEDDED_RBAC: &str = include_str!("embedded/rbac.yaml");

/// Why a manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not YAML.
    #[error("failed to parse a manifest: {0}")]
    Parse(String),
    /// A document names a kind the stack does not apply.
    #[error("a manifest names a kind the stack cannot apply: {0}")]
    Kind(String),
    /// The API server refused an object.
    #[error("failed to apply {kind} {name}: {source}")]
    Apply {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// The API server's answer.
        source: kube::Error,
    },
}

/// The objects of a multi-document YAML text (empty documents skipped).
pub fn parse(text: &str) -> Result<Vec<Value>, ManifestError> {
    sidecar_kit::yaml::objects(text).map_err(ManifestError::Parse)
}

/// The text with its optional rules uncommented, as each rule's comment asks a user to when
/// they need the feature: a commented YAML line (`# - apiGroups:` or `#   verbs:`, the `#` at
/// the rule's indentation followed by one space) loses its `# `; prose comments are kept.
pub fn with_optional_rules(text: &str) -> String {
    text.lines()
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            let rest = &line[indent..];
            match rest.strip_prefix("# ") {
                Some(yaml) if yaml.starts_with("- ") || yaml.starts_with("  ") => {
                    format!("{}{yaml}", &line[..indent])
                }
                _ => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Moves namespaced objects and the ServiceAccount subjects of bindings from `default` (where
/// the manifests put them, as upstream's do) to `namespace`.
pub fn in_namespace(objects: &mut [Value], namespace: &str) {
    for object in objects {
        if object["metadata"]["namespace"].as_str() == Some("default") {
            object["metadata"]["namespace"] = Value::String(namespace.to_string());
        }
        // `get_mut`: indexing a JSON object mutably adds the key (`"subjects": null` was
        // written into every ClusterRole and Deployment, and kubectl replace of one read back
        // was then refused for its unknown field).
        for subject in object
            .get_mut("subjects")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if subject["namespace"].as_str() == Some("default") {
                subject["namespace"] = Value::String(namespace.to_string());
            }
        }
    }
}

/// Where a kind of the manifests is served: (group, version, plural, namespaced).
fn resource_of(api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
    let (plural, namespaced) = match (api_version, kind) {
        ("v1", "ServiceAccount") => ("serviceaccounts", true),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => ("clusterroles", false),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => ("clusterrolebindings", false),
        ("rbac.authorization.k8s.io/v1", "Role") => ("roles", true),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => ("rolebindings", true),
        _ => return None,
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Some((
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
        },
        namespaced,
    ))
}

/// Creates each object, or replaces it with the manifest's version when it exists (the
/// rules a start applies are the manifests', whatever was changed by hand since).
pub async fn apply(client: &kube::Client, objects: &[Value]) -> Result<(), ManifestError> {
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (resource, namespaced) = resource_of(api_version, kind)
            .ok_or_else(|| ManifestError::Kind(format!("{api_version} {kind}")))?;
        let api: Api<DynamicObject> = if namespaced {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), namespace, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let failed = |source| ManifestError::Apply {
            kind: kind.to_string(),
            name: name.clone(),
            source,
        };
        let mut wanted: DynamicObject = serde_json::from_value(object.clone())
            .map_err(|e| failed(kube::Error::SerdeError(e)))?;
        match api.create(&PostParams::default(), &wanted).await {
            Ok(_) => continue,
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
            Err(error) => return Err(failed(error)),
        }
        let current = api.get(&name).await.map_err(failed)?;
        wanted.metadata.resource_version = current.metadata.resource_version;
        api.replace(&name, &PostParams::default(), &wanted)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_parse_and_name_only_kinds_the_stack_applies() {
        for text in [
            PROVISIONER_RBAC,
            VOLUME_SETS_RBAC,
            ATTACHER_RBAC,
            PV_CONTROLLER_RBAC,
            EMBEDDED_RBAC,
        ] {
            let objects = parse(&with_optional_rules(text)).unwrap();
            assert!(!objects.is_empty());
            for object in &objects {
                let api_version = object["apiVersion"].as_str().unwrap_or_default();
                let kind = object["kind"].as_str().unwrap_or_default();
                assert!(resource_of(api_version, kind).is_some(), "{object}");
            }
        }
    }

    #[test]
    fn optional_rules_are_uncommented_and_prose_is_kept() {
        let text = "rules:\n  # Uncomment for secrets.\n  # - apiGroups: [\"\"]\n  #   resources: [\"secrets\"]\n  #   verbs: [\"get\"]\n  - apiGroups: [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"get\"]\n";
        let uncommented = with_optional_rules(text);
        assert!(uncommented.contains("  # Uncomment for secrets."));
        let objects = parse(&uncommented).unwrap();
        let rules = objects[0]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["resources"], serde_json::json!(["secrets"]));
        // Without uncommenting, only the active rule.
        assert_eq!(
            parse(text).unwrap()[0]["rules"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn the_provisioners_optional_rules_are_secrets_and_reference_grants() {
        let all = parse(&with_optional_rules(PROVISIONER_RBAC)).unwrap();
        let active = parse(PROVISIONER_RBAC).unwrap();
        let resources = |objects: &[Value]| -> Vec<String> {
            objects
                .iter()
                .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
                .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect()
        };
        let mut extra: Vec<String> = resources(&all)
            .into_iter()
            .filter(|r| !resources(&active).contains(r))
            .collect();
        extra.sort();
        assert_eq!(extra, ["referencegrants", "secrets"]);
    }

    #[test]
    fn objects_move_to_the_stacks_namespace() {
        let mut objects = parse(PROVISIONER_RBAC).unwrap();
        in_namespace(&mut objects, "kube-system");
        for object in &objects {
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                assert_eq!(ns, "kube-system");
            }
            for subject in object["subjects"].as_array().into_iter().flatten() {
                assert_eq!(subject["namespace"], "kube-system");
            }
            // Nothing is added to objects that have no subjects.
            if object["kind"] != "ClusterRoleBinding" && object["kind"] != "RoleBinding" {
                assert!(object.get("subjects").is_none(), "{object}");
            }
        }
    }
}
