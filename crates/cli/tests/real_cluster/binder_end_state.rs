//! The binder differential's end state: claims, volumes, the binder's annotations and the
//! events it records, with generated names normalised.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use serde_json::{Value, json};

use super::BINDER_ANNOTATIONS;
use crate::bed::Bed;

/// A generated name (`pvc-<uid>`) as the claim it is for.
fn normal_volume(name: &str, pvs: &[PersistentVolume]) -> String {
    if !name.starts_with("pvc-") {
        return name.to_string();
    }
    pvs.iter()
        .find(|pv| pv.metadata.name.as_deref() == Some(name))
        .and_then(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.name.clone())
        .map_or_else(|| "pvc-?".to_string(), |claim| format!("pvc-for-{claim}"))
}

fn binder_annotations(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| BINDER_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The end state, names normalised: each claim and volume with its phase, binding and the
/// binder's annotations, and the events (object, type, reason, message) the binder records.
pub(super) async fn end_state(bed: &Bed) -> BTreeMap<String, Value> {
    let pvs = Api::<PersistentVolume>::all(bed.admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let claims = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut state = BTreeMap::new();
    for claim in &claims {
        let spec = claim.spec.clone().unwrap_or_default();
        state.insert(
            format!("claim {}", claim.metadata.name.clone().unwrap_or_default()),
            json!({
                "phase": claim.status.as_ref().and_then(|s| s.phase.clone()),
                "volumeName": spec.volume_name.as_deref().map(|v| normal_volume(v, &pvs)),
                "capacity": claim.status.as_ref().and_then(|s| s.capacity.clone()),
                "accessModes": claim.status.as_ref().and_then(|s| s.access_modes.clone()),
                "currentVolumeAttributesClassName": claim.status.as_ref()
                    .and_then(|s| s.current_volume_attributes_class_name.clone()),
                "annotations": binder_annotations(&claim.metadata),
            }),
        );
    }
    for pv in &pvs {
        let name = normal_volume(pv.metadata.name.as_deref().unwrap_or_default(), &pvs);
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        state.insert(
            format!("volume {name}"),
            json!({
                "phase": pv.status.as_ref().and_then(|s| s.phase.clone()),
                "claimRef": claim_ref.map(|r| format!("{}/{}", r.namespace.clone().unwrap_or_default(), r.name.clone().unwrap_or_default())),
                "claimRefUID": claim_ref.map(|r| r.uid.is_some()),
                "annotations": binder_annotations(&pv.metadata),
            }),
        );
    }
    let events = Api::<Event>::all(bed.admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut recorded: Vec<String> = events
        .iter()
        .filter(|e| {
            matches!(
                e.involved_object.kind.as_deref(),
                Some("PersistentVolumeClaim" | "PersistentVolume")
            )
        })
        // The provisioner's own events are the same provisioner's in both runs.
        .filter(|e| {
            !matches!(
                e.reason.as_deref(),
                Some("Provisioning" | "ProvisioningSucceeded")
            )
        })
        // A late-binding claim's ExternalProvisioning depends on timing in both binders: once
        // kube-scheduler has chosen the node, the binder that syncs the claim before the
        // provisioner's volume appears asks for one (the event); one that syncs it after binds
        // the volume (none).
        .filter(|e| {
            !(e.involved_object.name.as_deref() == Some("c-late")
                && e.reason.as_deref() == Some("ExternalProvisioning"))
        })
        // So does WaitForPodScheduled on the claims of the Pod kube-scheduler places: the
        // binder says it only if it syncs the claim before the Pod is on its node.
        .filter(|e| {
            !(matches!(
                e.involved_object.name.as_deref(),
                Some("c-late" | "c-local")
            ) && e.reason.as_deref() == Some("WaitForPodScheduled"))
        })
        .map(|e| {
            let object = normal_volume(e.involved_object.name.as_deref().unwrap_or_default(), &pvs);
            // Who reports it too: client-go's source and reporting fields.
            let source = e.source.clone().unwrap_or_default();
            format!(
                "{} {object}: {} {} {} (from {:?}/{:?}, reporting {:?}/{:?})",
                e.involved_object.kind.clone().unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default(),
                source.component,
                source.host,
                e.reporting_component,
                e.reporting_instance,
            )
        })
        .collect();
    recorded.sort();
    recorded.dedup();
    state.insert("events".into(), json!(recorded));
    state
}
