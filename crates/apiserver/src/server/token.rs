//! The TokenRequest API (`POST .../serviceaccounts/<name>/token`, `kubectl create token`): a
//! token of the ServiceAccount, valid for `spec.expirationSeconds` (an hour by default, ten
//! minutes at least, as kube-apiserver allows) and only while the account exists with the
//! same uid.

use super::*;
use crate::auth::tokens::{AccountClaims, ISSUER};
use crate::auth::{self, SERVICE_ACCOUNTS};

/// kube-apiserver's bounds of `spec.expirationSeconds`.
const SHORTEST: i64 = 600;
const LONGEST: i64 = 1 << 32;
const DEFAULT: i64 = 3600;

pub(crate) fn token_request(
    app: &App,
    namespace: &str,
    name: &str,
    request: Value,
) -> Result<Value, ApiError> {
    let account = app
        .store
        .get(SERVICE_ACCOUNTS, namespace, name)
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
    let spec = &request["spec"];
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT,
        value => value
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    let invalid = |why: &str| {
        ApiError::invalid(
            "TokenRequest",
            name,
            &format!("spec.expirationSeconds: Invalid value: {seconds}: {why}"),
        )
    };
    if seconds < SHORTEST {
        return Err(invalid("may not specify a duration less than 10 minutes"));
    }
    if seconds > LONGEST {
        return Err(invalid(
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let mut audiences = crate::auth::rules::strings(&spec["audiences"]);
    if audiences.is_empty() {
        audiences.push(ISSUER.to_string());
    }
    let now = auth::now();
    let claims = AccountClaims {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: account["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        expires: now.saturating_add(seconds),
    };
    let token = app.auth.authenticator.issue(&claims, now, &audiences);
    let at = |secs: i64| objects::rfc3339(u64::try_from(secs).unwrap_or(0));
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": at(now)},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": spec["boundObjectRef"].clone()},
        "status": {"token": token, "expirationTimestamp": at(claims.expires)},
    }))
}
