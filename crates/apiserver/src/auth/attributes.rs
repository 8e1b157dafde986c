//! What a request asks for, in RBAC's terms, read from its method, path and query alone (as
//! kube-apiserver's RequestInfoFactory reads it: a path that names no registered resource is
//! still a resource request, so an unknown resource is refused before it is found missing),
//! and the 403 kube-apiserver answers when it is not allowed.

use crate::status::ApiError;

/// A request's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    /// A request for a resource (`/api/...`, `/apis/...` with a resource).
    Resource(ResourceAttributes),
    /// Anything else (`/api`, `/apis/g/v`, `/version`, `/metrics`, ...).
    NonResource {
        /// The HTTP method in lower case (`get`, `post`, ...).
        verb: String,
        /// The path.
        path: String,
    },
}

/// The attributes of a resource request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group ("" for core).
    pub group: String,
    /// The version.
    pub version: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource, if any.
    pub subresource: String,
    /// The namespace ("" for cluster scope; a Namespace's own name for `namespaces`).
    pub namespace: String,
    /// The object's name ("" for collections; a list or watch selecting one name by
    /// `fieldSelector=metadata.name=N` names it).
    pub name: String,
}

impl Attributes {
    /// The verb.
    pub fn verb(&self) -> &str {
        match self {
            Attributes::Resource(r) => &r.verb,
            Attributes::NonResource { verb, .. } => verb,
        }
    }
}

/// Reads a request's attributes. `field_selector` is the query's `fieldSelector` and `watch`
/// its `watch` flag.
pub fn of_request(
    method: &str,
    path: &str,
    field_selector: Option<&str>,
    watch: bool,
) -> Attributes {
    let non_resource = || Attributes::NonResource {
        verb: method.to_ascii_lowercase(),
        path: path.to_string(),
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return non_resource(),
    };
    let verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => return non_resource(),
    };
    let mut rest: &[&str] = rest;
    let mut namespace = "";
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = rest[1];
        if rest.len() > 2 && !matches!(rest[2], "finalize" | "status") {
            rest = &rest[2..];
        }
    }
    let resource = rest.first().copied().unwrap_or_default();
    let mut name = rest.get(1).copied().unwrap_or_default().to_string();
    let subresource = rest.get(2).copied().unwrap_or_default();
    let mut verb = verb.to_string();
    if name.is_empty() && verb == "get" {
        verb = if watch { "watch" } else { "list" }.to_string();
        if let Some(selected) = field_selector.and_then(single_name) {
            name = selected;
        }
    }
    if name.is_empty() && verb == "delete" {
        verb = "deletecollection".to_string();
    }
    Attributes::Resource(ResourceAttributes {
        verb,
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        subresource: subresource.to_string(),
        namespace: namespace.to_string(),
        name,
    })
}

/// The name a field selector picks when it is exactly `metadata.name=N` (or `==`).
fn single_name(selector: &str) -> Option<String> {
    if selector.contains(',') {
        return None;
    }
    let value = selector
        .strip_prefix("metadata.name==")
        .or_else(|| selector.strip_prefix("metadata.name="))?;
    (!value.is_empty()).then(|| value.to_string())
}

/// kube-apiserver's 403 for a request `user` may not make (`reason`, if any, is appended).
pub fn forbidden(user: &str, attributes: &Attributes, reason: &str) -> ApiError {
    let suffix = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    match attributes {
        Attributes::NonResource { verb, path } => ApiError::forbidden(format!(
            "forbidden: User {user:?} cannot {verb} path {path:?}{suffix}"
        )),
        Attributes::Resource(r) => {
            let resource = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace {:?}", r.namespace)
            };
            let why = format!(
                "User {user:?} cannot {} resource {resource:?} in API group {:?} {scope}{suffix}",
                r.verb, r.group
            );
            let qualified = if r.group.is_empty() {
                r.resource.clone()
            } else {
                format!("{}.{}", r.resource, r.group)
            };
            let message = if r.name.is_empty() {
                format!("{qualified} is forbidden: {why}")
            } else {
                format!("{qualified} {:?} is forbidden: {why}", r.name)
            };
            let mut error = ApiError::forbidden(message);
            error.name = Some(r.name.clone());
            error.kind = Some(r.resource.clone().into());
            error.group = Some(r.group.clone().into());
            error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes::Resource(ResourceAttributes {
            verb: verb.into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
        })
    }

    #[test]
    fn requests_read_as_kube_apiserver_reads_them() {
        let non = |verb: &str, path: &str| Attributes::NonResource {
            verb: verb.into(),
            path: path.into(),
        };
        let cases = [
            (
                (
                    "GET",
                    "/api/v1/namespaces/default/persistentvolumeclaims/c",
                    None,
                    false,
                ),
                resource("get", "", "persistentvolumeclaims", "", "default", "c"),
            ),
            (
                (
                    "GET",
                    "/api/v1/namespaces/default/persistentvolumeclaims",
                    None,
                    false,
                ),
                resource("list", "", "persistentvolumeclaims", "", "default", ""),
            ),
            (
                (
                    "GET",
                    "/api/v1/namespaces/default/persistentvolumeclaims",
                    None,
                    true,
                ),
                resource("watch", "", "persistentvolumeclaims", "", "default", ""),
            ),
            (
                (
                    "GET",
                    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
                    Some("metadata.name=lock"),
                    true,
                ),
                resource(
                    "watch",
                    "coordination.k8s.io",
                    "leases",
                    "",
                    "kube-system",
                    "lock",
                ),
            ),
            (
                ("GET", "/api/v1/pods", Some("spec.nodeName=n1"), false),
                resource("list", "", "pods", "", "", ""),
            ),
            (
                (
                    "PATCH",
                    "/apis/storage.k8s.io/v1/volumeattachments/va/status",
                    None,
                    false,
                ),
                resource(
                    "patch",
                    "storage.k8s.io",
                    "volumeattachments",
                    "status",
                    "",
                    "va",
                ),
            ),
            (
                (
                    "POST",
                    "/api/v1/namespaces/default/pods/p/binding",
                    None,
                    false,
                ),
                resource("create", "", "pods", "binding", "default", "p"),
            ),
            (
                (
                    "POST",
                    "/api/v1/namespaces/ns/serviceaccounts/sa/token",
                    None,
                    false,
                ),
                resource("create", "", "serviceaccounts", "token", "ns", "sa"),
            ),
            // A Namespace is in its own namespace; its status and finalize are its subresources.
            (
                ("GET", "/api/v1/namespaces/team", None, false),
                resource("get", "", "namespaces", "", "team", "team"),
            ),
            (
                ("PUT", "/api/v1/namespaces/team/finalize", None, false),
                resource("update", "", "namespaces", "finalize", "team", "team"),
            ),
            (
                ("GET", "/api/v1/namespaces", None, false),
                resource("list", "", "namespaces", "", "", ""),
            ),
            (
                ("DELETE", "/api/v1/namespaces/default/events", None, false),
                resource("deletecollection", "", "events", "", "default", ""),
            ),
            (
                ("DELETE", "/api/v1/nodes/n1", None, false),
                resource("delete", "", "nodes", "", "", "n1"),
            ),
            // Unknown resources are still resource requests.
            (
                ("GET", "/apis/example.com/v1/widgets", None, false),
                resource("list", "example.com", "widgets", "", "", ""),
            ),
            (("GET", "/api", None, false), non("get", "/api")),
            (("GET", "/api/v1", None, false), non("get", "/api/v1")),
            (
                ("GET", "/apis/storage.k8s.io/v1", None, false),
                non("get", "/apis/storage.k8s.io/v1"),
            ),
            (("GET", "/version", None, false), non("get", "/version")),
            (
                ("POST", "/debug/faults", None, false),
                non("post", "/debug/faults"),
            ),
            (
                ("OPTIONS", "/api/v1/pods", None, false),
                non("options", "/api/v1/pods"),
            ),
        ];
        for ((method, path, selector, watch), want) in cases {
            assert_eq!(
                of_request(method, path, selector, watch),
                want,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn refusals_carry_kube_apiservers_words() {
        let cases = [
            (
                resource("patch", "", "persistentvolumeclaims", "", "default", "src"),
                r#"persistentvolumeclaims "src" is forbidden: User "u" cannot patch resource "persistentvolumeclaims" in API group "" in the namespace "default""#,
            ),
            (
                resource("list", "", "nodes", "", "", ""),
                r#"nodes is forbidden: User "u" cannot list resource "nodes" in API group "" at the cluster scope"#,
            ),
            (
                resource(
                    "patch",
                    "storage.k8s.io",
                    "volumeattachments",
                    "status",
                    "",
                    "va",
                ),
                r#"volumeattachments.storage.k8s.io "va" is forbidden: User "u" cannot patch resource "volumeattachments/status" in API group "storage.k8s.io" at the cluster scope"#,
            ),
            (
                Attributes::NonResource {
                    verb: "get".into(),
                    path: "/metrics".into(),
                },
                r#"forbidden: User "u" cannot get path "/metrics""#,
            ),
        ];
        for (attributes, want) in cases {
            let error = forbidden("u", &attributes, "");
            assert_eq!(error.code, 403);
            assert_eq!(error.reason, "Forbidden");
            assert_eq!(error.message, want);
        }
        let named = forbidden(
            "u",
            &resource("get", "apps", "deployments", "", "ns", "d"),
            "",
        );
        assert_eq!(named.name.as_deref(), Some("d"));
        assert_eq!(named.kind.as_deref(), Some("deployments"));
        assert_eq!(named.group.as_deref(), Some("apps"));
    }
}
