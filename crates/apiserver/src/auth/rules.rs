//! RBAC's policy rules: read from a Role or ClusterRole, matched against a request as
//! kube-apiserver's RBAC authorizer matches them (`*` for any verb, group or resource,
//! `*/sub` for a subresource of any resource, `resourceNames` only for named requests,
//! non-resource URLs with a trailing `*` as a prefix), and the coverage check that stops a
//! user from granting more than they hold.

use serde_json::Value;

use super::attributes::{Attributes, ResourceAttributes};

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Verbs (`*`: any).
    pub verbs: Vec<String>,
    /// API groups ("" core, `*` any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// Resources (`*` any, `res/sub`, `*/sub`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Names (empty: any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    /// Non-resource URLs (`*` any, a trailing `*` a prefix).
    #[serde(rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

/// The strings of a JSON list (anything else: none).
pub(crate) fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

impl Rule {
    /// A rule from its JSON (`verbs`, `apiGroups`, `resources`, `resourceNames`,
    /// `nonResourceURLs`).
    pub fn from_json(value: &Value) -> Rule {
        Rule {
            verbs: strings(&value["verbs"]),
            api_groups: strings(&value["apiGroups"]),
            resources: strings(&value["resources"]),
            resource_names: strings(&value["resourceNames"]),
            non_resource_urls: strings(&value["nonResourceURLs"]),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub fn of_role(role: &Value) -> Vec<Rule> {
        role["rules"]
            .as_array()
            .map(|rules| rules.iter().map(Rule::from_json).collect())
            .unwrap_or_default()
    }

    fn has_verb(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    /// Whether the rule allows the request.
    pub fn allows(&self, attributes: &Attributes) -> bool {
        match attributes {
            Attributes::Resource(r) => self.allows_resource(r),
            Attributes::NonResource { verb, path } => {
                self.has_verb(verb)
                    && self.non_resource_urls.iter().any(|url| {
                        url == "*"
                            || url == path
                            || url
                                .strip_suffix('*')
                                .is_some_and(|prefix| path.starts_with(prefix))
                    })
            }
        }
    }

    fn allows_resource(&self, r: &ResourceAttributes) -> bool {
        if !self.has_verb(&r.verb) {
            return false;
        }
        if !self.api_groups.iter().any(|g| g == "*" || *g == r.group) {
            return false;
        }
        // `res/sub` compared in place: this runs for every rule of every request.
        let names_it = |res: &str| {
            if r.subresource.is_empty() {
                return res == r.resource;
            }
            res.strip_prefix(r.resource.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                == Some(r.subresource.as_str())
        };
        let resource = self.resources.iter().any(|res| {
            res == "*"
                || names_it(res)
                || (!r.subresource.is_empty()
                    && res.strip_prefix("*/") == Some(r.subresource.as_str()))
        });
        resource && (self.resource_names.is_empty() || self.resource_names.contains(&r.name))
    }
}

/// Whether `held` lets its holder do everything `granted` allows (kube-apiserver's
/// ConfirmNoEscalation): each of the granted rule's verb, group, resource and name (or URL)
/// must be allowed by some held rule, a `*` only by a `*`.
pub fn covers(held: &[Rule], granted: &Rule) -> bool {
    let any = |list: &[String]| -> Vec<String> {
        if list.is_empty() {
            vec![String::new()]
        } else {
            list.to_vec()
        }
    };
    if !granted.non_resource_urls.is_empty() {
        return granted.verbs.iter().all(|verb| {
            granted.non_resource_urls.iter().all(|url| {
                held.iter().any(|h| {
                    h.has_verb(verb)
                        && h.non_resource_urls.iter().any(|mine| {
                            mine == "*"
                                || mine == url
                                || mine
                                    .strip_suffix('*')
                                    .is_some_and(|prefix| url.starts_with(prefix))
                        })
                })
            })
        });
    }
    let names = any(&granted.resource_names);
    granted.verbs.iter().all(|verb| {
        granted.api_groups.iter().all(|group| {
            granted.resources.iter().all(|resource| {
                names.iter().all(|name| {
                    held.iter().any(|h| {
                        let verb_ok = h.verbs.iter().any(|v| v == "*" || v == verb);
                        let group_ok = h.api_groups.iter().any(|g| g == "*" || g == group);
                        let resource_ok = h.resources.iter().any(|r| {
                            r == "*"
                                || r == resource
                                || (r.starts_with("*/")
                                    && resource
                                        .split_once('/')
                                        .is_some_and(|(_, sub)| Some(sub) == r.strip_prefix("*/")))
                        });
                        let name_ok = h.resource_names.is_empty()
                            || (!name.is_empty() && h.resource_names.contains(name));
                        verb_ok && group_ok && resource_ok && name_ok
                    })
                })
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(value: Value) -> Rule {
        Rule::from_json(&value)
    }

    fn request(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes::Resource(ResourceAttributes {
            verb: verb.into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "default".into(),
            name: name.into(),
        })
    }

    #[test]
    fn rules_match_as_kube_apiserver_matches_them() {
        let pvc = rule(
            json!({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "update"]}),
        );
        let status = rule(
            json!({"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments/status"], "verbs": ["patch"]}),
        );
        let any_status =
            rule(json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}));
        let named = rule(
            json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["lock"], "verbs": ["get", "watch"]}),
        );
        let urls = rule(json!({"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}));
        let cases = [
            (
                &pvc,
                request("get", "", "persistentvolumeclaims", "", "c"),
                true,
            ),
            (
                &pvc,
                request("patch", "", "persistentvolumeclaims", "", "c"),
                false,
            ),
            (
                &pvc,
                request("get", "apps", "persistentvolumeclaims", "", "c"),
                false,
            ),
            (
                &pvc,
                request("get", "", "persistentvolumeclaims", "status", "c"),
                false,
            ),
            (
                &status,
                request(
                    "patch",
                    "storage.k8s.io",
                    "volumeattachments",
                    "status",
                    "va",
                ),
                true,
            ),
            (
                &status,
                request("patch", "storage.k8s.io", "volumeattachments", "", "va"),
                false,
            ),
            (
                &any_status,
                request("update", "apps", "deployments", "status", "d"),
                true,
            ),
            (
                &any_status,
                request("update", "apps", "deployments", "", "d"),
                false,
            ),
            (
                &named,
                request("get", "coordination.k8s.io", "leases", "", "lock"),
                true,
            ),
            (
                &named,
                request("get", "coordination.k8s.io", "leases", "", "other"),
                false,
            ),
            // A list names nothing: a rule limited to names does not allow it.
            (
                &named,
                request("list", "coordination.k8s.io", "leases", "", ""),
                false,
            ),
            (
                &named,
                request("watch", "coordination.k8s.io", "leases", "", "lock"),
                true,
            ),
            (
                &urls,
                Attributes::NonResource {
                    verb: "get".into(),
                    path: "/healthz".into(),
                },
                true,
            ),
            (
                &urls,
                Attributes::NonResource {
                    verb: "get".into(),
                    path: "/apis/storage.k8s.io/v1".into(),
                },
                true,
            ),
            (
                &urls,
                Attributes::NonResource {
                    verb: "get".into(),
                    path: "/apis".into(),
                },
                false,
            ),
            (
                &urls,
                Attributes::NonResource {
                    verb: "post".into(),
                    path: "/healthz".into(),
                },
                false,
            ),
            // A resource rule never allows a non-resource request and the reverse.
            (&urls, request("get", "", "healthz", "", ""), false),
            (
                &pvc,
                Attributes::NonResource {
                    verb: "get".into(),
                    path: "/api".into(),
                },
                false,
            ),
        ];
        for (rule, attributes, want) in cases {
            assert_eq!(rule.allows(&attributes), want, "{rule:?} {attributes:?}");
        }
    }

    #[test]
    fn coverage_needs_each_verb_resource_and_name_held_and_a_star_by_a_star() {
        let held = vec![
            rule(
                json!({"apiGroups": [""], "resources": ["persistentvolumeclaims", "pods/status"], "verbs": ["get", "list"]}),
            ),
            rule(
                json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["a"], "verbs": ["get"]}),
            ),
            rule(json!({"nonResourceURLs": ["/api/*"], "verbs": ["get"]})),
        ];
        let cases = [
            (
                json!({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}),
                true,
            ),
            (
                json!({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "delete"]}),
                false,
            ),
            (
                json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}),
                false,
            ),
            (
                json!({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["*"]}),
                false,
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["list"]}),
                true,
            ),
            (
                json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["a"], "verbs": ["get"]}),
                true,
            ),
            (
                json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}),
                false,
            ),
            (
                json!({"nonResourceURLs": ["/api/v1"], "verbs": ["get"]}),
                true,
            ),
            (
                json!({"nonResourceURLs": ["/apis"], "verbs": ["get"]}),
                false,
            ),
        ];
        for (granted, want) in cases {
            assert_eq!(covers(&held, &rule(granted.clone())), want, "{granted}");
        }
        let everything = vec![rule(
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "nonResourceURLs": ["*"]}),
        )];
        let any_status = vec![rule(
            json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}),
        )];
        assert!(covers(
            &everything,
            &rule(json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}))
        ));
        assert!(covers(
            &any_status,
            &rule(
                json!({"apiGroups": ["apps"], "resources": ["deployments/status"], "verbs": ["patch"]})
            )
        ));
        assert!(!covers(
            &any_status,
            &rule(json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}))
        ));
    }
}
