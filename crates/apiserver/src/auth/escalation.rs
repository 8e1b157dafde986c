//! No one grants more than they hold (kube-apiserver's RBAC escalation checks): a Role or
//! ClusterRole is written only with rules its writer holds where it applies, unless the writer
//! may `escalate` it; a binding only of a role whose rules its writer holds there, unless the
//! writer may `bind` it. An aggregated ClusterRole can take any rules: it needs `escalate`.

use serde_json::Value;

use super::attributes::{Attributes, ResourceAttributes};
use super::policy::{Policy, User};
use super::rules::{Rule, covers};
use super::{Auth, CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, REQUESTER, ROLE_BINDINGS, ROLES};
use crate::registry::ResourceType;
use crate::status::ApiError;
use crate::store::Store;

const GROUP: &str = "rbac.authorization.k8s.io";

/// Checks a write of `object` (of `rt`, in `namespace`) by the request's user; writes the server
/// makes itself, and writes of other kinds, pass.
pub fn check(
    auth: &Auth,
    store: &Store,
    rt: &ResourceType,
    namespace: &str,
    object: &Value,
) -> Result<(), ApiError> {
    let key = rt.key();
    if !matches!(
        key.as_str(),
        CLUSTER_ROLES | ROLES | CLUSTER_ROLE_BINDINGS | ROLE_BINDINGS
    ) {
        return Ok(());
    }
    let Ok(user) = REQUESTER.try_with(User::clone) else {
        return Ok(());
    };
    if user.is_master() {
        return Ok(());
    }
    let policy = auth.policy(store);
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    decide(&policy, &user, &rt.plural, namespace, name, object)
}

/// The decision, pure over the compiled policy.
pub fn decide(
    policy: &Policy,
    user: &User,
    plural: &str,
    namespace: &str,
    name: &str,
    object: &Value,
) -> Result<(), ApiError> {
    let may = |verb: &str, resource: &str, target: &str| {
        policy
            .allowed_by(
                user,
                &Attributes::Resource(ResourceAttributes {
                    verb: verb.into(),
                    group: GROUP.into(),
                    version: "v1".into(),
                    resource: resource.into(),
                    subresource: String::new(),
                    namespace: namespace.into(),
                    name: target.into(),
                }),
            )
            .is_some()
    };
    let held = policy.granted(user).rules_in(namespace);
    let refuse = |why: String| {
        let mut error =
            ApiError::forbidden(format!("{plural}.{GROUP} {name:?} is forbidden: {why}"));
        error.name = Some(name.to_string());
        error.kind = Some(plural.into());
        error.group = Some(GROUP.into());
        error
    };
    let not_held = |rules: &[Rule]| -> Result<(), ApiError> {
        let missing: Vec<String> = rules
            .iter()
            .filter(|r| !covers(&held, r))
            .map(describe)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(refuse(format!(
            "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
            user.name,
            groups(user),
            missing.join("\n")
        )))
    };
    match plural {
        "roles" | "clusterroles" => {
            if may("escalate", plural, name) {
                return Ok(());
            }
            if !object["aggregationRule"].is_null() {
                return Err(refuse(
                    "must have cluster-admin privileges to use the aggregationRule".into(),
                ));
            }
            not_held(&Rule::of_role(object))
        }
        _ => {
            let kind = object["roleRef"]["kind"].as_str().unwrap_or_default();
            let role = object["roleRef"]["name"].as_str().unwrap_or_default();
            let resource = if kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            if may("bind", resource, role) {
                return Ok(());
            }
            let rules = if kind == "Role" {
                policy.role(namespace, role)
            } else {
                policy.cluster_role(role)
            };
            not_held(&rules)
        }
    }
}

fn groups(user: &User) -> String {
    let quoted: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// A rule as kube-apiserver lists a missing one.
fn describe(rule: &Rule) -> String {
    let list = |v: &[String]| {
        let quoted: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", quoted.join(" "))
    };
    let mut parts = Vec::new();
    if !rule.api_groups.is_empty() {
        parts.push(format!("APIGroups:{}", list(&rule.api_groups)));
    }
    if !rule.resources.is_empty() {
        parts.push(format!("Resources:{}", list(&rule.resources)));
    }
    if !rule.resource_names.is_empty() {
        parts.push(format!("ResourceNames:{}", list(&rule.resource_names)));
    }
    if !rule.non_resource_urls.is_empty() {
        parts.push(format!("NonResourceURLs:{}", list(&rule.non_resource_urls)));
    }
    parts.push(format!("Verbs:{}", list(&rule.verbs)));
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn policy() -> Policy {
        let cluster_roles = vec![
            Arc::new(
                json!({"metadata": {"name": "claims"}, "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}]}),
            ),
            Arc::new(
                json!({"metadata": {"name": "secrets"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
            ),
            Arc::new(json!({"metadata": {"name": "rbac-writer"}, "rules": [
                {"apiGroups": [GROUP], "resources": ["roles", "rolebindings", "clusterroles", "clusterrolebindings"], "verbs": ["create"]},
                {"apiGroups": [GROUP], "resources": ["clusterroles"], "resourceNames": ["secrets"], "verbs": ["bind"]},
            ]})),
        ];
        let bindings = vec![
            Arc::new(
                json!({"metadata": {"name": "w"}, "roleRef": {"kind": "ClusterRole", "name": "rbac-writer"}, "subjects": [{"kind": "User", "name": "bob"}]}),
            ),
            Arc::new(
                json!({"metadata": {"name": "c"}, "roleRef": {"kind": "ClusterRole", "name": "claims"}, "subjects": [{"kind": "User", "name": "bob"}]}),
            ),
        ];
        Policy::compile(&cluster_roles, &[], &bindings, &[])
    }

    #[test]
    fn roles_and_bindings_grant_only_what_their_writer_holds_or_may_bind() {
        let policy = policy();
        let bob = User {
            name: "bob".into(),
            uid: String::new(),
            groups: vec!["system:authenticated".into()],
        };
        let role = |rules: Value| json!({"metadata": {"name": "r"}, "rules": rules});
        let binding = |kind: &str, name: &str| json!({"metadata": {"name": "b"}, "roleRef": {"kind": kind, "name": name}});
        let cases = [
            (
                "clusterroles",
                role(
                    json!([{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}]),
                ),
                true,
            ),
            (
                "clusterroles",
                role(
                    json!([{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "delete"]}]),
                ),
                false,
            ),
            (
                "clusterroles",
                json!({"metadata": {"name": "agg"}, "aggregationRule": {"clusterRoleSelectors": []}}),
                false,
            ),
            (
                "clusterrolebindings",
                binding("ClusterRole", "claims"),
                true,
            ),
            // Not held, but bob may bind it.
            (
                "clusterrolebindings",
                binding("ClusterRole", "secrets"),
                true,
            ),
            (
                "clusterrolebindings",
                binding("ClusterRole", "rbac-writer"),
                true,
            ),
            ("rolebindings", binding("ClusterRole", "missing"), true),
        ];
        for (plural, object, allowed) in cases {
            let result = decide(&policy, &bob, plural, "", "x", &object);
            assert_eq!(result.is_ok(), allowed, "{plural} {object}: {result:?}");
        }
        let refused = decide(
            &policy,
            &bob,
            "clusterroles",
            "",
            "r",
            &role(json!([{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "delete"]}])),
        )
        .err()
        .map(|e| e.message)
        .unwrap_or_default();
        assert_eq!(
            refused,
            "clusterroles.rbac.authorization.k8s.io \"r\" is forbidden: user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"persistentvolumeclaims\"], Verbs:[\"get\" \"delete\"]}"
        );
    }
}
