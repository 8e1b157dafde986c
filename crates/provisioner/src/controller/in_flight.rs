//! Volumes that may exist without a PV: what is known of each (the claim, the request
//! without secrets, where the secret comes from), how one whose claim is gone is deleted, and
//! when one stops being in flight (its PV saved, or certainly not made).

use std::collections::BTreeMap;

use csi_proto::v1 as csi;
use kube::runtime::reflector::ObjectRef;

use super::claims::ClaimError;
use super::intents::Record;
use super::{ClaimKey, Provisioner};
use crate::decide::classify::{CreateOutcome, DeleteOutcome, classify_create, classify_delete};
use crate::decide::secrets::SecretRef;

/// A volume that may exist without a PV.
#[derive(Debug, Clone)]
pub struct InFlight {
    /// The claim it is for.
    pub claim: ClaimKey,
    /// That claim's UID.
    pub claim_uid: String,
    /// The CreateVolume request, without secrets.
    pub request: csi::CreateVolumeRequest,
    /// Where the CreateVolume/DeleteVolume secret comes from.
    pub secret: Option<SecretRef>,
    /// The volume's id, when it was found among the driver's volumes at start (its request
    /// is then only its name: it is deleted by id, never created again from the record).
    pub listed: Option<String>,
    /// With listed volumes, the serial it is marked with.
    pub serial: Option<crate::decide::recovery::Serial>,
}

impl InFlight {
    /// The PersistentVolumeSet the volume is made for, if it is a pool volume (recorded with
    /// the set's name in place of the claim's and no namespace: a claim always has one).
    pub fn pool(&self) -> Option<&str> {
        self.claim
            .namespace()
            .is_none()
            .then_some(self.claim.name())
    }

    /// Its intent-log record (the request without secrets).
    pub fn record(&self) -> Record {
        let secret = self
            .secret
            .as_ref()
            .map(|s| (s.namespace.clone(), s.name.clone()));
        let namespace = self.claim.namespace().unwrap_or_default();
        Record::new(
            namespace,
            self.claim.name(),
            &self.claim_uid,
            &self.request,
            secret,
        )
    }
}

impl Provisioner {
    /// Deletes a volume that may exist for a claim that is gone: repeat the recorded
    /// CreateVolume to learn its id (idempotent by name), then DeleteVolume.
    pub(crate) async fn clean_up(&self, name: &str, flight: &InFlight) -> Result<(), ClaimError> {
        if self.caches.volumes.contains(&ObjectRef::new(name)) {
            // The PV exists: the deletion path owns the volume now.
            self.ledger.settle(name);
            return Ok(());
        }
        let cleanup_error = |source: ClaimError| ClaimError::Cleanup {
            name: name.to_string(),
            source: Box::new(source),
        };
        if let Some(id) = &flight.listed {
            return self
                .clean_up_listed(name, id, flight)
                .await
                .map_err(cleanup_error);
        }
        let secrets = self
            .fetch_secret(flight.secret.as_ref())
            .await
            .map_err(cleanup_error)?;
        // The record must be durable before any CreateVolume, this one included: the attempt
        // that put it in flight may have failed to store it, and a crash after this call
        // would otherwise leave a volume nobody knows of.
        if let Some(log) = self.intent_log() {
            log.record(name, flight.record())
                .await
                .map_err(|e| cleanup_error(ClaimError::Intent(e)))?;
        }
        let mut request = flight.request.clone();
        request.secrets = secrets.clone();
        tracing::info!(
            volume = name,
            "claim is gone while its volume may exist: deleting the volume"
        );
        match self.create_volume(request).await {
            Ok(volume) => {
                let Some(id) = volume.map(|v| v.volume_id).filter(|id| !id.is_empty()) else {
                    self.ledger.settle(name);
                    return Ok(());
                };
                if let Err(error) = self.delete_volume_call(&id, secrets).await
                    && classify_delete(Err(error.code)) == DeleteOutcome::Retry
                {
                    return Err(cleanup_error(ClaimError::Csi(error)));
                }
                self.ledger.settle(name);
                tracing::info!(volume = name, volume_id = %id, "deleted the volume of a deleted claim");
                Ok(())
            }
            Err(error) => match classify_create(Err(error.code), false) {
                CreateOutcome::InBackground | CreateOutcome::Conflict => {
                    Err(cleanup_error(ClaimError::Csi(error)))
                }
                CreateOutcome::Final | CreateOutcome::Reschedule | CreateOutcome::Created => {
                    self.ledger.settle(name);
                    Ok(())
                }
            },
        }
    }

    /// Volumes recorded as possibly existing without a PV (for tests and metrics).
    pub fn in_flight(&self) -> BTreeMap<String, String> {
        self.ledger.summary()
    }
}
