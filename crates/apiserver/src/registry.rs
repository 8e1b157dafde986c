//! The resources the server knows: built-in types and those declared by CRDs.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

/// One resource type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group ("" for core).
    pub group: String,
    /// The version served (`v1`, `v1beta1`).
    pub version: String,
    /// Plural (URL) name.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// The kind (`PersistentVolumeClaim`).
    pub kind: String,
    /// Namespaced or cluster scoped.
    pub namespaced: bool,
    /// Has a status subresource.
    pub status: bool,
    /// Short names.
    pub short_names: Vec<String>,
    /// A custom resource's printer columns (priority 0), shown by `kubectl get`.
    pub printer_columns: Vec<PrinterColumn>,
    /// A custom resource's `openAPIV3Schema`, checked on every write.
    pub schema: Option<std::sync::Arc<serde_json::Value>>,
    /// A custom resource's scale subresource (the paths it reads and writes).
    pub scale: Option<crate::server::scale::ScalePaths>,
    /// Declared by a CustomResourceDefinition.
    pub custom: bool,
}

/// A column a CustomResourceDefinition declares for tables (`additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    /// The column's header, as `kubectl get` prints it.
    pub name: String,
    /// OpenAPI type: string, integer, number, boolean or date.
    pub kind: String,
    /// A simple JSONPath to the value (`.status.readyToUse`).
    pub json_path: String,
}

impl ResourceType {
    /// `apiVersion` of its objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether its objects carry `metadata.generation` (1 when made, one more at each change
    /// outside metadata and status), as kube-apiserver's strategies give it: custom resources
    /// and their definitions, Pods and the apps/v1 workloads; not claims, volumes, classes,
    /// ConfigMaps and the other kinds served here.
    pub fn has_generation(&self) -> bool {
        self.custom
            || matches!(
                (self.group.as_str(), self.plural.as_str()),
                ("", "pods") | ("apps", _) | ("apiextensions.k8s.io", "customresourcedefinitions")
            )
    }

    /// Whether a DELETE that removes one of its objects answers with the object (kube-apiserver's
    /// `ReturnDeletedObject` stores: claims, volumes, Pods, Namespaces, ServiceAccounts and the
    /// storage.k8s.io kinds but CSIStorageCapacity) rather than a `Status` of success (every
    /// other kind, custom resources and their definitions included; checked on kube-apiserver
    /// v1.36.2). A definition is removed at once here, where kube-apiserver first marks it and
    /// answers with it.
    pub fn answers_deletion_with_object(&self) -> bool {
        !self.custom
            && matches!(
                (self.group.as_str(), self.plural.as_str()),
                (
                    "",
                    "persistentvolumeclaims"
                        | "persistentvolumes"
                        | "pods"
                        | "namespaces"
                        | "serviceaccounts"
                ) | (
                    "storage.k8s.io",
                    "storageclasses"
                        | "volumeattachments"
                        | "csinodes"
                        | "csidrivers"
                        | "volumeattributesclasses"
                )
            )
    }

    /// The `Status` kube-apiserver answers a DELETE that removed `object` with, for kinds that
    /// do not answer with the object: `details.kind` is the resource's plural (as there), the
    /// core group left out.
    pub fn deletion_status(&self, object: &serde_json::Value) -> serde_json::Value {
        let mut details = serde_json::Map::new();
        details.insert("name".into(), object["metadata"]["name"].clone());
        if !self.group.is_empty() {
            details.insert("group".into(), self.group.clone().into());
        }
        details.insert("kind".into(), self.plural.clone().into());
        details.insert("uid".into(), object["metadata"]["uid"].clone());
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details,
        })
    }

    /// Storage key prefix, unique per resource, but for events.k8s.io/v1 Events: they are
    /// the core/v1 Events, stored once under the core key ([`crate::event_versions`]).
    pub fn key(&self) -> String {
        if self.stored_as_core_events() {
            return "/events".into();
        }
        format!("{}/{}", self.group, self.plural)
    }

    /// Whether its objects are stored as core/v1 Events and converted on the way in and out
    /// (events.k8s.io/v1 Events).
    pub fn stored_as_core_events(&self) -> bool {
        !self.custom && self.group == "events.k8s.io" && self.plural == "events"
    }
}

/// group, version, plural, kind, namespaced, status subresource, short names.
/// Discovery categories of the built-in resources we serve, as kube-apiserver lists them
/// (`kubectl get all` asks for the category `all`).
pub fn categories(group: &str, plural: &str) -> Option<&'static [&'static str]> {
    match (group, plural) {
        ("", "pods") | ("apps", "deployments" | "statefulsets" | "daemonsets" | "replicasets") => {
            Some(&["all"])
        }
        _ => None,
    }
}

type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
    &'static [&'static str],
);

const BUILTIN: &[Builtin] = &[
    ("", "v1", "namespaces", "Namespace", false, true, &["ns"]),
    ("", "v1", "nodes", "Node", false, true, &["no"]),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        true,
        &["pv"],
    ),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
        &["pvc"],
    ),
    ("", "v1", "pods", "Pod", true, true, &["po"]),
    ("", "v1", "secrets", "Secret", true, false, &[]),
    ("", "v1", "configmaps", "ConfigMap", true, false, &["cm"]),
    ("", "v1", "events", "Event", true, false, &["ev"]),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        false,
        &["sa"],
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        false,
        &["sc"],
    ),
    (
        "storage.k8s.io",
        "v1",
        "csidrivers",
        "CSIDriver",
        false,
        false,
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "csinodes",
        "CSINode",
        false,
        false,
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "csistoragecapacities",
        "CSIStorageCapacity",
        true,
        false,
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        true,
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "volumeattributesclasses",
        "VolumeAttributesClass",
        false,
        false,
        &["vac"],
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        false,
        &[],
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        false,
        &["ev"],
    ),
    (
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
        false,
        &[],
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
        false,
        &[],
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
        false,
        &[],
    ),
    (
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        false,
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        false,
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        false,
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        false,
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        false,
        &[],
    ),
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        true,
        &["deploy"],
    ),
    (
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        true,
        &["sts"],
    ),
    ("apps", "v1", "daemonsets", "DaemonSet", true, true, &["ds"]),
    (
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        true,
        &["rs"],
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        true,
        &["crd", "crds"],
    ),
];

/// The table of resource types; CRDs add and remove entries at run time. Every request looks
/// its type up ([`Registry::find`]): the types are shared (`Arc`), not copied, and found by
/// plural through an index rather than by comparing each type's names.
#[derive(Debug)]
pub struct Registry {
    types: RwLock<Types>,
}

/// The types in their order (built-in first, then the CRDs'), and by plural.
#[derive(Debug, Default)]
struct Types {
    all: Vec<Arc<ResourceType>>,
    by_plural: HashMap<String, Vec<Arc<ResourceType>>>,
}

impl Types {
    fn new(all: Vec<Arc<ResourceType>>) -> Self {
        let mut by_plural: HashMap<String, Vec<Arc<ResourceType>>> = HashMap::new();
        for t in &all {
            by_plural
                .entry(t.plural.clone())
                .or_default()
                .push(t.clone());
        }
        Types { all, by_plural }
    }
}

impl Default for Registry {
    fn default() -> Self {
        let types = BUILTIN
            .iter()
            .map(|(g, v, p, k, ns, st, short)| ResourceType {
                group: g.to_string(),
                version: v.to_string(),
                plural: p.to_string(),
                singular: k.to_lowercase(),
                kind: k.to_string(),
                namespaced: *ns,
                status: *st,
                short_names: short.iter().map(|s| s.to_string()).collect(),
                printer_columns: Vec::new(),
                schema: None,
                scale: None,
                custom: false,
            })
            .map(Arc::new)
            .collect();
        Registry {
            types: RwLock::new(Types::new(types)),
        }
    }
}

impl Registry {
    /// A built-in resource of version v1 by group and plural, for tests.
    #[cfg(test)]
    pub fn built_in(group: &str, plural: &str) -> Arc<ResourceType> {
        Registry::default()
            .find(group, "v1", plural)
            .unwrap_or_else(|| panic!("{group}/{plural} is registered"))
    }

    /// Looks a resource up by group, version and plural.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .read()
            .by_plural
            .get(plural)?
            .iter()
            .find(|t| t.group == group && t.version == version)
            .cloned()
    }

    /// All types, built-in first.
    pub fn all(&self) -> Vec<Arc<ResourceType>> {
        self.types.read().all.clone()
    }

    /// Replaces the CRD-declared types with those described by `crds` (CRD objects as JSON).
    pub fn set_custom(&self, crds: &[serde_json::Value]) {
        let mut custom = Vec::new();
        for crd in crds {
            let spec = &crd["spec"];
            let group = spec["group"].as_str().unwrap_or_default();
            let names = &spec["names"];
            let plural = names["plural"].as_str().unwrap_or_default();
            let kind = names["kind"].as_str().unwrap_or_default();
            if group.is_empty() || plural.is_empty() || kind.is_empty() {
                continue;
            }
            for version in spec["versions"].as_array().into_iter().flatten() {
                if version["served"].as_bool() == Some(false) {
                    continue;
                }
                let Some(name) = version["name"].as_str() else {
                    continue;
                };
                custom.push(Arc::new(ResourceType {
                    custom: true,
                    group: group.to_string(),
                    version: name.to_string(),
                    plural: plural.to_string(),
                    singular: names["singular"]
                        .as_str()
                        .map_or_else(|| kind.to_lowercase(), str::to_string),
                    kind: kind.to_string(),
                    namespaced: spec["scope"].as_str() != Some("Cluster"),
                    status: !version["subresources"]["status"].is_null(),
                    short_names: names["shortNames"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                    printer_columns: version["additionalPrinterColumns"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
                        .filter_map(|c| {
                            Some(PrinterColumn {
                                name: c["name"].as_str()?.to_string(),
                                kind: c["type"].as_str().unwrap_or("string").to_string(),
                                json_path: c["jsonPath"].as_str()?.to_string(),
                            })
                        })
                        .collect(),
                    scale: version["subresources"]["scale"]["specReplicasPath"]
                        .as_str()
                        .map(|spec| crate::server::scale::ScalePaths {
                            spec: spec.to_string(),
                            status: version["subresources"]["scale"]["statusReplicasPath"]
                                .as_str()
                                .unwrap_or(".status.replicas")
                                .to_string(),
                        }),
                    schema: version["schema"]["openAPIV3Schema"]
                        .is_object()
                        .then(|| Arc::new(version["schema"]["openAPIV3Schema"].clone())),
                }));
            }
        }
        let mut types = self.types.write();
        let mut all = std::mem::take(&mut types.all);
        all.truncate(BUILTIN.len());
        all.extend(custom);
        *types = Types::new(all);
    }
}
