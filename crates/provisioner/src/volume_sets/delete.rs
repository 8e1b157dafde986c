//! Deleting a set's volumes (scale-down, a deleted set): taken out of the pool before
//! DeleteVolume. A finalizer is added at the version the decision saw and the PV is deleted
//! with that version as precondition, so a claim that binds it meanwhile makes the deletion
//! fail instead of losing its data; DeleteVolume and the finalizers' removal follow, and a
//! crash in between is finished by the next pass (`finish_deletion`).

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use sidecar_kit::{finalizers, patch_ops};

use super::decide::{DeletionEnd, deletion_end};
use super::make::SET_FINALIZER;
use super::sync::SetError;
use crate::controller::Provisioner;
use crate::decide::classify::{DeleteOutcome, classify_delete};
use crate::decide::delete::recorded_secret;
use crate::decide::provision::PV_FINALIZER;

/// Deletes an Available volume of the set: out of the pool at the version decided on,
/// then DeleteVolume, then the PV goes.
pub(crate) async fn delete_member(
    p: &Provisioner,
    pv: &PersistentVolume,
    set: &str,
) -> Result<(), SetError> {
    if let Some(why) = p.cfg.caps.no_dynamic_provisioning {
        return Err(why.into());
    }
    let volume = pv.metadata.name.clone().unwrap_or_default();
    let api: Api<PersistentVolume> = Api::all(p.client.clone());
    let take_out = |source| SetError::TakeOut {
        volume: volume.clone(),
        source,
    };
    let mut ops = vec![patch_ops::test_version(&pv.metadata)];
    ops.extend(finalizers::add_ops(&pv.metadata, SET_FINALIZER).unwrap_or_default());
    let patch = patch_ops::patch(ops);
    let held = api
        .patch(&volume, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(take_out)?;
    let preconditions = Preconditions {
        uid: held.metadata.uid.clone(),
        resource_version: held.metadata.resource_version.clone(),
    };
    let params = DeleteParams {
        preconditions: Some(preconditions),
        ..DeleteParams::default()
    };
    let deleting = match api.delete(&volume, &params).await {
        Ok(either) => match either.left() {
            Some(deleting) => deleting,
            // Gone already: nothing holds it any more (our finalizer did not stick).
            None => return Ok(()),
        },
        Err(source) => {
            // Bound meanwhile (or changed): it stays in the pool, without our finalizer.
            let _ = drop_finalizers(p, &held, &[SET_FINALIZER]).await;
            return Err(take_out(source));
        }
    };
    tracing::info!(set, volume = %volume, "deleting a volume of the set");
    finish_deletion(p, &deleting, set).await
}

/// The second half of a deletion: DeleteVolume (unless a claim bound the volume before it
/// was taken out: then only our finalizer goes), then the finalizers.
pub(crate) async fn finish_deletion(
    p: &Provisioner,
    pv: &PersistentVolume,
    set: &str,
) -> Result<(), SetError> {
    let volume = pv.metadata.name.clone().unwrap_or_default();
    let handle = match deletion_end(pv, &p.cfg.caps.name) {
        DeletionEnd::Claimed => return drop_finalizers(p, pv, &[SET_FINALIZER]).await,
        DeletionEnd::Delete(handle) => handle,
    };
    if let Some(handle) = handle {
        let secret = recorded_secret(pv).flatten();
        // As a PV's deletion: a secret that cannot be read does not keep the volume.
        let secrets = p.secrets_or_none(&volume, secret.as_ref()).await;
        if let Err(source) = p.delete_volume_call(&handle, secrets, false).await
            && classify_delete(Err(source.code)) == DeleteOutcome::Retry
        {
            return Err(SetError::Delete { volume, source });
        }
    }
    drop_finalizers(p, pv, &[SET_FINALIZER, PV_FINALIZER]).await?;
    if let Some(manager) = &p.sets {
        manager.metrics.deleted.with_label_values(&[set]).inc();
    }
    tracing::info!(set, volume = %volume, "deleted a volume of the set");
    Ok(())
}

/// Removes `which` from the PV's finalizers, at the version it was seen at.
async fn drop_finalizers(
    p: &Provisioner,
    pv: &PersistentVolume,
    which: &[&str],
) -> Result<(), SetError> {
    let volume = pv.metadata.name.clone().unwrap_or_default();
    let kept: Vec<&String> = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| !which.contains(&f.as_str()))
        .collect();
    if kept.len() == pv.metadata.finalizers.as_ref().map_or(0, Vec::len) {
        return Ok(());
    }
    let kept: Vec<String> = kept.into_iter().cloned().collect();
    let patch = patch_ops::patch(vec![
        patch_ops::test_version(&pv.metadata),
        patch_ops::replace(&["metadata", "finalizers"], kept),
    ]);
    let finalize = |source| SetError::Finalize {
        volume: volume.clone(),
        source,
    };
    let api: Api<PersistentVolume> = Api::all(p.client.clone());
    match api
        .patch(&volume, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(()),
        Err(source) => Err(finalize(source)),
    }
}
