//! `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` and `Impersonate-Extra-*`
//! (`kubectl --as=... --as-group=...`): the request is served as another user when its maker
//! may `impersonate` that user (or ServiceAccount), each group, the uid and each extra, as
//! kube-apiserver's impersonation filter checks them.

use axum::http::HeaderMap;

use super::attributes::{Attributes, ResourceAttributes};
use super::policy::{AUTHENTICATED, User};
use crate::status::ApiError;

/// What the headers ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requested {
    /// The user.
    pub user: String,
    /// The groups (none given: a ServiceAccount's own).
    pub groups: Vec<String>,
    /// The uid, if given.
    pub uid: Option<String>,
    /// Extra fields (key, value).
    pub extra: Vec<(String, String)>,
}

/// The impersonation a request asks for, None when it asks for none; a group, uid or extra
/// without a user is a 400.
pub fn requested(headers: &HeaderMap) -> Result<Option<Requested>, ApiError> {
    let text = |v: &axum::http::HeaderValue| v.to_str().unwrap_or_default().to_string();
    let user = headers.get("impersonate-user").map(text);
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .map(text)
        .collect();
    let uid = headers.get("impersonate-uid").map(text);
    let extra: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("impersonate-extra-")?;
            Some((key.to_string(), text(value)))
        })
        .collect();
    match user {
        Some(user) if !user.is_empty() => Ok(Some(Requested {
            user,
            groups,
            uid,
            extra,
        })),
        _ if !groups.is_empty() || uid.is_some() || !extra.is_empty() => {
            Err(ApiError::bad_request(
                "requested impersonation of groups, uid or extra fields without impersonating a user",
            ))
        }
        _ => Ok(None),
    }
}

/// The checks impersonating `requested` takes: `impersonate` on the user (a ServiceAccount in
/// its namespace), each group, the uid and each extra.
pub fn checks(requested: &Requested) -> Vec<Attributes> {
    let check = |group: &str, resource: &str, namespace: &str, name: &str| {
        Attributes::Resource(ResourceAttributes {
            verb: "impersonate".into(),
            group: group.into(),
            version: String::new(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: namespace.into(),
            name: name.into(),
        })
    };
    let mut checks = vec![match service_account(&requested.user) {
        Some((namespace, name)) => check("", "serviceaccounts", namespace, name),
        None => check("", "users", "", &requested.user),
    }];
    checks.extend(requested.groups.iter().map(|g| check("", "groups", "", g)));
    checks.extend(
        requested
            .uid
            .iter()
            .map(|u| check("authentication.k8s.io", "uids", "", u)),
    );
    checks.extend(requested.extra.iter().map(|(key, value)| {
        check(
            "authentication.k8s.io",
            &format!("userextras/{key}"),
            "",
            value,
        )
    }));
    checks
}

fn service_account(user: &str) -> Option<(&str, &str)> {
    user.strip_prefix("system:serviceaccount:")?.split_once(':')
}

/// The user the request is served as: a ServiceAccount without groups given gets its own,
/// and everyone but `system:anonymous` is in `system:authenticated` unless a group says
/// otherwise.
pub fn impersonated(requested: &Requested) -> User {
    let mut groups = requested.groups.clone();
    if groups.is_empty()
        && let Some((namespace, _)) = service_account(&requested.user)
    {
        groups = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
        ];
    }
    let add_authenticated = requested.user != "system:anonymous"
        && !groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == "system:unauthenticated");
    if add_authenticated {
        groups.push(AUTHENTICATED.to_string());
    }
    User {
        name: requested.user.clone(),
        uid: requested.uid.clone().unwrap_or_default(),
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.append(*k, v);
            }
        }
        h
    }

    #[test]
    fn a_service_account_is_impersonated_with_its_groups_and_checked_in_its_namespace() {
        let asked = requested(&headers(&[(
            "impersonate-user",
            "system:serviceaccount:default:csi",
        )]))
        .ok()
        .flatten()
        .unwrap_or_default();
        let user = impersonated(&asked);
        assert_eq!(user.name, "system:serviceaccount:default:csi");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                AUTHENTICATED
            ]
        );
        let checks = checks(&asked);
        assert_eq!(checks.len(), 1);
        let Attributes::Resource(r) = &checks[0] else {
            panic!("{checks:?}");
        };
        assert_eq!(
            (
                r.verb.as_str(),
                r.resource.as_str(),
                r.namespace.as_str(),
                r.name.as_str()
            ),
            ("impersonate", "serviceaccounts", "default", "csi")
        );
    }

    #[test]
    fn users_groups_uids_and_extras_are_each_checked() {
        let asked = requested(&headers(&[
            ("impersonate-user", "alice"),
            ("impersonate-group", "devs"),
            ("impersonate-group", "system:unauthenticated"),
            ("impersonate-uid", "u-1"),
            ("impersonate-extra-scopes", "view"),
        ]))
        .ok()
        .flatten()
        .unwrap_or_default();
        let user = impersonated(&asked);
        assert_eq!(
            user.groups,
            ["devs", "system:unauthenticated"],
            "no system:authenticated"
        );
        assert_eq!(user.uid, "u-1");
        let described: Vec<String> = checks(&asked)
            .iter()
            .map(|c| match c {
                Attributes::Resource(r) => format!("{}/{} {}", r.group, r.resource, r.name),
                Attributes::NonResource { path, .. } => path.clone(),
            })
            .collect();
        assert_eq!(
            described,
            [
                "/users alice",
                "/groups devs",
                "/groups system:unauthenticated",
                "authentication.k8s.io/uids u-1",
                "authentication.k8s.io/userextras/scopes view",
            ]
        );
        let plain = impersonated(
            &requested(&headers(&[("impersonate-user", "bob")]))
                .ok()
                .flatten()
                .unwrap_or_default(),
        );
        assert_eq!(plain.groups, [AUTHENTICATED]);
        assert!(requested(&headers(&[("impersonate-group", "devs")])).is_err());
        assert_eq!(requested(&HeaderMap::new()).ok().flatten(), None);
    }
}
