//! The `snapshot.storage.k8s.io/v1` CustomResourceDefinitions the embedded stack installs:
//! VolumeSnapshotClass (cluster-scoped, no status), VolumeSnapshotContent (cluster-scoped) and
//! VolumeSnapshot (namespaced), both with a status subresource; the kinds, names, short names,
//! scopes and printer columns are those of the community definitions. Schemas check the
//! required fields and keep every other field.

use serde_json::{Value, json};

/// The API group.
pub const GROUP: &str = "snapshot.storage.k8s.io";

fn column(name: &str, kind: &str, path: &str) -> Value {
    json!({"name": name, "type": kind, "jsonPath": path})
}

fn age() -> Value {
    column("Age", "date", ".metadata.creationTimestamp")
}

fn open_object() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

struct Definition {
    kind: &'static str,
    plural: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    status: bool,
    required: &'static [&'static str],
    properties: Value,
    columns: Vec<Value>,
}

fn crd(d: Definition) -> Value {
    let singular = d.kind.to_ascii_lowercase();
    let mut schema = json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": d.properties,
    });
    if !d.required.is_empty() {
        schema["required"] = json!(d.required);
    }
    let subresources = if d.status {
        json!({"status": {}})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        // A group of the Kubernetes project names its API review (kube-apiserver refuses the
        // definition otherwise); the value is the one external-snapshotter's v1 CRDs carry.
        "metadata": {
            "name": format!("{}.{GROUP}", d.plural),
            "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-csi/external-snapshotter/pull/814"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": d.kind,
                "listKind": format!("{}List", d.kind),
                "plural": d.plural,
                "singular": singular,
                "shortNames": d.short_names,
            },
            "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": subresources,
                "additionalPrinterColumns": d.columns,
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    })
}

/// The three definitions, classes first.
pub fn definitions() -> Vec<Value> {
    vec![
        crd(Definition {
            kind: "VolumeSnapshotClass",
            plural: "volumesnapshotclasses",
            short_names: &["vsclass", "vsclasses"],
            namespaced: false,
            status: false,
            required: &["driver", "deletionPolicy"],
            properties: json!({
                "driver": {"type": "string"},
                "deletionPolicy": {"type": "string", "enum": ["Delete", "Retain"]},
                "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
            }),
            columns: vec![
                column("Driver", "string", ".driver"),
                column("DeletionPolicy", "string", ".deletionPolicy"),
                age(),
            ],
        }),
        crd(Definition {
            kind: "VolumeSnapshotContent",
            plural: "volumesnapshotcontents",
            short_names: &["vsc", "vscs"],
            namespaced: false,
            status: true,
            required: &["spec"],
            properties: json!({"spec": open_object(), "status": open_object()}),
            columns: vec![
                column("ReadyToUse", "boolean", ".status.readyToUse"),
                column("RestoreSize", "integer", ".status.restoreSize"),
                column("DeletionPolicy", "string", ".spec.deletionPolicy"),
                column("Driver", "string", ".spec.driver"),
                column(
                    "VolumeSnapshotClass",
                    "string",
                    ".spec.volumeSnapshotClassName",
                ),
                column("VolumeSnapshot", "string", ".spec.volumeSnapshotRef.name"),
                column(
                    "VolumeSnapshotNamespace",
                    "string",
                    ".spec.volumeSnapshotRef.namespace",
                ),
                age(),
            ],
        }),
        crd(Definition {
            kind: "VolumeSnapshot",
            plural: "volumesnapshots",
            short_names: &["vs"],
            namespaced: true,
            status: true,
            required: &["spec"],
            properties: json!({"spec": open_object(), "status": open_object()}),
            columns: vec![
                column("ReadyToUse", "boolean", ".status.readyToUse"),
                column(
                    "SourcePVC",
                    "string",
                    ".spec.source.persistentVolumeClaimName",
                ),
                column(
                    "SourceSnapshotContent",
                    "string",
                    ".spec.source.volumeSnapshotContentName",
                ),
                column("RestoreSize", "string", ".status.restoreSize"),
                column("SnapshotClass", "string", ".spec.volumeSnapshotClassName"),
                column(
                    "SnapshotContent",
                    "string",
                    ".status.boundVolumeSnapshotContentName",
                ),
                column("CreationTime", "date", ".status.creationTime"),
                age(),
            ],
        }),
    ]
}

/// Creates the definitions that do not exist yet (an existing one is left as it is).
pub async fn install(client: &kube::Client) -> Result<(), kube::Error> {
    sidecar_kit::custom_resource::install(client, definitions()).await
}

/// Creates a default VolumeSnapshotClass (deletionPolicy Delete) for `driver` unless one of
/// that name exists.
pub async fn install_default_class(
    client: &kube::Client,
    name: &str,
    driver: &str,
) -> Result<(), kube::Error> {
    use super::types::{API_VERSION, VolumeSnapshotClass};
    let class = VolumeSnapshotClass {
        api_version: API_VERSION.into(),
        kind: "VolumeSnapshotClass".into(),
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            annotations: Some(
                [(
                    super::decide::ANN_DEFAULT_CLASS.to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        driver: driver.into(),
        deletion_policy: "Delete".into(),
        parameters: None,
    };
    match kube::Api::<VolumeSnapshotClass>::all(client.clone())
        .create(&Default::default(), &class)
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_definitions_are_well_formed_crds() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: Vec<CustomResourceDefinition> = definitions()
            .into_iter()
            .map(|d| serde_json::from_value(d).unwrap())
            .collect();
        let names: Vec<(&str, &str)> = crds
            .iter()
            .map(|c| (c.spec.names.kind.as_str(), c.spec.scope.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("VolumeSnapshotClass", "Cluster"),
                ("VolumeSnapshotContent", "Cluster"),
                ("VolumeSnapshot", "Namespaced")
            ]
        );
        for crd in &crds {
            assert_eq!(
                crd.metadata.name.as_deref(),
                Some(format!("{}.{GROUP}", crd.spec.names.plural).as_str())
            );
            let version = &crd.spec.versions[0];
            assert!(version.served && version.storage);
            let has_status = version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some());
            assert_eq!(has_status, crd.spec.names.kind != "VolumeSnapshotClass");
        }
    }
}
