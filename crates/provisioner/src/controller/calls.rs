//! What the provisioner asks of others for a volume: CreateVolume and DeleteVolume of the
//! driver (timed and counted by sidecar-kit's CSI calls), and Secrets, read live.

use std::collections::HashMap;

use csi_proto::v1 as csi;
use sidecar_kit::csi::CallError;

use super::{ClaimError, Provisioner};
use crate::decide::secrets::SecretRef;

impl Provisioner {
    /// CreateVolume; `migrated`: for a class of the in-tree plugin we stand in for.
    pub(crate) async fn create_volume(
        &self,
        request: csi::CreateVolumeRequest,
        migrated: bool,
    ) -> Result<Option<csi::Volume>, CallError> {
        self.dynamic_provisioning("CreateVolume")?;
        let calls = &self.csi_calls;
        let mut client = csi::controller_client::ControllerClient::new(self.csi.clone());
        let response = calls
            .call_for(
                "/csi.v1.Controller/CreateVolume",
                migrated,
                client.create_volume(calls.request(request)),
            )
            .await?;
        // The recoverable-volumes marks are for ListVolumes, not for the PV.
        Ok(response.volume.map(|mut volume| {
            sidecar_kit::recoverable::strip(&mut volume.volume_context);
            volume
        }))
    }

    /// A driver that cannot provision is not asked to create or delete (it would answer
    /// UNIMPLEMENTED, a final error, and an in-flight record whose volume may exist would be
    /// settled): the call fails as one to try again (UNAVAILABLE), in upstream's words, so
    /// every record is kept until a provisioner started against a driver that can settles it.
    /// The recovery paths ask first, before they read a Secret or log that they call.
    pub(crate) fn dynamic_provisioning(&self, method: &'static str) -> Result<(), CallError> {
        match self.cfg.caps.no_dynamic_provisioning {
            Some(why) => Err(CallError {
                method,
                code: tonic::Code::Unavailable,
                message: why.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// DeleteVolume; `migrated`: of an in-tree PV of the plugin we stand in for.
    pub(crate) async fn delete_volume_call(
        &self,
        id: &str,
        secrets: HashMap<String, String>,
        migrated: bool,
    ) -> Result<(), CallError> {
        self.dynamic_provisioning("DeleteVolume")?;
        let calls = &self.csi_calls;
        let mut client = csi::controller_client::ControllerClient::new(self.csi.clone());
        let request = csi::DeleteVolumeRequest {
            volume_id: id.to_string(),
            secrets,
        };
        calls
            .call_for(
                "/csi.v1.Controller/DeleteVolume",
                migrated,
                client.delete_volume(calls.request(request)),
            )
            .await
            .map(|_| ())
    }

    /// The deletion secret of `volume`, or none when it cannot be read: as upstream, a secret
    /// that may be deleted already does not stop a deletion; the driver decides without it.
    pub(crate) async fn secrets_or_none(
        &self,
        volume: &str,
        secret: Option<&SecretRef>,
    ) -> HashMap<String, String> {
        match self.fetch_secret(secret).await {
            Ok(secrets) => secrets,
            Err(error) => {
                tracing::warn!(volume, %error, "deleting the volume without its deletion secret");
                HashMap::new()
            }
        }
    }

    /// Fetches a secret live (never cached, never logged) as CSI wants it: UTF-8 strings.
    pub(crate) async fn fetch_secret(
        &self,
        secret: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, ClaimError> {
        let Some(secret) = secret else {
            return Ok(HashMap::new());
        };
        sidecar_kit::secrets::fetch(&self.client, &secret.namespace, &secret.name)
            .await
            .map_err(|e| ClaimError::Secret {
                namespace: e.namespace,
                name: e.name,
                reason: e.reason,
            })
    }
}
