//! Discovery: the group and resource lists kubectl and client-go read before anything else,
//! in the classic form (`/api`, `/apis`, `/apis/<group>/<version>`) and aggregated
//! (`apidiscovery.k8s.io/v2`, one answer for all groups, so kubectl needs no fallback), and the
//! OpenAPI v3 index.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::server::{App, json_response};
use crate::status::ApiError;

/// The media type of aggregated discovery documents.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether the client asks for aggregated discovery (v2) anywhere in its Accept list.
pub fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept.split(',').any(|part| {
                let params: Vec<&str> = part.split(';').map(str::trim).collect();
                params.contains(&"as=APIGroupDiscoveryList")
                    && params.contains(&"g=apidiscovery.k8s.io")
                    && params.contains(&"v=v2")
            })
        })
}

/// An aggregated document with its media type.
pub fn aggregated_response(body: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, AGGREGATED)],
        body.to_string(),
    )
        .into_response()
}

fn verbs(t: &ResourceType) -> Value {
    if crate::auth::reviews::is_review(&t.group, &t.plural) {
        json!(["create"])
    } else {
        json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ])
    }
}

/// The aggregated discovery document of the core group (`/api`) or of every other group
/// (`/apis`).
pub fn aggregated(app: &App, core: bool) -> Value {
    let mut groups: BTreeMap<String, BTreeMap<String, Vec<Value>>> = BTreeMap::new();
    for t in app.registry.all() {
        if t.group.is_empty() != core {
            continue;
        }
        let scope = if t.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        };
        let kind = json!({"group": t.group, "version": t.version, "kind": t.kind});
        let mut resource = json!({
            "resource": t.plural, "responseKind": kind, "scope": scope,
            "singularResource": t.singular, "verbs": verbs(&t),
        });
        if !t.short_names.is_empty() {
            resource["shortNames"] = json!(t.short_names);
        }
        if let Some(categories) = crate::registry::categories(&t.group, &t.plural) {
            resource["categories"] = json!(categories);
        }
        let mut subresources = Vec::new();
        if t.status {
            subresources.push(json!({"subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.scale.is_some() {
            subresources.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": ["get", "patch", "update"]}));
        }
        if t.group.is_empty() && t.plural == "serviceaccounts" {
            subresources.push(json!({"subresource": "token", "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}, "verbs": ["create"]}));
        }
        if !subresources.is_empty() {
            resource["subresources"] = json!(subresources);
        }
        groups
            .entry(t.group.clone())
            .or_default()
            .entry(t.version.clone())
            .or_default()
            .push(resource);
    }
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(version, resources)| {
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let metadata = if group.is_empty() {
                json!({"creationTimestamp": null})
            } else {
                json!({"name": group, "creationTimestamp": null})
            };
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

pub fn api_versions(app: &App) -> Value {
    let address = app
        .address
        .lock()
        .as_ref()
        .map(|a| a.to_string())
        .unwrap_or_default();
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]})
}

pub fn api_groups(app: &App) -> Value {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in app.registry.all() {
        if t.group.is_empty() {
            continue;
        }
        let versions = groups.entry(t.group.clone()).or_default();
        if !versions.contains(&t.version) {
            versions.push(t.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions.clone(), "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The types served under one group and version.
fn types_of(app: &App, group: &str, version: &str) -> Vec<std::sync::Arc<ResourceType>> {
    app.registry
        .all()
        .into_iter()
        .filter(|t| t.group == group && t.version == version)
        .collect()
}

pub fn resource_list(app: &App, group: &str, version: &str) -> Response {
    let types = types_of(app, group, version);
    if types.is_empty() {
        return ApiError::no_route(&format!("{group}/{version}")).into_response();
    }
    let mut resources = Vec::new();
    for t in &types {
        let verbs = verbs(t);
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "verbs": verbs,
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if let Some(categories) = crate::registry::categories(&t.group, &t.plural) {
            r["categories"] = json!(categories);
        }
        resources.push(r);
        if t.status {
            resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        if t.group.is_empty() && t.plural == "serviceaccounts" {
            resources.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json_response(
        StatusCode::OK,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The OpenAPI v3 index: one document per group version. kubectl reads it to learn that the
/// server validates fields itself (`fieldValidation`), so it needs no schemas.
pub fn openapi_root(app: &App) -> Value {
    let mut paths = serde_json::Map::new();
    for t in app.registry.all() {
        let key = if t.group.is_empty() {
            format!("api/{}", t.version)
        } else {
            format!("apis/{}/{}", t.group, t.version)
        };
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=volstack")}),
        );
    }
    json!({"paths": paths})
}

pub fn openapi_group_version(app: &App, group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let types = types_of(app, group, version);
    for t in &types {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let item = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let collection = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", t.plural)
        } else {
            format!("{prefix}/{}", t.plural)
        };
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        // Every write may be a dry run (`dry_run::write_mode`).
        let op = |action: &str| {
            let parameters = match action {
                "post" | "put" | "patch" => json!([
                    param("dryRun"),
                    param("fieldManager"),
                    param("fieldValidation")
                ]),
                "delete" => json!([param("dryRun")]),
                _ => json!([param("fieldManager"), param("fieldValidation")]),
            };
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
        paths.insert(collection, json!({"get": op("list"), "post": op("post")}));
    }
    let schemas = crate::openapi::schemas(group, version, &types);
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.34.0"}, "paths": paths, "components": {"schemas": schemas}})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_a_v2_aggregated_request_gets_the_aggregated_document() {
        let cases = [
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
                true,
            ),
            (
                "application/json; g=apidiscovery.k8s.io; v=v2; as=APIGroupDiscoveryList",
                true,
            ),
            (
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
                false,
            ),
            ("application/json", false),
        ];
        for (accept, expected) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, accept.parse().unwrap());
            assert_eq!(wants_aggregated(&headers), expected, "{accept}");
        }
    }
}
