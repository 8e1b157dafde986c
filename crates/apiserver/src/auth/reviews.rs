//! The reviews: create-only resources answered from the same decisions as every request, and
//! never stored. `SelfSubjectReview` (`kubectl auth whoami`) names the requester,
//! `SelfSubjectAccessReview` (`kubectl auth can-i`) and `SubjectAccessReview` say whether a
//! request would be allowed, `SelfSubjectRulesReview` (`kubectl auth can-i --list`) lists the
//! rules the requester holds in a namespace.

use serde_json::{Value, json};

use super::attributes::{Attributes, ResourceAttributes};
use super::policy::{Policy, User};
use super::rules::{Rule, strings};
use crate::registry::ResourceType;
use crate::status::ApiError;

/// Whether a resource is one of the reviews.
pub fn is_review(group: &str, plural: &str) -> bool {
    matches!(
        (group, plural),
        ("authentication.k8s.io", "selfsubjectreviews")
            | (
                "authorization.k8s.io",
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews" | "subjectaccessreviews"
            )
    )
}

/// The answer to a created review of kind `rt` for `user` (None: the body could not be read,
/// as for a protobuf body of a self-review, which is then answered for an empty spec).
pub fn answer(
    rt: &ResourceType,
    request: Option<Value>,
    user: &User,
    policy: &Policy,
) -> Result<Value, ApiError> {
    let checked = request.is_some();
    let mut request = request.unwrap_or_else(
        || json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {}, "spec": {}}),
    );
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let spec = request["spec"].clone();
    let status = match rt.plural.as_str() {
        "selfsubjectreviews" => json!({"userInfo": user_info(user)}),
        "selfsubjectrulesreviews" => {
            let namespace = spec["namespace"].as_str().unwrap_or_default();
            rules_review(user, policy, namespace)
        }
        "subjectaccessreviews" => {
            let subject = User {
                name: spec["user"].as_str().unwrap_or_default().to_string(),
                uid: spec["uid"].as_str().unwrap_or_default().to_string(),
                groups: strings(&spec["groups"]),
            };
            if checked && subject.name.is_empty() && subject.groups.is_empty() {
                return Err(ApiError::invalid(
                    "SubjectAccessReview",
                    "",
                    "spec.user: Invalid value: \"\": at least one of user or group must be specified",
                ));
            }
            access_review(&spec, &subject, policy, checked, "SubjectAccessReview")?
        }
        _ => access_review(&spec, user, policy, checked, "SelfSubjectAccessReview")?,
    };
    request["status"] = status;
    if !request["metadata"].is_object() {
        request["metadata"] = json!({});
    }
    if let Some(meta) = request["metadata"].as_object_mut() {
        meta.insert("creationTimestamp".into(), Value::Null);
    }
    Ok(request)
}

fn user_info(user: &User) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    info
}

/// Whether `user` may make the request the spec describes.
fn access_review(
    spec: &Value,
    user: &User,
    policy: &Policy,
    checked: bool,
    kind: &str,
) -> Result<Value, ApiError> {
    let resource = &spec["resourceAttributes"];
    let non_resource = &spec["nonResourceAttributes"];
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let attributes = if resource.is_object() {
        Attributes::Resource(ResourceAttributes {
            verb: text(resource, "verb"),
            group: text(resource, "group"),
            version: text(resource, "version"),
            resource: text(resource, "resource"),
            subresource: text(resource, "subresource"),
            namespace: text(resource, "namespace"),
            name: text(resource, "name"),
        })
    } else if non_resource.is_object() {
        Attributes::NonResource {
            verb: text(non_resource, "verb"),
            path: text(non_resource, "path"),
        }
    } else if checked {
        return Err(ApiError::invalid(
            kind,
            "",
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    } else {
        return Ok(json!({"allowed": false}));
    };
    if user.is_master() {
        return Ok(json!({"allowed": true}));
    }
    Ok(match policy.allowed_by(user, &attributes) {
        Some(by) => json!({"allowed": true, "reason": format!("RBAC: allowed by {by}")}),
        None => json!({"allowed": false}),
    })
}

/// The rules `user` holds in `namespace` (and everywhere), split as kube-apiserver splits
/// them; members of `system:masters` hold everything.
fn rules_review(user: &User, policy: &Policy, namespace: &str) -> Value {
    let mut rules: Vec<Rule> = policy.granted(user).rules_in(namespace);
    if user.is_master() {
        rules.insert(
            0,
            Rule {
                verbs: vec!["*".into()],
                api_groups: vec!["*".into()],
                resources: vec!["*".into()],
                ..Rule::default()
            },
        );
        rules.insert(
            1,
            Rule {
                verbs: vec!["*".into()],
                non_resource_urls: vec!["*".into()],
                ..Rule::default()
            },
        );
    }
    let (non_resource, resource): (Vec<Rule>, Vec<Rule>) = rules
        .into_iter()
        .partition(|r| !r.non_resource_urls.is_empty());
    let resource: Vec<Value> = resource
        .iter()
        .map(|r| {
            // As the Go type writes them: empty lists are left out.
            let mut rule = json!({"verbs": r.verbs});
            for (key, list) in [
                ("apiGroups", &r.api_groups),
                ("resources", &r.resources),
                ("resourceNames", &r.resource_names),
            ] {
                if !list.is_empty() {
                    rule[key] = json!(list);
                }
            }
            rule
        })
        .collect();
    let non_resource: Vec<Value> = non_resource
        .iter()
        .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
        .collect();
    json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rt(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
        crate::registry::Registry::built_in(group, plural)
    }

    fn policy() -> Policy {
        Policy::compile(
            &[Arc::new(json!({"metadata": {"name": "reader"}, "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
                {"nonResourceURLs": ["/api"], "verbs": ["get"]},
            ]}))],
            &[],
            &[Arc::new(
                json!({"metadata": {"name": "r"}, "roleRef": {"kind": "ClusterRole", "name": "reader"},
                              "subjects": [{"kind": "User", "name": "alice"}]}),
            )],
            &[],
        )
    }

    #[test]
    fn reviews_answer_from_the_policy() {
        let policy = policy();
        let alice = User {
            name: "alice".into(),
            uid: "a-1".into(),
            groups: vec!["system:authenticated".into()],
        };
        let who = answer(
            &rt("authentication.k8s.io", "selfsubjectreviews"),
            Some(json!({})),
            &alice,
            &policy,
        )
        .unwrap();
        assert_eq!(
            who["status"]["userInfo"],
            json!({"username": "alice", "uid": "a-1", "groups": ["system:authenticated"]})
        );
        let ssar = rt("authorization.k8s.io", "selfsubjectaccessreviews");
        let ask = |attrs: Value| {
            answer(&ssar, Some(json!({"spec": attrs})), &alice, &policy).unwrap()["status"].clone()
        };
        assert_eq!(
            ask(json!({"resourceAttributes": {"verb": "list", "resource": "nodes"}})),
            json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"r\" of ClusterRole \"reader\" to User \"alice\""})
        );
        assert_eq!(
            ask(json!({"resourceAttributes": {"verb": "delete", "resource": "nodes"}})),
            json!({"allowed": false})
        );
        assert_eq!(
            ask(json!({"nonResourceAttributes": {"verb": "get", "path": "/api"}}))["allowed"],
            true
        );
        assert!(answer(&ssar, Some(json!({"spec": {}})), &alice, &policy).is_err());
        let sar = rt("authorization.k8s.io", "subjectaccessreviews");
        let for_bob = answer(&sar, Some(json!({"spec": {"user": "bob", "resourceAttributes": {"verb": "list", "resource": "nodes"}}})), &alice, &policy).unwrap();
        assert_eq!(for_bob["status"]["allowed"], false);
        let rules = answer(
            &rt("authorization.k8s.io", "selfsubjectrulesreviews"),
            Some(json!({"spec": {"namespace": "default"}})),
            &alice,
            &policy,
        )
        .unwrap();
        assert_eq!(
            rules["status"],
            json!({
                "resourceRules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["nodes"]}],
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/api"]}],
                "incomplete": false,
            })
        );
    }
}
