//! The recycler's decisions: which Released volumes with reclaim policy `Recycle` this node
//! scrubs, and with what.
//!
//! A volume is recycled by one node: the first agent whose node the volume's affinity admits
//! takes it by writing its name into [`ANN_RECYCLING_NODE`] (at the version it saw, so two
//! agents cannot both take it); the others leave it alone. The taker stages and publishes the
//! volume in a directory of its own, removes its contents, tears it down and clears the claim
//! reference, and the PV controller makes it Available. A restarted agent finds the volumes it
//! took by the annotation and starts them again (every step is idempotent).

use sidecar_kit::vocabulary::{pv_phase as phase, pv_reclaim_policy};
use std::collections::BTreeMap;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::selectors::affinity_allows;

use super::decide::SecretRef;

/// The node recycling a volume.
pub const ANN_RECYCLING_NODE: &str = "storage.volstack.dev/recycling-node";

/// What to do with a volume.
#[derive(Debug, Clone, PartialEq)]
pub enum RecycleStep {
    /// Not a Released `Recycle` volume of this driver.
    Ignore,
    /// Another node recycles it, or this node cannot reach it.
    NotHere,
    /// Take it (write the annotation).
    Take,
    /// Scrub it.
    Scrub(Box<Scrub>),
    /// It cannot be recycled: the reason (an event says it; it stays Released).
    Refuse(String),
    /// Something else uses its volume handle (another PersistentVolume, or a Pod on this node):
    /// scrubbing would wipe a volume in use. An event says who; looked at again later.
    InUse(String),
}

/// How to reach a volume's contents.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrub {
    /// The PV.
    pub pv: String,
    /// Its handle.
    pub handle: String,
    /// The capability to stage and publish it with.
    pub capability: csi::VolumeCapability,
    /// The volume attributes.
    pub attributes: std::collections::HashMap<String, String>,
    /// `controllerPublishSecretRef`.
    pub controller_secret: Option<SecretRef>,
    /// `nodeStageSecretRef`.
    pub stage_secret: Option<SecretRef>,
    /// `nodePublishSecretRef`.
    pub publish_secret: Option<SecretRef>,
}

/// What else uses `pv`'s volume handle: the other PersistentVolumes of the same driver naming
/// it (a duplicated static PV) and the Pod volumes recorded on this node with it.
pub fn handle_users<'a>(
    pv: &PersistentVolume,
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    published: &[(std::path::PathBuf, super::decide::VolumeData)],
) -> Vec<String> {
    let Some(source) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return Vec::new();
    };
    let same =
        |driver: &str, handle: &str| driver == source.driver && handle == source.volume_handle;
    let mut users: Vec<String> = volumes
        .into_iter()
        .filter(|other| other.metadata.name != pv.metadata.name)
        .filter(|other| {
            other
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| same(&c.driver, &c.volume_handle))
        })
        .map(|other| {
            format!(
                "PersistentVolume {:?}",
                other.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    users.sort();
    users.extend(
        published
            .iter()
            .filter(|(_, data)| same(&data.driver_name, &data.volume_handle))
            .map(|(dir, _)| format!("the Pod volume at {}", dir.display())),
    );
    users
}

/// Whether `pv` is a Released volume with reclaim policy `Recycle` (worth a look).
pub fn may_recycle(pv: &PersistentVolume) -> bool {
    phase(pv) == "Released" && pv_reclaim_policy(pv) == "Recycle"
}

/// The step for `pv` on node `node` (labels `labels`) of driver `driver`; `users` names what
/// else uses the same volume handle (other PersistentVolumes, Pod volumes on this node).
pub fn recycle_step(
    pv: &PersistentVolume,
    driver: &str,
    node: &str,
    labels: &BTreeMap<String, String>,
    users: &[String],
) -> RecycleStep {
    let Some(spec) = pv.spec.as_ref() else {
        return RecycleStep::Ignore;
    };
    let Some(source) = spec.csi.as_ref().filter(|c| c.driver == driver) else {
        return RecycleStep::Ignore;
    };
    if !may_recycle(pv) || pv.metadata.deletion_timestamp.is_some() {
        return RecycleStep::Ignore;
    }
    let taker = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_RECYCLING_NODE));
    match taker {
        Some(other) if other != node => return RecycleStep::NotHere,
        Some(_) => {}
        None => {
            return if affinity_allows(spec.node_affinity.as_ref(), labels) {
                RecycleStep::Take
            } else {
                RecycleStep::NotHere
            };
        }
    }
    if !users.is_empty() {
        return RecycleStep::InUse(format!(
            "volume handle {:?} is also used by {}: scrubbing it would wipe a volume in use; the volume stays Released",
            source.volume_handle,
            users.join(", ")
        ));
    }
    if spec.volume_mode.as_deref() == Some("Block") {
        return RecycleStep::Refuse(
            "recycling a block volume is not supported: it would have to be overwritten; the volume stays Released".into(),
        );
    }
    let capability = match sidecar_kit::pv_csi::capability(spec, false, "") {
        Ok(capability) => capability,
        Err(error) => return RecycleStep::Refuse(error.to_string()),
    };
    RecycleStep::Scrub(Box::new(Scrub {
        pv: pv.metadata.name.clone().unwrap_or_default(),
        handle: source.volume_handle.clone(),
        capability,
        attributes: source
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        controller_secret: SecretRef::of(source.controller_publish_secret_ref.as_ref()),
        stage_secret: SecretRef::of(source.node_stage_secret_ref.as_ref()),
        publish_secret: SecretRef::of(source.node_publish_secret_ref.as_ref()),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(phase: &str, policy: &str, extra: serde_json::Value) -> PersistentVolume {
        let mut v = json!({
            "metadata": {"name": "pv-1"},
            "spec": {
                "persistentVolumeReclaimPolicy": policy,
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"namespace": "default", "name": "gone", "uid": "u1"},
                "csi": {"driver": "d", "volumeHandle": "h1", "volumeAttributes": {"a": "b"},
                        "nodePublishSecretRef": {"name": "s", "namespace": "ns"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["z1"]}]}]}},
            },
            "status": {"phase": phase},
        });
        json_patch::merge(&mut v, &extra);
        serde_json::from_value(v).unwrap()
    }

    fn taken_by(node: &str) -> serde_json::Value {
        json!({"metadata": {"annotations": {ANN_RECYCLING_NODE: node}}})
    }

    #[test]
    fn released_recycle_volumes_are_taken_by_one_node_that_reaches_them() {
        let z1: BTreeMap<String, String> = [("zone".to_string(), "z1".to_string())].into();
        let z2: BTreeMap<String, String> = [("zone".to_string(), "z2".to_string())].into();
        let step = |v: &PersistentVolume, labels| recycle_step(v, "d", "node-1", labels, &[]);
        // (volume, labels) → step
        let table: Vec<(PersistentVolume, &BTreeMap<String, String>, RecycleStep)> = vec![
            (pv("Bound", "Recycle", json!({})), &z1, RecycleStep::Ignore),
            (
                pv("Released", "Retain", json!({})),
                &z1,
                RecycleStep::Ignore,
            ),
            (
                pv("Released", "Delete", json!({})),
                &z1,
                RecycleStep::Ignore,
            ),
            (
                pv(
                    "Released",
                    "Recycle",
                    json!({"spec": {"csi": {"driver": "other"}}}),
                ),
                &z1,
                RecycleStep::Ignore,
            ),
            (pv("Released", "Recycle", json!({})), &z1, RecycleStep::Take),
            (
                pv("Released", "Recycle", json!({})),
                &z2,
                RecycleStep::NotHere,
            ),
            (
                pv("Released", "Recycle", taken_by("node-2")),
                &z1,
                RecycleStep::NotHere,
            ),
        ];
        for (i, (v, labels, want)) in table.into_iter().enumerate() {
            assert_eq!(step(&v, labels), want, "case {i}");
        }
        let RecycleStep::Scrub(scrub) = step(&pv("Released", "Recycle", taken_by("node-1")), &z1)
        else {
            panic!("taken by this node: scrub it");
        };
        assert_eq!((scrub.pv.as_str(), scrub.handle.as_str()), ("pv-1", "h1"));
        assert_eq!(scrub.attributes.get("a").map(String::as_str), Some("b"));
        assert_eq!(
            scrub.publish_secret,
            Some(SecretRef {
                name: "s".into(),
                namespace: "ns".into()
            })
        );
        // A restarted agent scrubs what it took even if its labels changed meanwhile.
        assert!(matches!(
            step(&pv("Released", "Recycle", taken_by("node-1")), &z2),
            RecycleStep::Scrub(_)
        ));
        let block = pv(
            "Released",
            "Recycle",
            json!({"spec": {"volumeMode": "Block"}, "metadata": {"annotations": {ANN_RECYCLING_NODE: "node-1"}}}),
        );
        assert!(matches!(step(&block, &z1), RecycleStep::Refuse(why) if why.contains("block")));
    }

    #[test]
    fn a_handle_another_volume_or_a_pod_uses_is_never_scrubbed() {
        use super::super::decide::VolumeData;
        let mine = pv("Released", "Recycle", taken_by("node-1"));
        let named = |name: &str, csi: serde_json::Value| {
            pv(
                "Bound",
                "Retain",
                json!({"metadata": {"name": name}, "spec": {"csi": csi}}),
            )
        };
        let duplicate = named("static-copy", json!({"volumeHandle": "h1"}));
        let other_handle = named("other", json!({"volumeHandle": "h2"}));
        let other_driver = named("elsewhere", json!({"driver": "e", "volumeHandle": "h1"}));
        let record = |driver: &str, handle: &str| {
            (
                std::path::PathBuf::from(format!("/pods/u/{driver}-{handle}")),
                VolumeData {
                    driver_name: driver.into(),
                    volume_handle: handle.into(),
                    spec_vol_id: "pv-x".into(),
                    node_name: "node-1".into(),
                    done: true,
                    mounted: true,
                    ephemeral: false,
                },
            )
        };
        // (other volumes, Pod volumes on the node) → users
        let cases: Vec<(Vec<&PersistentVolume>, Vec<_>, Vec<&str>)> = vec![
            (vec![&mine, &other_handle, &other_driver], vec![], vec![]),
            (
                vec![&mine, &duplicate],
                vec![],
                vec!["PersistentVolume \"static-copy\""],
            ),
            (
                vec![&mine],
                vec![record("d", "h1"), record("d", "h2"), record("e", "h1")],
                vec!["the Pod volume at /pods/u/d-h1"],
            ),
        ];
        let z1: BTreeMap<String, String> = [("zone".to_string(), "z1".to_string())].into();
        for (i, (volumes, published, want)) in cases.into_iter().enumerate() {
            let users = handle_users(&mine, volumes, &published);
            assert_eq!(users, want, "case {i}");
            let step = recycle_step(&mine, "d", "node-1", &z1, &users);
            match step {
                RecycleStep::Scrub(_) => assert!(users.is_empty(), "case {i}: scrubbed in use"),
                RecycleStep::InUse(why) => {
                    assert!(!users.is_empty(), "case {i}");
                    assert!(why.contains(&users[0]) && why.contains("\"h1\""), "{why}");
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
    }
}
