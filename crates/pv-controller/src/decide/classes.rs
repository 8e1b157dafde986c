//! Default StorageClass selection.

use k8s_openapi::api::storage::v1::StorageClass;
pub use sidecar_kit::vocabulary::{ANN_BETA_DEFAULT_CLASS, ANN_DEFAULT_CLASS};

fn is_default(class: &StorageClass) -> bool {
    let Some(a) = class.metadata.annotations.as_ref() else {
        return false;
    };
    [ANN_DEFAULT_CLASS, ANN_BETA_DEFAULT_CLASS]
        .iter()
        .any(|k| a.get(*k).map(String::as_str) == Some("true"))
}

/// The default class: among classes annotated as default, the newest (as Kubernetes since
/// 1.26); ties by name for determinism.
pub fn default_class<'a>(
    classes: impl IntoIterator<Item = &'a StorageClass>,
) -> Option<&'a StorageClass> {
    classes
        .into_iter()
        .filter(|c| is_default(c))
        .max_by(|a, b| {
            let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ta.cmp(&tb)
                .then_with(|| b.metadata.name.cmp(&a.metadata.name))
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn class(name: &str, default: Option<&str>, created: i64) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: default.map(|k| BTreeMap::from([(k.to_string(), "true".to_string())])),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                ..Default::default()
            },
            provisioner: "p".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_default_wins() {
        let classes = vec![
            class("old", Some(ANN_DEFAULT_CLASS), 100),
            class("plain", None, 300),
            class("new", Some(ANN_BETA_DEFAULT_CLASS), 200),
        ];
        assert_eq!(
            default_class(&classes).unwrap().metadata.name.as_deref(),
            Some("new")
        );
        assert!(default_class(&classes[1..2]).is_none());
    }
}
