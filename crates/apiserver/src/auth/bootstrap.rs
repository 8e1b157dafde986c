//! The defaults kube-apiserver's RBAC makes at start that decide what every user may do
//! before anyone grants anything: `cluster-admin` for `system:masters`, discovery, the reviews
//! and the public information endpoints for every authenticated user, and the ServiceAccount
//! issuer discovery for ServiceAccounts. Marked `rbac.authorization.kubernetes.io/autoupdate`
//! as kube-apiserver marks them: a changed default gets its rules back at the next start.

use serde_json::{Value, json};

use super::{CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES};

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

fn meta(name: &str) -> Value {
    json!({
        "name": name,
        "annotations": {AUTOUPDATE: "true"},
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
    })
}

fn role(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta(name),
        "rules": rules,
    })
}

fn urls(paths: &[&str]) -> Value {
    json!([{"nonResourceURLs": paths, "verbs": ["get"]}])
}

fn binding(name: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    })
}

/// The default ClusterRoles and ClusterRoleBindings, as (storage key, object).
pub fn defaults() -> Vec<(&'static str, Value)> {
    vec![
        (
            CLUSTER_ROLES,
            role(
                "cluster-admin",
                json!([
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                    {"nonResourceURLs": ["*"], "verbs": ["*"]},
                ]),
            ),
        ),
        (
            CLUSTER_ROLES,
            role(
                "system:discovery",
                urls(&[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ]),
            ),
        ),
        (
            CLUSTER_ROLES,
            role(
                "system:basic-user",
                json!([
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
                ]),
            ),
        ),
        (
            CLUSTER_ROLES,
            role(
                "system:public-info-viewer",
                urls(&["/healthz", "/livez", "/readyz", "/version", "/version/"]),
            ),
        ),
        (
            CLUSTER_ROLES,
            role(
                "system:service-account-issuer-discovery",
                urls(&[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ]),
            ),
        ),
        (
            CLUSTER_ROLE_BINDINGS,
            binding("cluster-admin", &["system:masters"]),
        ),
        (
            CLUSTER_ROLE_BINDINGS,
            binding("system:discovery", &["system:authenticated"]),
        ),
        (
            CLUSTER_ROLE_BINDINGS,
            binding("system:basic-user", &["system:authenticated"]),
        ),
        (
            CLUSTER_ROLE_BINDINGS,
            binding(
                "system:public-info-viewer",
                &["system:authenticated", "system:unauthenticated"],
            ),
        ),
        (
            CLUSTER_ROLE_BINDINGS,
            binding(
                "system:service-account-issuer-discovery",
                &["system:serviceaccounts"],
            ),
        ),
    ]
}

/// What a default becomes given the stored object: made when missing; its rules (or
/// binding) restored when someone changed them and left it marked for autoupdate; left alone
/// when unmarked. None: nothing to write.
pub fn reconcile(default: &Value, stored: Option<&Value>) -> Option<Value> {
    let Some(stored) = stored else {
        return Some(default.clone());
    };
    if stored["metadata"]["annotations"][AUTOUPDATE].as_str() != Some("true") {
        return None;
    }
    let mut next = stored.clone();
    let mut changed = false;
    for field in ["rules", "roleRef", "subjects"] {
        if !default[field].is_null() && stored[field] != default[field] {
            next[field] = default[field].clone();
            changed = true;
        }
    }
    changed.then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_made_restored_or_left_when_unmarked() {
        let defaults = defaults();
        let admin = &defaults[0].1;
        assert_eq!(reconcile(admin, None).as_ref(), Some(admin));
        assert_eq!(reconcile(admin, Some(admin)), None);
        let mut changed = admin.clone();
        changed["rules"] = json!([]);
        assert_eq!(
            reconcile(admin, Some(&changed)).map(|v| v["rules"].clone()),
            Some(admin["rules"].clone())
        );
        changed["metadata"]["annotations"][AUTOUPDATE] = json!("false");
        assert_eq!(reconcile(admin, Some(&changed)), None);
        assert_eq!(defaults.len(), 10);
    }
}
