//! What a list's `resourceVersion` and `resourceVersionMatch` ask for, answered as
//! kube-apiserver answers them by a store that keeps only the current state: `0` (any) and unset
//! (most recent) are served; `NotOlderThan` N (also a bare N) once the store has reached N;
//! `Exact` N only when N is the current version, `410 Gone` when it is older.
//!
//! A list in pages (`limit`) hands out continue tokens that name the snapshot's version and
//! the last object sent: every page comes from the same snapshot, and a token older than the
//! store's history gets kube-apiserver's 410.

use base64::Engine;
use serde_json::json;

use crate::status::ApiError;

/// Where a paged list goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continue {
    /// The version of the snapshot the first page came from.
    pub rv: u64,
    /// The list key (`namespace\0name`) of the last object sent.
    pub after: String,
}

impl Continue {
    /// The opaque token.
    pub fn encode(&self) -> String {
        let text = json!({"v": "meta.k8s.io/v1", "rv": self.rv, "start": self.after}).to_string();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// Reads a token; 400 when it is not one of ours.
    pub fn decode(token: &str) -> Result<Continue, ApiError> {
        let invalid = || {
            ApiError::bad_request(
                "continue key is not valid: the token was not issued by this server",
            )
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| invalid())?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        let rv = value["rv"].as_u64().ok_or_else(invalid)?;
        let after = value["start"].as_str().ok_or_else(invalid)?.to_string();
        Ok(Continue { rv, after })
    }
}

/// kube-apiserver's answer to a continue token older than the history.
pub fn expired_continue() -> ApiError {
    ApiError::gone(
        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
    )
}

/// The decision for one list request.
#[derive(Debug, Clone, PartialEq)]
pub enum ListAt {
    /// Serve the current state.
    Current,
    /// The store has not reached this version yet: wait for it, then refuse with 504.
    NotYet(u64),
    /// An older state that is no longer kept.
    Gone(u64),
    /// The parameters are invalid.
    Invalid(String),
}

/// Decides from the query values and the store's current version.
pub fn decide(rv: Option<&str>, matching: Option<&str>, current: u64) -> ListAt {
    let rv = rv.filter(|r| !r.is_empty());
    let matching = matching.filter(|m| !m.is_empty());
    let Some(rv_text) = rv else {
        return match matching {
            None => ListAt::Current,
            Some(_) => ListAt::Invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
            ),
        };
    };
    let Ok(n) = rv_text.parse::<u64>() else {
        return ListAt::Invalid(format!(
            "resourceVersion: Invalid value: {rv_text:?}: must be an unsigned integer"
        ));
    };
    match matching {
        None | Some("NotOlderThan") if n == 0 => ListAt::Current,
        None | Some("NotOlderThan") if n > current => ListAt::NotYet(n),
        None | Some("NotOlderThan") => ListAt::Current,
        Some("Exact") if n == 0 => ListAt::Invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
        ),
        Some("Exact") if n == current => ListAt::Current,
        Some("Exact") if n > current => ListAt::NotYet(n),
        Some("Exact") => ListAt::Gone(n),
        Some(other) => ListAt::Invalid(format!(
            "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        )),
    }
}

/// The error for a decision that does not serve.
pub fn refusal(at: &ListAt, current: u64) -> Option<ApiError> {
    match at {
        ListAt::Current => None,
        ListAt::NotYet(n) => Some(ApiError::too_large_resource_version(*n, current)),
        ListAt::Gone(n) => Some(ApiError::gone(format!(
            "The resourceVersion for the provided list is too old: {n} (current {current}); this server keeps only the current state"
        ))),
        ListAt::Invalid(message) => Some(ApiError::bad_request(message.clone())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_foreign_ones_are_refused() {
        let token = Continue {
            rv: 42,
            after: "default\u{0}c7".into(),
        };
        assert_eq!(Continue::decode(&token.encode()).unwrap(), token);
        for bad in [
            "7",
            "",
            "!!!",
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("{}"),
        ] {
            assert_eq!(Continue::decode(bad).unwrap_err().code, 400, "{bad}");
        }
        assert_eq!(expired_continue().code, 410);
    }

    #[test]
    fn list_versions_are_answered_as_kube_apiserver_does() {
        let cases: [(Option<&str>, Option<&str>, ListAt); 11] = [
            (None, None, ListAt::Current),
            (Some("0"), None, ListAt::Current),
            (Some("50"), None, ListAt::Current),
            (Some("100"), Some("NotOlderThan"), ListAt::Current),
            (Some("101"), Some("NotOlderThan"), ListAt::NotYet(101)),
            (Some("101"), None, ListAt::NotYet(101)),
            (Some("100"), Some("Exact"), ListAt::Current),
            (Some("99"), Some("Exact"), ListAt::Gone(99)),
            (Some("200"), Some("Exact"), ListAt::NotYet(200)),
            (Some("0"), Some("Exact"), ListAt::Invalid("resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into())),
            (None, Some("Exact"), ListAt::Invalid("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into())),
        ];
        for (rv, matching, want) in cases {
            assert_eq!(decide(rv, matching, 100), want, "{rv:?} {matching:?}");
        }
        assert!(matches!(decide(Some("x"), None, 1), ListAt::Invalid(_)));
        assert!(matches!(
            decide(Some("5"), Some("Newest"), 10),
            ListAt::Invalid(_)
        ));
    }
}
