//! Pure decisions of the snapshot controller: from a VolumeSnapshot (or a content) and what it
//! refers to, the steps to take, in order. The controller carries them out and looks again
//! when the objects change.
//!
//! The protocol is the community snapshot-controller's and csi-snapshotter's: content
//! `snapcontent-<snapshot uid>`, CSI snapshot name `snapshot-<snapshot uid>`, their finalizers
//! and annotations, status fields and event reasons.
//!
//! - `snapshot`: a VolumeSnapshot's steps (the snapshot controller's part);
//! - `content`: a VolumeSnapshotContent's steps (the csi-snapshotter's part).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

mod content;
mod dynamic;
mod snapshot;

pub use content::{ContentStep, ContentWorld, content_status, decide_content, snapshot_parameters};
pub use snapshot::{
    SnapshotStep, SnapshotWorld, claim_busy, content_name, decide_snapshot, may_wait_for_class,
    restores_from, restoring, status_from, wanted_content,
};

/// On a VolumeSnapshot while a claim may restore from it.
pub const FINALIZER_AS_SOURCE: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a VolumeSnapshot bound to a content with deletionPolicy Delete.
pub const FINALIZER_BOUND: &str = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
/// On a bound VolumeSnapshotContent, until its CSI snapshot is dealt with.
pub const FINALIZER_CONTENT: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// On a claim being snapshotted.
pub const FINALIZER_CLAIM: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";
/// On a content whose VolumeSnapshot is being deleted.
pub const ANN_BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// On a content while CreateSnapshot may be running.
pub const ANN_BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// On the default VolumeSnapshotClass of a driver.
pub const ANN_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// The secret DeleteSnapshot uses, on a content.
pub const ANN_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
/// Its namespace.
pub const ANN_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
/// Class parameters naming the CreateSnapshot/DeleteSnapshot secret.
pub const PARAM_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
/// Its namespace.
pub const PARAM_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";

/// Class parameter keys in the reserved prefix that are not passed to the driver.
const RESERVED: [&str; 8] = [
    PARAM_SECRET_NAME,
    PARAM_SECRET_NAMESPACE,
    "csi.storage.k8s.io/snapshotter-list-secret-name",
    "csi.storage.k8s.io/snapshotter-list-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-secret-name",
    "csi.storage.k8s.io/group-snapshotter-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-get-secret-name",
    "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
];

/// What happens after the steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing more until something changes.
    Done,
    /// Look again after a backoff (a failure was reported by the steps, or a wait).
    Retry,
}

/// Steps and what follows them.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<S> {
    /// The steps, in order.
    pub steps: Vec<S>,
    /// Then.
    pub outcome: Outcome,
}

fn has(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Unix nanoseconds as RFC 3339 (seconds precision, UTC).
pub fn rfc3339_from_nanos(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The steps, and nothing more until something changes.
fn done<S>(steps: Vec<S>) -> Plan<S> {
    Plan {
        steps,
        outcome: Outcome::Done,
    }
}

#[cfg(test)]
mod tests;
