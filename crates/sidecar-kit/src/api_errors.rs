//! The API server's refusals, named once: what a failed request means (`is_not_found`,
//! `is_conflict`, ...: by its reason, or by its code when the reason is not one Kubernetes
//! defines, as client-go's `errors.Is*` decide) and what a controller does next after a write
//! failed ([`after_write`]), so every controller reads an error the same way instead of
//! comparing codes.

use std::time::Duration;

use kube::core::Status;

/// The reasons Kubernetes defines (`metav1.StatusReason`).
const KNOWN_REASONS: [&str; 17] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "StoreReadError",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
];

fn status(error: &kube::Error) -> Option<&Status> {
    match error {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// Client-go's rule: the reason says so, or the reason is none Kubernetes knows and the code
/// says so.
fn is(error: &kube::Error, reason: &str, code: u16) -> bool {
    status(error).is_some_and(|s| {
        s.reason == reason || (!KNOWN_REASONS.contains(&s.reason.as_str()) && s.code == code)
    })
}

/// The error as a Go client prints it: an API refusal is the API server's message
/// (`persistentvolumes "pv" not found`), without the Status's debug form kube adds to it;
/// anything else as it displays.
pub fn message(error: &kube::Error) -> String {
    match status(error) {
        Some(s) if !s.message.is_empty() => s.message.clone(),
        _ => error.to_string(),
    }
}

/// 404: the object (or its namespace) does not exist.
pub fn is_not_found(error: &kube::Error) -> bool {
    is(error, "NotFound", 404)
}

/// 409 AlreadyExists: a create found the name taken.
pub fn is_already_exists(error: &kube::Error) -> bool {
    is(error, "AlreadyExists", 409)
}

/// 409 Conflict: the object changed since the version the write named.
pub fn is_conflict(error: &kube::Error) -> bool {
    is(error, "Conflict", 409)
}

/// 410: the version asked for is older than what the server keeps.
pub fn is_gone(error: &kube::Error) -> bool {
    is(error, "Gone", 410) || is(error, "Expired", 410)
}

/// 422: the object is refused as invalid (also a JSON patch whose `test` failed).
pub fn is_invalid(error: &kube::Error) -> bool {
    is(error, "Invalid", 422)
}

/// 403: the request is not allowed (RBAC).
pub fn is_forbidden(error: &kube::Error) -> bool {
    is(error, "Forbidden", 403)
}

/// 429: the server asks to come back later.
pub fn is_throttled(error: &kube::Error) -> bool {
    is(error, "TooManyRequests", 429)
}

/// 5xx, a timeout on the server, or no answer at all (the connection, TLS, a timeout here).
pub fn is_unavailable(error: &kube::Error) -> bool {
    match status(error) {
        Some(s) => {
            s.code >= 500
                || matches!(
                    s.reason.as_str(),
                    "ServerTimeout" | "Timeout" | "InternalError" | "StoreReadError"
                )
        }
        None => matches!(
            error,
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_)
        ),
    }
}

/// The wait a 429 names (`details.retryAfterSeconds`), if any.
pub fn retry_after(error: &kube::Error) -> Option<Duration> {
    let seconds = status(error)?.details.as_ref()?.retry_after_seconds;
    (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)))
}

/// What a controller does after a write of an object failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterWrite {
    /// The object is gone: nothing left to do for it.
    Gone,
    /// The object changed since it was read (a conflict, an expired version, or a JSON patch
    /// whose `test` failed): decide again from what is current, at once.
    Changed,
    /// The server cannot answer now: try again after a backoff (or the wait it named).
    Later(Option<Duration>),
    /// The server refuses the request itself (forbidden, invalid, bad request): a defect or a
    /// missing rule to report; retrying soon would be refused the same way.
    Refused,
}

/// How the write was guarded: a JSON patch with `test` operations fails with 422 when what it
/// tested changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A create, update, merge patch or apply.
    Plain,
    /// A JSON patch whose `test` operations guard it.
    Tested,
}

/// The one table from a failed write to the next step.
pub fn after_write(error: &kube::Error, write: Write) -> AfterWrite {
    if is_not_found(error) {
        AfterWrite::Gone
    } else if is_conflict(error)
        || is_already_exists(error)
        || is_gone(error)
        || (is_invalid(error) && write == Write::Tested)
    {
        AfterWrite::Changed
    } else if is_throttled(error) {
        AfterWrite::Later(retry_after(error))
    } else if is_unavailable(error) {
        AfterWrite::Later(None)
    } else {
        // Refused by the server, or not an answer of it (decoding, building the request).
        AfterWrite::Refused
    }
}

/// How soon an object that changed under a write is looked at again: a conflict is not a
/// failure (the failure backoff grows to minutes and held 50 claims unbound when every one
/// raced another writer), just a sign that the cache is behind for a moment.
pub const CHANGED_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);

/// The runtime's next step after a failed write, by [`after_write`]: gone → done (or `gone`
/// where the caller goes on), changed → look again soon (not a failure), a wait named by the
/// server → that wait; anything else is returned as the error (retried after the backoff).
pub fn next_after(
    error: kube::Error,
    write: Write,
    gone: crate::workqueue::Next,
) -> Result<crate::workqueue::Next, kube::Error> {
    use crate::workqueue::Next;
    match after_write(&error, write) {
        AfterWrite::Gone => Ok(gone),
        AfterWrite::Changed => Ok(Next::After(CHANGED_LOOK_AGAIN)),
        AfterWrite::Later(Some(wait)) => Ok(Next::After(wait)),
        AfterWrite::Later(None) | AfterWrite::Refused => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, retry: u32) -> kube::Error {
        let status: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": reason, "message": "m",
            "details": {"retryAfterSeconds": retry},
        }))
        .unwrap_or_else(|_| Status::failure("m", reason));
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn an_api_refusal_prints_as_the_api_servers_message() {
        assert_eq!(message(&api(404, "NotFound", 0)), "m");
        let other = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(message(&other), other.to_string());
    }

    #[test]
    fn each_refusal_has_its_name_and_its_next_step() {
        use AfterWrite::*;
        use Write::*;
        let cases = [
            (api(404, "NotFound", 0), Plain, Gone),
            // A proxy's 404 without a Kubernetes reason is still not found.
            (api(404, "", 0), Plain, Gone),
            (api(409, "Conflict", 0), Plain, Changed),
            (api(409, "AlreadyExists", 0), Plain, Changed),
            (api(410, "Gone", 0), Plain, Changed),
            (api(410, "Expired", 0), Plain, Changed),
            (api(422, "Invalid", 0), Tested, Changed),
            (api(422, "Invalid", 0), Plain, Refused),
            (
                api(429, "TooManyRequests", 3),
                Plain,
                Later(Some(Duration::from_secs(3))),
            ),
            (api(429, "TooManyRequests", 0), Plain, Later(None)),
            (api(500, "InternalError", 0), Plain, Later(None)),
            (api(503, "ServiceUnavailable", 0), Plain, Later(None)),
            (api(504, "Timeout", 0), Plain, Later(None)),
            (api(403, "Forbidden", 0), Plain, Refused),
            (api(400, "BadRequest", 0), Plain, Refused),
            // A known reason decides over the code.
            (api(404, "Conflict", 0), Plain, Changed),
        ];
        for (error, write, want) in cases {
            assert_eq!(after_write(&error, write), want, "{error:?} {write:?}");
        }
        use crate::workqueue::Next;
        let next = |e| next_after(e, Plain, Next::Done).map_err(|e| e.to_string());
        assert_eq!(next(api(404, "NotFound", 0)), Ok(Next::Done));
        assert_eq!(
            next(api(409, "Conflict", 0)),
            Ok(Next::After(CHANGED_LOOK_AGAIN))
        );
        assert_eq!(
            next(api(429, "TooManyRequests", 2)),
            Ok(Next::After(Duration::from_secs(2)))
        );
        assert!(next(api(500, "InternalError", 0)).is_err());
        assert!(next(api(403, "Forbidden", 0)).is_err());
        assert!(is_forbidden(&api(403, "Forbidden", 0)));
        assert!(!is_conflict(&api(409, "AlreadyExists", 0)));
        assert!(is_already_exists(&api(409, "AlreadyExists", 0)));
    }
}
