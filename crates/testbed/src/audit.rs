//! kube-apiserver's audit log, read back: every request a test's identities made that was
//! answered `403 Forbidden`. The policy logs every request at the Metadata level (who, what,
//! which answer; never a body, so no Secret reaches the file).

use std::path::Path;

use serde::Deserialize;

use crate::Error;
use crate::binaries::io;

/// The audit policy the control plane starts with.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
  - level: Metadata
";

/// One refused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Who asked.
    pub user: String,
    /// The verb (`get`, `patch`, ...).
    pub verb: String,
    /// `group/resource[/subresource]` or the path of a non-resource request.
    pub what: String,
    /// The namespace, if any.
    pub namespace: String,
    /// The object's name, if any.
    pub name: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cannot {} {} {}/{}",
            self.user, self.verb, self.what, self.namespace, self.name
        )
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    request_uri: String,
    #[serde(default)]
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
}

#[derive(Deserialize, Default)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// The 403 answers in the audit log `text` given to users `who` selects.
pub fn refusals(text: &str, who: impl Fn(&str) -> bool) -> Vec<Refusal> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .filter(|e| e.stage == "ResponseComplete" || e.stage == "Panic")
        .filter(|e| e.response_status.as_ref().is_some_and(|s| s.code == 403))
        .filter(|e| who(&e.user.username))
        .map(|e| {
            let (what, namespace, name) = match e.object_ref {
                Some(o) => {
                    let mut what = if o.api_group.is_empty() {
                        o.resource
                    } else {
                        format!("{}/{}", o.api_group, o.resource)
                    };
                    if !o.subresource.is_empty() {
                        what = format!("{what}/{}", o.subresource);
                    }
                    (what, o.namespace, o.name)
                }
                None => (e.request_uri, String::new(), String::new()),
            };
            Refusal {
                user: e.user.username,
                verb: e.verb,
                what,
                namespace,
                name,
            }
        })
        .collect()
}

/// [`refusals`] of the file at `path`; an error when it cannot be read (a missing log is never
/// read as one without refusals).
pub fn refusals_in(path: &Path, who: impl Fn(&str) -> bool) -> Result<Vec<Refusal>, Error> {
    let text = std::fs::read_to_string(path).map_err(io("read", path))?;
    Ok(refusals(&text, who))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_that_cannot_be_read_is_an_error_not_an_empty_answer() {
        let dir = tempfile::tempdir().expect("make a temporary directory");
        let missing = dir.path().join("audit.log");
        let read = refusals_in(&missing, |_| true);
        assert!(
            matches!(&read, Err(Error::Io { action: "read", path, .. }) if *path == missing),
            "{read:?}"
        );
    }

    #[test]
    fn only_completed_refusals_of_the_chosen_users_count() {
        let log = [
            r#"{"stage":"ResponseComplete","verb":"patch","requestURI":"/api/v1/namespaces/default/persistentvolumeclaims/src","user":{"username":"system:serviceaccount:default:csi-provisioner"},"objectRef":{"resource":"persistentvolumeclaims","namespace":"default","name":"src","apiVersion":"v1"},"responseStatus":{"code":403}}"#,
            r#"{"stage":"ResponseComplete","verb":"get","requestURI":"/api/v1/nodes","user":{"username":"system:serviceaccount:default:csi-provisioner"},"objectRef":{"resource":"nodes"},"responseStatus":{"code":200}}"#,
            r#"{"stage":"ResponseStarted","verb":"watch","requestURI":"/x","user":{"username":"system:serviceaccount:default:csi-provisioner"},"responseStatus":{"code":403}}"#,
            r#"{"stage":"ResponseComplete","verb":"get","requestURI":"/metrics","user":{"username":"admin"},"responseStatus":{"code":403}}"#,
            r#"{"stage":"ResponseComplete","verb":"patch","requestURI":"/apis/storage.k8s.io/v1/volumeattachments/va/status","user":{"username":"system:serviceaccount:default:csi-attacher"},"objectRef":{"resource":"volumeattachments","subresource":"status","name":"va","apiGroup":"storage.k8s.io"},"responseStatus":{"code":403}}"#,
            "not json",
        ]
        .join("\n");
        let found = refusals(&log, |u| u.starts_with("system:serviceaccount:"));
        assert_eq!(
            found.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "system:serviceaccount:default:csi-provisioner cannot patch persistentvolumeclaims default/src",
                "system:serviceaccount:default:csi-attacher cannot patch storage.k8s.io/volumeattachments/status /va",
            ]
        );
    }
}
