//! How one volume of a set is made, as pure decisions: the class as the template overrides it,
//! a stand-in claim for the provisioning decisions (they provision claims), and the finished
//! PersistentVolume: the set's labels, the template's annotations, no claim.

use std::collections::BTreeMap;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::types::{LABEL_SET, PersistentVolumeSet};
use crate::decide::parameters::{PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY};
use crate::decide::provision::{
    DriverCapabilities, ProvisionError, ProvisionOptions, ProvisionPlan, ResponseError, build_pv,
    plan_provision,
};

/// The finalizer that holds a set's volume while the manager deletes it (scale-down): the
/// volume is out of the pool (being deleted, so never bound) until DeleteVolume succeeded.
pub const SET_FINALIZER: &str = "storage.volstack.dev/persistentvolumeset";

/// Characters of the set's name kept in a volume's name.
const NAME_KEEP: usize = 240;

/// Why a set's volume cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MakeError {
    /// The class refers to the claim, and a pool volume has none.
    #[error(
        "StorageClass {class:?} parameter {key:?} refers to the claim ({value:?}); a volume made for a PersistentVolumeSet has no claim"
    )]
    ClaimTemplate {
        /// The class.
        class: String,
        /// The parameter.
        key: String,
        /// Its value.
        value: String,
    },
    /// The provisioning decisions refused.
    #[error(transparent)]
    Plan(#[from] ProvisionError),
}

/// The name of a new volume of `set`: `<set>-<12 hex of the token>`.
pub fn volume_name(set: &str, token: &uuid::Uuid) -> String {
    let kept: String = set.chars().take(NAME_KEEP).collect();
    let hex = token.simple().to_string();
    format!("{kept}-{}", &hex[..12])
}

/// The class with the template's reclaim policy and mount options in place of its own.
pub fn effective_class(set: &PersistentVolumeSet, class: &StorageClass) -> StorageClass {
    let template = &set.spec.template.spec;
    let mut class = class.clone();
    if let Some(policy) = &template.persistent_volume_reclaim_policy {
        class.reclaim_policy = Some(policy.clone());
    }
    if let Some(options) = &template.mount_options {
        class.mount_options = Some(options.clone());
    }
    class
}

/// A claim standing in for the volume: the template's size, access modes, volume mode and
/// class, named after the volume, in no namespace.
fn stand_in(set: &PersistentVolumeSet, name: &str, token: &uuid::Uuid) -> PersistentVolumeClaim {
    let template = &set.spec.template.spec;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            uid: Some(token.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: template.access_modes.clone(),
            storage_class_name: template.storage_class_name.clone(),
            volume_mode: template.volume_mode.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: template.capacity.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// Plans volume `name` of `set` with its class (the class's provisioner, parameters and
/// secrets; the template's size, modes, policy and mount options).
pub fn plan_member(
    caps: &DriverCapabilities,
    options: &ProvisionOptions,
    set: &PersistentVolumeSet,
    class: &StorageClass,
    name: &str,
    token: &uuid::Uuid,
) -> Result<ProvisionPlan, MakeError> {
    let class_name = class.metadata.name.clone().unwrap_or_default();
    // A set's volumes are CSI volumes of the driver: the class must name it (an in-tree class
    // of a migrated plugin would make in-tree PVs the set could not delete through the driver).
    if class.provisioner != caps.name {
        return Err(MakeError::Plan(ProvisionError::WrongProvisioner {
            class: class_name,
            provisioner: class.provisioner.clone(),
        }));
    }
    if let Some((key, value)) = class
        .parameters
        .iter()
        .flatten()
        .find(|(_, v)| v.contains("${pvc."))
    {
        return Err(MakeError::ClaimTemplate {
            class: class_name,
            key: key.clone(),
            value: value.clone(),
        });
    }
    let class = effective_class(set, class);
    let claim = stand_in(set, name, token);
    let mut plan = plan_provision(caps, options, &claim, &class)?;
    plan.pv_name = name.to_string();
    plan.claim_key = format!(
        "persistentvolumeset/{}",
        set.metadata.name.as_deref().unwrap_or("")
    );
    if options.extra_create_metadata {
        plan.parameters.remove(PVC_NAME_KEY);
        plan.parameters.remove(PVC_NAMESPACE_KEY);
        plan.parameters.insert(PV_NAME_KEY.into(), name.to_string());
    }
    Ok(plan)
}

/// The PV of a created volume of `set`: as the provisioner writes it, without a claim, with the
/// template's labels and annotations and the set's label.
pub fn member_pv(
    set: &PersistentVolumeSet,
    plan: &ProvisionPlan,
    caps: &DriverCapabilities,
    options: &ProvisionOptions,
    volume: Option<&csi::Volume>,
    identity: &str,
) -> Result<PersistentVolume, ResponseError> {
    let token = uuid::Uuid::nil();
    let claim = stand_in(set, &plan.pv_name, &token);
    let mut pv = build_pv(plan, caps, options, &claim, volume, identity)?;
    if let Some(spec) = pv.spec.as_mut() {
        spec.claim_ref = None;
    }
    member_metadata(set, &mut pv.metadata);
    Ok(pv)
}

/// The template's labels and annotations, and the set's label, on a volume of the set (an
/// annotation the volume has already is kept).
fn member_metadata(set: &PersistentVolumeSet, metadata: &mut ObjectMeta) {
    let template = &set.spec.template.metadata;
    let mut labels: BTreeMap<String, String> = template.labels.clone().unwrap_or_default();
    labels.insert(
        LABEL_SET.to_string(),
        set.metadata.name.clone().unwrap_or_default(),
    );
    metadata.labels = Some(labels);
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (key, value) in template.annotations.iter().flatten() {
        annotations
            .entry(key.clone())
            .or_insert_with(|| value.clone());
    }
}

/// A static volume of `set` (its template gives a volume source): the template's spec as it
/// is, under `name`, with the template's labels and annotations and the set's label. Nothing
/// is made in any storage; it has no provisioner, so nothing but the set deletes it.
pub fn static_member_pv(set: &PersistentVolumeSet, name: &str) -> PersistentVolume {
    let mut spec = set.spec.template.spec.clone();
    spec.claim_ref = None;
    let mut metadata = ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    };
    member_metadata(set, &mut metadata);
    if let Some(annotations) = metadata.annotations.as_mut() {
        // The set deletes what it made only when nobody claims to have provisioned it.
        annotations.remove(sidecar_kit::vocabulary::ANN_PROVISIONED_BY);
    }
    if metadata
        .annotations
        .as_ref()
        .is_some_and(BTreeMap::is_empty)
    {
        metadata.annotations = None;
    }
    PersistentVolume {
        metadata,
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decide::names::VolumeNaming;
    use serde_json::json;

    fn set() -> PersistentVolumeSet {
        serde_json::from_value(json!({
            "metadata": {"name": "fast"},
            "spec": {
                "minimumReplicas": 1, "maximumReplicas": 2,
                "selector": {"matchLabels": {"pool": "fast"}},
                "template": {
                    "metadata": {"labels": {"pool": "fast"}, "annotations": {"team": "ci", "pv.kubernetes.io/provisioned-by": "someone-else"}},
                    "spec": {"storageClassName": "hostpath", "capacity": {"storage": "2Gi"},
                             "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Recycle",
                             "mountOptions": ["noatime"]},
                },
            },
        }))
        .unwrap()
    }

    fn class(params: serde_json::Value) -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "hostpath"},
            "provisioner": "hostpath.csi",
            "reclaimPolicy": "Delete",
            "parameters": params,
        }))
        .unwrap()
    }

    fn caps() -> DriverCapabilities {
        DriverCapabilities {
            name: "hostpath.csi".into(),
            ..Default::default()
        }
    }

    fn options(extra: bool) -> ProvisionOptions {
        ProvisionOptions {
            naming: VolumeNaming::new("pvc", -1).unwrap(),
            default_fstype: "ext4".into(),
            extra_create_metadata: extra,
            controller_publish_readonly: false,
            topology: true,
            attributes_classes: true,
        }
    }

    #[test]
    fn a_members_request_and_pv_come_from_the_class_and_the_template() {
        let token = uuid::Uuid::from_u128(0xabcdef0123456789_u128 << 64);
        let name = volume_name("fast", &token);
        assert_eq!(name, "fast-abcdef012345");
        let s = set();
        let c = class(
            json!({"kind": "ssd", "csi.storage.k8s.io/provisioner-secret-name": "creds",
                              "csi.storage.k8s.io/provisioner-secret-namespace": "kube-system"}),
        );
        let plan = plan_member(&caps(), &options(true), &s, &c, &name, &token).unwrap();
        assert_eq!(plan.pv_name, name);
        assert_eq!(plan.required_bytes, 2 << 30);
        assert_eq!(plan.reclaim_policy, "Recycle", "the template's policy wins");
        assert_eq!(plan.mount_options, vec!["noatime".to_string()]);
        assert_eq!(plan.parameters.get("kind").map(String::as_str), Some("ssd"));
        assert_eq!(plan.parameters.get(PV_NAME_KEY), Some(&name));
        assert!(!plan.parameters.contains_key(PVC_NAME_KEY));
        assert!(!plan.parameters.contains_key(PVC_NAMESPACE_KEY));
        assert_eq!(
            plan.provisioner_secret.as_ref().map(|s| s.name.as_str()),
            Some("creds")
        );
        let volume = csi::Volume {
            volume_id: "vol-1".into(),
            capacity_bytes: 3 << 30,
            ..Default::default()
        };
        let pv = member_pv(&s, &plan, &caps(), &options(true), Some(&volume), "id").unwrap();
        let spec = pv.spec.as_ref().unwrap();
        assert!(spec.claim_ref.is_none());
        assert_eq!(spec.storage_class_name.as_deref(), Some("hostpath"));
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "3Gi");
        assert_eq!(spec.csi.as_ref().unwrap().volume_handle, "vol-1");
        let labels = pv.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["pool"], "fast");
        assert_eq!(labels[LABEL_SET], "fast");
        let annotations = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["team"], "ci");
        assert_eq!(
            annotations["pv.kubernetes.io/provisioned-by"], "hostpath.csi",
            "the template cannot take the volume from its deleter"
        );
        assert_eq!(
            pv.metadata.finalizers, None,
            "Recycle volumes have no deleter finalizer"
        );
    }

    #[test]
    fn a_static_volume_is_the_templates_spec_with_the_sets_labels() {
        let mut s = set();
        s.spec.template.spec.storage_class_name = Some("nfs-pool".into());
        s.spec.template.spec.nfs = Some(k8s_openapi::api::core::v1::NFSVolumeSource {
            server: "nfs.example".into(),
            path: "/exports/a".into(),
            read_only: Some(true),
        });
        s.spec.template.spec.claim_ref = Some(Default::default());
        let pv = static_member_pv(&s, "fast-0123456789ab");
        assert_eq!(pv.metadata.name.as_deref(), Some("fast-0123456789ab"));
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.nfs.as_ref().unwrap().path, "/exports/a");
        assert_eq!(spec.storage_class_name.as_deref(), Some("nfs-pool"));
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "2Gi");
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Recycle")
        );
        assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
        assert!(spec.claim_ref.is_none(), "never bound in advance");
        assert!(spec.csi.is_none());
        let labels = pv.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["pool"], "fast");
        assert_eq!(labels[LABEL_SET], "fast");
        let annotations = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["team"], "ci");
        assert!(
            !annotations.contains_key("pv.kubernetes.io/provisioned-by"),
            "nobody provisioned it: the set may delete it"
        );
        assert_eq!(pv.metadata.finalizers, None);
    }

    #[test]
    fn classes_a_pool_cannot_use_are_refused_with_the_reason() {
        let token = uuid::Uuid::nil();
        let s = set();
        let templated = class(
            json!({"csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}",
                                      "csi.storage.k8s.io/provisioner-secret-namespace": "ns"}),
        );
        let err = plan_member(&caps(), &options(false), &s, &templated, "v", &token).unwrap_err();
        assert!(err.to_string().contains("refers to the claim"), "{err}");
        let mut in_tree = class(json!({}));
        in_tree.provisioner = "kubernetes.io/aws-ebs".into();
        let mut ebs = caps();
        ebs.name = "ebs.csi.aws.com".into();
        ebs.migrated_from = Some(sidecar_kit::migration::Plugin::AwsEbs);
        let err = plan_member(&ebs, &options(false), &s, &in_tree, "v", &token).unwrap_err();
        assert!(
            matches!(
                err,
                MakeError::Plan(ProvisionError::WrongProvisioner { .. })
            ),
            "a set never makes in-tree volumes: {err}"
        );
        let mut other = class(json!({}));
        other.provisioner = "other.csi".into();
        let err = plan_member(&caps(), &options(false), &s, &other, "v", &token).unwrap_err();
        assert!(matches!(
            err,
            MakeError::Plan(ProvisionError::WrongProvisioner { .. })
        ));
        // A long set name still gives a valid object name.
        let long = "s".repeat(253);
        assert!(volume_name(&long, &token).len() <= 253);
    }
}
