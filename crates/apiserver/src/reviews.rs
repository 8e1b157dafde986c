//! `SelfSubjectReview` and `SelfSubjectAccessReview`: create-only resources that answer for the
//! token's user and are never stored, so `kubectl auth whoami` and `kubectl auth can-i` work.
//! The server has one user, the holder of its token, who may do everything.

use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::status::ApiError;

/// The token holder's name.
pub const USER: &str = "volstack-admin";
/// The token holder's groups (a cluster administrator, as kube-apiserver names one).
pub const GROUPS: [&str; 2] = ["system:masters", "system:authenticated"];

/// Whether a resource is one of the reviews.
pub fn is_review(group: &str, plural: &str) -> bool {
    matches!(
        (group, plural),
        ("authentication.k8s.io", "selfsubjectreviews")
            | ("authorization.k8s.io", "selfsubjectaccessreviews")
    )
}

/// The answer to a created review: the request (None when it could not be read, as for a
/// protobuf body) with its status filled in.
pub fn answer(rt: &ResourceType, request: Option<Value>) -> Result<Value, ApiError> {
    let checked = request.is_some();
    let mut request = request.unwrap_or_else(
        || json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {}, "spec": {}}),
    );
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let status = match rt.plural.as_str() {
        "selfsubjectreviews" => json!({"userInfo": {"username": USER, "groups": GROUPS}}),
        _ => {
            let attributes = &request["spec"];
            if checked
                && attributes["resourceAttributes"].is_null()
                && attributes["nonResourceAttributes"].is_null()
            {
                return Err(ApiError::invalid(
                    "SelfSubjectAccessReview",
                    "",
                    "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
                ));
            }
            json!({"allowed": true, "reason": "the token holder may do everything on this server"})
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rt(group: &str, plural: &str, kind: &str) -> ResourceType {
        crate::registry::Registry::default()
            .find(group, "v1", plural)
            .unwrap_or_else(|| panic!("{kind} is registered"))
    }

    #[test]
    fn reviews_answer_for_the_token_holder() {
        let ssr = rt(
            "authentication.k8s.io",
            "selfsubjectreviews",
            "SelfSubjectReview",
        );
        let ssar = rt(
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
        );
        let who = answer(&ssr, Some(json!({"kind": "SelfSubjectReview"}))).unwrap_or_default();
        assert_eq!(who["status"]["userInfo"]["username"], USER);
        let unread = answer(&ssr, None).unwrap_or_default();
        assert_eq!(unread["kind"], "SelfSubjectReview");
        assert_eq!(unread["status"]["userInfo"]["groups"][0], "system:masters");
        let can = answer(
            &ssar,
            Some(json!({"spec": {"resourceAttributes": {"verb": "create", "resource": "pods"}}})),
        )
        .unwrap_or_default();
        assert_eq!(can["status"]["allowed"], true);
        assert!(answer(&ssar, Some(json!({"spec": {}}))).is_err());
        assert!(answer(&ssr, Some(json!(5))).is_err());
    }
}
