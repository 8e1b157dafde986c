//! The endpoints beside the API's objects: health (`/healthz`, `/livez`, `/readyz`), the
//! version, the request counters (`/metrics`) and the fault switchboard (`/debug/faults`).

use axum::body::Bytes;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{App, Query, json_response};
use crate::access;
use crate::status::ApiError;

/// `/debug/faults`: GET shows the rules, POST `{"rules": [...]}` replaces them, DELETE clears
/// them, POST `?closeWatches=RESOURCE|*` closes open watches.
pub(super) fn fault_admin(app: &App, method: &Method, query: &Query, body: &Bytes) -> Response {
    if let Some(resource) = query.get("closeWatches") {
        app.close_open_watches(resource);
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

pub(super) fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-volstack", "gitCommit": "", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "rust", "compiler": "rustc", "platform": "linux/amd64"
    })
}

/// `/healthz` and `/livez` answer while the process serves; `/readyz` also fails once the store
/// refuses writes.
pub(super) fn health(app: &App, path: &str) -> Response {
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

pub(super) fn metrics(app: &App) -> Response {
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
