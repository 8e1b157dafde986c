//! HTTP: routing, verbs, watch streams, discovery, tables, auth and request metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::access;
use crate::discovery;
use crate::media::{self, Format};
use crate::objects::{self, merge_update, prepare_create, validate};
use crate::patch::{self, PatchError, PatchKind};
use crate::protobuf;
use crate::registry::{Registry, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Store, StoreError, Write2};
use crate::tables::table;

/// Largest accepted body (kube-apiserver's default is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Shared state of the handlers.
pub struct App {
    /// Objects.
    pub store: Store,
    /// Types.
    pub registry: Registry,
    /// Bearer token.
    pub token: String,
    /// Requests by (verb, resource, code, client).
    pub requests: Mutex<BTreeMap<(String, String, u16, String), u64>>,
    /// Address clients use (discovery).
    pub address: Mutex<Option<SocketAddr>>,
    /// Injected faults (empty: none).
    pub faults: Mutex<Vec<crate::faults::FaultRule>>,
    /// Bumped to close open watches: (resource or `*`, nonce).
    pub close_watches: tokio::sync::watch::Sender<(String, u64)>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

pub(crate) type Shared = Arc<App>;

pub(crate) struct Query(BTreeMap<String, String>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        let mut m = BTreeMap::new();
        for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            m.insert(decode(k), decode(v));
        }
        Query(m)
    }
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    pub(crate) fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A resolved resource path.
pub(crate) struct Target {
    pub(crate) rt: ResourceType,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

enum Route {
    Version,
    ApiVersions,
    ApiGroups,
    Resources(String, String),
    Object(Target),
    Metrics,
    Health,
    Faults,
    OpenApiRoot,
    OpenApiGroupVersion(String, String),
}

fn route(app: &App, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["metrics"] => return Ok(Route::Metrics),
        ["debug", "faults"] => return Ok(Route::Faults),
        ["healthz" | "readyz" | "livez", ..] => return Ok(Route::Health),
        ["openapi", "v3"] => return Ok(Route::OpenApiRoot),
        ["openapi", "v3", "api", v] => {
            return Ok(Route::OpenApiGroupVersion(String::new(), v.to_string()));
        }
        ["openapi", "v3", "apis", g, v] => {
            return Ok(Route::OpenApiGroupVersion(g.to_string(), v.to_string()));
        }
        ["api"] => return Ok(Route::ApiVersions),
        ["apis"] => return Ok(Route::ApiGroups),
        ["api", v] => return Ok(Route::Resources(String::new(), v.to_string())),
        ["apis", g, v] => return Ok(Route::Resources(g.to_string(), v.to_string())),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest.to_vec()),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest.to_vec()),
        _ => return Err(ApiError::no_route(path)),
    };
    let find = |plural: &str| {
        app.registry
            .find(&group, &version, plural)
            .ok_or_else(|| ApiError::no_route(path))
    };
    let target = match rest.as_slice() {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => {
            let rt = find(plural)?;
            if !rt.namespaced {
                return Err(ApiError::no_route(path));
            }
            let (name, sub) = match tail {
                [] => (None, None),
                [n] => (Some(n.to_string()), None),
                [n, s] => (Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::no_route(path)),
            };
            Target {
                rt,
                namespace: Some(ns.to_string()),
                name,
                subresource: sub,
            }
        }
        [plural, tail @ ..] => {
            let rt = find(plural)?;
            let (name, sub) = match tail {
                [] => (None, None),
                [n] if !rt.namespaced => (Some(n.to_string()), None),
                [n, s] if !rt.namespaced => (Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::no_route(path)),
            };
            Target {
                rt,
                namespace: None,
                name,
                subresource: sub,
            }
        }
        _ => return Err(ApiError::no_route(path)),
    };
    if let Some(sub) = &target.subresource
        && !(sub == "status" && target.rt.status)
    {
        return Err(ApiError::no_route(path));
    }
    Ok(Route::Object(target))
}

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(crate) fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn check_accept(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let ok = accept.split(',').any(|part| {
        let media = part.split(';').next().unwrap_or("").trim();
        matches!(
            media,
            "application/json" | "*/*" | "application/*" | "" | "application/yaml"
        )
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::not_acceptable(format!(
            "only the following media types are accepted: application/json (asked for {accept:?})"
        )))
    }
}

/// The single handler: authenticates (before routing, so every path answers alike without the
/// token), routes, counts.
pub async fn handle(State(app): State<Shared>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    if !access::is_health(&path) && !access::authorized(request.headers(), &app.token) {
        count(&app, "", String::new(), 401, access::UNAUTHENTICATED);
        let mut response = ApiError::unauthorized().into_response();
        // An unauthenticated client does not keep its connection.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return response;
    }
    let client = access::client_label(request.headers());
    let (verb, resource, response) = dispatch(&app, request).await;
    let code = response.status().as_u16();
    count(&app, verb, resource, code, &client);
    response
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

async fn dispatch(app: &Shared, request: Request) -> (&'static str, String, Response) {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = Query::parse(request.uri().query());
    let headers = request.headers().clone();
    let route = match route(app, &path) {
        Ok(r) => r,
        Err(e) => return ("GET", String::new(), e.into_response()),
    };
    if !matches!(route, Route::Object(_))
        && let Err(e) = check_accept(&headers)
    {
        return ("", String::new(), e.into_response());
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return ("", String::new(), ApiError::too_large().into_response());
    }
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return ("", String::new(), ApiError::too_large().into_response()),
    };
    match route {
        Route::Health => ("", String::new(), health(app, &path)),
        Route::Faults => ("", String::new(), fault_admin(app, &method, &query, &body)),
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
            let rules = app.faults.lock().clone();
            if let Some(injection) =
                crate::faults::decide(&rules, &resource, verb, rand::random::<f64>())
            {
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
            let (verb, result) = object_request(app, &method, target, &query, &headers, body).await;
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

/// What the client accepts for this resource: a client that takes protobuf only gets 406 for
/// a kind that has no protobuf form (custom resources), before anything is done.
fn negotiate(target: &Target, headers: &HeaderMap) -> Result<media::Accepted, ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let accepted = media::accepted(accept)?;
    if accepted.preferred == Format::Protobuf
        && !accepted.json
        && !protobuf::supports(&target.rt.api_version(), &target.rt.kind)
    {
        return Err(ApiError::not_acceptable(format!(
            "{} is served as JSON only; only the following media types are accepted: application/json, application/yaml",
            target.rt.kind
        )));
    }
    Ok(accepted)
}

/// The body of a create, update or delete as JSON: protobuf bodies are converted here, so the
/// handlers see JSON only. Patches carry their own media types and pass through.
fn json_body(method: &Method, headers: &HeaderMap, body: Bytes) -> Result<Bytes, ApiError> {
    if !matches!(method.as_str(), "POST" | "PUT" | "DELETE") || body.is_empty() {
        return Ok(body);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    match media::body_format(content_type)? {
        Format::Json => Ok(body),
        Format::Protobuf => match protobuf::decode_object(&body) {
            Ok(object) => Ok(Bytes::from(object.to_string())),
            Err(error @ protobuf::ProtobufError::Unsupported { .. }) => {
                Err(ApiError::unsupported_media(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json ({error})"
                )))
            }
            Err(error) => Err(ApiError::bad_request(format!(
                "the protobuf request body could not be read: {error}"
            ))),
        },
    }
}

/// Rewrites a JSON answer (object, list or Status) in protobuf. An object this server cannot
/// write in protobuf (a field outside its table) is answered in JSON, which client-go reads by
/// the answer's Content-Type.
async fn to_protobuf(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/json");
    if !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("failed to read the answer").into_response();
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .map(|value| protobuf::encode_object(&value));
    match encoded {
        Some(Ok(pb)) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(protobuf::MEDIA_TYPE),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(pb))
        }
        Some(Err(error)) => {
            tracing::debug!(%error, "answering in JSON: no protobuf form");
            Response::from_parts(parts, axum::body::Body::from(bytes))
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match (method.as_str(), named) {
        ("GET", true) => "GET",
        ("GET", false) if watch => "WATCH",
        ("GET", false) => "LIST",
        ("POST", _) => "CREATE",
        ("PUT", _) => "UPDATE",
        ("PATCH", _) => "PATCH",
        ("DELETE", true) => "DELETE",
        ("DELETE", false) => "DELETECOLLECTION",
        _ => "",
    }
}

/// `/debug/faults`: GET shows the rules, POST `{"rules": [...]}` replaces them, DELETE clears
/// them, POST `?closeWatches=RESOURCE|*` closes open watches.
fn fault_admin(app: &App, method: &Method, query: &Query, body: &Bytes) -> Response {
    if let Some(resource) = query.get("closeWatches") {
        let _ = app
            .close_watches
            .send((resource.to_string(), rand::random::<u64>()));
        return json_response(StatusCode::OK, &json!({"closed": resource}));
    }
    match method.as_str() {
        "GET" => json_response(StatusCode::OK, &json!({"rules": app.faults.lock().clone()})),
        "DELETE" => {
            {
                let mut f = app.faults.lock();
                f.clear();
            }
            json_response(StatusCode::OK, &json!({"rules": []}))
        }
        "POST" | "PUT" => {
            #[derive(serde::Deserialize)]
            struct Body {
                rules: Vec<crate::faults::FaultRule>,
            }
            let parsed: Body = match serde_json::from_slice(body) {
                Ok(b) => b,
                Err(e) => {
                    return ApiError::bad_request(format!("expected {{\"rules\": [...]}}: {e}"))
                        .into_response();
                }
            };
            if let Some(why) = parsed.rules.iter().find_map(|r| r.validate().err()) {
                return ApiError::bad_request(why).into_response();
            }
            {
                let mut f = app.faults.lock();
                *f = parsed.rules.clone();
            }
            json_response(StatusCode::OK, &json!({"rules": parsed.rules}))
        }
        _ => ApiError::method_not_allowed("use GET, POST or DELETE").into_response(),
    }
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-volstack", "gitCommit": "", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "rust", "compiler": "rustc", "platform": "linux/amd64"
    })
}

/// `/healthz` and `/livez` answer while the process serves; `/readyz` also fails once the store
/// refuses writes.
fn health(app: &App, path: &str) -> Response {
    if path.trim_start_matches('/').starts_with("readyz")
        && let Some(reason) = app.store.failure()
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-]storage failed: {reason}\nreadyz check failed\n"),
        )
            .into_response();
    }
    "ok".into_response()
}

fn metrics(app: &App) -> Response {
    let mut out = String::from(
        "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, resource, client and HTTP response code.\n# TYPE apiserver_request_total counter\n",
    );
    {
        let counts = app.requests.lock();
        for ((verb, resource, code, client), n) in counts.iter() {
            let (client, resource) = (access::escape_label(client), access::escape_label(resource));
            out.push_str(&format!("apiserver_request_total{{client=\"{client}\",code=\"{code}\",resource=\"{resource}\",verb=\"{verb}\"}} {n}\n"));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn namespace_active(app: &App, rt: &ResourceType, ns: &str) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    match app.store.get("/namespaces", "", ns) {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(n) if !n["metadata"]["deletionTimestamp"].is_null() => {
            Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            )))
        }
        Some(_) => Ok(()),
    }
}

async fn object_request(
    app: &Shared,
    method: &Method,
    t: Target,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> (&'static str, Result<Response, ApiError>) {
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let key = rt.key();
    // A subresource (status) supports get, update and patch only, as in kube-apiserver.
    if t.subresource.is_some() && !matches!(method.as_str(), "GET" | "PUT" | "PATCH") {
        return (
            "",
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource: {method} on a subresource"
            ))),
        );
    }
    if crate::reviews::is_review(&rt.group, &rt.plural) {
        return match (method.as_str(), t.name.is_none()) {
            ("POST", true) => (
                "CREATE",
                parse_body(&body)
                    .and_then(|request| crate::reviews::answer(&rt, Some(request)))
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
    match (method.as_str(), t.name.clone()) {
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
                Some(obj) if wants_table(headers) => Ok(json_response(
                    StatusCode::OK,
                    &table(&rt, &[obj], app.store.current_rv()),
                )),
                Some(obj) => Ok(json_response(StatusCode::OK, &obj)),
                None => Err(ApiError::not_found(&rt.group, &rt.plural, &name)),
            },
        ),
        ("POST", None) => ("CREATE", create(app, &t, query, body).await),
        ("PUT", Some(name)) => ("UPDATE", update(app, &t, &name, body).await),
        ("PATCH", Some(name)) => ("PATCH", patch(app, &t, &name, headers, query, body).await),
        ("DELETE", Some(name)) => (
            "DELETE",
            delete(app, &rt, &ns, &name, &body)
                .await
                .map(|v| json_response(StatusCode::OK, &v)),
        ),
        ("DELETE", None) => ("DELETECOLLECTION", delete_collection(app, &t, query).await),
        _ => (
            "",
            Err(ApiError::method_not_allowed(format!(
                "{method} is not allowed here"
            ))),
        ),
    }
}

/// Checks a list's `resourceVersion`/`resourceVersionMatch`; a version the store has not
/// reached is waited for, as kube-apiserver's watch cache does.
async fn list_version_reached(app: &App, query: &Query) -> Result<(), ApiError> {
    use crate::list_versions::{ListAt, decide, refusal};
    let check = || {
        let current = app.store.current_rv();
        let at = decide(
            query.get("resourceVersion"),
            query.get("resourceVersionMatch"),
            current,
        );
        (at, current)
    };
    let (mut at, mut current) = check();
    if let ListAt::NotYet(rv) = at {
        app.store
            .wait_visible(rv, crate::store::FUTURE_VERSION_WAIT)
            .await;
        (at, current) = check();
    }
    refusal(&at, current).map_or(Ok(()), Err)
}

pub(crate) fn selectors(query: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn list(app: &App, t: &Target, query: &Query, headers: &HeaderMap) -> Result<Response, ApiError> {
    use crate::list_versions::{Continue, expired_continue};
    let (labels, fields) = selectors(query)?;
    let continued = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(Continue::decode(token)?),
        None => None,
    };
    if continued.is_some() && query.get("resourceVersion").is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let (items, rv) = match &continued {
        Some(c) => {
            let items = app
                .store
                .list_at(&t.rt.key(), t.namespace.as_deref(), c.rv)
                .map_err(|e| match e {
                    crate::store::ResumeError::Gone(_) => expired_continue(),
                    crate::store::ResumeError::TooLarge(_) => ApiError::bad_request(
                        "continue key is not valid: its version is newer than this server's",
                    ),
                })?;
            (items, c.rv)
        }
        None => app.store.list(&t.rt.key(), t.namespace.as_deref()),
    };
    let list_key = |o: &Value| {
        format!(
            "{}\u{0}{}",
            o["metadata"]["namespace"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    let after = continued.map(|c| c.after);
    let items: Vec<Arc<Value>> = items
        .into_iter()
        .filter(|o| labels.matches_object(o) && fields.matches(o))
        .filter(|o| {
            after
                .as_ref()
                .is_none_or(|a| list_key(o).as_str() > a.as_str())
        })
        .collect();
    if wants_table(headers) {
        return Ok(json_response(StatusCode::OK, &table(&t.rt, &items, rv)));
    }
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page: Vec<&Value> = items.iter().take(limit).map(|a| a.as_ref()).collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(last) = page.last().filter(|_| page.len() < items.len()) {
        let token = Continue {
            rv,
            after: list_key(last),
        };
        metadata["continue"] = json!(token.encode());
        metadata["remainingItemCount"] = json!(items.len() - page.len());
    }
    let body = json!({
        "kind": format!("{}List", t.rt.kind),
        "apiVersion": t.rt.api_version(),
        "metadata": metadata,
        "items": page,
    });
    Ok(json_response(StatusCode::OK, &body))
}

async fn commit(app: &App, rv: u64) -> Result<(), ApiError> {
    app.store.wait_durable(rv).await.map_err(ApiError::from)
}

async fn create(
    app: &Shared,
    t: &Target,
    query: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    if t.subresource.is_some() {
        return Err(ApiError::method_not_allowed(
            "create is not allowed on a subresource",
        ));
    }
    let ns = t.namespace.clone().unwrap_or_default();
    if t.rt.namespaced && ns.is_empty() {
        return Err(ApiError::bad_request(
            "the namespace of the object is required (POST to /namespaces/{ns}/...)",
        ));
    }
    let obj = parse_body(&body)?;
    create_object(app, t, query, obj, None).await
}

/// Creates `obj`; `managed_fields` is the field ownership of a server-side apply that creates.
pub(crate) async fn create_object(
    app: &Shared,
    t: &Target,
    query: &Query,
    mut obj: Value,
    managed_fields: Option<Value>,
) -> Result<Response, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let name = prepare_create(&t.rt, &ns, &mut obj)?;
    if let Some(managed) = managed_fields {
        obj["metadata"]["managedFields"] = managed;
    }
    validate(&t.rt, &obj, None)?;
    namespace_active(app, &t.rt, &ns)?;
    if query.get("dryRun") == Some("All") {
        if app.store.get(&t.rt.key(), &ns, &name).is_some() {
            return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
        }
        return Ok(json_response(StatusCode::CREATED, &obj));
    }
    let rt = t.rt.clone();
    let (stored, rv) = app
        .store
        .write(&rt.key(), &ns, &name, |current, _| match current {
            Some(_) => Err(ApiError::already_exists(&rt.group, &rt.plural, &name)),
            None => Ok(Write2::Put(obj)),
        })?;
    commit(app, rv).await?;
    if rt.plural == "customresourcedefinitions" {
        refresh_crds(app);
    }
    let stored = stored.ok_or_else(|| ApiError::internal("object vanished"))?;
    Ok(json_response(StatusCode::CREATED, &stored))
}

fn refresh_crds(app: &App) {
    let (crds, _) = app
        .store
        .list("apiextensions.k8s.io/customresourcedefinitions", None);
    let crds: Vec<Value> = crds.iter().map(|c| (**c).clone()).collect();
    app.registry.set_custom(&crds);
}

/// Applies an update (full object) under optimistic concurrency; deletes the object when it is
/// being deleted and has no finalizers left.
pub(crate) async fn apply_update(
    app: &Shared,
    t: &Target,
    name: &str,
    incoming: Value,
    check_rv: bool,
) -> Result<Response, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let status_only = t.subresource.as_deref() == Some("status");
    if incoming["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n != name)
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            incoming["metadata"]["name"]
        )));
    }
    let wanted_rv = incoming["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let (result, rv) = app.store.write(&rt.key(), &ns, name, |current, _| {
        let Some(current) = current else { return Err(ApiError::not_found(&rt.group, &rt.plural, name)) };
        let current_rv = current["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if check_rv && !wanted_rv.is_empty() && wanted_rv != current_rv {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let next = merge_update(&rt, current, incoming, status_only)?;
        validate(&rt, &next, Some(current))?;
        let deleting = !next["metadata"]["deletionTimestamp"].is_null();
        let no_finalizers = next["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if deleting && no_finalizers {
            return Ok(Write2::Delete);
        }
        let mut a = next.clone();
        let mut b = current.clone();
        if let (Some(ma), Some(mb)) = (a["metadata"].as_object_mut(), b["metadata"].as_object_mut()) {
            ma.remove("resourceVersion");
            mb.remove("resourceVersion");
        }
        if a == b {
            return Ok(Write2::Keep);
        }
        Ok(Write2::Put(next))
    })?;
    commit(app, rv).await?;
    if rt.plural == "customresourcedefinitions" {
        refresh_crds(app);
    }
    let object = result.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    Ok(json_response(StatusCode::OK, &object))
}

async fn update(app: &Shared, t: &Target, name: &str, body: Bytes) -> Result<Response, ApiError> {
    let incoming = parse_body(&body)?;
    apply_update(app, t, name, incoming, true).await
}

/// A patch may not turn the object or its metadata into something other than a JSON object.
fn patched_is_an_object(t: &Target, name: &str, next: &Value) -> Result<(), ApiError> {
    if next.is_object() && next["metadata"].is_object() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &t.rt.kind,
        name,
        "metadata: Invalid value: the patched object and its metadata must be JSON objects",
    ))
}

async fn patch(
    app: &Shared,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    query: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let kind = PatchKind::from_content_type(content_type)?;
    let patch_value = parse_body(&body)?;
    if kind == PatchKind::Apply {
        return crate::apply::server_side_apply(app, t, name, query, patch_value).await;
    }
    let ns = t.namespace.clone().unwrap_or_default();
    // A patch that names a resourceVersion is a precondition; otherwise the patch applies to
    // what was just read, and a concurrent change makes it read again and retry.
    let patched_rv = patch_value["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    for _ in 0..5 {
        let current = app
            .store
            .get(&t.rt.key(), &ns, name)
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        let mut next = patch::apply(kind, &current, &patch_value).map_err(|e| match e {
            PatchError::Parse(message) => ApiError::bad_request(message),
            PatchError::Apply(_) => ApiError::invalid(&t.rt.kind, name, &e.to_string()),
        })?;
        patched_is_an_object(t, name, &next)?;
        if patched_rv.is_none() {
            next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        }
        match apply_update(app, t, name, next, true).await {
            Err(e) if e.code == 409 && patched_rv.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::conflict(
        &t.rt.group,
        &t.rt.plural,
        name,
        "the object keeps changing",
    ))
}

async fn delete(
    app: &Shared,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    body: &Bytes,
) -> Result<Value, ApiError> {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(body)?
    };
    let pre_uid = options["preconditions"]["uid"].as_str().map(str::to_string);
    let pre_rv = options["preconditions"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    let is_namespace = rt.plural == "namespaces";
    let (object, rv) = app.store.write(&rt.key(), ns, name, |current, _| {
        let Some(current) = current else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        if let Some(uid) = &pre_uid
            && current["metadata"]["uid"].as_str() != Some(uid.as_str())
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or("")
                ),
            ));
        }
        if let Some(want) = &pre_rv
            && current["metadata"]["resourceVersion"].as_str() != Some(want.as_str())
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "Precondition failed: the resourceVersion does not match",
            ));
        }
        let has_finalizers = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers || is_namespace {
            if !current["metadata"]["deletionTimestamp"].is_null() {
                return Ok(Write2::Keep);
            }
            let mut next = current.clone();
            next["metadata"]["deletionTimestamp"] = json!(objects::now_rfc3339());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if is_namespace {
                next["status"]["phase"] = json!("Terminating");
            }
            return Ok(Write2::Put(next));
        }
        Ok(Write2::Delete)
    })?;
    commit(app, rv).await?;
    if is_namespace {
        finish_namespace(app.clone(), name.to_string());
    }
    if rt.plural == "customresourcedefinitions" {
        refresh_crds(app);
    }
    object
        .map(|o| (*o).clone())
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
}

/// Deletes everything in a terminating namespace, then the namespace once it is empty.
fn finish_namespace(app: Shared, namespace: String) {
    tokio::spawn(async move {
        for _ in 0..600 {
            let contents = app.store.in_namespace(&namespace);
            if contents.is_empty() {
                let _ = app.store.write("/namespaces", "", &namespace, |_, _| {
                    Ok::<_, ApiError>(Write2::Delete)
                });
                return;
            }
            for (resource, name) in contents {
                let Some(rt) = app.registry.all().into_iter().find(|t| t.key() == resource) else {
                    continue;
                };
                let _ = delete(&app, &rt, &namespace, &name, &Bytes::new()).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

async fn delete_collection(app: &Shared, t: &Target, query: &Query) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
    let (items, _) = app.store.list(&t.rt.key(), t.namespace.as_deref());
    let mut deleted = Vec::new();
    for item in items
        .iter()
        .filter(|o| labels.matches_object(o) && fields.matches(o))
    {
        let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
        let ns = item["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if let Ok(obj) = delete(app, &t.rt, &ns, &name, &Bytes::new()).await {
            deleted.push(obj);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.rt.kind), "apiVersion": t.rt.api_version(), "metadata": {}, "items": deleted}),
    ))
}

/// Builds the application state with the built-in namespaces, and returns once they are
/// durable and visible (a client that connects first must find `default`).
pub async fn new_app(store: Store, token: String) -> Result<Shared, StoreError> {
    let app = Arc::new(App {
        store,
        registry: Registry::default(),
        token,
        requests: Mutex::new(BTreeMap::new()),
        address: Mutex::new(None),
        faults: Mutex::new(Vec::new()),
        close_watches: tokio::sync::watch::channel((String::new(), 0)).0,
    });
    refresh_crds(&app);
    let mut last = 0;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if app.store.get("/namespaces", "", ns).is_some() {
            continue;
        }
        let Some(rt) = app.registry.find("", "v1", "namespaces") else {
            continue;
        };
        let mut obj = json!({"metadata": {"name": ns}});
        if prepare_create(&rt, "", &mut obj).is_ok() {
            let (_, rv) = app.store.write("/namespaces", "", ns, |_, _| {
                Ok::<_, StoreError>(Write2::Put(obj))
            })?;
            last = last.max(rv);
        }
    }
    app.store.wait_durable(last).await?;
    Ok(app)
}

/// Where the server keeps its kubeconfig and how it is reached.
pub fn kubeconfig(address: SocketAddr, token: &str, ca_data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: volstack\n  cluster:\n    server: https://{address}\n    certificate-authority-data: {ca_data}\ncontexts:\n- name: volstack\n  context:\n    cluster: volstack\n    user: volstack-admin\n    namespace: default\ncurrent-context: volstack\nusers:\n- name: volstack-admin\n  user:\n    token: {token}\n"
    )
}

/// Writes the kubeconfig with mode 0600.
pub fn write_kubeconfig(
    path: &PathBuf,
    address: SocketAddr,
    token: &str,
    ca_data: &str,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(kubeconfig(address, token, ca_data).as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
