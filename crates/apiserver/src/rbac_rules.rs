//! kube-apiserver's checks of the RBAC types: a rule names its verbs, a resource rule its API
//! groups, a Role's rules no non-resource URL, a rule not both; a binding's role reference is
//! a ClusterRole (or, in a RoleBinding, a Role), named, and never changes; its subjects are
//! Users, Groups or ServiceAccounts with names (and, in a ClusterRoleBinding, a ServiceAccount's
//! namespace). Messages are kube-apiserver's (`path: Type: detail`).

use serde_json::Value;

/// A Role (`namespaced`) or ClusterRole.
pub(crate) fn role(obj: &Value, namespaced: bool) -> Result<(), String> {
    for (i, rule) in obj["rules"].as_array().into_iter().flatten().enumerate() {
        let path = format!("rules[{i}]");
        let empty = |k: &str| rule[k].as_array().is_none_or(Vec::is_empty);
        if empty("verbs") {
            return Err(format!(
                "{path}.verbs: Required value: verbs must contain at least one value"
            ));
        }
        let urls = !empty("nonResourceURLs");
        if urls && namespaced {
            return Err(format!(
                "{path}.nonResourceURLs: Invalid value: {}: namespaced rules cannot apply to non-resource URLs",
                rule["nonResourceURLs"]
            ));
        }
        if urls && (!empty("resources") || !empty("apiGroups")) {
            return Err(format!(
                "{path}.nonResourceURLs: Invalid value: {}: rules cannot apply to both regular resources and non-resource URLs",
                rule["nonResourceURLs"]
            ));
        }
        if !urls && empty("apiGroups") {
            return Err(format!(
                "{path}.apiGroups: Required value: resource rules must supply at least one api group"
            ));
        }
        if !urls && empty("resources") {
            return Err(format!(
                "{path}.resources: Required value: resource rules must supply at least one resource"
            ));
        }
    }
    Ok(())
}

/// A RoleBinding (`namespaced`) or ClusterRoleBinding; `old` is the stored one on an update.
pub(crate) fn binding(obj: &Value, old: Option<&Value>, namespaced: bool) -> Result<(), String> {
    let role_ref = &obj["roleRef"];
    let kind = role_ref["kind"].as_str().unwrap_or_default();
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&kind) {
        let supported: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
        return Err(format!(
            "roleRef.kind: Unsupported value: {kind:?}: supported values: {}",
            supported.join(", ")
        ));
    }
    if role_ref["name"].as_str().is_none_or(str::is_empty) {
        return Err("roleRef.name: Required value".to_string());
    }
    if let Some(old) = old
        && old["roleRef"] != *role_ref
    {
        return Err(format!(
            "roleRef: Invalid value: {role_ref}: cannot change roleRef"
        ));
    }
    for (i, subject) in obj["subjects"].as_array().into_iter().flatten().enumerate() {
        let path = format!("subjects[{i}]");
        let kind = subject["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "User" | "Group" | "ServiceAccount") {
            return Err(format!(
                "{path}.kind: Unsupported value: {kind:?}: supported values: \"ServiceAccount\", \"User\", \"Group\""
            ));
        }
        if subject["name"].as_str().is_none_or(str::is_empty) {
            return Err(format!("{path}.name: Required value"));
        }
        if kind == "ServiceAccount"
            && !namespaced
            && subject["namespace"].as_str().is_none_or(str::is_empty)
        {
            return Err(format!("{path}.namespace: Required value"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_and_bindings_are_checked_with_kube_apiservers_messages() {
        let rule = |r: Value| json!({"rules": [r]});
        let role_cases = [
            (
                rule(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})),
                true,
                None,
            ),
            (
                rule(json!({"apiGroups": [""], "resources": ["pods"]})),
                true,
                Some("rules[0].verbs: Required value: verbs must contain at least one value"),
            ),
            (
                rule(json!({"resources": ["pods"], "verbs": ["get"]})),
                true,
                Some(
                    "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
                ),
            ),
            (
                rule(json!({"nonResourceURLs": ["/x"], "verbs": ["get"]})),
                true,
                Some(
                    "rules[0].nonResourceURLs: Invalid value: [\"/x\"]: namespaced rules cannot apply to non-resource URLs",
                ),
            ),
            (
                rule(json!({"nonResourceURLs": ["/x"], "verbs": ["get"]})),
                false,
                None,
            ),
            (
                rule(json!({"nonResourceURLs": ["/x"], "apiGroups": [""], "verbs": ["get"]})),
                false,
                Some(
                    "rules[0].nonResourceURLs: Invalid value: [\"/x\"]: rules cannot apply to both regular resources and non-resource URLs",
                ),
            ),
        ];
        for (obj, namespaced, want) in role_cases {
            assert_eq!(role(&obj, namespaced).err().as_deref(), want, "{obj}");
        }
        let b = |kind: &str, subject: Value| json!({"roleRef": {"kind": kind, "name": "r"}, "subjects": [subject]});
        let sa = json!({"kind": "ServiceAccount", "name": "csi"});
        let binding_cases = [
            (
                b("ClusterRole", json!({"kind": "User", "name": "u"})),
                false,
                None,
            ),
            (
                b("Role", json!({"kind": "User", "name": "u"})),
                false,
                Some(
                    "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                ),
            ),
            (b("Role", sa.clone()), true, None),
            (
                b("ClusterRole", sa),
                false,
                Some("subjects[0].namespace: Required value"),
            ),
            (
                b("ClusterRole", json!({"kind": "Robot", "name": "r"})),
                false,
                Some(
                    "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                ),
            ),
        ];
        for (obj, namespaced, want) in binding_cases {
            assert_eq!(
                binding(&obj, None, namespaced).err().as_deref(),
                want,
                "{obj}"
            );
        }
        let old = b("ClusterRole", json!({"kind": "User", "name": "u"}));
        let mut changed = old.clone();
        changed["roleRef"]["name"] = json!("other");
        assert!(
            binding(&changed, Some(&old), false)
                .is_err_and(|e| e.ends_with("cannot change roleRef"))
        );
    }
}
