//! StorageClass parameters: the `csi.storage.k8s.io/` keys reserved by the provisioner (secret
//! references, fsType) are parsed into typed data and removed; the rest goes to the driver.

use std::collections::BTreeMap;

/// Prefix of the reserved keys.
pub const PREFIX: &str = "csi.storage.k8s.io/";
/// fsType key.
pub const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// Parameters added with `--extra-create-metadata`.
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PVC_NAME_KEY`].
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
/// See [`PVC_NAME_KEY`].
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// The operations that can carry a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretKind {
    /// CreateVolume and DeleteVolume.
    Provisioner,
    /// ControllerPublishVolume (PV `controllerPublishSecretRef`).
    ControllerPublish,
    /// NodeStageVolume (PV `nodeStageSecretRef`).
    NodeStage,
    /// NodePublishVolume (PV `nodePublishSecretRef`).
    NodePublish,
    /// ControllerExpandVolume (PV `controllerExpandSecretRef`).
    ControllerExpand,
    /// NodeExpandVolume (PV `nodeExpandSecretRef`).
    NodeExpand,
    /// ControllerModifyVolume (PV annotations).
    ControllerModify,
}

impl SecretKind {
    /// Every kind.
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    /// The prefixed parameter stem: `csi.storage.k8s.io/<stem>-secret-name`.
    fn stem(self) -> &'static str {
        match self {
            SecretKind::Provisioner => "provisioner",
            SecretKind::ControllerPublish => "controller-publish",
            SecretKind::NodeStage => "node-stage",
            SecretKind::NodePublish => "node-publish",
            SecretKind::ControllerExpand => "controller-expand",
            SecretKind::NodeExpand => "node-expand",
            SecretKind::ControllerModify => "controller-modify",
        }
    }

    /// The deprecated unprefixed keys (name, namespace), where upstream accepts them.
    fn deprecated(self) -> Option<(&'static str, &'static str)> {
        match self {
            SecretKind::Provisioner => {
                Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace"))
            }
            SecretKind::ControllerPublish => Some((
                "csiControllerPublishSecretName",
                "csiControllerPublishSecretNamespace",
            )),
            SecretKind::NodeStage => {
                Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace"))
            }
            SecretKind::NodePublish => {
                Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace"))
            }
            SecretKind::ControllerExpand
            | SecretKind::NodeExpand
            | SecretKind::ControllerModify => None,
        }
    }

    fn keys(self) -> (String, String) {
        (
            format!("{PREFIX}{}-secret-name", self.stem()),
            format!("{PREFIX}{}-secret-namespace", self.stem()),
        )
    }
}

const DEFAULT_NAME_KEY: &str = "csi.storage.k8s.io/secret-name";
const DEFAULT_NAMESPACE_KEY: &str = "csi.storage.k8s.io/secret-namespace";

/// A secret reference as written in the class: templates not yet resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretTemplate {
    /// Name template.
    pub name: String,
    /// Namespace template.
    pub namespace: String,
}

/// The class parameters, split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassParameters {
    /// What the driver receives.
    pub driver: BTreeMap<String, String>,
    /// fsType from `csi.storage.k8s.io/fstype` (or the deprecated `fstype`).
    pub fs_type: Option<String>,
    /// Secret references by operation.
    pub secrets: BTreeMap<SecretKind, SecretTemplate>,
}

/// A class parameter the provisioner refuses. All of these are final until the class changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    /// A `csi.storage.k8s.io/` key we do not know (upstream's words).
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{0}\" with reserved namespace csi.storage.k8s.io/"
    )]
    UnknownReserved(String),
    /// A key with the prefix of the provisioner's marks: a driver that follows the
    /// recoverable-volumes convention would take it for one.
    #[error(
        "StorageClass parameter {0:?}: keys with the prefix volstack.dev/ are reserved for the provisioner's marks (the recoverable-volumes convention)"
    )]
    Marked(String),
    /// A reserved key with an empty value.
    #[error("StorageClass parameter {0:?} must not be empty")]
    Empty(String),
    /// Only one of name and namespace is given.
    #[error(
        "StorageClass parameters {present:?} and {missing:?} come in pairs: {missing:?} is missing"
    )]
    HalfPair {
        /// Key given.
        present: String,
        /// Key missing.
        missing: String,
    },
    /// Both the prefixed and the deprecated form are given.
    #[error(
        "StorageClass parameters {prefixed:?} and {deprecated:?} are two forms of the same setting: give only {prefixed:?}"
    )]
    BothForms {
        /// Prefixed key.
        prefixed: String,
        /// Deprecated key.
        deprecated: String,
    },
    /// Both fstype forms.
    #[error(
        "StorageClass parameters \"csi.storage.k8s.io/fstype\" and \"fstype\" are two forms of the same setting"
    )]
    BothFsTypes,
}

fn pair(
    params: &BTreeMap<String, String>,
    name_key: &str,
    namespace_key: &str,
) -> Result<Option<SecretTemplate>, ParameterError> {
    let name = params.get(name_key);
    let namespace = params.get(namespace_key);
    for (key, value) in [(name_key, name), (namespace_key, namespace)] {
        if value.is_some_and(|v| v.is_empty()) {
            return Err(ParameterError::Empty(key.to_string()));
        }
    }
    match (name, namespace) {
        (Some(name), Some(namespace)) => Ok(Some(SecretTemplate {
            name: name.clone(),
            namespace: namespace.clone(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(ParameterError::HalfPair {
            present: name_key.into(),
            missing: namespace_key.into(),
        }),
        (None, Some(_)) => Err(ParameterError::HalfPair {
            present: namespace_key.into(),
            missing: name_key.into(),
        }),
    }
}

/// Splits class parameters into driver parameters, fsType and secret references.
pub fn parse_class_parameters(
    params: &BTreeMap<String, String>,
) -> Result<ClassParameters, ParameterError> {
    let mut consumed: Vec<String> = Vec::new();
    let default = pair(params, DEFAULT_NAME_KEY, DEFAULT_NAMESPACE_KEY)?;
    consumed.extend([
        DEFAULT_NAME_KEY.to_string(),
        DEFAULT_NAMESPACE_KEY.to_string(),
    ]);
    let mut secrets = BTreeMap::new();
    for kind in SecretKind::ALL {
        let (name_key, namespace_key) = kind.keys();
        let prefixed = pair(params, &name_key, &namespace_key)?;
        // The deprecated keys stay among the driver's parameters (upstream passes them on).
        let deprecated = match kind.deprecated() {
            Some((dn, dns)) => {
                let found = pair(params, dn, dns)?;
                if found.is_some() && prefixed.is_some() {
                    return Err(ParameterError::BothForms {
                        prefixed: name_key,
                        deprecated: dn.to_string(),
                    });
                }
                found
            }
            None => None,
        };
        consumed.extend([name_key, namespace_key]);
        if let Some(template) = prefixed.or(deprecated).or_else(|| default.clone()) {
            secrets.insert(kind, template);
        }
    }
    // An empty fsType is none: `--default-fstype` applies (upstream's).
    let prefixed_fs = params.get(FSTYPE_KEY);
    let legacy_fs = params
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("fstype"))
        .map(|(_, v)| v);
    if prefixed_fs.is_some() && legacy_fs.is_some() {
        return Err(ParameterError::BothFsTypes);
    }
    if legacy_fs.is_some() {
        tracing::warn!(
            "StorageClass parameter \"fstype\" is deprecated; use \"csi.storage.k8s.io/fstype\""
        );
    }
    consumed.push(FSTYPE_KEY.to_string());
    let mut driver = BTreeMap::new();
    for (key, value) in params {
        if consumed.iter().any(|c| c == key) {
            continue;
        }
        if key.starts_with(PREFIX) {
            return Err(ParameterError::UnknownReserved(key.clone()));
        }
        if sidecar_kit::recoverable::is_mark(key) {
            return Err(ParameterError::Marked(key.clone()));
        }
        driver.insert(key.clone(), value.clone());
    }
    Ok(ClassParameters {
        driver,
        fs_type: prefixed_fs.or(legacy_fs).cloned().filter(|v| !v.is_empty()),
        secrets,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn tmpl(name: &str, ns: &str) -> SecretTemplate {
        SecretTemplate {
            name: name.into(),
            namespace: ns.into(),
        }
    }

    #[test]
    fn reserved_keys_are_removed_and_typed() {
        let p = parse_class_parameters(&params(&[
            ("kind", "fast"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/provisioner-secret-name", "prov"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "ns1"),
            (
                "csi.storage.k8s.io/node-publish-secret-name",
                "${pvc.name}-np",
            ),
            (
                "csi.storage.k8s.io/node-publish-secret-namespace",
                "${pvc.namespace}",
            ),
        ]))
        .unwrap();
        assert_eq!(p.driver, params(&[("kind", "fast")]));
        assert_eq!(p.fs_type.as_deref(), Some("xfs"));
        assert_eq!(
            p.secrets.get(&SecretKind::Provisioner),
            Some(&tmpl("prov", "ns1"))
        );
        assert_eq!(
            p.secrets.get(&SecretKind::NodePublish),
            Some(&tmpl("${pvc.name}-np", "${pvc.namespace}"))
        );
        assert_eq!(p.secrets.get(&SecretKind::NodeStage), None);
    }

    #[test]
    fn the_default_secret_applies_to_every_operation_without_its_own() {
        let p = parse_class_parameters(&params(&[
            ("csi.storage.k8s.io/secret-name", "all"),
            ("csi.storage.k8s.io/secret-namespace", "ns"),
            ("csi.storage.k8s.io/node-stage-secret-name", "stage"),
            ("csi.storage.k8s.io/node-stage-secret-namespace", "ns2"),
        ]))
        .unwrap();
        assert_eq!(p.secrets.len(), SecretKind::ALL.len());
        assert_eq!(p.secrets[&SecretKind::NodeStage], tmpl("stage", "ns2"));
        assert_eq!(p.secrets[&SecretKind::Provisioner], tmpl("all", "ns"));
        assert!(p.driver.is_empty());
    }

    #[test]
    fn deprecated_secret_keys_are_accepted() {
        let p = parse_class_parameters(&params(&[
            ("csiProvisionerSecretName", "old"),
            ("csiProvisionerSecretNamespace", "ns"),
        ]))
        .unwrap();
        assert_eq!(p.secrets[&SecretKind::Provisioner], tmpl("old", "ns"));
        assert_eq!(
            p.driver,
            params(&[
                ("csiProvisionerSecretName", "old"),
                ("csiProvisionerSecretNamespace", "ns"),
            ]),
            "deprecated keys are passed to the driver, as upstream passes them"
        );
    }

    #[test]
    fn malformed_reserved_parameters_are_refused() {
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (
                vec![("csi.storage.k8s.io/provisioner-secret-name", "x")],
                "pairs",
            ),
            (
                vec![("csi.storage.k8s.io/node-stage-secret-namespace", "x")],
                "pairs",
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", ""),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                "empty",
            ),
            (vec![("csi.storage.k8s.io/colour", "blue")], "reserved"),
            (vec![("csi.storage.k8s.io/pvc/name", "x")], "reserved"),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "a"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "b"),
                    ("csiProvisionerSecretName", "c"),
                    ("csiProvisionerSecretNamespace", "d"),
                ],
                "two forms",
            ),
            (
                vec![("csi.storage.k8s.io/fstype", "ext4"), ("fstype", "xfs")],
                "two forms",
            ),
            (
                vec![("volstack.dev/secret", "vault/creds")],
                "reserved for the provisioner's marks",
            ),
            (
                vec![("volstack.dev/cluster", "x")],
                "reserved for the provisioner's marks",
            ),
        ];
        for (pairs, words) in cases {
            let err = parse_class_parameters(&params(&pairs)).unwrap_err();
            assert!(err.to_string().contains(words), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn an_empty_fstype_is_none() {
        let p = parse_class_parameters(&params(&[("csi.storage.k8s.io/fstype", "")])).unwrap();
        assert_eq!(p.fs_type, None);
        assert!(p.driver.is_empty());
    }

    #[test]
    fn the_deprecated_fstype_is_used_and_still_passed_on() {
        let p = parse_class_parameters(&params(&[("fstype", "ext3")])).unwrap();
        assert_eq!(p.fs_type.as_deref(), Some("ext3"));
        assert_eq!(p.driver, params(&[("fstype", "ext3")]));
    }
}
