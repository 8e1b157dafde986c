//! Fault injection for the reliability tests, off by default and changeable at run time: per
//! resource and verb an added latency and an error status with a probability (500, 429 with
//! `Retry-After`, 409), and closing the open watches.

use serde::{Deserialize, Serialize};

use crate::status::ApiError;

/// One rule. `resource` and `verb` may be `*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// Resource plural (`persistentvolumeclaims`) or `*`.
    #[serde(default = "any")]
    pub resource: String,
    /// kube-apiserver verb (`CREATE`, `LIST`, `WATCH`, `GET`, `UPDATE`, `PATCH`, `DELETE`,
    /// `DELETECOLLECTION`) or `*`.
    #[serde(default = "any")]
    pub verb: String,
    /// Added latency in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
    /// Status to answer: 500, 429 or 409.
    #[serde(default)]
    pub error: Option<u16>,
    /// Probability of the error, in [0, 1].
    #[serde(default = "one")]
    pub probability: f64,
}

fn any() -> String {
    "*".into()
}

fn one() -> f64 {
    1.0
}

impl FaultRule {
    fn matches(&self, resource: &str, verb: &str) -> bool {
        (self.resource == "*" || self.resource == resource)
            && (self.verb == "*" || self.verb.eq_ignore_ascii_case(verb))
    }

    /// Checks a rule before it is installed.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(code) = self.error
            && !matches!(code, 409 | 429 | 500)
        {
            return Err(format!("error must be 409, 429 or 500, got {code}"));
        }
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(format!(
                "probability must be in [0, 1], got {}",
                self.probability
            ));
        }
        Ok(())
    }
}

/// What the first matching rule does to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    /// Sleep first.
    pub latency_ms: u64,
    /// Then fail with this error.
    pub error: Option<ApiError>,
}

/// The error for a status code.
pub fn error_for(code: u16, resource: &str) -> ApiError {
    match code {
        409 => ApiError::conflict("", resource, "", "injected conflict"),
        429 => ApiError::too_many_requests(),
        _ => ApiError::internal("injected fault"),
    }
}

/// Decides the injection for a request (`draw` gives the random draw, asked for only when the
/// matched rule's error happens with a probability strictly between 0 and 1).
pub fn decide(
    rules: &[FaultRule],
    resource: &str,
    verb: &str,
    draw: impl FnOnce() -> f64,
) -> Option<Injection> {
    let rule = rules.iter().find(|r| r.matches(resource, verb))?;
    // The draw only for an error that may or may not happen.
    let error = rule
        .error
        .filter(|_| match rule.probability {
            p if p >= 1.0 => true,
            p if p > 0.0 => draw() < p,
            _ => false,
        })
        .map(|code| error_for(code, resource));
    Some(Injection {
        latency_ms: rule.latency_ms,
        error,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(resource: &str, verb: &str, error: Option<u16>, probability: f64) -> FaultRule {
        FaultRule {
            resource: resource.into(),
            verb: verb.into(),
            latency_ms: 5,
            error,
            probability,
        }
    }

    #[test]
    fn the_first_matching_rule_applies() {
        let rules = vec![
            rule("persistentvolumes", "CREATE", Some(500), 1.0),
            rule("*", "*", Some(429), 0.5),
        ];
        assert_eq!(
            decide(&rules, "persistentvolumes", "CREATE", || 0.9)
                .unwrap()
                .error
                .unwrap()
                .code,
            500
        );
        assert_eq!(
            decide(&rules, "pods", "LIST", || 0.1)
                .unwrap()
                .error
                .unwrap()
                .code,
            429
        );
        assert!(
            decide(&rules, "pods", "LIST", || 0.7)
                .unwrap()
                .error
                .is_none(),
            "drawn above the probability"
        );
        assert!(decide(&[], "pods", "LIST", || 0.0).is_none());
        // No draw where nothing is left to chance (a seeded run's draws stay with the rest).
        let sure = vec![
            rule("pods", "LIST", Some(500), 1.0),
            rule("nodes", "LIST", None, 0.5),
        ];
        let no_draw = || -> f64 { panic!("drew") };
        assert!(
            decide(&sure, "pods", "LIST", no_draw)
                .unwrap()
                .error
                .is_some()
        );
        assert!(
            decide(&sure, "nodes", "LIST", no_draw)
                .unwrap()
                .error
                .is_none()
        );
    }

    #[test]
    fn rules_are_validated() {
        assert!(rule("*", "*", Some(418), 1.0).validate().is_err());
        assert!(rule("*", "*", Some(500), 2.0).validate().is_err());
        assert!(rule("*", "*", Some(409), 0.2).validate().is_ok());
    }
}
