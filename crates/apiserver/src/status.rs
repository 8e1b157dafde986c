//! Errors as `Status` objects with kube-apiserver's reasons and codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP code.
    pub code: u16,
    /// Reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// The Status message a client prints.
    pub message: String,
    /// details.name.
    pub name: Option<String>,
    /// details.kind (resource plural).
    pub kind: Option<Box<str>>,
    /// details.group.
    pub group: Option<Box<str>>,
    /// details.causes and details.retryAfterSeconds, when there are any.
    pub extra: Option<Box<Extra>>,
}

/// One of a Status's details.causes.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `reason` (`FieldValueInvalid`, ...).
    pub reason: &'static str,
    /// `message`.
    pub message: String,
    /// `field`, a field path.
    pub field: Option<String>,
}

impl Cause {
    /// The cause of a field error written as kube-apiserver words it (`path: Type: detail`).
    pub fn from_field_error(text: &str) -> Cause {
        let Some((field, message)) = text.split_once(": ") else {
            return Cause {
                reason: "FieldValueInvalid",
                message: text.to_string(),
                field: None,
            };
        };
        let reason = [
            ("Invalid value", "FieldValueInvalid"),
            ("Unsupported value", "FieldValueNotSupported"),
            ("Required value", "FieldValueRequired"),
            ("Forbidden", "FieldValueForbidden"),
            ("Too long", "FieldValueTooLong"),
            ("Duplicate value", "FieldValueDuplicate"),
            ("Not found", "FieldValueNotFound"),
        ]
        .iter()
        .find(|(prefix, _)| message.starts_with(prefix))
        .map_or("FieldValueInvalid", |(_, reason)| reason);
        Cause {
            reason,
            message: message.to_string(),
            field: Some(field.to_string()),
        }
    }
}

/// The rarer parts of a Status's details.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extra {
    /// details.causes.
    pub causes: Vec<Cause>,
    /// details.retryAfterSeconds.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            name: None,
            kind: None,
            group: None,
            extra: None,
        }
    }
    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// An error about the object `name` of `group`/`plural`: `message` is given the resource
    /// as kube-apiserver names it (`plural` or `plural.group`), and the details name the object.
    fn about_object(
        code: u16,
        reason: &'static str,
        group: &str,
        plural: &str,
        name: &str,
        message: impl FnOnce(&str) -> String,
    ) -> Self {
        let resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        let mut e = Self::new(code, reason, message(&resource));
        e.name = Some(name.into());
        e.kind = Some(plural.into());
        e.group = Some(group.into());
        e
    }
    /// 403 for an object an admission plugin refused: `<resource> "<name>" is forbidden: why`.
    pub fn forbidden_object(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::about_object(403, "Forbidden", group, plural, name, |resource| {
            format!("{resource} \"{name}\" is forbidden: {why}")
        })
    }
    /// 404 for an object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::about_object(404, "NotFound", group, plural, name, |resource| {
            format!("{resource} \"{name}\" not found")
        })
    }
    /// 404 for a path.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }
    /// 405.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::about_object(409, "AlreadyExists", group, plural, name, |resource| {
            format!("{resource} \"{name}\" already exists")
        })
    }
    /// 409 Conflict.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::about_object(409, "Conflict", group, plural, name, |resource| {
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}")
        })
    }
    /// 409 for a read-modify-write that kept losing to concurrent changes.
    pub fn keeps_changing(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(group, plural, name, "the object keeps changing")
    }
    /// 409 Conflict of a server-side apply, one cause per conflicting field.
    pub fn conflict_with_causes(message: impl Into<String>, causes: Vec<Cause>) -> Self {
        let mut e = Self::new(409, "Conflict", message);
        e.extra = Some(Box::new(Extra {
            causes,
            retry_after: None,
        }));
        e
    }
    /// 410.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 429, with `Retry-After: 1` added by the response.
    pub fn too_many_requests() -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "injected fault: too many requests, please try again later",
        )
    }
    /// 413.
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "the request body is too large",
        )
    }
    /// 413, saying why.
    pub fn too_large_because(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }
    /// 415.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }
    /// 406.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    /// 422 for several field errors, one details.cause each (what kubectl prints as a list):
    /// the message holds the one, or `[a, b]` as kube-apiserver writes them.
    pub fn invalid_list(kind: &str, name: &str, field_errors: &[String]) -> Self {
        let listed = match field_errors {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut e = Self::invalid(kind, name, &listed);
        if field_errors.len() > 1 {
            e.extra = Some(Box::new(Extra {
                causes: field_errors
                    .iter()
                    .map(|error| Cause::from_field_error(error))
                    .collect(),
                retry_after: None,
            }));
        }
        e
    }
    /// 422, with one details.cause for the field error (`path: Type: detail`).
    pub fn invalid(kind: &str, name: &str, field_errors: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field_errors}"),
        );
        e.name = Some(name.into());
        e.kind = Some(kind.into());
        e.extra = Some(Box::new(Extra {
            causes: vec![Cause::from_field_error(field_errors)],
            retry_after: None,
        }));
        e
    }
    /// 422 for a request's options (`CreateOptions`, `PatchOptions`, ...) kube-apiserver
    /// refuses: `<Kind>.meta.k8s.io "" is invalid: <field error>`.
    pub fn invalid_options(kind: &str, field_error: &str) -> Self {
        let mut e = Self::invalid(&format!("{kind}.meta.k8s.io"), "", field_error);
        e.name = None;
        e.kind = Some(kind.into());
        e.group = Some("meta.k8s.io".into());
        e
    }
    /// 504 for a resourceVersion newer than the server's, as kube-apiserver answers it.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.extra = Some(Box::new(Extra {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge",
                message: "Too large resource version".to_string(),
                field: None,
            }],
            retry_after: Some(1),
        }));
        e
    }
    /// 503 while the store refuses writes.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }
    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The Status object.
    pub fn to_status(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.name {
            details.insert("name".into(), json!(n));
        }
        // The core group is "", which kube-apiserver leaves out.
        if let Some(g) = self.group.as_deref().filter(|g| !g.is_empty()) {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &self.kind {
            details.insert("kind".into(), json!(k.as_ref()));
        }
        if let Some(extra) = &self.extra {
            if !extra.causes.is_empty() {
                let causes: Vec<Value> = extra
                    .causes
                    .iter()
                    .map(|c| match &c.field {
                        Some(field) => {
                            json!({"reason": c.reason, "message": c.message, "field": field})
                        }
                        None => json!({"reason": c.reason, "message": c.message}),
                    })
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            if let Some(seconds) = extra.retry_after {
                details.insert("retryAfterSeconds".into(), json!(seconds));
            }
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_status().to_string();
        if self.code == 429 {
            let headers = [
                (axum::http::header::CONTENT_TYPE, "application/json"),
                (axum::http::header::RETRY_AFTER, "1"),
            ];
            return (code, headers, body).into_response();
        }
        (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match &error {
            StoreError::TooDeep => ApiError::bad_request(error.to_string()),
            StoreError::Failed(_) => ApiError::unavailable(format!(
                "{error}; the server refuses writes until it is restarted"
            )),
            StoreError::TooLarge => ApiError::internal(error.to_string()),
            StoreError::Encode(_)
            | StoreError::Open(_)
            | StoreError::Legacy(_)
            | StoreError::Replay { .. }
            | StoreError::Malformed(_) => ApiError::internal(error.to_string()),
        }
    }
}

/// The options a write takes (`CreateOptions`, ...), which kube-apiserver's 422s about a
/// request's options name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOptions {
    Create,
    Update,
    Patch,
    Delete,
}

impl WriteOptions {
    /// The options of a write of `method`; None for a read.
    pub fn of(method: &axum::http::Method) -> Option<Self> {
        match method.as_str() {
            "POST" => Some(WriteOptions::Create),
            "PUT" => Some(WriteOptions::Update),
            "PATCH" => Some(WriteOptions::Patch),
            "DELETE" => Some(WriteOptions::Delete),
            _ => None,
        }
    }

    /// The kind's name.
    pub fn kind(self) -> &'static str {
        match self {
            WriteOptions::Create => "CreateOptions",
            WriteOptions::Update => "UpdateOptions",
            WriteOptions::Patch => "PatchOptions",
            WriteOptions::Delete => "DeleteOptions",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_name_a_group_only_when_it_is_not_the_core_one() {
        let core = ApiError::not_found("", "namespaces", "team").to_status();
        assert_eq!(
            core["details"],
            json!({"name": "team", "kind": "namespaces"}),
            "as kube-apiserver answers"
        );
        let storage = ApiError::not_found("storage.k8s.io", "storageclasses", "gold").to_status();
        assert_eq!(
            storage["details"],
            json!({"name": "gold", "group": "storage.k8s.io", "kind": "storageclasses"})
        );
        assert_eq!(
            storage["message"],
            r#"storageclasses.storage.k8s.io "gold" not found"#
        );
    }
}
