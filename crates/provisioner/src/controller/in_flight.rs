//! Volumes that may exist without a PV: what is known of each (the claim, the request
//! without secrets, where the secret comes from), how one whose claim is gone is deleted, and
//! when one stops being in flight (its PV saved, or certainly not made).

use csi_proto::v1 as csi;

use super::ClaimKey;
use super::intents::Record;
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
    /// Its class is the in-tree plugin's our driver stands in for: the `migrated` label of
    /// the CreateVolume repeated for a claim that is gone, as upstream labels it. Kept in the
    /// intent-log record. A volume taken back from the driver's list is never created again
    /// (its flag is not read): only its DeleteVolume counts, as not migrated.
    pub migrated: bool,
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
            self.migrated,
        )
    }
}
