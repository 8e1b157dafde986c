//! Who may ask: the bearer token check (constant time, before routing, so known and unknown
//! paths answer alike) and the bounded, escaped client label of request metrics.

use axum::http::{HeaderMap, header};

/// Label for requests that did not present the token.
pub const UNAUTHENTICATED: &str = "unauthenticated";
/// Label for clients past [`MAX_CLIENT_LABELS`] or with an unusable User-Agent.
pub const OTHER: &str = "other";
/// Distinct client labels kept in the request counters.
pub const MAX_CLIENT_LABELS: usize = 64;

/// Paths that answer without the token.
pub fn is_health(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    matches!(first, "healthz" | "readyz" | "livez")
}

/// The token of `Authorization: Bearer <token>` ("" when there is none).
pub fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("")
}

/// Whether the request carries `Authorization: Bearer <token>`.
pub fn authorized(headers: &HeaderMap, token: &str) -> bool {
    constant_time_eq(bearer(headers).as_bytes(), token.as_bytes())
}

/// Compares without an early exit, so the time taken does not tell how much matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// The client label from a User-Agent: its program name (before the first `/`), restricted
/// to `[A-Za-z0-9._-]` and 40 characters; anything else is [`OTHER`].
pub fn client_label(headers: &HeaderMap) -> String {
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let program = agent.split('/').next().unwrap_or("");
    let usable = !program.is_empty()
        && program.len() <= 40
        && program
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if usable {
        program.to_string()
    } else {
        OTHER.to_string()
    }
}

/// The label a client gets given the labels in use (sorted): its own while it is one of them
/// or there is room for another, else [`OTHER`].
pub fn bounded_client<'a>(in_use: &[&str], client: &'a str) -> &'a str {
    if in_use.binary_search(&client).is_ok() || in_use.len() < MAX_CLIENT_LABELS {
        client
    } else {
        OTHER
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
        headers
    }

    #[test]
    fn only_the_exact_token_is_accepted() {
        let cases = [
            ("Bearer secret", true),
            ("Bearer  secret ", true),
            ("Bearer secre", false),
            ("Bearer secretx", false),
            ("Basic secret", false),
            ("", false),
        ];
        for (value, want) in cases {
            assert_eq!(
                authorized(&with(header::AUTHORIZATION, value), "secret"),
                want,
                "{value:?}"
            );
        }
        assert!(!authorized(&HeaderMap::new(), "secret"));
    }

    #[test]
    fn constant_time_eq_compares_lengths_and_bytes() {
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"a", b""));
        assert!(!constant_time_eq(b"ab", b"ac"));
        assert!(constant_time_eq(b"abc", b"abc"));
    }

    #[test]
    fn client_labels_are_program_names_or_other() {
        let cases = [
            ("kubectl/v1.32.0 (linux/amd64)", "kubectl"),
            ("csi-provisioner", "csi-provisioner"),
            ("evil\"agent", OTHER),
            ("", OTHER),
            ("a b", OTHER),
        ];
        for (agent, want) in cases {
            assert_eq!(
                client_label(&with(header::USER_AGENT, agent)),
                want,
                "{agent:?}"
            );
        }
        assert_eq!(
            client_label(&with(header::USER_AGENT, &"x".repeat(41))),
            OTHER
        );
    }

    #[test]
    fn client_labels_are_bounded() {
        let full: Vec<String> = (0..MAX_CLIENT_LABELS).map(|i| format!("c{i:03}")).collect();
        let mut full: Vec<&str> = full.iter().map(String::as_str).collect();
        full.sort_unstable();
        assert_eq!(
            bounded_client(&full, "c005"),
            "c005",
            "a known client keeps its label"
        );
        assert_eq!(bounded_client(&full, "newcomer"), OTHER);
        assert_eq!(bounded_client(&full[1..], "newcomer"), "newcomer");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn health_paths_are_recognised() {
        assert!(is_health("/healthz"));
        assert!(is_health("/readyz/ping"));
        assert!(!is_health("/api"));
        assert!(!is_health("/healthzz"));
    }
}
