//! An update's stored object: what the write may change, what stays as stored, and the
//! generation it bumps.

use serde_json::{Map, Value, json};

use super::{apply_defaults, check_type, drop_empty_lists_and_maps, meta_mut, now_rfc3339};
use crate::registry::ResourceType;
use crate::status::ApiError;
use crate::storage_defaults;

/// The object an update stores: immutable metadata kept, status or spec taken from the right
/// side of the status subresource, generation bumped when the spec changes.
pub fn merge_update(
    rt: &ResourceType,
    current: &Value,
    mut incoming: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    check_type(rt, &mut incoming)?;
    let mut next = if status_only {
        // The current object's fields but its status, and the incoming status moved in: the
        // old status is not copied only to be replaced. A built-in kind's status write keeps
        // the metadata it sends (labels, annotations, finalizers; the fixed fields are restored
        // below), as kube-apiserver's status strategies do, but for the fields some of them
        // restore (`status_keeps_stored`); a custom resource's keeps the stored metadata.
        let status = incoming.get_mut("status").map_or(Value::Null, Value::take);
        let metadata = incoming
            .get_mut("metadata")
            .filter(|m| m.is_object() && !rt.custom)
            .map(Value::take);
        let mut next: Map<String, Value> = current
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(key, _)| *key != "status" && !(*key == "metadata" && metadata.is_some()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if let Some(mut metadata) = metadata {
            for field in status_keeps_stored(rt) {
                metadata[*field] = current["metadata"][*field].clone();
            }
            next.insert("metadata".into(), metadata);
        }
        next.insert("status".into(), status);
        Value::Object(next)
    } else {
        if rt.status {
            incoming["status"] = current["status"].clone();
        }
        incoming
    };
    let cm = &current["metadata"];
    let meta = meta_mut(&mut next)?;
    for key in [
        "uid",
        "creationTimestamp",
        "namespace",
        "name",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match cm.get(key) {
            Some(v) => {
                meta.insert(key.into(), v.clone());
            }
            None => {
                meta.remove(key);
            }
        }
    }
    // Field ownership stays unless the write sets it (server-side apply does; an empty list
    // clears it, as in kube-apiserver).
    match meta.get("managedFields") {
        Some(Value::Array(list)) if list.is_empty() => {
            meta.remove("managedFields");
        }
        Some(Value::Array(_)) => {}
        _ => match cm.get("managedFields") {
            Some(v) => {
                meta.insert("managedFields".into(), v.clone());
            }
            None => {
                meta.remove("managedFields");
            }
        },
    }
    drop_empty_lists_and_maps(meta);
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumes") => {
            storage_defaults::stamp_phase_transition(Some(current), &mut next, &now_rfc3339());
        }
        // As at create: a client that sends one of the two (a manifest replaced, an older
        // client) gets the other filled in again, as kube-apiserver's PrepareForUpdate does.
        ("", "persistentvolumeclaims") if !status_only => {
            storage_defaults::mirror_data_sources(&mut next);
        }
        ("", "pods") if status_only => crate::pod_defaults::keep_qos_class(current, &mut next),
        _ => {}
    }
    // Defaulted before the specs are compared, as kube-apiserver compares them: a manifest
    // written again without the defaults changes nothing.
    apply_defaults(rt, &mut next);
    if !status_only && rt.group.is_empty() && rt.plural == "pods" {
        crate::admission::pod_update(current, &mut next);
    }
    if !status_only && rt.has_generation() {
        let spec_changed = !same_apart_from(current, &next, &["metadata", "status"]);
        if spec_changed {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            next["metadata"]["generation"] = json!(generation);
        }
    }
    if (rt.group.as_str(), rt.plural.as_str()) == ("", "namespaces") {
        crate::namespace_rules::keep_spec_finalizers(current, &mut next);
    }
    Ok(next)
}

/// The metadata fields a kind's status write cannot change (kube-apiserver's status
/// strategies put the stored ones back): a Pod's owner references, a VolumeAttachment's labels,
/// annotations, finalizers and owner references (`ResetObjectMetaForStatus`), a Deployment's
/// labels.
fn status_keeps_stored(rt: &ResourceType) -> &'static [&'static str] {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => &["ownerReferences"],
        ("storage.k8s.io", "volumeattachments") => {
            &["labels", "annotations", "finalizers", "ownerReferences"]
        }
        ("apps", "deployments") => &["labels"],
        _ => &[],
    }
}

/// Whether two JSON values are equal apart from the fields `skipped` (compared in place: an
/// update used to copy both objects to compare their specs).
pub(crate) fn same_apart_from(a: &Value, b: &Value, skipped: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept = |m: &Map<String, Value>| m.keys().filter(|k| !skipped.contains(&k.as_str())).count();
    kept(a) == kept(b)
        && a.iter()
            .filter(|(k, _)| !skipped.contains(&k.as_str()))
            .all(|(k, v)| b.get(k) == Some(v))
}
