//! kube-apiserver's checks of the storage types and the objects the sidecars write:
//! PersistentVolume, StorageClass, CSIDriver, CSINode, VolumeAttachment, CSIStorageCapacity,
//! Lease and Event. Messages are kube-apiserver's (`path: Type: detail`).

use serde_json::Value;

use crate::claim_rules::{quantity_sign, unsupported};
use crate::meta_rules::qualified_name_error;

pub(crate) const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const PV_RECLAIM: [&str; 3] = ["Delete", "Recycle", "Retain"];
const CLASS_RECLAIM: [&str; 2] = ["Delete", "Retain"];
const BINDING_MODES: [&str; 2] = ["Immediate", "WaitForFirstConsumer"];
pub(crate) const VOLUME_MODES: [&str; 2] = ["Block", "Filesystem"];
const FS_GROUP_POLICIES: [&str; 3] = ["File", "None", "ReadWriteOnceWithFSType"];
const LIFECYCLE_MODES: [&str; 2] = ["Ephemeral", "Persistent"];
const EVENT_TYPES: [&str; 2] = ["Normal", "Warning"];
/// The volume sources of a PersistentVolume (one must be set).
const PV_SOURCES: [&str; 22] = [
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "nfs",
    "rbd",
    "iscsi",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

type Check = Result<(), String>;

pub(crate) fn one_of(path: &str, value: &Value, allowed: &[&str]) -> Check {
    if value.is_null() || value.as_str().is_some_and(|v| allowed.contains(&v)) {
        Ok(())
    } else {
        Err(unsupported(path, value, allowed))
    }
}

fn required(path: &str, value: &Value) -> Check {
    let missing = value.is_null() || value.as_str().is_some_and(str::is_empty);
    if missing {
        Err(format!("{path}: Required value"))
    } else {
        Ok(())
    }
}

pub(crate) fn quantity(path: &str, value: &Value, positive: bool) -> Check {
    if value.is_null() {
        return Ok(());
    }
    let text = value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_string);
    match quantity_sign(&text) {
        None => Err(format!(
            "{path}: Invalid value: {text:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )),
        Some(s) if positive && s <= 0 => Err(format!(
            "{path}: Invalid value: {text:?}: must be greater than zero"
        )),
        Some(s) if s < 0 => Err(format!(
            "{path}: Invalid value: {text:?}: must be greater than or equal to 0"
        )),
        Some(_) => Ok(()),
    }
}

fn immutable(
    path: &str,
    old: Option<&Value>,
    new: &Value,
    pick: impl Fn(&Value) -> &Value,
) -> Check {
    match old {
        Some(old) if pick(old) != pick(new) => Err(format!(
            "{path}: Invalid value: {}: field is immutable",
            pick(new)
        )),
        _ => Ok(()),
    }
}

/// A volume's source (its one volume-type field), as compared after creation: a CSI source
/// may gain a `nodeExpandSecretRef` it had none of (kube-apiserver allows that one change).
fn volume_source(spec: &Value, old_spec: &Value) -> Vec<(&'static str, Value)> {
    PV_SOURCES
        .iter()
        .filter(|s| !spec[**s].is_null())
        .map(|s| {
            let mut source = spec[*s].clone();
            // A hostPath's type defaults to "" (volumes stored before that default had none).
            if *s == "hostPath"
                && let Some(host_path) = source.as_object_mut()
            {
                host_path
                    .entry("type")
                    .and_modify(|t| {
                        if t.is_null() {
                            *t = Value::String(String::new());
                        }
                    })
                    .or_insert(Value::String(String::new()));
            }
            if *s == "csi"
                && old_spec["csi"]["nodeExpandSecretRef"].is_null()
                && let Some(csi) = source.as_object_mut()
            {
                csi.remove("nodeExpandSecretRef");
            }
            (*s, source)
        })
        .collect()
}

/// A PersistentVolume (updates: its source fixed).
pub fn persistent_volume(pv: &Value, old: Option<&Value>) -> Check {
    let spec = &pv["spec"];
    if spec["capacity"]["storage"].is_null() {
        return Err("spec.capacity: Required value".into());
    }
    quantity("spec.capacity[storage]", &spec["capacity"]["storage"], true)?;
    let modes = spec["accessModes"].as_array().filter(|m| !m.is_empty());
    let Some(modes) = modes else {
        return Err("spec.accessModes: Required value".into());
    };
    for mode in modes {
        one_of("spec.accessModes", mode, &ACCESS_MODES)?;
    }
    one_of(
        "spec.persistentVolumeReclaimPolicy",
        &spec["persistentVolumeReclaimPolicy"],
        &PV_RECLAIM,
    )?;
    one_of("spec.volumeMode", &spec["volumeMode"], &VOLUME_MODES)?;
    let sources: Vec<&str> = PV_SOURCES
        .iter()
        .copied()
        .filter(|s| !spec[*s].is_null())
        .collect();
    match sources.as_slice() {
        [] => return Err("spec: Required value: must specify a volume type".into()),
        [_] => {}
        [_, second, ..] => {
            return Err(format!(
                "spec.{second}: Forbidden: may not specify more than 1 volume type"
            ));
        }
    }
    if !spec["csi"].is_null() {
        required("spec.csi.driver", &spec["csi"]["driver"])?;
        required("spec.csi.volumeHandle", &spec["csi"]["volumeHandle"])?;
    }
    if let Some(old) = old
        && volume_source(spec, &old["spec"]) != volume_source(&old["spec"], &old["spec"])
    {
        return Err("spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation".into());
    }
    Ok(())
}

/// A StorageClass (updates: provisioner, parameters, reclaimPolicy, volumeBindingMode fixed).
pub fn storage_class(class: &Value, old: Option<&Value>) -> Check {
    let provisioner = class["provisioner"].as_str().unwrap_or_default();
    if provisioner.is_empty() {
        return Err("provisioner: Required value".into());
    }
    if let Some(why) = qualified_name_error(provisioner) {
        return Err(format!(
            "provisioner: Invalid value: {provisioner:?}: {why}"
        ));
    }
    one_of("reclaimPolicy", &class["reclaimPolicy"], &CLASS_RECLAIM)?;
    one_of(
        "volumeBindingMode",
        &class["volumeBindingMode"],
        &BINDING_MODES,
    )?;
    if let Some(old) = old {
        for field in [
            "provisioner",
            "parameters",
            "reclaimPolicy",
            "volumeBindingMode",
        ] {
            if old[field] != class[field] {
                return Err(format!(
                    "{field}: Forbidden: updates to {field} are forbidden."
                ));
            }
        }
    }
    Ok(())
}

/// A driver a CSINode already lists keeps its nodeID and topology keys (kube-apiserver
/// compares the drivers of the same name; its allocatable count may change, and a driver may
/// go and come back with another ID). The message shows the new driver as kube-apiserver
/// prints its internal type.
fn csi_node_drivers_kept(node: &Value, old: &Value) -> Check {
    let drivers = |n: &Value| n["spec"]["drivers"].as_array().cloned().unwrap_or_default();
    let keys = |d: &Value| match &d["topologyKeys"] {
        Value::Array(keys) if !keys.is_empty() => Value::Array(keys.clone()),
        _ => Value::Null,
    };
    let before = drivers(old);
    for driver in drivers(node) {
        let Some(was) = before.iter().find(|d| d["name"] == driver["name"]) else {
            continue;
        };
        if driver["nodeID"] != was["nodeID"] || keys(&driver) != keys(was) {
            // Go's field order, which a JSON map would sort.
            let shown = format!(
                r#"{{"Name":{},"NodeID":{},"TopologyKeys":{},"Allocatable":null}}"#,
                driver["name"],
                driver["nodeID"],
                keys(&driver)
            );
            return Err(format!(
                "spec.drivers: Invalid value: {shown}: field is immutable"
            ));
        }
    }
    Ok(())
}

/// A CSIDriver (its name at most 63 characters; attachRequired and more are immutable).
pub fn csi_driver(driver: &Value, old: Option<&Value>) -> Check {
    let name = driver["metadata"]["name"].as_str().unwrap_or_default();
    if name.len() > 63 {
        return Err("metadata.name: Too long: may not be more than 63 bytes".into());
    }
    let spec = &driver["spec"];
    one_of(
        "spec.fsGroupPolicy",
        &spec["fsGroupPolicy"],
        &FS_GROUP_POLICIES,
    )?;
    if let Some(modes) = spec["volumeLifecycleModes"].as_array() {
        for mode in modes {
            one_of("spec.volumeLifecycleModes", mode, &LIFECYCLE_MODES)?;
        }
    }
    immutable(
        "spec.attachRequired",
        old,
        driver,
        |d| &d["spec"]["attachRequired"],
    )?;
    immutable(
        "spec.fsGroupPolicy",
        old,
        driver,
        |d| &d["spec"]["fsGroupPolicy"],
    )?;
    immutable(
        "spec.podInfoOnMount",
        old,
        driver,
        |d| &d["spec"]["podInfoOnMount"],
    )?;
    immutable(
        "spec.volumeLifecycleModes",
        old,
        driver,
        |d| &d["spec"]["volumeLifecycleModes"],
    )?;
    Ok(())
}

/// A CSINode: each driver named once, with a node ID and valid topology keys.
pub fn csi_node(node: &Value, old: Option<&Value>) -> Check {
    if let Some(old) = old {
        csi_node_drivers_kept(node, old)?;
    }
    let drivers = node["spec"]["drivers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, driver) in drivers.iter().enumerate() {
        let path = format!("spec.drivers[{i}]");
        required(&format!("{path}.name"), &driver["name"])?;
        required(&format!("{path}.nodeID"), &driver["nodeID"])?;
        let node_id = driver["nodeID"].as_str().unwrap_or_default();
        if node_id.len() > 192 {
            return Err(format!(
                "{path}.nodeID: Too long: may not be more than 192 bytes"
            ));
        }
        if drivers[..i].iter().any(|d| d["name"] == driver["name"]) {
            return Err(format!("{path}.name: Duplicate value: {}", driver["name"]));
        }
        for (k, key) in driver["topologyKeys"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let text = key.as_str().unwrap_or_default();
            if let Some(why) = qualified_name_error(text) {
                return Err(format!(
                    "{path}.topologyKeys[{k}]: Invalid value: {text:?}: {why}"
                ));
            }
        }
        if driver["allocatable"]["count"]
            .as_i64()
            .is_some_and(|c| c < 0)
        {
            return Err(format!(
                "{path}.allocatable.count: Invalid value: {}: must be greater than or equal to 0",
                driver["allocatable"]["count"]
            ));
        }
    }
    Ok(())
}

/// A VolumeAttachment: attacher, node and exactly one source; the spec is immutable.
pub fn volume_attachment(attachment: &Value, old: Option<&Value>) -> Check {
    let spec = &attachment["spec"];
    required("spec.attacher", &spec["attacher"])?;
    required("spec.nodeName", &spec["nodeName"])?;
    let sources = [
        &spec["source"]["persistentVolumeName"],
        &spec["source"]["inlineVolumeSpec"],
    ];
    if sources.iter().filter(|s| !s.is_null()).count() != 1 {
        return Err("spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName".into());
    }
    immutable("spec", old, attachment, |a| &a["spec"])
}

/// A CSIStorageCapacity.
pub fn storage_capacity(capacity: &Value, old: Option<&Value>) -> Check {
    // What it stands for is fixed once made (its class and topology segment).
    immutable(
        "storageClassName",
        old,
        capacity,
        |c| &c["storageClassName"],
    )?;
    immutable("nodeTopology", old, capacity, |c| &c["nodeTopology"])?;
    required("storageClassName", &capacity["storageClassName"])?;
    let class = capacity["storageClassName"].as_str().unwrap_or_default();
    if !crate::objects::is_dns_subdomain(class) {
        return Err(format!(
            "storageClassName: Invalid value: {class:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    quantity("capacity", &capacity["capacity"], false)?;
    quantity("maximumVolumeSize", &capacity["maximumVolumeSize"], false)
}

/// A Lease.
pub fn lease(lease: &Value) -> Check {
    let spec = &lease["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64().filter(|d| *d <= 0) {
        return Err(format!(
            "spec.leaseDurationSeconds: Invalid value: {d}: must be greater than 0"
        ));
    }
    if let Some(t) = spec["leaseTransitions"].as_i64().filter(|t| *t < 0) {
        return Err(format!(
            "spec.leaseTransitions: Invalid value: {t}: must be greater than or equal to 0"
        ));
    }
    Ok(())
}

/// A core/v1 Event: its object is in its namespace; its type, when set, Normal or Warning.
pub fn core_event(event: &Value) -> Check {
    let namespace = event["metadata"]["namespace"].as_str().unwrap_or_default();
    let involved = event["involvedObject"]["namespace"]
        .as_str()
        .unwrap_or_default();
    if !involved.is_empty() && involved != namespace {
        return Err(format!(
            "involvedObject.namespace: Invalid value: {involved:?}: does not match event.namespace"
        ));
    }
    if event["type"].as_str().is_some_and(|t| !t.is_empty()) {
        one_of("type", &event["type"], &EVENT_TYPES)?;
    }
    Ok(())
}

/// An events.k8s.io/v1 Event.
pub fn event(event: &Value) -> Check {
    required("eventTime", &event["eventTime"])?;
    required("reportingController", &event["reportingController"])?;
    required("reportingInstance", &event["reportingInstance"])?;
    required("action", &event["action"])?;
    required("reason", &event["reason"])?;
    one_of("type", &event["type"], &EVENT_TYPES)?;
    required("type", &event["type"])
}

#[cfg(test)]
mod tests;
