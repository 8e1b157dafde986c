//! Before any CreateVolume, what a crashed predecessor left in flight is found and finished or
//! undone ([`crate::decide::recovery`] says how):
//! - the intent log's records, always (records written before a switch to listed volumes
//!   are finished and forgotten as before);
//! - the driver's volumes marked with this cluster's identity that have no PV and whose serial
//!   is not settled (with listed volumes; and, when the driver follows the
//!   convention, after a switch back to the intent log too): the claim's worker provisions
//!   them (CreateVolume finds the volume by name), or deletes them when the claim is gone,
//!   after reading the PV and the claim live; a set's volume goes back to its set's create
//!   worker, which deletes it (the set makes another).
use std::collections::HashSet;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::csi::CallError;

use super::intents::IntentLog;
use super::listing::{Found, Listing, ListingError};
use super::{ClaimError, ClaimKey, InFlight, Provisioner};
use crate::decide::classify::{CreateOutcome, DeleteOutcome, classify_create, classify_delete};
use crate::decide::recovery::{self, Listed, Recovery, Settled};
use crate::decide::secrets::SecretRef;

/// Entries asked for per ListVolumes page.
const LIST_PAGE: i32 = 500;

/// Why the driver's volumes could not be taken back (retried every second).
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The listed volumes' Lease could not be read or written.
    #[error("failed to learn this cluster's identity and settled mark: {0}")]
    Identity(#[source] ListingError),
    /// A ListVolumes call failed.
    #[error("failed to list the driver's volumes: {0}")]
    List(#[source] CallError),
    /// The driver answered with a page token it had given before.
    #[error("failed to list the driver's volumes: the page token {0:?} came back twice")]
    TokenLoop(String),
}

impl InFlight {
    /// A listed volume of this cluster, in flight until its claim's worker settles it.
    pub(crate) fn listed(listed: Listed) -> (String, InFlight) {
        let flight = InFlight {
            claim: listed.claim,
            claim_uid: listed.claim_uid,
            request: csi::CreateVolumeRequest {
                name: listed.name.clone(),
                ..Default::default()
            },
            secret: listed.secret,
            listed: Some(listed.volume_id),
            serial: Some(listed.serial),
            migrated: false,
        };
        (listed.name, flight)
    }
}

/// The start-up step: reads the intent log (retrying until it reads), then the driver's
/// volumes when volumes are or were marked for listing (retrying until they list).
pub(crate) async fn recover(p: &Provisioner) {
    let (ns, name) = p.cfg.intent_log.clone();
    let log = loop {
        match IntentLog::open(p.client.clone(), &ns, &name).await {
            Ok(log) => break log,
            Err(error) => {
                tracing::warn!(%error, "cannot read the intent log yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let recovered = log.records();
    for (volume, record) in &recovered {
        let Some(request) = record.request() else {
            continue;
        };
        let flight = InFlight {
            claim: ClaimKey::new(Some(&record.namespace), &record.name),
            claim_uid: record.uid.clone(),
            request,
            secret: record
                .secret()
                .map(|(namespace, name)| SecretRef { name, namespace }),
            listed: None,
            serial: None,
            migrated: record.migrated,
        };
        take_back(p, volume.clone(), flight);
    }
    if !recovered.is_empty() {
        tracing::info!(
            volumes = recovered.len(),
            "recovered in-flight volumes from the intent log"
        );
    }
    p.ledger.keep_intents(log);
    loop {
        match take_back_listed(p).await {
            Ok(Some(taken)) => {
                tracing::info!(
                    volumes = taken,
                    "listed the driver's volumes: took back this cluster's without a PV"
                );
                return;
            }
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, "cannot list the driver's volumes yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Puts a volume in flight and queues whoever settles it: a set's create worker for a set's
/// volume, else the claim's worker.
fn take_back(p: &Provisioner, volume: String, flight: InFlight) {
    let queue_set = flight.pool().is_some() && p.sets.is_some();
    let (claim, set_volume) = (flight.claim.clone(), volume.clone());
    p.ledger.take_back(volume, flight);
    match &p.sets {
        Some(sets) if queue_set => sets.creates.add_now(set_volume),
        // Without the set manager, the claim path deletes a set's volume (no claim has it).
        Some(_) | None => p.claims.add_now(claim),
    }
}

/// With listed volumes, starts the Lease (identity, this start's epoch); else reads it, if
/// a run with listed volumes left one and the driver still lists their marks. Then lists
/// the driver's volumes page by page and takes back those marked with the identity, not
/// settled, that have no PV in the cache. Returns how many (None when nothing was listed).
async fn take_back_listed(p: &Provisioner) -> Result<Option<usize>, RecoveryError> {
    let (namespace, name) = &p.cfg.listed_lease;
    let found = if p.cfg.recovery == Recovery::ListVolumes {
        if p.listing.get().is_none() {
            let listing = Listing::start(p.client.clone(), namespace, name)
                .await
                .map_err(RecoveryError::Identity)?;
            tracing::info!(
                lease = %name,
                settled = %listing.found.settled.mark,
                unsettled = listing.found.settled.unsettled.len(),
                "marking volumes for listing"
            );
            let _ = p.listing.set(listing);
        }
        p.listing.get().map(|l| l.found.clone())
    } else {
        let found = Listing::peek(p.client.clone(), namespace, name)
            .await
            .map_err(RecoveryError::Identity)?;
        if found.is_some() && !p.cfg.caps.recoverable {
            tracing::warn!(
                lease = %name,
                "volumes were marked for listing by an earlier run, and the driver no longer follows the recoverable-volumes convention: any of them left without a PV at a crash cannot be found"
            );
            return Ok(None);
        }
        found
    };
    let Some(Found { identity, settled }) = found else {
        return Ok(None);
    };
    let mut client = csi::controller_client::ControllerClient::new(p.csi.clone());
    let calls = &p.csi_calls;
    let (mut token, mut seen, mut taken) = (String::new(), HashSet::new(), 0);
    loop {
        let request = csi::ListVolumesRequest {
            max_entries: LIST_PAGE,
            starting_token: token.clone(),
        };
        let page = calls
            .call(
                "/csi.v1.Controller/ListVolumes",
                client.list_volumes(calls.request(request)),
            )
            .await
            .map_err(RecoveryError::List)?;
        for volume in page.entries.iter().filter_map(|e| e.volume.as_ref()) {
            let Some(listed) = recovery::listed(volume, &identity) else {
                continue;
            };
            if !settled.may_be_in_flight(listed.serial) {
                // It had a PV, deleted without DeleteVolume: kept on purpose.
                continue;
            }
            let known = p.caches.volumes.contains(&ObjectRef::new(&listed.name))
                || p.ledger.contains(&listed.name);
            if !known {
                let (name, flight) = InFlight::listed(listed);
                take_back(p, name, flight);
                taken += 1;
            }
        }
        if page.next_token.is_empty() {
            return Ok(Some(taken));
        }
        if !seen.insert(page.next_token.clone()) {
            return Err(RecoveryError::TokenLoop(page.next_token));
        }
        token = page.next_token;
    }
}

/// The settled mark's queue: writes what is settled when it changed (after a PV that outlives its
/// volume's deletion, `Retain`, was saved or seen).
pub(crate) async fn write_settled(
    p: &Provisioner,
) -> Result<sidecar_kit::workqueue::Next, ListingError> {
    let Some(listing) = p.listing.get() else {
        return Ok(sidecar_kit::workqueue::Next::Done);
    };
    let settled = Settled::now(p.ledger.serials(), listing.next_serial());
    if listing.settle(&settled).await? {
        tracing::debug!(
            settled = %settled.mark,
            unsettled = settled.unsettled.len(),
            "settled mark written"
        );
    }
    Ok(sidecar_kit::workqueue::Next::Done)
}

/// Deletes a volume that may exist for a claim that is gone: repeat the recorded
/// CreateVolume to learn its id (idempotent by name), then DeleteVolume.
pub(crate) async fn clean_up(
    p: &Provisioner,
    name: &str,
    flight: &InFlight,
) -> Result<(), ClaimError> {
    if p.caches.volumes.contains(&ObjectRef::new(name)) {
        // The PV exists: the deletion path owns the volume now.
        p.ledger.settle(name);
        return Ok(());
    }
    let cleanup_error = |source: ClaimError| ClaimError::Cleanup {
        name: name.to_string(),
        source: Box::new(source),
    };
    if let Some(id) = &flight.listed {
        return clean_up_listed(p, name, id, flight)
            .await
            .map_err(cleanup_error);
    }
    // Nothing to ask a driver that cannot create (the record is kept, retried with backoff):
    // neither its secret read nor a line logged at each try.
    p.dynamic_provisioning("CreateVolume")
        .map_err(|e| cleanup_error(ClaimError::Csi(e)))?;
    let secrets = p
        .fetch_secret(flight.secret.as_ref())
        .await
        .map_err(cleanup_error)?;
    // The record must be durable before any CreateVolume, this one included: the attempt
    // that put it in flight may have failed to store it, and a crash after this call
    // would otherwise leave a volume nobody knows of.
    if let Some(log) = p.intent_log() {
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
    match p.create_volume(request, flight.migrated).await {
        Ok(volume) => {
            let Some(id) = volume.map(|v| v.volume_id).filter(|id| !id.is_empty()) else {
                p.ledger.settle(name);
                return Ok(());
            };
            if let Err(error) = p.delete_volume_call(&id, secrets, false).await
                && classify_delete(Err(error.code)) == DeleteOutcome::Retry
            {
                return Err(cleanup_error(ClaimError::Csi(error)));
            }
            p.ledger.settle(name);
            tracing::info!(volume = name, volume_id = %id, "deleted the volume of a deleted claim");
            Ok(())
        }
        Err(error) => match classify_create(Err(error.code), false) {
            CreateOutcome::InBackground | CreateOutcome::Conflict => {
                Err(cleanup_error(ClaimError::Csi(error)))
            }
            CreateOutcome::Final | CreateOutcome::Reschedule | CreateOutcome::Created => {
                p.ledger.settle(name);
                Ok(())
            }
        },
    }
}

/// Deletes a listed volume whose claim (or set) is gone. The PV and the claim are read live
/// first: a predecessor may have saved the PV, or a claim the cache has not seen yet may
/// own the volume.
pub(crate) async fn clean_up_listed(
    p: &Provisioner,
    name: &str,
    volume_id: &str,
    flight: &InFlight,
) -> Result<(), ClaimError> {
    let recheck =
        |what: &'static str| move |source: kube::Error| ClaimError::Recheck { what, source };
    let pvs: Api<PersistentVolume> = Api::all(p.client.clone());
    if pvs
        .get_opt(name)
        .await
        .map_err(recheck("PersistentVolume"))?
        .is_some()
    {
        p.ledger.settle(name);
        return Ok(());
    }
    if let Some(namespace) = flight.claim.namespace() {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(p.client.clone(), namespace);
        let live = claims
            .get_opt(flight.claim.name())
            .await
            .map_err(recheck("PersistentVolumeClaim"))?;
        if live.is_some_and(|claim| {
            claim.metadata.uid.as_deref() == Some(flight.claim_uid.as_str())
                && claim.metadata.deletion_timestamp.is_none()
        }) {
            // The claim is there after all: its worker provisions when the cache shows it
            // (its watch event queues it), and CreateVolume finds this volume by name.
            return Ok(());
        }
    }
    p.dynamic_provisioning("DeleteVolume")?;
    // As a PV's deletion: a secret that cannot be read does not keep the volume.
    let secrets = p.secrets_or_none(name, flight.secret.as_ref()).await;
    tracing::info!(
        volume = name,
        volume_id,
        "the claim of a listed volume is gone: deleting the volume"
    );
    if let Err(error) = p.delete_volume_call(volume_id, secrets, false).await
        && classify_delete(Err(error.code)) == DeleteOutcome::Retry
    {
        return Err(ClaimError::Csi(error));
    }
    p.ledger.settle(name);
    tracing::info!(
        volume = name,
        volume_id,
        "deleted the listed volume of a deleted claim"
    );
    Ok(())
}
