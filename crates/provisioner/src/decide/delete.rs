//! Which volumes are ours to delete, and what to do with each PV.

use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::vocabulary::annotation;

use super::provision::{
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_PROVISIONED_BY, PV_FINALIZER,
};
use super::secrets::SecretRef;

/// What the deleter does with a PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Not ours, or nothing to do.
    Ignore,
    /// Released with policy Delete: DeleteVolume, then delete the PV, then drop the finalizer.
    Delete {
        /// CSI volume handle.
        volume_handle: String,
        /// Secret for DeleteVolume: Some(None) means "recorded as none", None means "not
        /// recorded on the PV" (an older provisioner made it; fall back to the class).
        secret: Option<Option<SecretRef>>,
    },
    /// The policy is no longer Delete (or the PV is already gone from the driver's view):
    /// drop our finalizer so the PV can go.
    RemoveFinalizer,
    /// A Bound volume of ours with policy Delete lacks our finalizer (a static PV, one whose
    /// policy became Delete, one an older provisioner made): add it, so deleting the PV
    /// object cannot leak the volume (upstream's `handleProtectionFinalizer`).
    AddFinalizer,
    /// An in-tree PV of the migrated plugin whose source does not translate (why): it cannot
    /// be deleted through the driver.
    Untranslatable(String),
}

/// Whether the PV belongs to our driver: provisioned by us, or a static PV of our driver.
pub fn is_ours(pv: &PersistentVolume, driver: &str) -> bool {
    if annotation(&pv.metadata, ANN_PROVISIONED_BY) == Some(driver) {
        return true;
    }
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == driver)
        && annotation(&pv.metadata, ANN_PROVISIONED_BY).is_none()
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == PV_FINALIZER))
}

/// Decides what to do with a PV (`migrated_from`: the in-tree plugin our driver stands in
/// for, whose PVs are ours too).
pub fn decide_volume(
    pv: &PersistentVolume,
    driver: &str,
    migrated_from: Option<sidecar_kit::migration::Plugin>,
) -> VolumeDecision {
    let migrated = migrated_from.is_some_and(|p| super::migration::is_migrated_ours(pv, driver, p));
    if !is_ours(pv, driver) && !migrated {
        return VolumeDecision::Ignore;
    }
    let spec = pv.spec.as_ref();
    let policy = spec
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    let phase = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    if policy != "Delete" {
        return if has_finalizer(pv) {
            VolumeDecision::RemoveFinalizer
        } else {
            VolumeDecision::Ignore
        };
    }
    if phase == "Bound" && pv.metadata.deletion_timestamp.is_none() && !has_finalizer(pv) {
        return VolumeDecision::AddFinalizer;
    }
    if phase != "Released" {
        return VolumeDecision::Ignore;
    }
    let handle = match super::migration::csi_handle(pv) {
        Ok(Some(handle)) => handle,
        Ok(None) => return VolumeDecision::Ignore,
        Err(error) => return VolumeDecision::Untranslatable(error.to_string()),
    };
    VolumeDecision::Delete {
        volume_handle: handle,
        secret: recorded_secret(pv),
    }
}

/// The DeleteVolume secret a PV records: Some(None) means "recorded as none", None means "not
/// recorded" (an older provisioner made it).
pub fn recorded_secret(pv: &PersistentVolume) -> Option<Option<SecretRef>> {
    match (
        annotation(&pv.metadata, ANN_DELETION_SECRET_NAME),
        annotation(&pv.metadata, ANN_DELETION_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) if !name.is_empty() => Some(Some(SecretRef {
            name: name.to_string(),
            namespace: namespace.to_string(),
        })),
        (Some(_), _) | (_, Some(_)) => Some(None),
        (None, None) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decide::testing::pv;

    const D: &str = "hostpath.csi";

    #[test]
    fn released_delete_volumes_of_ours_are_deleted_with_their_recorded_secret() {
        let v = pv("pv-1")
            .ours(D)
            .policy("Delete")
            .phase("Released")
            .secret("s", "ns")
            .build();
        assert_eq!(
            decide_volume(&v, D, None),
            VolumeDecision::Delete {
                volume_handle: "handle-pv-1".into(),
                secret: Some(Some(SecretRef {
                    name: "s".into(),
                    namespace: "ns".into()
                }))
            }
        );
        let none = pv("pv-1")
            .ours(D)
            .policy("Delete")
            .phase("Released")
            .secret("", "")
            .build();
        assert_eq!(
            decide_volume(&none, D, None),
            VolumeDecision::Delete {
                volume_handle: "handle-pv-1".into(),
                secret: Some(None)
            }
        );
        let old = pv("pv-1")
            .ours(D)
            .policy("Delete")
            .phase("Released")
            .build();
        assert_eq!(
            decide_volume(&old, D, None),
            VolumeDecision::Delete {
                volume_handle: "handle-pv-1".into(),
                secret: None
            }
        );
    }

    #[test]
    fn other_phases_policies_and_drivers_are_left_alone() {
        let being_deleted = {
            let mut v = pv("a").ours(D).policy("Delete").phase("Bound").build();
            v.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            v
        };
        let table = [
            (
                pv("a")
                    .ours(D)
                    .policy("Delete")
                    .phase("Bound")
                    .finalizer()
                    .build(),
                VolumeDecision::Ignore,
            ),
            // Upstream's handleProtectionFinalizer: only a Bound Delete volume not being
            // deleted gets the finalizer.
            (
                pv("a").ours(D).policy("Delete").phase("Bound").build(),
                VolumeDecision::AddFinalizer,
            ),
            (being_deleted, VolumeDecision::Ignore),
            (
                pv("a")
                    .ours("other")
                    .policy("Delete")
                    .phase("Bound")
                    .build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a").ours(D).policy("Retain").phase("Bound").build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a").ours(D).policy("Delete").phase("Available").build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a").ours(D).policy("Retain").phase("Released").build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a").ours(D).policy("Recycle").phase("Released").build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a")
                    .ours("other")
                    .policy("Delete")
                    .phase("Released")
                    .build(),
                VolumeDecision::Ignore,
            ),
            (
                pv("a")
                    .ours(D)
                    .policy("Retain")
                    .phase("Bound")
                    .finalizer()
                    .build(),
                VolumeDecision::RemoveFinalizer,
            ),
        ];
        for (v, want) in table {
            assert_eq!(decide_volume(&v, D, None), want, "{:?}", v.metadata.name);
        }
    }

    #[test]
    fn in_tree_volumes_of_the_plugin_we_stand_in_for_are_deleted_through_their_csi_handle() {
        use sidecar_kit::migration::Plugin;
        let ebs = |volume_id: &str, by: Option<&str>| -> PersistentVolume {
            let mut v: PersistentVolume = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pvc-1"},
                "spec": {"awsElasticBlockStore": {"volumeID": volume_id},
                         "persistentVolumeReclaimPolicy": "Delete"},
                "status": {"phase": "Released"},
            }))
            .unwrap();
            if let Some(by) = by {
                v.metadata.annotations =
                    Some([(ANN_PROVISIONED_BY.to_string(), by.to_string())].into());
            }
            v
        };
        const EBS: &str = "ebs.csi.aws.com";
        let mine = ebs("aws://us-east-1a/vol-0abc", Some("kubernetes.io/aws-ebs"));
        assert_eq!(
            decide_volume(&mine, EBS, Some(Plugin::AwsEbs)),
            VolumeDecision::Delete {
                volume_handle: "vol-0abc".into(),
                secret: None
            }
        );
        assert_eq!(
            decide_volume(&mine, EBS, None),
            VolumeDecision::Ignore,
            "CSIMigration off: the in-tree plugin's"
        );
        assert_eq!(
            decide_volume(&ebs("vol-1", None), EBS, Some(Plugin::AwsEbs)),
            VolumeDecision::Ignore,
            "a static in-tree volume not marked migrated to us"
        );
        assert!(matches!(
            decide_volume(&ebs("aws://us-east-1a/disk-9", Some("kubernetes.io/aws-ebs")), EBS, Some(Plugin::AwsEbs)),
            VolumeDecision::Untranslatable(why) if why.contains("Invalid format for AWS volume")
        ));
    }

    #[test]
    fn static_pvs_of_our_driver_count_as_ours() {
        let v = pv("static")
            .csi_driver(D)
            .policy("Delete")
            .phase("Released")
            .build();
        assert!(is_ours(&v, D));
        assert!(matches!(
            decide_volume(&v, D, None),
            VolumeDecision::Delete { .. }
        ));
        let foreign = pv("x")
            .csi_driver(D)
            .annotation(ANN_PROVISIONED_BY, "someone-else")
            .build();
        assert!(!is_ours(&foreign, D), "provisioned by another provisioner");
    }
}
