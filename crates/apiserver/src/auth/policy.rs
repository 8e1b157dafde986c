//! The RBAC objects in force, compiled: Roles and ClusterRoles with their rules (a ClusterRole
//! with an `aggregationRule` holds the rules of every ClusterRole its selectors match, as
//! kube-controller-manager's aggregation controller would write them), bindings with their
//! subjects, and for each user who asked, what they hold everywhere and in each namespace.
//! Pure: built from objects as JSON, it answers without I/O.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::Value;

use super::attributes::Attributes;
use super::rules::Rule;

/// Who made a request, as authentication (and impersonation) found them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct User {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub name: String,
    /// Its uid, if known.
    pub uid: String,
    /// Its groups.
    pub groups: Vec<String>,
}

/// The group whose members may do everything, whatever the bindings say.
pub const MASTERS: &str = "system:masters";
/// The group of every authenticated user.
pub const AUTHENTICATED: &str = "system:authenticated";

impl User {
    /// Whether the user is in the privileged group.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// A ServiceAccount's user: its name and the groups kube-apiserver gives it.
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> User {
        User {
            name: service_account_name(namespace, name),
            uid: uid.to_string(),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                AUTHENTICATED.to_string(),
            ],
        }
    }
}

/// The user name of a ServiceAccount.
pub fn service_account_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// A binding's subject.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
    ServiceAccount(String),
}

impl Subject {
    /// A subject of a binding in `namespace` ("" for a ClusterRoleBinding): a ServiceAccount
    /// without a namespace is the binding's own namespace's.
    fn from_json(value: &Value, namespace: &str) -> Option<Subject> {
        let name = value["name"].as_str()?.to_string();
        match value["kind"].as_str()? {
            "User" => Some(Subject::User(name)),
            "Group" => Some(Subject::Group(name)),
            "ServiceAccount" => {
                let ns = value["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(namespace);
                (!ns.is_empty()).then(|| Subject::ServiceAccount(service_account_name(ns, &name)))
            }
            _ => None,
        }
    }

    fn applies_to(&self, user: &User) -> bool {
        match self {
            Subject::User(name) | Subject::ServiceAccount(name) => *name == user.name,
            Subject::Group(group) => user.groups.contains(group),
        }
    }

    fn describe(&self) -> String {
        match self {
            Subject::User(n) => format!("User {n:?}"),
            Subject::Group(n) => format!("Group {n:?}"),
            Subject::ServiceAccount(n) => {
                let short = n.trim_start_matches("system:serviceaccount:");
                let (ns, name) = short.split_once(':').unwrap_or(("", short));
                format!("ServiceAccount {name:?}/{ns:?}")
            }
        }
    }
}

/// A RoleBinding (in a namespace) or ClusterRoleBinding (namespace "").
#[derive(Debug, Clone)]
struct Binding {
    namespace: String,
    name: String,
    /// `Role` or `ClusterRole`.
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

/// Rules a user holds through one binding.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The rules.
    pub rules: Arc<Vec<Rule>>,
    /// How they were granted, in kube-apiserver's words (`RoleBinding "ns/b" of Role "r" to
    /// User "u"`).
    pub by: String,
}

/// What one user holds.
#[derive(Debug, Clone, Default)]
pub struct Granted {
    /// Everywhere (ClusterRoleBindings).
    pub cluster: Vec<Grant>,
    /// In one namespace (RoleBindings).
    pub namespaced: HashMap<String, Vec<Grant>>,
}

impl Granted {
    /// The grants that apply in `namespace` ("" for the cluster scope).
    pub fn in_namespace<'a>(&'a self, namespace: &str) -> impl Iterator<Item = &'a Grant> + 'a {
        let local = if namespace.is_empty() {
            None
        } else {
            self.namespaced.get(namespace)
        };
        self.cluster.iter().chain(local.into_iter().flatten())
    }

    /// Every rule that applies in `namespace`.
    pub fn rules_in(&self, namespace: &str) -> Vec<Rule> {
        self.in_namespace(namespace)
            .flat_map(|g| g.rules.iter().cloned())
            .collect()
    }
}

/// Users whose holdings are remembered before the memory is cleared.
const USERS_REMEMBERED: usize = 4096;

/// The compiled policy.
#[derive(Debug, Default)]
pub struct Policy {
    cluster_roles: HashMap<String, Arc<Vec<Rule>>>,
    roles: HashMap<(String, String), Arc<Vec<Rule>>>,
    bindings: Vec<Binding>,
    /// The rules each aggregated ClusterRole holds (for writing them into the object).
    aggregated: BTreeMap<String, Vec<Value>>,
    users: RwLock<HashMap<User, Arc<Granted>>>,
}

/// A metav1.LabelSelector (matchLabels, matchExpressions) against labels.
fn selector_matches(selector: &Value, labels: &serde_json::Map<String, Value>) -> bool {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let match_labels = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let expressions = selector["matchExpressions"].as_array().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            }
        })
    });
    match_labels && expressions
}

fn name_of(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

impl Policy {
    /// Compiles the stored objects.
    pub fn compile(
        cluster_roles: &[Arc<Value>],
        roles: &[Arc<Value>],
        cluster_bindings: &[Arc<Value>],
        bindings: &[Arc<Value>],
    ) -> Policy {
        let mut policy = Policy::default();
        let empty = serde_json::Map::new();
        for role in cluster_roles {
            let name = name_of(role);
            let rules = match role["aggregationRule"]["clusterRoleSelectors"].as_array() {
                Some(selectors) => {
                    let mut union: Vec<Value> = Vec::new();
                    for other in cluster_roles {
                        let labels = other["metadata"]["labels"].as_object().unwrap_or(&empty);
                        if name_of(other) != name
                            && selectors.iter().any(|s| selector_matches(s, labels))
                        {
                            for rule in other["rules"].as_array().into_iter().flatten() {
                                if !union.contains(rule) {
                                    union.push(rule.clone());
                                }
                            }
                        }
                    }
                    let rules = union.iter().map(Rule::from_json).collect();
                    policy.aggregated.insert(name.clone(), union);
                    rules
                }
                None => Rule::of_role(role),
            };
            policy.cluster_roles.insert(name, Arc::new(rules));
        }
        for role in roles {
            let namespace = role["metadata"]["namespace"].as_str().unwrap_or_default();
            policy.roles.insert(
                (namespace.to_string(), name_of(role)),
                Arc::new(Rule::of_role(role)),
            );
        }
        for binding in cluster_bindings.iter().chain(bindings) {
            let namespace = binding["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let subjects = binding["subjects"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(|s| Subject::from_json(s, &namespace))
                        .collect()
                })
                .unwrap_or_default();
            policy.bindings.push(Binding {
                namespace,
                name: name_of(binding),
                role_kind: binding["roleRef"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                role_name: binding["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                subjects,
            });
        }
        policy
    }

    /// The rules each aggregated ClusterRole holds, by name.
    pub fn aggregated(&self) -> &BTreeMap<String, Vec<Value>> {
        &self.aggregated
    }

    /// The rules of a ClusterRole (empty if it does not exist).
    pub fn cluster_role(&self, name: &str) -> Arc<Vec<Rule>> {
        self.cluster_roles.get(name).cloned().unwrap_or_default()
    }

    /// The rules of a Role (empty if it does not exist).
    pub fn role(&self, namespace: &str, name: &str) -> Arc<Vec<Rule>> {
        self.roles
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// What `user` holds (remembered until the policy changes).
    pub fn granted(&self, user: &User) -> Arc<Granted> {
        if let Some(found) = self.users.read().get(user) {
            return found.clone();
        }
        let mut granted = Granted::default();
        for binding in &self.bindings {
            let Some(subject) = binding.subjects.iter().find(|s| s.applies_to(user)) else {
                continue;
            };
            let rules = match (binding.role_kind.as_str(), binding.namespace.is_empty()) {
                ("ClusterRole", _) => self.cluster_role(&binding.role_name),
                ("Role", false) => self.role(&binding.namespace, &binding.role_name),
                _ => continue,
            };
            let by = if binding.namespace.is_empty() {
                format!(
                    "ClusterRoleBinding {:?} of ClusterRole {:?} to {}",
                    binding.name,
                    binding.role_name,
                    subject.describe()
                )
            } else {
                format!(
                    "RoleBinding {:?} of {} {:?} to {}",
                    format!("{}/{}", binding.namespace, binding.name),
                    binding.role_kind,
                    binding.role_name,
                    subject.describe()
                )
            };
            let grant = Grant { rules, by };
            if binding.namespace.is_empty() {
                granted.cluster.push(grant);
            } else {
                granted
                    .namespaced
                    .entry(binding.namespace.clone())
                    .or_default()
                    .push(grant);
            }
        }
        let granted = Arc::new(granted);
        let mut users = self.users.write();
        if users.len() >= USERS_REMEMBERED {
            users.clear();
        }
        users.insert(user.clone(), granted.clone());
        granted
    }

    /// Whether `user` may make the request: the binding that allows it, or None.
    pub fn allowed_by(&self, user: &User, attributes: &Attributes) -> Option<String> {
        let namespace = match attributes {
            Attributes::Resource(r) => r.namespace.as_str(),
            Attributes::NonResource { .. } => "",
        };
        self.granted(user)
            .in_namespace(namespace)
            .find(|g| g.rules.iter().any(|r| r.allows(attributes)))
            .map(|g| g.by.clone())
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
