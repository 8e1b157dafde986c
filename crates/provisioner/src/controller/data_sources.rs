//! The I/O around `decide::data_source`: looking up a clone's source claim and volume, a
//! restore's VolumeSnapshot and VolumeSnapshotContent, ReferenceGrants for sources in other
//! namespaces; the cloning-protection finalizer on a source claim before its clone's
//! CreateVolume, and the controller that removes it once no clone is pending.

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use sidecar_kit::events::EventType;
use sidecar_kit::finalizers;
use sidecar_kit::update::{Updated, update_live};
use sidecar_kit::workqueue::Next;

use super::claims::{ClaimError, reference};
use super::{ClaimKey, Provisioner};
use crate::decide::cloning::{CloningProtection, clones_pending, cloning_protection};
use crate::decide::data_source::{
    SNAPSHOT_GROUP, SourceKind, SourceRef, clone_source, granted, kind_of, snapshot_source,
    source_of,
};

/// What a claim's data source means for its CreateVolume.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// No data source: an empty volume.
    Empty,
    /// A populator's kind: the claim is left to it.
    Populator,
    /// Copy this source; protect this source claim (clones) until the clone is provisioned.
    Copy {
        /// For CreateVolume.
        source: csi::VolumeContentSource,
        /// The source claim of a clone.
        protect: Option<ClaimKey>,
    },
}

fn snapshot_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: SNAPSHOT_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{SNAPSHOT_GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn reference_grants() -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "gateway.networking.k8s.io/v1beta1".into(),
        kind: "ReferenceGrant".into(),
        plural: "referencegrants".into(),
    }
}

fn lookup(what: &'static str) -> impl FnOnce(kube::Error) -> ClaimError {
    move |source| ClaimError::SourceLookup { what, source }
}

fn as_json(object: DynamicObject) -> Result<Value, ClaimError> {
    serde_json::to_value(object).map_err(|e| ClaimError::SourceLookup {
        what: "snapshot object",
        source: kube::Error::SerdeError(e),
    })
}

/// Resolves a claim's data source, with every check upstream makes before CreateVolume, and
/// the MODIFY_VOLUME capability check upstream makes once the source's kind is known.
pub(crate) async fn resolve(
    p: &Provisioner,
    claim: &PersistentVolumeClaim,
    class_name: &str,
) -> Result<Resolved, ClaimError> {
    // Upstream checks the driver's capabilities once it knows the source's kind, before
    // looking the source up: dynamic provisioning at all, then snapshots or clones (by
    // `kind_of`), then MODIFY_VOLUME for a claim naming a VolumeAttributesClass.
    let dynamic = || match p.cfg.caps.no_dynamic_provisioning {
        Some(why) => Err(crate::decide::provision::ProvisionError::from(why)),
        None => Ok(()),
    };
    let modify = || {
        crate::decide::provision::check_modify_volume(
            &p.cfg.caps,
            claim,
            p.cfg.options.attributes_classes,
        )
    };
    let Some(source) = source_of(claim, p.cfg.cross_namespace)? else {
        dynamic()?;
        modify()?;
        return Ok(Resolved::Empty);
    };
    let claim_namespace = claim.metadata.namespace.clone().unwrap_or_default();
    if source.namespace != claim_namespace {
        let api: Api<DynamicObject> =
            Api::namespaced_with(p.client.clone(), &source.namespace, &reference_grants());
        let grants: Vec<Value> = api
            .list(&Default::default())
            .await
            .map_err(lookup("ReferenceGrants"))?
            .items
            .into_iter()
            .map(as_json)
            .collect::<Result<_, _>>()?;
        if !granted(&grants, &claim_namespace, &source) {
            return Err(crate::decide::data_source::DataSourceError::NotGranted {
                source_namespace: source.namespace.clone(),
                source_name: source.name.clone(),
                kind: source.kind.clone(),
                claim: format!(
                    "{claim_namespace}/{}",
                    claim.metadata.name.as_deref().unwrap_or_default()
                ),
            }
            .into());
        }
    }
    let caps = &p.cfg.caps;
    // A populator's claim is left to it whatever the driver can do, as upstream leaves it.
    if kind_of(claim, &source, true, true)? != SourceKind::Populator {
        dynamic()?;
    }
    match kind_of(
        claim,
        &source,
        caps.clone_volume,
        caps.create_delete_snapshot,
    )? {
        SourceKind::Populator => {
            p.csi_layer_recorder.record(
                &reference(claim),
                EventType::Normal,
                "Provisioning",
                "Assuming an external populator will provision the volume",
            );
            Ok(Resolved::Populator)
        }
        SourceKind::Clone => {
            modify()?;
            clone_of(p, claim, &source).await
        }
        SourceKind::Snapshot => {
            modify()?;
            let content = restore_of(p, claim, &source, class_name).await?;
            Ok(Resolved::Copy {
                source: content,
                protect: None,
            })
        }
    }
}

async fn clone_of(
    p: &Provisioner,
    claim: &PersistentVolumeClaim,
    source: &SourceRef,
) -> Result<Resolved, ClaimError> {
    let key = ClaimKey::new(Some(&source.namespace), &source.name);
    let source_claim = p.caches.claims.get(&key);
    let volume_name = source_claim
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    // From the cache (it keeps every field the checks read); upstream GETs it on every
    // pass. A cache behind by one event makes the check fail once and the claim retry.
    let volume = volume_name.and_then(|name| p.caches.volumes.get(&ObjectRef::new(&name)));
    let content = clone_source(
        claim,
        source,
        source_claim.as_deref(),
        volume.as_deref(),
        &p.cfg.caps.name,
        already_sent(p, claim),
    )?;
    Ok(Resolved::Copy {
        source: content,
        protect: Some(key),
    })
}

async fn restore_of(
    p: &Provisioner,
    claim: &PersistentVolumeClaim,
    source: &SourceRef,
    class_name: &str,
) -> Result<csi::VolumeContentSource, ClaimError> {
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        p.client.clone(),
        &source.namespace,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let snapshot = snapshots
        .get_opt(&source.name)
        .await
        .map_err(lookup("the VolumeSnapshot"))?
        .map(as_json)
        .transpose()?;
    let content_name = snapshot
        .as_ref()
        .and_then(|s| s.pointer("/status/boundVolumeSnapshotContentName"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let content = match content_name {
        Some(name) => {
            let contents: Api<DynamicObject> = Api::all_with(
                p.client.clone(),
                &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
            );
            contents
                .get_opt(&name)
                .await
                .map_err(lookup("the VolumeSnapshotContent"))?
                .map(as_json)
                .transpose()?
        }
        None => None,
    };
    Ok(snapshot_source(
        claim,
        source,
        snapshot.as_ref(),
        content.as_ref(),
        &p.cfg.caps.name,
        class_name,
        p.cfg.prevent_volume_mode_conversion,
        already_sent(p, claim),
    )?)
}

/// Whether this claim's CreateVolume was sent before (its volume is in the intent log).
fn already_sent(p: &Provisioner, claim: &PersistentVolumeClaim) -> bool {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    p.ledger.contains(&p.cfg.options.naming.pv_name(&uid))
}

/// Adds the cloning-protection finalizer to a clone's source claim (before CreateVolume):
/// read live and written back whole (`update`, as upstream's RBAC grants; the cached claim
/// is trimmed).
pub(crate) async fn protect_clone_source(
    p: &Provisioner,
    key: &ClaimKey,
) -> Result<(), ClaimError> {
    let finalizer = sidecar_kit::vocabulary::CLONING_PROTECTION_FINALIZER;
    let Some(source) = p.caches.claims.get(key) else {
        return Ok(());
    };
    if finalizers::has(&source.metadata, finalizer) {
        return Ok(());
    }
    let namespace = key.namespace().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(p.client.clone(), namespace);
    match update_live(&api, key.name(), |claim| {
        finalizers::add(&mut claim.metadata, finalizer)
    })
    .await
    .map_err(ClaimError::CloneFinalizer)?
    {
        Updated::Written(_) | Updated::Unchanged(_) => Ok(()),
        Updated::Gone => Err(ClaimError::CloneSourceGone(key.to_string())),
    }
}

/// The cloning-protection controller's reconcile: a source claim being deleted loses its
/// finalizer once no clone of it is pending.
pub(crate) async fn sync_clone_source(p: &Provisioner, key: &ClaimKey) -> Result<Next, ClaimError> {
    let Some(claim) = p.caches.claims.get(key) else {
        return Ok(Next::Done);
    };
    // Looked at only for a source being deleted with the finalizer (most passes are not).
    let pending = |namespace: &str, name: &str| {
        let handle = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .and_then(|pv| p.caches.volumes.get(&ObjectRef::new(&pv)))
            .and_then(|pv| {
                pv.spec
                    .as_ref()?
                    .csi
                    .as_ref()
                    .map(|c| c.volume_handle.clone())
            });
        let clones: Vec<_> = p
            .caches
            .clones
            .of(namespace, name)
            .iter()
            .filter_map(|clone| p.caches.claims.get(&ClaimKey::new(Some(namespace), clone)))
            .collect();
        handle.is_some_and(|h| p.ledger.copying_from(&h))
            || clones_pending(name, namespace, clones.iter().map(|c| c.as_ref()))
    };
    match cloning_protection(&claim, pending) {
        CloningProtection::Nothing => Ok(Next::Done),
        CloningProtection::Wait => {
            // Info: why a claim's deletion does not finish is worth a line per retry.
            tracing::info!(claim = %key, "cloning in progress; keeping the cloning-protection finalizer");
            Ok(Next::Retry)
        }
        CloningProtection::Release => {
            let namespace = key.namespace().unwrap_or_default();
            let api = Api::<PersistentVolumeClaim>::namespaced(p.client.clone(), namespace);
            let finalizer = sidecar_kit::vocabulary::CLONING_PROTECTION_FINALIZER;
            let result = update_live(&api, key.name(), |claim| {
                finalizers::remove(&mut claim.metadata, finalizer)
            })
            .await
            .map_err(ClaimError::CloneFinalizer)?;
            if matches!(result, Updated::Written(_)) {
                tracing::info!(claim = %key, "cloning-protection finalizer removed");
            }
            Ok(Next::Done)
        }
    }
}
