//! Secrets for CSI calls: fetched live at call time (never cached, never logged), as the
//! UTF-8 strings CSI wants.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Secret, SecretReference};
use kube::Api;

/// A Secret by namespace and name (its contents are read at call time, never kept).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace.
    pub namespace: String,
}

impl SecretRef {
    /// The Secret a PV's `*SecretRef` names (None without a name).
    pub fn of(reference: Option<&SecretReference>) -> Option<SecretRef> {
        let r = reference?;
        Some(SecretRef {
            namespace: r.namespace.clone().unwrap_or_default(),
            name: r.name.clone()?,
        })
    }
}

/// A Secret that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to load secret \"{namespace}/{name}\": {reason}")]
pub struct SecretError {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// Why it could not be read (missing, forbidden, a value that is not UTF-8).
    pub reason: String,
}

/// The data of the Secret `secret` names, as strings; none without one.
pub async fn fetch_ref(
    client: &kube::Client,
    secret: Option<&SecretRef>,
) -> Result<HashMap<String, String>, SecretError> {
    match secret {
        None => Ok(HashMap::new()),
        Some(s) => fetch(client, &s.namespace, &s.name).await,
    }
}

/// The data of Secret `namespace/name` as strings.
pub async fn fetch(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<HashMap<String, String>, SecretError> {
    let fail = |reason: String| SecretError {
        namespace: namespace.to_string(),
        name: name.to_string(),
        reason,
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // The API server's own words (`secrets "name" not found`), as the Go sidecars print
    // client-go's error; kube's rendering of a Status adds its whole debug form.
    let found = api.get(name).await.map_err(|e| match e {
        kube::Error::Api(status) if !status.message.is_empty() => fail(status.message),
        e if crate::api_errors::is_not_found(&e) => fail(format!("secrets {name:?} not found")),
        other => fail(other.to_string()),
    })?;
    let mut out = HashMap::new();
    for (key, value) in found.data.unwrap_or_default() {
        let text = String::from_utf8(value.0)
            .map_err(|_| fail(format!("value of key {key:?} is not UTF-8")))?;
        out.insert(key, text);
    }
    Ok(out)
}
