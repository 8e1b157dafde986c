//! What kube-controller-manager's attach/detach controller decides: a VolumeAttachment for
//! every CSI volume a scheduled, unfinished Pod uses on its node (when the volume's CSIDriver
//! requires attach), and the deletion of every VolumeAttachment no Pod needs any more, once
//! the node no longer reports the volume in use (`status.volumesInUse`, written by kubelet
//! after unmounting).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use super::protection::claims_of;

/// A volume on a node, as a VolumeAttachment names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Wanted {
    /// The VolumeAttachment's name (`csi-<sha256>`).
    pub name: String,
    /// The driver (`spec.attacher`).
    pub driver: String,
    /// The node.
    pub node: String,
    /// The PV.
    pub volume: String,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Actions {
    /// VolumeAttachments to create.
    pub create: Vec<Wanted>,
    /// VolumeAttachments to delete (by name).
    pub delete: Vec<String>,
}

/// The objects the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// Claims by (namespace, name).
    pub claims: &'a HashMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    /// Volumes by name.
    pub volumes: &'a HashMap<&'a str, &'a PersistentVolume>,
    /// CSIDrivers by name.
    pub drivers: &'a HashMap<&'a str, &'a CSIDriver>,
    /// Nodes by name.
    pub nodes: &'a HashMap<&'a str, &'a Node>,
}

pub use sidecar_kit::pv_csi::unique_volume_name as unique_name;

/// The VolumeAttachments the Pods need.
pub fn wanted<'a>(pods: impl IntoIterator<Item = &'a Pod>, world: World<'_>) -> BTreeSet<Wanted> {
    let mut out = BTreeSet::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        if node.is_empty() || sidecar_kit::vocabulary::pod_finished(pod) {
            continue;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for claim in claims_of(pod) {
            let Some(volume) = world
                .claims
                .get(&(namespace, claim.as_str()))
                .and_then(|c| c.spec.as_ref()?.volume_name.as_deref())
                .filter(|v| !v.is_empty())
            else {
                continue;
            };
            // An in-tree PV of a migrated plugin is attached by its CSI driver.
            let Some(spec) = world
                .volumes
                .get(volume)
                .and_then(|pv| sidecar_kit::migration::csi_spec(pv))
            else {
                continue;
            };
            let Some(csi) = spec.csi.as_ref() else {
                continue;
            };
            if !sidecar_kit::pv_csi::attach_required(
                world.drivers.get(csi.driver.as_str()).copied(),
            ) {
                continue;
            }
            out.insert(Wanted {
                name: sidecar_kit::pv_csi::attachment_name(&csi.volume_handle, &csi.driver, node),
                driver: csi.driver.clone(),
                node: node.to_string(),
                volume: volume.to_string(),
            });
        }
    }
    out
}

/// The creations and deletions that make the VolumeAttachments what the Pods need. Only
/// attachments of PVs are managed; one still in use on its node (or whose node reports it)
/// waits, and one being deleted is left to its attacher.
pub fn actions<'a>(
    wanted: &BTreeSet<Wanted>,
    existing: impl IntoIterator<Item = &'a VolumeAttachment>,
    world: World<'_>,
) -> Actions {
    let mut by_name: BTreeMap<&str, &VolumeAttachment> = BTreeMap::new();
    for va in existing {
        if let Some(name) = va.metadata.name.as_deref() {
            by_name.insert(name, va);
        }
    }
    let mut out = Actions::default();
    for w in wanted {
        if !by_name.contains_key(w.name.as_str()) {
            out.create.push(w.clone());
        }
    }
    let wanted_names: BTreeSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
    for (name, va) in by_name {
        if wanted_names.contains(name) || va.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(pv) = va.spec.source.persistent_volume_name.as_deref() else {
            continue;
        };
        let handle = world
            .volumes
            .get(pv)
            .and_then(|v| sidecar_kit::migration::csi_spec(v))
            .and_then(|s| s.csi.as_ref().map(|c| c.volume_handle.clone()));
        let in_use = handle.is_some_and(|h| {
            let unique = unique_name(&va.spec.attacher, &h);
            world
                .nodes
                .get(va.spec.node_name.as_str())
                .and_then(|n| n.status.as_ref()?.volumes_in_use.as_ref())
                .is_some_and(|used| used.contains(&unique))
        });
        if !in_use {
            out.delete.push(name.to_string());
        }
    }
    out
}

/// The Pods that wait on an attachment that failed, each with kube-controller-manager's
/// `FailedAttachVolume` message (`AttachVolume.Attach failed for volume "pv" : why`).
pub fn attach_failures<'a>(
    attachments: impl IntoIterator<Item = &'a VolumeAttachment>,
    pods: &[&'a Pod],
    claims: &HashMap<(&str, &str), &PersistentVolumeClaim>,
) -> Vec<(&'a Pod, String)> {
    let mut out = Vec::new();
    for va in attachments {
        let Some(error) = va.status.as_ref().and_then(|s| s.attach_error.as_ref()) else {
            continue;
        };
        let Some(volume) = va.spec.source.persistent_volume_name.as_deref() else {
            continue;
        };
        let message = format!(
            "AttachVolume.Attach failed for volume {volume:?} : {}",
            error.message.as_deref().unwrap_or_default()
        );
        for pod in pods {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let uses = claims_of(pod).iter().any(|c| {
                claims
                    .get(&(ns, c.as_str()))
                    .and_then(|c| c.spec.as_ref()?.volume_name.as_deref())
                    == Some(volume)
            });
            if uses {
                out.push((*pod, message.clone()));
            }
        }
    }
    out
}
