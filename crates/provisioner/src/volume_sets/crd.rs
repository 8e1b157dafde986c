//! The `persistentvolumesets.storage.volstack.dev` CustomResourceDefinition: cluster-scoped,
//! short name `pvset`, status and scale subresources (`kubectl scale pvset --replicas=N` sets
//! the maximum), printer columns and an OpenAPI schema for the seed's fields.
//! `deploy/kubernetes/persistentvolumeset-crd.json` is this definition (a test keeps them
//! equal).

use serde_json::{Value, json};

use super::types::{GROUP, VERSION};

fn column(name: &str, kind: &str, path: &str) -> Value {
    json!({"name": name, "type": kind, "jsonPath": path})
}

/// The definition.
pub fn definition() -> Value {
    let count = json!({"type": "integer", "format": "int32", "minimum": 0});
    // A LabelSelector, or the seed's plain map of labels (its keys kept: read as matchLabels).
    let label_selector = json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "matchExpressions": {"type": "array", "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            }},
        },
    });
    let template = json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "metadata": {"type": "object", "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            }},
            // A PersistentVolume spec: the fields the manager reads are checked here, a volume
            // source (for static volumes) is kept as given.
            "spec": {
                "type": "object",
                "required": ["capacity", "accessModes"],
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "storageClassName": {"type": "string"},
                    "capacity": {
                        "type": "object",
                        "required": ["storage"],
                        "properties": {"storage": {"x-kubernetes-int-or-string": true}},
                    },
                    "accessModes": {"type": "array", "minItems": 1, "items": {
                        "type": "string",
                        "enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"],
                    }},
                    "volumeMode": {"type": "string", "enum": ["Filesystem", "Block"]},
                    "persistentVolumeReclaimPolicy": {"type": "string", "enum": ["Retain", "Delete", "Recycle"]},
                    "mountOptions": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    });
    let condition = json!({
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    });
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("persistentvolumesets.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "PersistentVolumeSet",
                "listKind": "PersistentVolumeSetList",
                "plural": "persistentvolumesets",
                "singular": "persistentvolumeset",
                "shortNames": ["pvset", "pvsets"],
            },
            "scope": "Cluster",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.maximumReplicas",
                        "statusReplicasPath": ".status.replicas",
                    },
                },
                "additionalPrinterColumns": [
                    column("Min", "integer", ".spec.minimumReplicas"),
                    column("Max", "integer", ".spec.maximumReplicas"),
                    column("Bound", "integer", ".status.boundReplicas"),
                    column("Available", "integer", ".status.unboundReplicas"),
                    column("Class", "string", ".spec.template.spec.storageClassName"),
                    column("Age", "date", ".metadata.creationTimestamp"),
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {
                            "type": "object",
                            "required": ["minimumReplicas", "maximumReplicas", "selector", "template"],
                            // Evaluated by kube-apiserver (CEL); the embedded API server does
                            // not evaluate CEL, and the manager reports the same as InvalidSpec.
                            "x-kubernetes-validations": [{
                                "rule": "self.minimumReplicas <= self.maximumReplicas",
                                "message": "spec.minimumReplicas must not exceed spec.maximumReplicas",
                            }],
                            "properties": {
                                "minimumReplicas": count,
                                "maximumReplicas": count,
                                "selector": label_selector,
                                "template": template,
                            },
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "boundReplicas": count,
                                "unboundReplicas": count,
                                "replicas": count,
                                "observedGeneration": {"type": "integer", "format": "int64"},
                                "conditions": {"type": "array", "items": condition},
                            },
                        },
                    },
                }},
            }],
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn the_deploy_manifest_is_this_definition() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/kubernetes/persistentvolumeset-crd.json"
        );
        if std::env::var_os("VOLSTACK_WRITE_CRD").is_some() {
            let text = serde_json::to_string_pretty(&super::definition()).unwrap();
            std::fs::write(path, text + "\n").unwrap();
        }
        let text = std::fs::read_to_string(path).unwrap();
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            file,
            super::definition(),
            "rewrite the file with: VOLSTACK_WRITE_CRD=1 cargo test -p provisioner the_deploy_manifest"
        );
    }
}
