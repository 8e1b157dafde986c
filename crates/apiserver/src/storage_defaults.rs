//! What kube-apiserver's strategies set on storage objects as they are written, beyond plain
//! defaults: a claim's two data-source fields mirrored into each other (and refused when they
//! disagree), a volume's `status.lastPhaseTransitionTime`, a VolumeAttachment's initial
//! status and a hostPath volume's `type`. Checked against kube-apiserver v1.36.

use serde_json::{Map, Value, json};

/// The fields a claim's `dataSource` (TypedLocalObjectReference) has; `dataSourceRef`
/// (TypedObjectReference) adds `namespace`.
const REFERENCE_FIELDS: [&str; 3] = ["apiGroup", "kind", "name"];

/// A reference's fields as a local reference (an absent `apiGroup` stays absent).
fn local_reference(reference: &Map<String, Value>) -> Value {
    let mut local = Map::new();
    for field in REFERENCE_FIELDS {
        if let Some(value) = reference.get(field).filter(|v| !v.is_null()) {
            local.insert(field.to_string(), value.clone());
        }
    }
    Value::Object(local)
}

/// Whether a `dataSourceRef` names another namespace (then it is not mirrored).
fn other_namespace(reference: &Map<String, Value>) -> bool {
    reference
        .get("namespace")
        .and_then(Value::as_str)
        .is_some_and(|ns| !ns.is_empty())
}

/// A claim being created: one data-source field set gives the other the same reference
/// (`dataSourceRef` only when it names no namespace). kube-apiserver writes an absent
/// `apiGroup` as `null`; it stays absent here, since a client's typed object leaves a `null`
/// out and its update would then differ from the stored spec.
pub fn mirror_data_sources(claim: &mut Value) {
    let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let source = spec.get("dataSource").and_then(Value::as_object).cloned();
    let reference = spec
        .get("dataSourceRef")
        .and_then(Value::as_object)
        .cloned();
    match (source, reference) {
        (Some(source), None) => {
            spec.insert("dataSourceRef".into(), local_reference(&source));
        }
        (None, Some(reference)) if !other_namespace(&reference) => {
            spec.insert("dataSource".into(), local_reference(&reference));
        }
        _ => {}
    }
}

/// Both data-source fields set, the reference in the claim's namespace: they must name the
/// same object (an `apiGroup` of `""` is not the same as none, as in kube-apiserver).
pub fn check_data_sources(spec: &Value) -> Result<(), String> {
    let (Some(source), Some(reference)) = (
        spec["dataSource"].as_object(),
        spec["dataSourceRef"].as_object(),
    ) else {
        return Ok(());
    };
    if other_namespace(reference) || local_reference(source) == local_reference(reference) {
        return Ok(());
    }
    Err("spec: Invalid value: {}: must match dataSourceRef".into())
}

/// A volume's phase changed by a write (or set by its create): `status.lastPhaseTransitionTime`
/// becomes `now`, unless the write set a new time of its own. A write that keeps the phase and
/// gives no time keeps the time there was.
pub fn stamp_phase_transition(current: Option<&Value>, next: &mut Value, now: &str) {
    if !next["status"].is_object() {
        return;
    }
    let old_time = current.map_or(&Value::Null, |c| &c["status"]["lastPhaseTransitionTime"]);
    let new_time = &next["status"]["lastPhaseTransitionTime"];
    let same_phase = current.map(|c| &c["status"]["phase"]) == Some(&next["status"]["phase"]);
    let time = if same_phase {
        if !new_time.is_null() || old_time.is_null() {
            return;
        }
        old_time.clone()
    } else {
        if !(new_time.is_null() || new_time == old_time) {
            return;
        }
        json!(now)
    };
    next["status"]["lastPhaseTransitionTime"] = time;
}

/// A hostPath volume's `type` is `""` when not given.
pub fn default_host_path_type(volume: &mut Value) {
    if let Some(host_path) = volume["spec"]
        .get_mut("hostPath")
        .and_then(Value::as_object_mut)
    {
        host_path.entry("type").or_insert(json!(""));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claim(spec: Value) -> Value {
        json!({"metadata": {"name": "c"}, "spec": spec})
    }

    #[test]
    fn data_sources_are_mirrored_as_kube_apiserver_stores_them() {
        let pvc = json!({"kind": "PersistentVolumeClaim", "name": "src"});
        let pvc_stored = json!({"kind": "PersistentVolumeClaim", "name": "src"});
        let snap =
            json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"});
        let elsewhere = json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s", "namespace": "other"});
        let rows = [
            (
                json!({"dataSource": pvc}),
                json!({"dataSource": pvc_stored, "dataSourceRef": pvc_stored}),
            ),
            (
                json!({"dataSourceRef": snap}),
                json!({"dataSource": snap, "dataSourceRef": snap}),
            ),
            (
                json!({"dataSourceRef": elsewhere}),
                json!({"dataSourceRef": elsewhere}),
            ),
            (json!({}), json!({})),
            (
                json!({"dataSource": snap, "dataSourceRef": pvc}),
                json!({"dataSource": snap, "dataSourceRef": pvc_stored}),
            ),
        ];
        for (spec, want) in rows {
            let mut object = claim(spec.clone());
            mirror_data_sources(&mut object);
            assert_eq!(object["spec"], want, "{spec}");
        }
    }

    #[test]
    fn two_data_sources_must_name_the_same_object() {
        let pvc = json!({"kind": "PersistentVolumeClaim", "name": "src"});
        let rows = [
            (json!({"dataSource": pvc, "dataSourceRef": pvc}), true),
            (json!({"dataSource": pvc}), true),
            (
                json!({"dataSource": pvc, "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "other"}}),
                false,
            ),
            (
                json!({"dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "src"}, "dataSourceRef": pvc}),
                false,
            ),
            (
                json!({"dataSource": pvc, "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "x", "namespace": "other"}}),
                true,
            ),
        ];
        for (spec, ok) in rows {
            let checked = check_data_sources(&spec);
            assert_eq!(checked.is_ok(), ok, "{spec}");
            if let Err(message) = checked {
                assert_eq!(message, "spec: Invalid value: {}: must match dataSourceRef");
            }
        }
    }

    #[test]
    fn a_phase_change_stamps_its_time_unless_the_write_gave_one() {
        let at = |phase: &str, time: Value| json!({"status": {"phase": phase, "lastPhaseTransitionTime": time}});
        let rows = [
            (None, at("Pending", Value::Null), json!("now")),
            (
                Some(at("Pending", json!("t1"))),
                at("Available", json!("t1")),
                json!("now"),
            ),
            (
                Some(at("Pending", json!("t1"))),
                at("Available", Value::Null),
                json!("now"),
            ),
            (
                Some(at("Pending", json!("t1"))),
                at("Available", json!("t2")),
                json!("t2"),
            ),
            (
                Some(at("Bound", json!("t1"))),
                at("Bound", json!("t1")),
                json!("t1"),
            ),
            (
                Some(at("Bound", json!("t1"))),
                at("Bound", Value::Null),
                json!("t1"),
            ),
            (
                Some(at("Bound", Value::Null)),
                at("Bound", Value::Null),
                Value::Null,
            ),
        ];
        for (current, mut next, want) in rows {
            stamp_phase_transition(current.as_ref(), &mut next, "now");
            assert_eq!(
                next["status"]["lastPhaseTransitionTime"], want,
                "{current:?}"
            );
        }
    }

    #[test]
    fn a_host_path_gets_an_empty_type() {
        let mut volume = json!({"spec": {"hostPath": {"path": "/x"}}});
        default_host_path_type(&mut volume);
        assert_eq!(
            volume["spec"]["hostPath"],
            json!({"path": "/x", "type": ""})
        );
        let mut other = json!({"spec": {"csi": {"driver": "d"}}});
        default_host_path_type(&mut other);
        assert!(other["spec"].get("hostPath").is_none());
    }
}
