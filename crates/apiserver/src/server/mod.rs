//! HTTP: the one handler (authentication before routing, request metrics), dispatch to the
//! read, write, patch and delete handlers, health and metrics endpoints. The application state,
//! routing, negotiation, reads, writes, deletes and the kubeconfig are submodules.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::access;
use crate::auth::attributes::{self, Attributes};
use crate::auth::policy::User;
use crate::auth::{impersonation, reviews};
use crate::discovery;
use crate::media::{self, Format};
use crate::objects::{self, merge_update, prepare_create, validate};
use crate::patch::{self, PatchError, PatchKind};
use crate::protobuf;
use crate::registry::{Registry, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, WriteOptions};
use crate::store::{Change, Write2, Written};
use crate::tables::table;
use crate::unknown_fields::{FieldValidation, Verdict};

mod app;
mod binding;
mod definitions;
mod delete;
mod dry_run;
mod endpoints;
mod kubeconfig;
mod leaves;

pub(crate) use self::leaves::LeavesSet;
mod namespaces;
mod read;
mod respond;
mod routing;
pub mod scale;
mod token;
mod write;

pub(crate) use self::app::Shared;
pub use self::app::{App, new_app};
use endpoints::{fault_admin, health, metrics, version};

use delete::{delete, delete_collection};
pub(crate) use dry_run::WriteMode;
pub use kubeconfig::{kubeconfig, write_kubeconfig};
pub(crate) use read::selectors;
use read::{list, list_version_reached};
use respond::{check_accept, json_body, negotiate, parse_body, to_protobuf};
pub(crate) use respond::{json_response, wants_table, written_response};
pub(crate) use routing::{Query, Target};
use routing::{Route, route, verb_of};
use token::token_request;
pub(crate) use token::token_request as token_request_for;
pub(crate) use write::{PATCH_TRIES, apply_update, create_object, update_object};
use write::{checked_body, commit, create, patch, update, with_warnings, write_object};

/// Largest accepted body (kube-apiserver's default is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// The single handler: authenticates (before routing, so every path answers alike without a
/// token), applies impersonation, authorizes with RBAC, routes, counts.
pub async fn handle(State(app): State<Shared>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let health = access::is_health(&path);
    let user = app
        .auth
        .authenticate(access::bearer(request.headers()), &app.store);
    let Some(user) = user else {
        if health {
            let query = Query::parse(request.uri().query());
            let (_, _, response) = dispatch(&app, request, &query, None).await;
            return response;
        }
        count(&app, "", String::new(), 401, access::UNAUTHENTICATED);
        let mut response = ApiError::unauthorized().into_response();
        // An unauthenticated client does not keep its connection.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return response;
    };
    // A valid token: its connection keeps its slot (see the listener).
    if let Some(connection) = request.extensions().get::<crate::listener::Authenticated>() {
        connection.mark();
    }
    let client = access::client_label(request.headers());
    let query = Query::parse(request.uri().query());
    let attributes = attributes::of_request(
        request.method().as_str(),
        &path,
        query.get("fieldSelector"),
        query.flag("watch"),
    );
    let allowed = impersonate(&app, user, request.headers()).and_then(|user| {
        app.auth
            .authorize(&app.store, &user, &attributes)
            .map(|_| user)
    });
    let user = match allowed {
        Ok(user) => user,
        Err(error) => {
            tracing::debug!(%client, reason = %error.message, "request refused");
            // Labelled with a resource this server serves, else none: a refused client's
            // made-up paths must not add a series each.
            let (verb, resource) = match (&attributes, route(&app.registry, &path)) {
                (Attributes::Resource(r), Ok(Route::Object(target))) => (
                    verb_of(request.method(), !r.name.is_empty(), query.flag("watch")),
                    target.rt.plural.clone(),
                ),
                (Attributes::Resource(r), _) => (
                    verb_of(request.method(), !r.name.is_empty(), query.flag("watch")),
                    String::new(),
                ),
                (Attributes::NonResource { .. }, _) => ("", String::new()),
            };
            count(&app, verb, resource, error.code, &client);
            return error.into_response();
        }
    };
    let (verb, resource, response) = crate::auth::REQUESTER
        .scope(user.clone(), dispatch(&app, request, &query, Some(&user)))
        .await;
    let code = response.status().as_u16();
    count(&app, verb, resource, code, &client);
    response
}

/// The user a request is served as: its maker, or whom it impersonates when its maker may.
fn impersonate(app: &App, user: User, headers: &HeaderMap) -> Result<User, ApiError> {
    let Some(requested) = impersonation::requested(headers)? else {
        return Ok(user);
    };
    for check in impersonation::checks(&requested) {
        app.auth.authorize(&app.store, &user, &check)?;
    }
    Ok(impersonation::impersonated(&requested))
}

/// Counts a request; clients beyond the first [`access::MAX_CLIENT_LABELS`] share one label.
fn count(app: &App, verb: &str, resource: String, code: u16, client: &str) {
    let mut counts = app.requests.lock();
    let mut key = (verb.to_string(), resource, code, client.to_string());
    if let Some(n) = counts.get_mut(&key) {
        *n += 1;
        return;
    }
    // A new series (rare: their number is bounded): its client label must be known already or
    // fit under the limit.
    let mut clients: Vec<&str> = counts.keys().map(|(_, _, _, c)| c.as_str()).collect();
    clients.sort_unstable();
    clients.dedup();
    key.3 = access::bounded_client(&clients, client).to_string();
    *counts.entry(key).or_default() += 1;
}

/// Serves an authorized request (`user` None only for an unauthenticated health check).
async fn dispatch(
    app: &Shared,
    request: Request,
    query: &Query,
    user: Option<&User>,
) -> (&'static str, String, Response) {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let headers = request.headers().clone();
    let route = match route(&app.registry, &path) {
        Ok(r) => r,
        Err(e) => return ("GET", String::new(), e.into_response()),
    };
    if !matches!(route, Route::Object(_))
        && let Err(e) = check_accept(&headers)
    {
        return ("", String::new(), e.into_response());
    }
    // Only the fault admin and objects read a body: a health check (which needs no token) or
    // a discovery request is answered without buffering one.
    let body = if matches!(route, Route::Faults | Route::Object(_)) {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > MAX_BODY) {
            return ("", String::new(), ApiError::too_large().into_response());
        }
        match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
            Ok(b) => b,
            Err(_) => return ("", String::new(), ApiError::too_large().into_response()),
        }
    } else {
        Bytes::new()
    };
    match route {
        Route::Health => ("", String::new(), health(app, &path)),
        Route::Faults => ("", String::new(), fault_admin(app, &method, query, &body)),
        Route::Version => (
            "GET",
            String::new(),
            json_response(StatusCode::OK, &version()),
        ),
        Route::Metrics => ("GET", String::new(), metrics(app)),
        Route::ApiVersions if discovery::wants_aggregated(&headers) => (
            "GET",
            String::new(),
            discovery::aggregated_response(&discovery::aggregated(app, true)),
        ),
        Route::ApiGroups if discovery::wants_aggregated(&headers) => (
            "GET",
            String::new(),
            discovery::aggregated_response(&discovery::aggregated(app, false)),
        ),
        Route::ApiVersions => (
            "GET",
            String::new(),
            json_response(StatusCode::OK, &discovery::api_versions(app)),
        ),
        Route::ApiGroups => (
            "GET",
            String::new(),
            json_response(StatusCode::OK, &discovery::api_groups(app)),
        ),
        Route::Resources(g, v) => ("GET", String::new(), discovery::resource_list(app, &g, &v)),
        Route::OpenApiRoot => (
            "GET",
            String::new(),
            json_response(StatusCode::OK, &discovery::openapi_root(app)),
        ),
        Route::OpenApiGroupVersion(g, v) => (
            "GET",
            String::new(),
            json_response(
                StatusCode::OK,
                &discovery::openapi_group_version(app, &g, &v),
            ),
        ),
        Route::Object(target) => {
            let resource = target.rt.plural.clone();
            let verb = verb_of(&method, target.name.is_some(), query.flag("watch"));
            // The draw is taken only for a rule that may fail the request or not, so a seeded
            // run's draws go to the requests the faults are about.
            let injection = crate::faults::decide(&app.faults.lock(), &resource, verb, || {
                use rand::Rng;
                app.fault_draws.lock().random::<f64>()
            });
            if let Some(injection) = injection {
                if injection.latency_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(injection.latency_ms)).await;
                }
                if let Some(error) = injection.error {
                    return (verb, resource, error.into_response());
                }
            }
            let accept = match negotiate(&target, &headers) {
                Ok(accept) => accept,
                Err(error) => return (verb, resource, error.into_response()),
            };
            let body = match json_body(&method, &headers, body) {
                Ok(body) => body,
                Err(error) => return (verb, resource, error.into_response()),
            };
            let Some(user) = user else {
                return ("", String::new(), ApiError::unauthorized().into_response());
            };
            let (verb, result) =
                object_request(app, &method, *target, query, &headers, body, user).await;
            let response = result.unwrap_or_else(IntoResponse::into_response);
            let response = match accept.preferred {
                Format::Protobuf if verb != "WATCH" && !wants_table(&headers) => {
                    to_protobuf(response).await
                }
                _ => response,
            };
            (verb, resource, response)
        }
    }
}

impl App {
    /// Closes every open watch of `resource` (`*`: all), network and in-process alike;
    /// clients re-list or resume.
    pub fn close_open_watches(&self, resource: &str) {
        self.close_watches
            .send_modify(|closes| closes.count(resource));
    }
}

async fn object_request(
    app: &Shared,
    method: &Method,
    t: Target,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
    user: &User,
) -> (&'static str, Result<Response, ApiError>) {
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let key = rt.key();
    // A ServiceAccount's token subresource (TokenRequest) supports create only.
    if t.subresource.as_deref() == Some("token") {
        return match (method.as_str(), t.name.clone()) {
            ("POST", Some(name)) => (
                "CREATE",
                parse_body(&body).and_then(|request| {
                    token_request(app, &ns, &name, request)
                        .map(|answer| json_response(StatusCode::CREATED, &answer))
                }),
            ),
            _ => (
                "",
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource: {method} on serviceaccounts/token"
                ))),
            ),
        };
    }
    let mode = match dry_run::write_mode(method, query.all("dryRun"), &body) {
        Ok(mode) => mode,
        Err(refused) => return (verb_of(method, t.name.is_some(), false), Err(refused)),
    };
    let validation =
        match crate::unknown_fields::field_validation(method, query.get("fieldValidation")) {
            Ok(validation) => validation,
            Err(refused) => return (verb_of(method, t.name.is_some(), false), Err(refused)),
        };
    // A Pod's binding subresource supports create only.
    if t.subresource.as_deref() == Some("binding") {
        return match (method.as_str(), t.name.clone()) {
            ("POST", Some(name)) => ("CREATE", binding::bind(app, &t, &name, body, mode).await),
            _ => (
                "",
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource: {method} on pods/binding"
                ))),
            ),
        };
    }
    // A namespace's finalize subresource supports update only, as in kube-apiserver; the
    // update writes spec.finalizers alone (see `update_object`).
    if t.subresource.as_deref() == Some("finalize") {
        return match (method.as_str(), t.name.clone()) {
            ("PUT", Some(name)) => {
                let updated =
                    update(app, &t, &name, body, &writer_manager(query, headers), mode).await;
                // `kubernetes` put back on a terminating namespace: it is emptied again.
                if updated.is_ok() && mode == WriteMode::Store {
                    namespaces::finish_namespace(app.clone(), name);
                }
                ("UPDATE", updated)
            }
            _ => (
                "",
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource: {method} on namespaces/finalize"
                ))),
            ),
        };
    }
    // A custom resource's scale subresource.
    if t.subresource.as_deref() == Some("scale")
        && let (Some(_), Some(name)) = (&rt.scale, t.name.clone())
        && matches!(method.as_str(), "GET" | "PUT" | "PATCH")
    {
        let verb = match method.as_str() {
            "GET" => "GET",
            "PUT" => "UPDATE",
            _ => "PATCH",
        };
        return (
            verb,
            scale::scale(app, method, &t, &name, headers, body, mode).await,
        );
    }
    // A subresource (status) supports get, update and patch only, as in kube-apiserver.
    if t.subresource.is_some() && !matches!(method.as_str(), "GET" | "PUT" | "PATCH") {
        return (
            "",
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource: {method} on a subresource"
            ))),
        );
    }
    if reviews::is_review(&rt.group, &rt.plural) {
        return match (method.as_str(), t.name.is_none()) {
            ("POST", true) => (
                "CREATE",
                parse_body(&body)
                    .and_then(|request| {
                        reviews::answer(&rt, Some(request), user, &app.auth.policy(&app.store))
                    })
                    .map(|review| json_response(StatusCode::CREATED, &review)),
            ),
            _ => (
                "",
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource: {} supports create only",
                    rt.plural
                ))),
            ),
        };
    }
    // A create's or update's body (an object's, or its status's) read for unknown fields.
    let (body, warnings) = if matches!(method.as_str(), "POST" | "PUT")
        && t.subresource.as_deref().is_none_or(|s| s == "status")
    {
        // An update is read against the object it replaces (see `unknown_fields::judge`).
        let stored = match (&t.name, validation) {
            (_, FieldValidation::Unset) | (None, _) => None,
            (Some(name), _) => app
                .store
                .newest(&key, &ns, name)
                .map(|stored| crate::event_versions::served(&rt, stored)),
        };
        match checked_body(&rt, validation, body, stored.as_deref()) {
            Ok(checked) => checked,
            Err(refused) => return (verb_of(method, t.name.is_some(), false), Err(refused)),
        }
    } else {
        (body, Vec::new())
    };
    let (verb, result) = match (method.as_str(), t.name.clone()) {
        ("GET", None) if query.flag("watch") => {
            ("WATCH", crate::watch::watch(app, &t, query, headers).await)
        }
        ("GET", None) => (
            "LIST",
            match list_version_reached(app, query).await {
                Ok(()) => list(app, &t, query, headers),
                Err(error) => Err(error),
            },
        ),
        ("GET", Some(name)) => (
            "GET",
            match app.store.get(&key, &ns, &name) {
                // A table is drawn from the stored form, whichever version is asked for.
                Some(obj) if wants_table(headers) => Ok(json_response(
                    StatusCode::OK,
                    &table(&rt, &[obj], app.store.current_rv()),
                )),
                Some(obj) => Ok(json_response(
                    StatusCode::OK,
                    &crate::event_versions::served(&rt, obj),
                )),
                None => Err(ApiError::not_found(&rt.group, &rt.plural, &name)),
            },
        ),
        ("POST", None) => ("CREATE", create(app, &t, mode, body).await),
        ("PUT", Some(name)) => (
            "UPDATE",
            update(app, &t, &name, body, &writer_manager(query, headers), mode).await,
        ),
        ("PATCH", Some(name)) => (
            "PATCH",
            patch(app, &t, &name, headers, query, body, mode).await,
        ),
        ("DELETE", Some(name)) => (
            "DELETE",
            delete(app, &rt, &ns, &name, &body, mode)
                .await
                .map(|deleted| deleted.response(&rt)),
        ),
        ("DELETE", None) => (
            "DELETECOLLECTION",
            delete_collection(app, &t, query, mode).await,
        ),
        _ => (
            "",
            Err(ApiError::method_not_allowed(format!(
                "{method} is not allowed here"
            ))),
        ),
    };
    (
        verb,
        result.map(|response| with_warnings(response, &warnings)),
    )
}

/// The field manager of a plain update or patch: `fieldManager`, else the User-Agent.
fn writer_manager(query: &Query, headers: &HeaderMap) -> String {
    crate::apply::update_manager(
        query.get("fieldManager"),
        headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
    )
}
