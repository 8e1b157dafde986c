//! From a claim and its class to the CreateVolume request, and from the driver's answer to the
//! PersistentVolume, exactly as upstream writes it.

use std::collections::{BTreeMap, HashMap};

use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::quantity::format_binary_si;

use super::claim::{SizeError, requested_bytes};
use super::names::VolumeNaming;
use super::parameters::{
    PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY, ParameterError, SecretKind,
    parse_class_parameters,
};
use super::secrets::{SecretError, SecretRef, TemplateContext, resolve};
use super::topology::Requirement;
pub use sidecar_kit::vocabulary::{
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_MODIFY_SECRET_NAME,
    ANN_MODIFY_SECRET_NAMESPACE, ANN_PROVISIONED_BY, PV_FINALIZER,
};

/// Volume attribute identifying the provisioner instance.
pub const IDENTITY_ATTRIBUTE: &str = "storage.kubernetes.io/csiProvisionerIdentity";

/// What the driver advertised at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    /// Driver name (= provisioner name).
    pub name: String,
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS.
    pub accessibility: bool,
    /// SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
    /// PUBLISH_UNPUBLISH_VOLUME.
    pub publish_unpublish: bool,
    /// GET_CAPACITY.
    pub get_capacity: bool,
    /// CLONE_VOLUME.
    pub clone_volume: bool,
    /// CREATE_DELETE_SNAPSHOT (restores from snapshots).
    pub create_delete_snapshot: bool,
    /// MODIFY_VOLUME (claims naming a VolumeAttributesClass).
    pub modify_volume: bool,
    /// LIST_VOLUMES, and the recoverable-volumes convention in GetPluginInfo's manifest.
    pub recoverable: bool,
    /// The in-tree plugin the driver stands in for (CSI migration), if any.
    pub migrated_from: Option<sidecar_kit::migration::Plugin>,
    /// Why the driver cannot provision or delete volumes at all, if it cannot (see
    /// [`no_dynamic_provisioning`]).
    pub no_dynamic_provisioning: Option<NoDynamicProvisioning>,
}

/// Why a driver cannot provision or delete volumes at all. Like external-provisioner (its
/// `checkDriverCapabilities`), the provisioner starts anyway and fails each claim
/// (`ProvisioningFailed`) and each deletion (`VolumeFailedDelete`) with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoDynamicProvisioning {
    /// GetPluginCapabilities does not list CONTROLLER_SERVICE.
    #[error(
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
    )]
    ControllerService,
    /// ControllerGetCapabilities does not list CREATE_DELETE_VOLUME.
    #[error(
        "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
    )]
    CreateDeleteVolume,
}

/// Whether a driver with (or without) a controller service and CREATE_DELETE_VOLUME can
/// provision, checked in upstream's order.
pub fn no_dynamic_provisioning(
    controller_service: bool,
    create_delete_volume: bool,
) -> Option<NoDynamicProvisioning> {
    if !controller_service {
        Some(NoDynamicProvisioning::ControllerService)
    } else if !create_delete_volume {
        Some(NoDynamicProvisioning::CreateDeleteVolume)
    } else {
        None
    }
}

/// Provisioning flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionOptions {
    /// PV naming.
    pub naming: VolumeNaming,
    /// `--default-fstype`.
    pub default_fstype: String,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
    /// The `Topology` feature gate: with the driver's VOLUME_ACCESSIBILITY_CONSTRAINTS, the
    /// PV gets the node affinity of the volume's accessible topology (upstream's
    /// `supportsTopology`).
    pub topology: bool,
    /// The `VolumeAttributesClass` feature gate: the claim's class is sent and named on the PV.
    pub attributes_classes: bool,
}

/// A claim that cannot be provisioned as it stands. Final: an event explains it and the
/// claim is retried with backoff (the class or claim may be fixed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    /// The driver cannot provision at all.
    #[error(transparent)]
    NoDynamicProvisioning(#[from] NoDynamicProvisioning),
    /// The claim has a label selector.
    #[error("claim Selector is not supported")]
    Selector,
    /// The claim names a VolumeAttributesClass and the driver cannot modify volumes.
    #[error(
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    )]
    ModifyVolumeUnsupported,
    /// The claim's size.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// The class parameters.
    #[error(transparent)]
    Parameter(#[from] ParameterError),
    /// A secret template.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// No access mode, or one we cannot map.
    #[error("{0}")]
    AccessMode(String),
    /// The class names another provisioner.
    #[error("StorageClass {class:?} names provisioner {provisioner:?}, not this driver")]
    WrongProvisioner {
        /// The class's name.
        class: String,
        /// Its provisioner.
        provisioner: String,
    },
    /// The VolumeAttributesClass belongs to another driver.
    #[error(
        "VAC {name} referenced in PVC is for driver {driver} which does not match driver name {ours}"
    )]
    VacDriver {
        /// VAC name.
        name: String,
        /// Its driver.
        driver: String,
        /// This provisioner's driver.
        ours: String,
    },
    /// The in-tree class of a migrated plugin cannot be translated.
    #[error("failed to translate storage class: {0}")]
    Translate(#[source] sidecar_kit::migration::TranslateError),
}

/// Everything about a claim that does not depend on the driver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionPlan {
    /// PV and volume name.
    pub pv_name: String,
    /// Claim namespace/name (for logs and events).
    pub claim_key: String,
    /// Bytes asked for (the claim's request; upstream sends no limit, whatever the claim's
    /// `resources.limits` say).
    pub required_bytes: i64,
    /// Block volume.
    pub block: bool,
    /// fsType for mount volumes.
    pub fs_type: String,
    /// Capabilities, one per access mode.
    pub capabilities: Vec<csi::VolumeCapability>,
    /// Driver parameters.
    pub parameters: BTreeMap<String, String>,
    /// Mutable parameters from the VolumeAttributesClass.
    pub mutable_parameters: BTreeMap<String, String>,
    /// CreateVolume/DeleteVolume secret.
    pub provisioner_secret: Option<SecretRef>,
    /// Secrets written into the PV.
    pub pv_secrets: BTreeMap<SecretKind, SecretRef>,
    /// Class name.
    pub class_name: String,
    /// Reclaim policy for the PV.
    pub reclaim_policy: String,
    /// Mount options for the PV.
    pub mount_options: Vec<String>,
    /// The in-tree plugin whose class this is (CSI migration): the PV is written as its.
    pub migrated_from: Option<sidecar_kit::migration::Plugin>,
}

fn access_mode_to_csi(mode: &str, caps: &DriverCapabilities) -> Result<Mode, ProvisionError> {
    Ok(match mode {
        "ReadWriteOnce" if caps.single_node_multi_writer => Mode::SingleNodeMultiWriter,
        "ReadWriteOnce" => Mode::SingleNodeWriter,
        "ReadWriteOncePod" if caps.single_node_multi_writer => Mode::SingleNodeSingleWriter,
        "ReadWriteOncePod" => Mode::SingleNodeWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        other => {
            return Err(ProvisionError::AccessMode(format!(
                "unknown access mode {other:?}"
            )));
        }
    })
}

/// Upstream's capability check for a claim that names a VolumeAttributesClass (`vac_gate`:
/// the VolumeAttributesClass feature gate): the driver must advertise MODIFY_VOLUME. Made once
/// the data source's kind is known (a populator's claim is not checked) and before the source
/// or the VolumeAttributesClass is looked up, as upstream orders them.
pub fn check_modify_volume(
    caps: &DriverCapabilities,
    claim: &PersistentVolumeClaim,
    vac_gate: bool,
) -> Result<(), ProvisionError> {
    let names_a_class = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if vac_gate && names_a_class && !caps.modify_volume {
        return Err(ProvisionError::ModifyVolumeUnsupported);
    }
    Ok(())
}

/// Plans the provisioning of a claim with its class; the VolumeAttributesClass's parameters
/// come later ([`vac_parameters`]), as upstream reads that class after the topology and the
/// secret.
pub fn plan_provision(
    caps: &DriverCapabilities,
    options: &ProvisionOptions,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<ProvisionPlan, ProvisionError> {
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let Some(chosen) = super::migration::provisioning_class(&caps.name, caps.migrated_from, class)
    else {
        return Err(ProvisionError::WrongProvisioner {
            class: class_name,
            provisioner: class.provisioner.clone(),
        });
    };
    let (translated, migrated_from) = chosen.map_err(ProvisionError::Translate)?;
    if let Some(why) = caps.no_dynamic_provisioning {
        return Err(why.into());
    }
    let class = &translated;
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.selector.is_some() {
        return Err(ProvisionError::Selector);
    }
    let required_bytes = requested_bytes(claim)?;
    let class_params: BTreeMap<String, String> = class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let parsed = parse_class_parameters(&class_params)?;
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let claim_namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = options.naming.pv_name(&uid);
    let annotations: Option<BTreeMap<String, String>> = claim.metadata.annotations.clone();
    let ctx = TemplateContext {
        pv_name: &pv_name,
        pvc_name: &claim_name,
        pvc_namespace: &claim_namespace,
        pvc_annotations: annotations.as_ref(),
    };
    let mut pv_secrets = BTreeMap::new();
    let mut provisioner_secret = None;
    for (kind, template) in &parsed.secrets {
        let resolved = resolve(template, &ctx)?;
        if *kind == SecretKind::Provisioner {
            provisioner_secret = Some(resolved);
        } else {
            pv_secrets.insert(*kind, resolved);
        }
    }
    let block = spec.volume_mode.as_deref() == Some("Block");
    // Upstream's: the class's options go on the PV for a Block volume too (its CreateVolume
    // capability has no mount flags).
    let mount_options = class.mount_options.clone().unwrap_or_default();
    let modes = spec.access_modes.clone().unwrap_or_default();
    if modes.is_empty() {
        return Err(ProvisionError::AccessMode(
            "claim has no access modes".into(),
        ));
    }
    let fs_type = if block {
        String::new()
    } else {
        parsed
            .fs_type
            .clone()
            .unwrap_or_else(|| options.default_fstype.clone())
    };
    let mut capabilities = Vec::new();
    for mode in &modes {
        let csi_mode = access_mode_to_csi(mode, caps)?;
        capabilities.push(csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: csi_mode as i32,
            }),
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.clone(),
                    mount_flags: mount_options.clone(),
                    volume_mount_group: String::new(),
                })
            }),
        });
    }
    let mut parameters = parsed.driver.clone();
    if options.extra_create_metadata {
        parameters.insert(PVC_NAME_KEY.into(), claim_name.clone());
        parameters.insert(PVC_NAMESPACE_KEY.into(), claim_namespace.clone());
        parameters.insert(PV_NAME_KEY.into(), pv_name.clone());
    }
    Ok(ProvisionPlan {
        pv_name,
        claim_key: format!("{claim_namespace}/{claim_name}"),
        required_bytes,
        block,
        fs_type,
        capabilities,
        parameters,
        mutable_parameters: BTreeMap::new(),
        provisioner_secret,
        pv_secrets,
        class_name,
        reclaim_policy: class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".into()),
        mount_options,
        migrated_from,
    })
}

/// The `mutable_parameters` of CreateVolume: the claim's VolumeAttributesClass's parameters,
/// refused when the class is another driver's.
pub fn vac_parameters(
    caps: &DriverCapabilities,
    vac: Option<&VolumeAttributesClass>,
) -> Result<BTreeMap<String, String>, ProvisionError> {
    let Some(vac) = vac else {
        return Ok(BTreeMap::new());
    };
    if vac.driver_name != caps.name {
        return Err(ProvisionError::VacDriver {
            name: vac.metadata.name.clone().unwrap_or_default(),
            driver: vac.driver_name.clone(),
            ours: caps.name.clone(),
        });
    }
    Ok(vac
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect())
}

/// The CreateVolume request for a plan, with the fetched secret data and the topology.
pub fn create_request(
    plan: &ProvisionPlan,
    secrets: HashMap<String, String>,
    topology: Option<&Requirement>,
) -> csi::CreateVolumeRequest {
    let to_csi = |segs: &[BTreeMap<String, String>]| {
        segs.iter()
            .map(|s| csi::Topology {
                segments: s.clone().into_iter().collect(),
            })
            .collect()
    };
    csi::CreateVolumeRequest {
        name: plan.pv_name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: plan.required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: plan.capabilities.clone(),
        parameters: plan.parameters.clone().into_iter().collect(),
        secrets,
        volume_content_source: None,
        accessibility_requirements: topology.map(|(requisite, preferred)| {
            csi::TopologyRequirement {
                requisite: to_csi(requisite),
                preferred: to_csi(preferred),
            }
        }),
        mutable_parameters: plan.mutable_parameters.clone().into_iter().collect(),
    }
}

/// The driver's answer cannot be used; the new volume must be deleted again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// No volume or no id.
    #[error("driver returned no volume id")]
    NoVolumeId,
    /// Smaller than asked.
    #[error("created volume capacity {got} less than requested capacity {wanted}")]
    TooSmall {
        /// Bytes returned.
        got: i64,
        /// Bytes asked for.
        wanted: i64,
    },
    /// A clone or restore answered without saying what it copied: the driver ignored the
    /// source, so the volume is empty.
    #[error("volume content source missing")]
    ContentSourceMissing,
    /// The PV of a migrated class cannot be written as the in-tree plugin's.
    #[error("failed to translate CSI PV to in-tree due to: {0}")]
    Translate(#[source] sidecar_kit::migration::TranslateError),
}

/// Upstream's check of a clone's or restore's answer: the driver must name the source it
/// copied (a driver that ignores `volume_content_source` made an empty volume).
pub fn check_content_source(
    copying: bool,
    volume: Option<&csi::Volume>,
) -> Result<(), ResponseError> {
    let copied = volume.is_some_and(|v| v.content_source.is_some());
    if copying && !copied {
        return Err(ResponseError::ContentSourceMissing);
    }
    Ok(())
}

fn secret_ref(r: &SecretRef) -> SecretReference {
    SecretReference {
        name: Some(r.name.clone()),
        namespace: Some(r.namespace.clone()),
    }
}

/// Builds the PV for a created volume, as upstream writes it.
pub fn build_pv(
    plan: &ProvisionPlan,
    caps: &DriverCapabilities,
    options: &ProvisionOptions,
    claim: &PersistentVolumeClaim,
    volume: Option<&csi::Volume>,
    identity: &str,
) -> Result<PersistentVolume, ResponseError> {
    let volume = volume
        .filter(|v| !v.volume_id.is_empty())
        .ok_or(ResponseError::NoVolumeId)?;
    let bytes = if volume.capacity_bytes == 0 {
        plan.required_bytes
    } else {
        volume.capacity_bytes
    };
    if bytes < plan.required_bytes {
        return Err(ResponseError::TooSmall {
            got: bytes,
            wanted: plan.required_bytes,
        });
    }
    let spec = claim.spec.clone().unwrap_or_default();
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    let mut annotations = BTreeMap::from([(ANN_PROVISIONED_BY.to_string(), caps.name.clone())]);
    let (del_name, del_ns) = plan
        .provisioner_secret
        .as_ref()
        .map(|s| (s.name.clone(), s.namespace.clone()))
        .unwrap_or_default();
    annotations.insert(ANN_DELETION_SECRET_NAME.into(), del_name);
    annotations.insert(ANN_DELETION_SECRET_NAMESPACE.into(), del_ns);
    if let Some(modify) = plan.pv_secrets.get(&SecretKind::ControllerModify) {
        annotations.insert(ANN_MODIFY_SECRET_NAME.into(), modify.name.clone());
        annotations.insert(ANN_MODIFY_SECRET_NAMESPACE.into(), modify.namespace.clone());
    }
    // The identity first, the driver's context over it: a key of the driver's wins, as in
    // external-provisioner.
    let mut attributes = BTreeMap::from([(IDENTITY_ATTRIBUTE.to_string(), identity.to_string())]);
    attributes.extend(volume.volume_context.clone());
    let read_only =
        options.controller_publish_readonly && access_modes.iter().all(|m| m == "ReadOnlyMany");
    let topology = options.topology && caps.accessibility;
    let node_affinity =
        (topology && !volume.accessible_topology.is_empty()).then(|| VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: volume
                    .accessible_topology
                    .iter()
                    .map(|t| {
                        let sorted: BTreeMap<&String, &String> = t.segments.iter().collect();
                        NodeSelectorTerm {
                            match_expressions: Some(
                                sorted
                                    .into_iter()
                                    .map(|(k, v)| NodeSelectorRequirement {
                                        key: k.clone(),
                                        operator: "In".into(),
                                        values: Some(vec![v.clone()]),
                                    })
                                    .collect(),
                            ),
                            match_fields: None,
                        }
                    })
                    .collect(),
            }),
        });
    let get = |kind| plan.pv_secrets.get(&kind).map(secret_ref);
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.pv_name.clone()),
            annotations: Some(annotations),
            finalizers: (plan.reclaim_policy == "Delete").then(|| vec![PV_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(access_modes),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                K8sQuantity(format_binary_si(bytes)),
            )])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                name: claim.metadata.name.clone(),
                namespace: claim.metadata.namespace.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                field_path: None,
            }),
            persistent_volume_reclaim_policy: Some(plan.reclaim_policy.clone()),
            storage_class_name: Some(plan.class_name.clone()),
            volume_mode: Some(if plan.block {
                "Block".into()
            } else {
                "Filesystem".into()
            }),
            mount_options: (!plan.mount_options.is_empty()).then(|| plan.mount_options.clone()),
            // Only a class named (the API server refuses an empty name on a PV) and with the
            // gate on, as upstream.
            volume_attributes_class_name: spec
                .volume_attributes_class_name
                .clone()
                .filter(|name| options.attributes_classes && !name.is_empty()),
            node_affinity,
            csi: Some(CSIPersistentVolumeSource {
                driver: caps.name.clone(),
                volume_handle: volume.volume_id.clone(),
                volume_attributes: Some(attributes),
                fs_type: (!plan.block && !plan.fs_type.is_empty()).then(|| plan.fs_type.clone()),
                read_only: read_only.then_some(true),
                controller_publish_secret_ref: get(SecretKind::ControllerPublish),
                node_stage_secret_ref: get(SecretKind::NodeStage),
                node_publish_secret_ref: get(SecretKind::NodePublish),
                controller_expand_secret_ref: get(SecretKind::ControllerExpand),
                node_expand_secret_ref: get(SecretKind::NodeExpand),
            }),
            ..Default::default()
        }),
        status: None,
    };
    match plan.migrated_from {
        Some(plugin) => super::migration::in_tree_pv(pv, plugin).map_err(ResponseError::Translate),
        None => Ok(pv),
    }
}

/// Whether an existing PV of the name we would create was made for this claim (by an earlier
/// pass of ours): then saving it again is done, otherwise it is a conflict.
pub fn made_for_claim(existing: &PersistentVolume, claim_uid: &str) -> bool {
    existing
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        == Some(claim_uid)
}

#[cfg(test)]
#[path = "provision_tests.rs"]
mod tests;
