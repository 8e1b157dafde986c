//! The plan for one VolumeAttachment of our driver: mark it attached (a driver without
//! PUBLISH_UNPUBLISH_VOLUME), attach it (finalizers first, then ControllerPublishVolume, then
//! the status), detach it (ControllerUnpublishVolume, then the finalizer), or write why it
//! cannot be done.

use std::borrow::Cow;
use std::collections::HashMap;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use sidecar_kit::finalizers;
use sidecar_kit::patch_ops::Op;
use sidecar_kit::pv_csi::{self, VolumeSpecError};

use super::{ANN_NODE_ID, DriverView, Options, attached, deleting, finalizer};

pub use sidecar_kit::secrets::SecretRef;

/// ControllerPublishVolume's arguments, but the secret's contents.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// `volume_id`: the PV's volume handle.
    pub volume_id: String,
    /// `node_id`: the driver's id of the node (from CSINode).
    pub node_id: String,
    /// `volume_capability`.
    pub capability: csi::VolumeCapability,
    /// `readonly`.
    pub readonly: bool,
    /// `volume_context`: the PV's volume attributes.
    pub context: HashMap<String, String>,
    /// `controllerPublishSecretRef`.
    pub secret: Option<SecretRef>,
    /// The PV is an in-tree one, translated (CSI migration): the metrics' `migrated`.
    pub migrated: bool,
}

/// An attach: the API writes before the call, then the call.
#[derive(Debug, Clone, PartialEq)]
pub struct Attach {
    /// The PV and the JSON patch adding our finalizer, when it lacks it (before any publish,
    /// so the PV outlives the attachment and the detach can read it).
    pub protect_volume: Option<(String, Vec<Op>)>,
    /// The JSON patch adding our finalizer and the node-id annotation to the
    /// VolumeAttachment, when either is missing (before the publish, so a deletion waits for
    /// the detach).
    pub protect_attachment: Option<Vec<Op>>,
    /// The call.
    pub publish: Publish,
}

/// A detach: the call, then the writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Detach {
    /// `volume_id`.
    pub volume_id: String,
    /// `node_id`: from CSINode, else the annotation written at attach.
    pub node_id: String,
    /// `controllerPublishSecretRef`.
    pub secret: Option<SecretRef>,
    /// The JSON patch removing our finalizer, when it is there.
    pub release: Option<Vec<Op>>,
    /// The PV is an in-tree one, translated (CSI migration): the metrics' `migrated`.
    pub migrated: bool,
    /// Whether `status` is written afterwards (`attached: false`): not when removing our
    /// finalizer lets the object go (nobody would read it; upstream's write gets a 404).
    pub write_status: bool,
}

/// What to do with one VolumeAttachment.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Nothing: attached already, or being deleted without our finalizer.
    Nothing,
    /// A driver without PUBLISH_UNPUBLISH_VOLUME: write `attached: true`, no finalizers.
    MarkAttached,
    /// Protect the volume and the attachment, then ControllerPublishVolume and the status.
    Attach(Attach),
    /// ControllerUnpublishVolume, then the finalizer and the status.
    Detach(Detach),
    /// The attach cannot be tried: the message goes to `attachError`, retried with backoff.
    /// The volume's finalizer is added first when the volume was found and is not being
    /// deleted, as upstream adds it right after reading the PV, before its other checks.
    AttachFailed {
        /// Why (what `attachError` says).
        message: String,
        /// The PV and the ops that add our finalizer to it.
        protect_volume: Option<(String, Vec<Op>)>,
        /// The attach secret to read before reporting `message`: upstream reads it before it
        /// looks for the node's id, so a missing secret is what an attachment refused for
        /// both reasons reports. Set only for a refusal that comes after that read.
        secret_first: Option<SecretRef>,
    },
    /// The detach cannot be tried: the message goes to `detachError`, retried with backoff.
    DetachFailed {
        /// Why (what `detachError` says).
        message: String,
        /// The detach secret to read first, as in [`Plan::AttachFailed`].
        secret_first: Option<SecretRef>,
    },
}

/// The objects a plan reads.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// The VolumeAttachment's PV (by `spec.source.persistentVolumeName`), if it exists.
    pub volume: Option<&'a PersistentVolume>,
    /// The CSINode of `spec.nodeName`, if it exists.
    pub csinode: Option<&'a CSINode>,
    /// The Node of `spec.nodeName`, read only when its CSINode has no id for the driver
    /// ([`needs_node`]).
    pub node: Option<&'a Node>,
    /// The driver.
    pub driver: &'a DriverView,
    /// What the attacher's flags change in a plan.
    pub options: &'a Options,
}

/// The volume spec a VolumeAttachment names: its PV's, or the inline one (which
/// kube-controller-manager has already translated for a migrated in-tree volume). A PV with an
/// in-tree source of a migrated plugin is translated to its CSI form (CSI migration).
pub fn volume_spec<'a>(
    va: &'a VolumeAttachment,
    volume: Option<&'a PersistentVolume>,
) -> Result<Cow<'a, PersistentVolumeSpec>, String> {
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => {
            Err("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source".into())
        }
        (None, None) => Err(
            "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source".into(),
        ),
        (None, Some(spec)) => {
            if spec.csi.is_none() {
                return Err("inline volume spec contains nil CSI source".into());
            }
            Ok(Cow::Borrowed(spec))
        }
        (Some(name), None) => {
            let pv = volume
                .filter(|pv| pv.spec.is_some())
                .ok_or_else(|| format!("persistentvolume {name:?} not found"))?;
            if !sidecar_kit::migration::is_migratable(pv) {
                return pv
                    .spec
                    .as_ref()
                    .map(Cow::Borrowed)
                    .ok_or_else(|| format!("persistentvolume {name:?} not found"));
            }
            let translated = sidecar_kit::migration::pv_to_csi(pv)
                .map_err(|e| format!("failed to translate in tree pv to CSI: {e}"))?;
            translated
                .spec
                .map(Cow::Owned)
                .ok_or_else(|| format!("persistentvolume {name:?} not found"))
        }
    }
}

/// The driver's id of the VolumeAttachment's node, from its CSINode.
fn node_id_from_csinode(
    va: &VolumeAttachment,
    csinode: Option<&CSINode>,
    driver: &str,
) -> Result<String, String> {
    let node = &va.spec.node_name;
    let csinode = csinode.ok_or_else(|| format!("csinode.storage.k8s.io {node:?} not found"))?;
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.clone())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| format!("CSINode {node} does not contain driver {driver}"))
}

/// Whether [`plan`] will read the Node for the driver's node id, so the Node is worth reading:
/// a plan that calls the driver (an attach not done yet or forced, or a detach without the id
/// written at attach) for a node whose CSINode has no id for the driver.
pub fn needs_node(
    va: &VolumeAttachment,
    csinode: Option<&CSINode>,
    driver: &DriverView,
    force: bool,
) -> bool {
    if !driver.publish_unpublish || node_id_from_csinode(va, csinode, &driver.name).is_ok() {
        return false;
    }
    if deleting(va) {
        return attached_id(va).is_none();
    }
    !attached(va) || force
}

/// The id written on the VolumeAttachment at attach.
fn attached_id(va: &VolumeAttachment) -> Option<String> {
    sidecar_kit::vocabulary::annotation(&va.metadata, ANN_NODE_ID)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

/// The driver's id of the node in the Node's `csi.volume.kubernetes.io/nodeid` annotation.
fn node_id_from_node(node: &Node, driver: &str) -> Result<Option<String>, String> {
    let ids = sidecar_kit::vocabulary::node_ids(&node.metadata).map_err(|error| {
        format!(
            "failed to parse the {} annotation of Node {:?}: {error}",
            sidecar_kit::vocabulary::ANN_NODE_IDS,
            node.metadata.name.as_deref().unwrap_or_default()
        )
    })?;
    Ok(ids.get(driver).filter(|id| !id.is_empty()).cloned())
}

/// The driver's id of the VolumeAttachment's node: its CSINode's, else the one in its Node's
/// annotation (the CSI-in-Kubernetes design reads either; kubelet writes both). The error
/// names what was missing.
pub fn node_id(
    va: &VolumeAttachment,
    csinode: Option<&CSINode>,
    node: Option<&Node>,
    driver: &str,
) -> Result<String, String> {
    node_id_from_csinode(va, csinode, driver).or_else(|error| or_from_node(node, driver, error))
}

/// The id in the Node's annotation, else `error` (what was missing before it).
fn or_from_node(node: Option<&Node>, driver: &str, error: String) -> Result<String, String> {
    match node
        .map(|node| node_id_from_node(node, driver))
        .transpose()?
    {
        Some(Some(id)) => Ok(id),
        Some(None) | None => Err(error),
    }
}

/// The node id for a detach or a reconcile: the CSINode's, else the one written on the
/// attachment at attach (the id it was published with), else the Node's annotation.
pub fn node_id_for_detach(
    va: &VolumeAttachment,
    csinode: Option<&CSINode>,
    node: Option<&Node>,
    driver: &str,
) -> Result<String, String> {
    node_id_from_csinode(va, csinode, driver).or_else(|error| match attached_id(va) {
        Some(id) => Ok(id),
        None => or_from_node(node, driver, error),
    })
}

fn secret_of(spec: &PersistentVolumeSpec) -> Option<SecretRef> {
    SecretRef::of(spec.csi.as_ref()?.controller_publish_secret_ref.as_ref())
}

fn spec_error(error: VolumeSpecError) -> String {
    error.to_string()
}

/// The plan for `va` (ours), `force` when the periodic reconcile found the driver disagreeing
/// with `status.attached`.
pub fn plan(va: &VolumeAttachment, world: World<'_>, force: bool) -> Plan {
    let driver = world.driver;
    if !driver.publish_unpublish {
        return if attached(va) {
            Plan::Nothing
        } else {
            Plan::MarkAttached
        };
    }
    let ours = finalizer(&driver.name);
    if deleting(va) {
        return plan_detach(va, world, force, &ours);
    }
    if attached(va) && !force {
        return Plan::Nothing;
    }
    match plan_attach(va, world, &ours) {
        Ok(attach) => Plan::Attach(attach),
        Err(refused) => Plan::AttachFailed {
            message: refused.message,
            protect_volume: refused.protect_volume,
            secret_first: refused.secret_first,
        },
    }
}

/// Why an attach cannot be tried, the volume's finalizer to add all the same, and the secret
/// upstream would have read first.
struct Refused {
    message: String,
    protect_volume: Option<(String, Vec<Op>)>,
    secret_first: Option<SecretRef>,
}

impl Refused {
    fn because(message: String) -> Self {
        Refused {
            message,
            protect_volume: None,
            secret_first: None,
        }
    }
}

fn plan_attach(va: &VolumeAttachment, world: World<'_>, ours: &str) -> Result<Attach, Refused> {
    let driver = world.driver;
    let mut protect_volume = None;
    // Upstream's order: the PV's deletion and finalizer come before its translation (an
    // in-tree PV that does not translate gets the finalizer too).
    if va.spec.source.persistent_volume_name.is_some()
        && va.spec.source.inline_volume_spec.is_none()
        && let Some(pv) = world.volume.filter(|pv| pv.spec.is_some())
    {
        let name = pv.metadata.name.clone().unwrap_or_default();
        if pv.metadata.deletion_timestamp.is_some() {
            return Err(Refused::because(format!(
                "PersistentVolume {name:?} is marked for deletion"
            )));
        }
        protect_volume = finalizers::add_ops(&pv.metadata, ours).map(|ops| (name, ops));
    }
    let refused = |message: String| Refused {
        message,
        protect_volume: protect_volume.clone(),
        secret_first: None,
    };
    let spec = volume_spec(va, world.volume).map_err(refused)?;
    let source = pv_csi::csi_source(&spec)
        .map_err(spec_error)
        .map_err(refused)?;
    let capability = pv_csi::capability(
        &spec,
        driver.single_node_multi_writer,
        &world.options.default_fstype,
    )
    .map_err(spec_error)
    .map_err(refused)?;
    let node_id =
        node_id(va, world.csinode, world.node, &driver.name).map_err(|message| Refused {
            secret_first: secret_of(&spec),
            ..refused(message)
        })?;
    let mut ops = finalizers::add_ops(&va.metadata, ours).unwrap_or_default();
    if sidecar_kit::vocabulary::annotation(&va.metadata, ANN_NODE_ID) != Some(node_id.as_str()) {
        ops.push(finalizers::annotation_op(
            &va.metadata,
            ANN_NODE_ID,
            &node_id,
        ));
    }
    Ok(Attach {
        protect_volume,
        protect_attachment: (!ops.is_empty()).then_some(ops),
        publish: Publish {
            volume_id: source.volume_handle.clone(),
            node_id,
            capability,
            readonly: source.read_only.unwrap_or(false) && driver.publish_readonly,
            context: source
                .volume_attributes
                .clone()
                .map(|a| a.into_iter().collect())
                .unwrap_or_default(),
            secret: secret_of(&spec),
            migrated: translated(va, world.volume),
        },
    })
}

/// Whether the attachment's PV is an in-tree one that is translated (upstream's
/// `IsPVMigratable` of the PV the attachment names).
fn translated(va: &VolumeAttachment, volume: Option<&PersistentVolume>) -> bool {
    va.spec.source.persistent_volume_name.is_some()
        && volume.is_some_and(sidecar_kit::migration::is_migratable)
}

fn plan_detach(va: &VolumeAttachment, world: World<'_>, force: bool, ours: &str) -> Plan {
    let release = finalizers::remove_ops(&va.metadata, ours);
    if release.is_none() && !force {
        return Plan::Nothing;
    }
    let resolved = volume_spec(va, world.volume)
        .and_then(|spec| {
            let source = pv_csi::csi_source(&spec).map_err(spec_error)?;
            Ok((source.volume_handle.clone(), secret_of(&spec)))
        })
        .map_err(|message| (message, None))
        .and_then(|(volume_id, secret)| {
            // Upstream reads the secret before it looks for the node's id.
            match node_id_for_detach(va, world.csinode, world.node, &world.driver.name) {
                Ok(node_id) => Ok((volume_id, node_id, secret)),
                Err(message) => Err((message, secret)),
            }
        });
    let (volume_id, node_id, secret) = match resolved {
        Ok(r) => r,
        Err((message, secret_first)) => {
            return Plan::DetachFailed {
                message,
                secret_first,
            };
        }
    };
    let only_ours = va
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.len() == 1);
    let status_clean = !attached(va)
        && va
            .status
            .as_ref()
            .is_none_or(|s| s.detach_error.is_none() && s.attachment_metadata.is_none());
    let write_status = if release.is_some() {
        !only_ours
    } else {
        !status_clean
    };
    Plan::Detach(Detach {
        volume_id,
        node_id,
        secret,
        release,
        write_status,
        migrated: translated(va, world.volume),
    })
}
