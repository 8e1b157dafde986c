//! One pass of the set manager over a set, carrying out the decisions with the provisioner's
//! driver connection, intent log and caches.
//!
//! Never a leaked volume, never past the maximum:
//! - a new volume is put in flight by the set's pass and made by a create worker (its own
//!   queue, `--volume-set-creates` workers): recorded in the intent log, or marked for listing
//!   (as a claim's would be, the set in place of the claim), before CreateVolume, it counts
//!   towards the maximum from then until its PV is gone. A failed attempt is retried with the
//!   same name (CreateVolume is idempotent by name); if the set is gone, the volume is deleted
//!   instead, and so is one found among the driver's volumes at start (the set makes another).
//! - a volume is taken out of the pool before DeleteVolume: a finalizer is added at the version
//!   the decision saw and the PV is deleted with that version as precondition, so a claim that
//!   bound it meanwhile makes the deletion fail instead of losing its data. DeleteVolume and
//!   the finalizer's removal follow; a crash in between is finished by the next pass.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::workqueue::Next;

use super::decide::{being_made, deletable_by, leftovers, member_token, members, plan, unfinished};
use super::make::{MakeError, member_pv, plan_member, static_member_pv, volume_name};
use super::status::{should_write, status};
use super::types::{LABEL_SET, PersistentVolumeSet};
use crate::controller::{InFlight, Provisioner};
use crate::decide::classify::{CreateOutcome, classify_create};
use crate::decide::provision::{ResponseError, create_request};

/// Why a pass over a set failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// The template's class is not there (yet).
    #[error("storageclass.storage.k8s.io {0:?} not found")]
    ClassNotFound(String),
    /// The class cannot make the set's volumes.
    #[error(transparent)]
    Plan(#[from] MakeError),
    /// The CreateVolume secret.
    #[error("failed to read the secret for CreateVolume: {0}")]
    Secret(#[source] Box<crate::controller::ClaimError>),
    /// The intent log.
    #[error(transparent)]
    Intent(#[from] crate::controller::intents::IntentError),
    /// CreateVolume failed.
    #[error("CreateVolume of {volume} failed: {}", source.status_text())]
    Create {
        /// The volume.
        volume: String,
        /// The driver's refusal.
        source: sidecar_kit::csi::CallError,
    },
    /// The driver's answer cannot be used (the volume was deleted again).
    #[error("volume {volume}: {source}")]
    Response {
        /// The volume.
        volume: String,
        /// What is wrong with the driver's answer.
        source: ResponseError,
    },
    /// Writing the PV failed.
    #[error("failed to create PersistentVolume {name}: {source}")]
    SavePv {
        /// The PV.
        name: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// Undoing an in-flight volume of a deleted set failed.
    #[error("failed to delete volume {volume} of a deleted set: {source}")]
    Undo {
        /// The volume.
        volume: String,
        /// Why DeleteVolume, or the secret it needs, failed.
        source: Box<crate::controller::ClaimError>,
    },
    /// The driver cannot create or delete volumes: a volume stays in the pool rather than be
    /// taken out for a deletion that cannot happen, and one in flight stays in flight.
    #[error(transparent)]
    NoDynamicProvisioning(#[from] crate::decide::provision::NoDynamicProvisioning),
    /// Taking a volume out of the pool failed (a claim may have bound it meanwhile).
    #[error("failed to take volume {volume} out of the pool: {source}")]
    TakeOut {
        /// The volume.
        volume: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// DeleteVolume failed.
    #[error("DeleteVolume of {volume} failed: {source}")]
    Delete {
        /// The volume.
        volume: String,
        /// The driver's error.
        source: sidecar_kit::csi::CallError,
    },
    /// Removing the finalizer of a deleted volume failed.
    #[error("failed to remove the finalizer of volume {volume}: {source}")]
    Finalize {
        /// The volume.
        volume: String,
        /// The API server's error.
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("failed to write the status of PersistentVolumeSet {set}: {source}")]
    Status {
        /// The set.
        set: String,
        /// The API server's error.
        source: kube::Error,
    },
}

impl SetError {
    /// Whether the set's owner should hear of it (an event on the set).
    fn event_worthy(&self) -> bool {
        match self {
            SetError::ClassNotFound(_)
            | SetError::Plan(_)
            | SetError::Secret(_)
            | SetError::Create { .. }
            | SetError::Response { .. }
            | SetError::Delete { .. }
            | SetError::NoDynamicProvisioning(_) => true,
            SetError::Intent(_)
            | SetError::SavePv { .. }
            | SetError::Undo { .. }
            | SetError::TakeOut { .. }
            | SetError::Finalize { .. }
            | SetError::Status { .. } => false,
        }
    }
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// One pass over a set.
pub(crate) async fn sync_set(p: &Provisioner, name: &str) -> Result<Next, SetError> {
    let result = sync_set_once(p, name).await;
    if let Err(error) = &result
        && let Some(set) = p
            .sets
            .as_ref()
            .and_then(|m| m.sets.get(&ObjectRef::new(name)))
    {
        report_on_set(p, &set, error);
    }
    result
}

/// A `ProvisioningFailed` event on the set, for the failures its owner can act on.
fn report_on_set(p: &Provisioner, set: &PersistentVolumeSet, error: &SetError) {
    if error.event_worthy() {
        p.recorder.record(
            &reference(set),
            EventType::Warning,
            "ProvisioningFailed",
            &error.to_string(),
        );
    }
}

async fn sync_set_once(p: &Provisioner, name: &str) -> Result<Next, SetError> {
    let Some(manager) = p.sets.as_ref() else {
        return Ok(Next::Done);
    };
    let set = manager.sets.get(&ObjectRef::new(name));
    // A new volume is in flight, then made, then in the index: read in that order, each
    // volume is seen at least once; seen twice, it is counted once (by name).
    let pending = p.ledger.of_pool(name);
    // Cached PVs are decoded on each read: the set's candidates come from its own index.
    let view = manager.view(name, set.as_deref(), |volume| {
        p.caches.volumes.contains(&ObjectRef::new(volume))
    });
    let volumes = view.volumes.unwrap_or_else(|| p.caches.volumes.state());
    let members: Vec<&PersistentVolume> = match &set {
        Some(set) => members(set, volumes.iter().map(AsRef::as_ref)),
        None => volumes
            .iter()
            .map(AsRef::as_ref)
            .filter(|pv| label(pv, LABEL_SET) == Some(name))
            .collect(),
    };
    // Deletions started by an earlier pass (or process) finish first.
    for pv in unfinished(&members) {
        super::delete::finish_deletion(p, pv, name).await?;
    }
    let Some(set) = set else {
        // Its volumes in flight are deleted by their create workers (the set is gone).
        for (volume, _) in pending {
            manager.creates.add(volume);
        }
        // Its unused volumes go with the set, by their reclaim policy.
        for pv in leftovers(&members) {
            super::delete::delete_member(p, pv, name).await?;
        }
        manager.forget(name);
        return Ok(Next::Done);
    };
    let creating = being_made(
        pending.iter().map(|(volume, _)| volume.as_str()),
        view.unseen.iter().map(String::as_str),
        &members,
    );
    let decided = plan(&set, &members, creating, p.cfg.volume_set_creates, |pv| {
        deletable_by(pv, &p.cfg.caps.name, name)
    });
    manager.gauges(name, &decided.status, &members);
    let busy = decided.create > 0 || !decided.delete.is_empty() || !pending.is_empty();
    let new_status = status(&set, &decided, sidecar_kit::vocabulary::now());
    if should_write(&set, &new_status, busy) {
        write_status(p, name, &new_status).await?;
    }
    if let Some(why) = &decided.invalid {
        tracing::warn!(set = name, reason = %why, "the set's spec cannot be served");
        return Ok(Next::Done);
    }
    for victim in &decided.delete {
        if let Some(pv) = members
            .iter()
            .find(|pv| pv.metadata.name.as_deref() == Some(victim.as_str()))
        {
            super::delete::delete_member(p, pv, name).await?;
        }
    }
    if decided.create > 0 {
        if let Some(wait) = manager.waiting(name) {
            return Ok(Next::After(wait));
        }
        if decided.objects_only {
            make_static(p, &set, decided.create).await?;
        } else {
            for _ in 0..decided.create {
                create_member(p, &set)?;
            }
        }
    }
    Ok(Next::Done)
}

async fn write_status(
    p: &Provisioner,
    name: &str,
    status: &super::types::PersistentVolumeSetStatus,
) -> Result<(), SetError> {
    let api: Api<PersistentVolumeSet> = Api::all(p.client.clone());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(|source| SetError::Status {
        set: name.to_string(),
        source,
    })?;
    Ok(())
}

/// Creates `count` static volumes of the set: PersistentVolume objects from its template, with
/// nothing to make in any storage (a failed create leaves nothing behind; the next pass counts
/// again).
async fn make_static(
    p: &Provisioner,
    set: &PersistentVolumeSet,
    count: usize,
) -> Result<(), SetError> {
    let Some(manager) = &p.sets else {
        return Ok(());
    };
    let name = set.metadata.name.clone().unwrap_or_default();
    let api: Api<PersistentVolume> = Api::all(p.client.clone());
    for _ in 0..count {
        let volume = volume_name(&name, &uuid::Uuid::new_v4());
        let pv = static_member_pv(set, &volume);
        // Noted before the write, as for a provisioned volume (its event ends the note).
        manager.made(&name, &volume);
        if let Err(source) = api.create(&PostParams::default(), &pv).await {
            manager.unmade(&volume);
            return Err(SetError::SavePv {
                name: volume,
                source,
            });
        }
        manager.metrics.created.with_label_values(&[&name]).inc();
        tracing::info!(set = %name, volume, "static volume made for the set");
    }
    Ok(())
}

/// Puts a new volume of the set in flight and hands it to a create worker.
fn create_member(p: &Provisioner, set: &Arc<PersistentVolumeSet>) -> Result<(), SetError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let class = template_class(p, set)?;
    let token = uuid::Uuid::new_v4();
    let volume = volume_name(&name, &token);
    let plan = plan_member(&p.cfg.caps, &p.cfg.options, set, &class, &volume, &token)?;
    let claim = crate::controller::ClaimKey::cluster(&name);
    let flight = InFlight {
        claim,
        claim_uid: token.to_string(),
        request: create_request(&plan, HashMap::new(), None),
        secret: plan.provisioner_secret.clone(),
        listed: None,
        serial: None,
        migrated: false,
    };
    p.ledger.open(&volume, flight, p.listing.get());
    if let Some(manager) = &p.sets {
        manager.creates.add(volume);
    }
    Ok(())
}

/// A create worker's pass over an in-flight volume of a set: made (CreateVolume, then its
/// PV), or deleted when its set is gone. A failure is retried with the key's backoff, and
/// the set waits before it puts more in flight.
pub(crate) async fn sync_member(p: &Provisioner, volume: &str) -> Result<Next, SetError> {
    let Some(manager) = p.sets.as_ref() else {
        return Ok(Next::Done);
    };
    let Some(flight) = p.ledger.get(volume) else {
        return Ok(Next::Done);
    };
    let Some(name) = flight.pool().map(str::to_string) else {
        return Ok(Next::Done);
    };
    // A listed volume of a set is not made again from its name alone, nor one whose record
    // lost its token (the stand-in claim's UID): it is deleted, and the set makes another.
    let set = manager.sets.get(&ObjectRef::new(&name));
    let token = member_token(set.is_some(), flight.listed.is_some(), &flight.claim_uid);
    let (Some(set), Some(token)) = (set, token) else {
        crate::controller::recovery::clean_up(p, volume, &flight)
            .await
            .map_err(|source| SetError::Undo {
                volume: volume.to_string(),
                source: Box::new(source),
            })?;
        // It no longer counts towards the set's maximum: the set's pass may make another
        // (nothing else queues it: the volume never had a PV).
        manager.queue.add(name);
        return Ok(Next::Done);
    };
    match finish_member(p, &set, volume, &flight, &token).await {
        Ok(()) => {
            manager.creation_succeeded(&name);
            // The set's pass that the new PV's event started may have run while this volume
            // was still in flight (busy: no status written); one more pass sees it at rest.
            manager.queue.add(name);
            Ok(Next::Done)
        }
        Err(error) => {
            manager.creation_failed(&name);
            report_on_set(p, &set, &error);
            Err(error)
        }
    }
}

fn template_class(
    p: &Provisioner,
    set: &PersistentVolumeSet,
) -> Result<Arc<k8s_openapi::api::storage::v1::StorageClass>, SetError> {
    let class_name = set
        .spec
        .template
        .spec
        .storage_class_name
        .clone()
        .unwrap_or_default();
    p.caches
        .classes
        .get(&ObjectRef::new(&class_name))
        .ok_or(SetError::ClassNotFound(class_name))
}

/// Makes an in-flight volume of the set: the record is made durable (with the intent log),
/// CreateVolume (again, with the recorded name: idempotent), then the PV.
async fn finish_member(
    p: &Provisioner,
    set: &PersistentVolumeSet,
    volume: &str,
    flight: &InFlight,
    token: &uuid::Uuid,
) -> Result<(), SetError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    if p.caches.volumes.contains(&ObjectRef::new(volume)) {
        p.ledger.settle(volume);
        return Ok(());
    }
    // A driver that cannot create: the record stays (retried with backoff), its secret
    // unread, the set told in upstream's words.
    if let Some(why) = p.cfg.caps.no_dynamic_provisioning {
        return Err(why.into());
    }
    if let Some(log) = p.intent_log() {
        log.record(volume, flight.record()).await?;
    }
    let secrets = p
        .fetch_secret(flight.secret.as_ref())
        .await
        .map_err(|e| SetError::Secret(Box::new(e)))?;
    let mut request = flight.request.clone();
    request.secrets = secrets.clone();
    tracing::info!(set = %name, volume, "calling CreateVolume for the set");
    let created = match p.create_volume(request, false).await {
        Ok(created) => created,
        Err(error) => {
            match classify_create(Err(error.code), false) {
                CreateOutcome::Final | CreateOutcome::Reschedule => p.ledger.settle(volume),
                CreateOutcome::InBackground | CreateOutcome::Conflict | CreateOutcome::Created => {}
            }
            return Err(SetError::Create {
                volume: volume.to_string(),
                source: error,
            });
        }
    };
    let class = template_class(p, set)?;
    let plan = plan_member(&p.cfg.caps, &p.cfg.options, set, &class, volume, token)?;
    let pv = match member_pv(
        set,
        &plan,
        &p.cfg.caps,
        &p.cfg.options,
        created.as_ref(),
        &p.cfg.identity,
    ) {
        Ok(pv) => pv,
        Err(source) => {
            p.discard(volume, created.as_ref(), secrets).await;
            return Err(SetError::Response {
                volume: volume.to_string(),
                source,
            });
        }
    };
    // Noted before the PV is written, so that its delete event (which ends the note) comes
    // after the note: a note taken after it would count a volume a pass deleted meanwhile.
    if let Some(manager) = &p.sets {
        manager.made(&name, volume);
    }
    let api: Api<PersistentVolume> = Api::all(p.client.clone());
    match api.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        // An earlier pass wrote it (names are random: nobody else has this one).
        Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
        Err(source) => {
            if let Some(manager) = &p.sets {
                manager.unmade(volume);
            }
            return Err(SetError::SavePv {
                name: volume.to_string(),
                source,
            });
        }
    }
    if let Some(manager) = &p.sets {
        manager.metrics.created.with_label_values(&[&name]).inc();
    }
    p.ledger.settle(volume);
    p.retained(&pv);
    tracing::info!(set = %name, volume, "volume made for the set");
    Ok(())
}
