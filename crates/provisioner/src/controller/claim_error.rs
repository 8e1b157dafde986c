//! Why a claim was not provisioned this time, and which failures are worth an event.

use sidecar_kit::csi::CallError;

use crate::decide::data_source::DataSourceError;
use crate::decide::provision::{ProvisionError, ResponseError};
use crate::decide::topology::TopologyError;

/// Why a claim was not provisioned this time. Every variant is retried with backoff; the
/// comment says which upstream class it belongs to.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// No change: the class may appear.
    #[error("storageclass.storage.k8s.io {0:?} not found")]
    ClassNotFound(String),
    /// No change: the VolumeAttributesClass may appear.
    #[error("volumeattributesclasses.storage.k8s.io {0:?} not found")]
    VacNotFound(String),
    /// Reading the claim's VolumeAttributesClass failed; nothing changed, retried.
    #[error("{}", sidecar_kit::api_errors::message(.0))]
    VacLookup(#[source] kube::Error),
    /// Final: the claim or class is invalid as it stands.
    #[error(transparent)]
    Plan(#[from] ProvisionError),
    /// The data source cannot be used (yet): retried, the source may become ready.
    #[error(transparent)]
    DataSource(#[from] DataSourceError),
    /// Looking up the data source failed.
    #[error(
        "error getting {what} from api server: {}",
        sidecar_kit::api_errors::message(source)
    )]
    SourceLookup {
        /// What was looked up.
        what: &'static str,
        /// API error.
        source: kube::Error,
    },
    /// Adding or removing the cloning-protection finalizer failed.
    #[error("failed to update the cloning-protection finalizer: {}", sidecar_kit::api_errors::message(.0))]
    CloneFinalizer(#[source] kube::Error),
    /// The clone's source claim was deleted before it could be protected.
    #[error("the source claim {0} of the clone no longer exists")]
    CloneSourceGone(String),
    /// No change: the node or its CSINode may appear.
    #[error("error generating accessibility requirements: {0}")]
    Topology(#[from] TopologyError),
    /// The selected node has no CSINode (the node is gone, or its CSINode is not made yet):
    /// the claim goes back to the scheduler.
    #[error("failed to get selected CSINode {0}: csinode.storage.k8s.io {0:?} not found")]
    SelectedCsiNodeGone(String),
    /// No change: the secret may appear.
    #[error("error getting secret {name} in namespace {namespace}: {reason}")]
    Secret {
        /// The Secret's namespace, after templates.
        namespace: String,
        /// The Secret's name, after templates.
        name: String,
        /// Why (never the content).
        reason: String,
    },
    /// CreateVolume failed (what that means is `decide::classify`'s, acted on already).
    #[error("{}", .0.status_text())]
    Create(#[source] CallError),
    /// The driver's answer was unusable; the volume was deleted again.
    #[error(transparent)]
    Response(#[from] ResponseError),
    /// The PV could not be saved; the volume stays recorded.
    #[error("failed to save PersistentVolume {name:?}: {source}")]
    SavePv {
        /// PV name.
        name: String,
        /// API error.
        source: kube::Error,
    },
    /// A PV with our name exists for another claim.
    #[error("PersistentVolume {0:?} already exists for another claim")]
    PvConflict(String),
    /// The intent could not be recorded; no CreateVolume was sent.
    #[error("failed to record the in-flight volume: {0}")]
    Intent(#[source] super::intents::IntentError),
    /// Reading the PV or the claim of a listed volume before deleting it failed.
    #[error("failed to read the {what} of a listed volume before deleting it: {source}")]
    Recheck {
        /// The kind read.
        what: &'static str,
        /// API error.
        source: kube::Error,
    },
    /// A CSI call of the clean-up failed.
    #[error(transparent)]
    Csi(#[from] CallError),
    /// Cleaning up after a deleted claim failed; retried.
    #[error("failed to delete volume {name:?} of a deleted claim: {source}")]
    Cleanup {
        /// Volume name.
        name: String,
        /// Why the volume could not be deleted.
        source: Box<ClaimError>,
    },
}

impl ClaimError {
    /// Whether the driver refused CreateVolume with INVALID_ARGUMENT: upstream (v6.1 on) calls
    /// it infeasible and tries the claim again only after `--retry-interval-max`.
    pub(super) fn infeasible(&self) -> bool {
        matches!(self, ClaimError::Create(e) if e.code == tonic::Code::InvalidArgument)
    }

    /// The message of its `ProvisioningFailed` event, as upstream v6 words it: the error
    /// itself, prefixed for an infeasible one.
    pub(super) fn event_message(&self) -> String {
        if self.infeasible() {
            format!(
                "Volume provisioning failed with infeasible error. Retries will be delayed. {self}"
            )
        } else {
            self.to_string()
        }
    }

    /// Whether the claim goes back to the scheduler (its selected node removed), as upstream's
    /// `ProvisioningReschedule` before CreateVolume: only when the selected node's CSINode is
    /// gone (a refusal of CreateVolume itself is classified by `classify_create`).
    pub(super) fn sends_back_to_scheduler(&self) -> bool {
        self.handling().send_back
    }

    /// Whether the user should hear about it in a `ProvisioningFailed` event. A class gone
    /// after the claim was handed to us is logged and retried without one, as upstream's
    /// (kube-controller-manager's binder reports a claim naming a class that never existed).
    pub(super) fn event_worthy(&self) -> bool {
        self.handling().event
    }

    /// How it is handled, decided in one match over every variant.
    fn handling(&self) -> Handling {
        const EVENT: Handling = Handling {
            event: true,
            send_back: false,
        };
        const LOG_ONLY: Handling = Handling {
            event: false,
            send_back: false,
        };
        match self {
            ClaimError::SelectedCsiNodeGone(_) => Handling {
                event: true,
                send_back: true,
            },
            ClaimError::VacNotFound(_)
            | ClaimError::VacLookup(_)
            | ClaimError::Plan(_)
            | ClaimError::DataSource(_)
            | ClaimError::SourceLookup { .. }
            | ClaimError::CloneFinalizer(_)
            | ClaimError::CloneSourceGone(_)
            | ClaimError::Topology(_)
            | ClaimError::Secret { .. }
            | ClaimError::Create(_)
            | ClaimError::Response(_)
            | ClaimError::PvConflict(_)
            // Upstream says so once it gives up saving (and deletes the volume); ours keeps the
            // volume and tries again, saying so each time.
            | ClaimError::SavePv { .. } => EVENT,
            ClaimError::ClassNotFound(_)
            | ClaimError::Cleanup { .. }
            | ClaimError::Csi(_)
            | ClaimError::Intent(_)
            | ClaimError::Recheck { .. } => LOG_ONLY,
        }
    }
}

/// What a claim's error leads to besides its retry.
struct Handling {
    /// A `ProvisioningFailed` event.
    event: bool,
    /// The claim sent back to the scheduler.
    send_back: bool,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn create(code: &'static str) -> ClaimError {
        ClaimError::Create(CallError {
            method: "CreateVolume",
            code: sidecar_kit::csi::parse_code(code).unwrap(),
            message: "size 3 is odd".into(),
        })
    }

    #[test]
    fn the_event_is_the_error_as_upstream_v6_words_it_and_infeasible_ones_say_so() {
        assert!(create("InvalidArgument").infeasible());
        assert_eq!(
            create("InvalidArgument").event_message(),
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = size 3 is odd"
        );
        for code in ["Internal", "ResourceExhausted", "FailedPrecondition"] {
            assert!(!create(code).infeasible());
            assert_eq!(
                create(code).event_message(),
                format!("rpc error: code = {code} desc = size 3 is odd")
            );
        }
        assert_eq!(
            ClaimError::VacNotFound("gold".into()).event_message(),
            "volumeattributesclasses.storage.k8s.io \"gold\" not found"
        );
        let gone = ClaimError::SelectedCsiNodeGone("node-1".into());
        assert_eq!(
            gone.event_message(),
            "failed to get selected CSINode node-1: csinode.storage.k8s.io \"node-1\" not found"
        );
        assert!(gone.sends_back_to_scheduler());
        // A refused CreateVolume is classified by classify_create, not here.
        assert!(!create("ResourceExhausted").sends_back_to_scheduler());
        let missing = ClaimError::ClassNotFound("fast".into());
        assert!(!missing.infeasible());
        assert!(!missing.event_worthy(), "upstream only logs it");
        let refused = ClaimError::SavePv {
            name: "pvc-1".into(),
            source: kube::Error::Api(Box::new(
                serde_json::from_value(serde_json::json!({
                    "status": "Failure", "code": 403, "reason": "Forbidden",
                    "message": "admission webhook denied the request",
                }))
                .unwrap(),
            )),
        };
        assert!(
            refused.event_worthy(),
            "a volume that cannot be saved is said so"
        );
        assert!(
            refused
                .event_message()
                .starts_with("failed to save PersistentVolume \"pvc-1\": "),
            "{}",
            refused.event_message()
        );
        assert_eq!(
            missing.event_message(),
            "storageclass.storage.k8s.io \"fast\" not found"
        );
    }
}
