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

    /// The kind's name in upstream's messages (its `secretParamsMap.name`).
    fn upstream_name(self) -> &'static str {
        match self {
            SecretKind::Provisioner => "Provisioner",
            SecretKind::ControllerPublish => "ControllerPublish",
            SecretKind::NodeStage => "NodeStage",
            SecretKind::NodePublish => "NodePublish",
            SecretKind::ControllerExpand => "ControllerExpand",
            SecretKind::NodeExpand => "NodeExpand",
            SecretKind::ControllerModify => "ControllerModify",
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
    /// A secret's keys given wrongly (upstream's words; `context` is `""`, or `"default "`
    /// for the default secret's keys).
    #[error("failed to get {context}name and namespace template from params: {problem}")]
    SecretKeys {
        /// `""` or `"default "`.
        context: &'static str,
        /// What is wrong.
        problem: SecretKeysProblem,
    },
    /// More than one fstype key (upstream's words).
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    )]
    BothFsTypes,
}

/// How a secret's keys are given wrongly, in upstream's words (`verifyAndGetSecretNameAndNamespaceTemplate`);
/// each names the secret as upstream does (`Provisioner`, `NodeStage`, ..., `Default`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretKeysProblem {
    /// A name or a namespace given under both the prefixed and the deprecated key.
    #[error(
        "{0} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"
    )]
    BothForms(&'static str),
    /// A name without a namespace or the other way round.
    #[error("either name and namespace for {0} secrets specified, Both must be specified")]
    HalfPair(&'static str),
    /// Both given, one of them empty.
    #[error("{0} secrets specified in parameters but value of either namespace or name is empty")]
    Empty(&'static str),
}

/// The name and namespace templates of one secret, read as upstream reads them: each of name
/// and namespace from the deprecated key, then the prefixed one; none of either given is no
/// secret; `what` names it in the errors. `deprecated` are the (name, namespace) keys upstream
/// still reads for it, if any.
fn secret_keys(
    params: &BTreeMap<String, String>,
    what: &'static str,
    (name_key, namespace_key): (&str, &str),
    deprecated: Option<(&str, &str)>,
) -> Result<Option<SecretTemplate>, SecretKeysProblem> {
    let found = |keys: [Option<&str>; 2]| -> (usize, Option<&String>) {
        let values: Vec<&String> = keys
            .into_iter()
            .flatten()
            .filter_map(|k| params.get(k))
            .collect();
        (values.len(), values.last().copied())
    };
    let (names, name) = found([deprecated.map(|d| d.0), Some(name_key)]);
    let (namespaces, namespace) = found([deprecated.map(|d| d.1), Some(namespace_key)]);
    if names > 1 || namespaces > 1 {
        return Err(SecretKeysProblem::BothForms(what));
    }
    if names != namespaces {
        return Err(SecretKeysProblem::HalfPair(what));
    }
    match (name, namespace) {
        (Some(name), Some(namespace)) if name.is_empty() || namespace.is_empty() => {
            Err(SecretKeysProblem::Empty(what))
        }
        (Some(name), Some(namespace)) => Ok(Some(SecretTemplate {
            name: name.clone(),
            namespace: namespace.clone(),
        })),
        _ => Ok(None),
    }
}

/// Splits class parameters into driver parameters, fsType and secret references, checked in
/// upstream's order (fstype, then each secret in turn, the default one where a secret has no
/// keys of its own, then the unknown reserved keys) and refused in its words.
pub fn parse_class_parameters(
    params: &BTreeMap<String, String>,
) -> Result<ClassParameters, ParameterError> {
    let fs_keys = params
        .keys()
        .filter(|k| k.as_str() == FSTYPE_KEY || k.eq_ignore_ascii_case("fstype"))
        .count();
    if fs_keys > 1 {
        return Err(ParameterError::BothFsTypes);
    }
    let mut consumed: Vec<String> = vec![
        DEFAULT_NAME_KEY.to_string(),
        DEFAULT_NAMESPACE_KEY.to_string(),
    ];
    let mut secrets = BTreeMap::new();
    for kind in SecretKind::ALL {
        let (name_key, namespace_key) = kind.keys();
        // The deprecated keys stay among the driver's parameters (upstream passes them on).
        let own = secret_keys(
            params,
            kind.upstream_name(),
            (&name_key, &namespace_key),
            kind.deprecated(),
        )
        .map_err(|problem| ParameterError::SecretKeys {
            context: "",
            problem,
        })?;
        consumed.extend([name_key, namespace_key]);
        let template = match own {
            Some(own) => Some(own),
            None => secret_keys(
                params,
                "Default",
                (DEFAULT_NAME_KEY, DEFAULT_NAMESPACE_KEY),
                None,
            )
            .map_err(|problem| ParameterError::SecretKeys {
                context: "default ",
                problem,
            })?,
        };
        if let Some(template) = template {
            secrets.insert(kind, template);
        }
    }
    // An empty fsType is none: `--default-fstype` applies (upstream's).
    let prefixed_fs = params.get(FSTYPE_KEY);
    let legacy_fs = params
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("fstype"))
        .map(|(_, v)| v);
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
    fn malformed_reserved_parameters_are_refused_in_upstreams_words() {
        let keys = "failed to get name and namespace template from params: ";
        let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
            (
                vec![("csi.storage.k8s.io/provisioner-secret-name", "x")],
                format!("{keys}either name and namespace for Provisioner secrets specified, Both must be specified"),
            ),
            (
                vec![("csi.storage.k8s.io/node-stage-secret-namespace", "x")],
                format!("{keys}either name and namespace for NodeStage secrets specified, Both must be specified"),
            ),
            (
                vec![("csi.storage.k8s.io/provisioner-secret-name", "")],
                format!("{keys}either name and namespace for Provisioner secrets specified, Both must be specified"),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", ""),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                format!("{keys}Provisioner secrets specified in parameters but value of either namespace or name is empty"),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "a"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "b"),
                    ("csiProvisionerSecretName", "c"),
                    ("csiProvisionerSecretNamespace", "d"),
                ],
                format!("{keys}Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/node-publish-secret-name", "a"),
                    ("csiNodePublishSecretName", "c"),
                    ("csiNodePublishSecretNamespace", "d"),
                ],
                format!("{keys}NodePublish secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"),
            ),
            (
                vec![("csi.storage.k8s.io/secret-name", "x")],
                "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified".into(),
            ),
            (
                vec![("csi.storage.k8s.io/fstype", "ext4"), ("fstype", "xfs")],
                "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys".into(),
            ),
            (
                vec![("fsType", "ext4"), ("fstype", "xfs")],
                "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys".into(),
            ),
            (
                vec![("csi.storage.k8s.io/colour", "blue")],
                "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/colour\" with reserved namespace csi.storage.k8s.io/".into(),
            ),
        ];
        for (pairs, words) in cases {
            let err = parse_class_parameters(&params(&pairs)).unwrap_err();
            assert_eq!(err.to_string(), words, "{pairs:?}");
        }
        // Ours, with no upstream counterpart (and one upstream refuses in the same words).
        for (pairs, words) in [
            (
                vec![("csi.storage.k8s.io/pvc/name", "x")],
                "found unknown parameter key \"csi.storage.k8s.io/pvc/name\" with reserved namespace",
            ),
            (
                vec![("volstack.dev/secret", "vault/creds")],
                "reserved for the provisioner's marks",
            ),
            (
                vec![("volstack.dev/cluster", "x")],
                "reserved for the provisioner's marks",
            ),
        ] {
            let err = parse_class_parameters(&params(&pairs)).unwrap_err();
            assert!(err.to_string().contains(words), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn a_secret_may_take_its_name_and_namespace_from_either_form_as_upstream_reads_them() {
        let p = parse_class_parameters(&params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "new-name"),
            ("csiProvisionerSecretNamespace", "old-ns"),
        ]))
        .unwrap();
        assert_eq!(
            p.secrets[&SecretKind::Provisioner],
            tmpl("new-name", "old-ns")
        );
        // A broken default secret is read only for a secret without keys of its own.
        let p = parse_class_parameters(&params(&[
            ("csi.storage.k8s.io/secret-name", "x"),
            ("csi.storage.k8s.io/provisioner-secret-name", "p"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
        ]));
        assert!(
            matches!(
                p,
                Err(ParameterError::SecretKeys {
                    context: "default ",
                    ..
                })
            ),
            "{p:?}"
        );
        // Every secret with its own keys: the broken default is never read, as there.
        let mut all = vec![(
            "csi.storage.k8s.io/secret-name".to_string(),
            "x".to_string(),
        )];
        for kind in SecretKind::ALL {
            let (name, namespace) = kind.keys();
            all.push((name, "s".into()));
            all.push((namespace, "n".into()));
        }
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let p = parse_class_parameters(&params(&all)).unwrap();
        assert_eq!(p.secrets.len(), SecretKind::ALL.len());
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
