//! The node's part of an expansion, as kubelet does it: once a volume a Pod uses is staged
//! and published, and its claim awaits the node, NodeExpandVolume grows it and the claim
//! records its new capacity (a node service without EXPAND_VOLUME fails the step, as
//! kubelet's does). Events on the Pod (and the claim, on success) say how it went.

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::{now_rfc3339, reference};

use super::decide::PodVolume;
use super::decide_expand;
use super::{NodeAgent, NodeError};

impl NodeAgent {
    /// Grows `volume` at the node when its claim awaits it (the volume is set up for the Pod
    /// `uid`), then records the claim's new capacity; events on the Pod say how it went.
    pub(super) async fn expand(
        &self,
        pod: &Pod,
        uid: &str,
        volume: &PodVolume,
    ) -> Result<(), NodeError> {
        let Some(expansion) = &volume.expand else {
            return Ok(());
        };
        let key = ObjectRef::new(&expansion.claim).within(&expansion.namespace);
        let Some(claim) = self.claims.get(&key) else {
            return Ok(());
        };
        // Whether the Pod runs already (online expansion) or is being set up (at mount).
        let online = super::decide::running(pod);
        let claim = self
            .patch_claim_status(
                &claim,
                &decide_expand::started(),
                "mark the claim's node expansion in progress",
            )
            .await?;
        let failure = if self.expands {
            let staging = if self.stage_unstage {
                self.paths
                    .staging_target(&volume.driver, &volume.handle)
                    .display()
                    .to_string()
            } else {
                String::new()
            };
            let request = csi::NodeExpandVolumeRequest {
                volume_id: volume.handle.clone(),
                volume_path: self.paths.target(uid, &volume.pv).display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: expansion.to,
                    limit_bytes: 0,
                }),
                staging_target_path: staging,
                volume_capability: Some(volume.capability.clone()),
                secrets: self.secrets(volume.expand_secret.as_ref()).await?,
            };
            let mut client = self.node_client();
            self.calls
                .call(
                    "/csi.v1.Node/NodeExpandVolume",
                    client.node_expand_volume(self.calls.request(request)),
                )
                .await
                .err()
                .map(|e| {
                    let printed = e.status_text();
                    (
                        Some(e.code),
                        decide_expand::expander_error(Some(e.code), &printed),
                        e,
                    )
                })
        } else {
            let message = format!(
                "NodeExpand is not supported by the CSI driver {}",
                volume.driver
            );
            let error = sidecar_kit::csi::CallError {
                method: "NodeExpandVolume",
                code: tonic::Code::Unimplemented,
                message: message.clone(),
            };
            Some((None, decide_expand::expander_error(None, &message), error))
        };
        if let Some((code, message, source)) = failure {
            let (reason, text) = decide_expand::failure_event(online, &volume.pv, &message);
            self.recorder
                .record(&reference(pod), EventType::Warning, reason, &text);
            if let Some(patch) = decide_expand::failed(&claim, code, &message, &now_rfc3339()) {
                self.patch_claim_status(&claim, &patch, "record the claim's failed node expansion")
                    .await?;
            }
            return Err(NodeError::Expand {
                pv: volume.pv.clone(),
                source,
            });
        }
        self.patch_claim_status(
            &claim,
            &decide_expand::finished(&claim, expansion.to),
            "record the claim's expanded capacity",
        )
        .await?;
        let message = format!(
            "MountVolume.NodeExpandVolume succeeded for volume {:?} {}",
            volume.pv, self.node
        );
        for object in [reference(pod), reference(&claim)] {
            self.recorder.record(
                &object,
                EventType::Normal,
                "FileSystemResizeSuccessful",
                &message,
            );
        }
        Ok(())
    }

    /// Patches the claim's status over the claim it was decided from (a conflict fails the
    /// pass, retried from what is current); returns the claim as written.
    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        patch: &Value,
        action: &'static str,
    ) -> Result<PersistentVolumeClaim, NodeError> {
        let patch = sidecar_kit::patch_ops::merge_at_version(&claim.metadata, patch);
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| NodeError::Api { action, source })
    }
}
