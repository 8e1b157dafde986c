//! The `persistentvolumesets.storage.volstack.dev` object, with the seed's fields.

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "storage.volstack.dev";
/// The version.
pub const VERSION: &str = "v1alpha1";
/// The label naming the set that made a volume.
pub const LABEL_SET: &str = "storage.volstack.dev/persistentvolumeset";

/// A PersistentVolumeSet (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeSet {
    /// `storage.volstack.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `PersistentVolumeSet`.
    #[serde(default)]
    pub kind: String,
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the set keeps.
    #[serde(default)]
    pub spec: PersistentVolumeSetSpec,
    /// What the manager saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeSetStatus>,
}

/// The set's spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeSetSpec {
    /// Available (unbound) volumes kept at least.
    #[serde(default)]
    pub minimum_replicas: i32,
    /// Volumes in the set at most, whatever their phase.
    #[serde(default)]
    pub maximum_replicas: i32,
    /// The volumes that belong to the set (the template's labels must match it): a
    /// LabelSelector, or the seed's shorthand, a plain map of labels (read as `matchLabels`).
    #[serde(default, deserialize_with = "selector_or_labels")]
    pub selector: LabelSelector,
    /// What new volumes are made from.
    #[serde(default)]
    pub template: PersistentVolumeTemplate,
}

/// A volume's template: labels and annotations, and a PersistentVolume spec, as the seed has
/// it. Without a volume source the volumes are provisioned through the class the spec names
/// (its driver, parameters and secrets); with one (NFS, local, iSCSI...) the spec is the
/// volume's, and the set creates PersistentVolume objects only ("static" volumes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeTemplate {
    /// Labels and annotations of the volumes.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The volumes' spec.
    #[serde(default)]
    pub spec: PersistentVolumeSpec,
}

/// The fields of a PersistentVolume spec that are not a volume source.
const NOT_SOURCES: &[&str] = &[
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

/// The volume source a template's spec gives (its field name: `nfs`, `local`, `csi`...), if any.
pub fn template_source(spec: &PersistentVolumeSpec) -> Option<String> {
    let value = serde_json::to_value(spec).ok()?;
    value
        .as_object()?
        .iter()
        .find(|(key, value)| !NOT_SOURCES.contains(&key.as_str()) && !value.is_null())
        .map(|(key, _)| key.clone())
}

/// What the manager saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeSetStatus {
    /// Volumes bound to claims.
    #[serde(default)]
    pub bound_replicas: i32,
    /// Available volumes.
    #[serde(default)]
    pub unbound_replicas: i32,
    /// Every volume of the set (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the minimum is met) and `Invalid` (the spec cannot be served).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

sidecar_kit::custom_resource!(
    PersistentVolumeSet,
    GROUP,
    VERSION,
    "PersistentVolumeSet",
    "persistentvolumesets",
    k8s_openapi::ClusterResourceScope
);

/// A LabelSelector (an object whose keys are only `matchLabels` and `matchExpressions`), or a
/// plain map of labels, read as its `matchLabels`.
fn selector_or_labels<'de, D>(deserializer: D) -> Result<LabelSelector, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    let value = serde_json::Value::deserialize(deserializer)?;
    let selector_keys = value.as_object().is_some_and(|object| {
        object
            .keys()
            .all(|key| key == "matchLabels" || key == "matchExpressions")
    });
    if selector_keys {
        return serde_json::from_value(value).map_err(D::Error::custom);
    }
    let labels: std::collections::BTreeMap<String, String> = serde_json::from_value(value)
        .map_err(|error| {
            D::Error::custom(format!(
                "selector: neither a LabelSelector nor a map of labels: {error}"
            ))
        })?;
    Ok(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod selector_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_selector_is_a_label_selector_or_the_seeds_plain_map() {
        let spec = |selector: serde_json::Value| {
            serde_json::from_value::<PersistentVolumeSetSpec>(json!({"selector": selector}))
                .map(|s| s.selector)
        };
        let labels = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            )
        };
        let plain = spec(json!({"pool": "fast", "zone": "a"})).unwrap();
        assert_eq!(
            plain.match_labels,
            labels(&[("pool", "fast"), ("zone", "a")])
        );
        assert_eq!(plain.match_expressions, None);
        let full = spec(json!({"matchLabels": {"pool": "fast"},
            "matchExpressions": [{"key": "zone", "operator": "Exists"}]}))
        .unwrap();
        assert_eq!(full.match_labels, labels(&[("pool", "fast")]));
        assert_eq!(full.match_expressions.unwrap().len(), 1);
        assert_eq!(spec(json!({})).unwrap(), LabelSelector::default());
        let error = spec(json!({"pool": 3})).unwrap_err().to_string();
        assert!(
            error.contains("neither a LabelSelector nor a map of labels"),
            "{error}"
        );
        let missing: PersistentVolumeSetSpec = serde_json::from_value(json!({})).unwrap();
        assert_eq!(
            missing.selector,
            LabelSelector::default(),
            "absent: the default"
        );
    }
}
