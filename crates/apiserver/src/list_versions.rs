//! What a list's `resourceVersion` and `resourceVersionMatch` ask for, answered as
//! kube-apiserver answers them by a store that keeps only the current state: `0` (any) and unset
//! (most recent) are served; `NotOlderThan` N (also a bare N) once the store has reached N;
//! `Exact` N only when N is the current version, `410 Gone` when it is older.

use crate::status::ApiError;

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
mod tests {
    use super::*;

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
