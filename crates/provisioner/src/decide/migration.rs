//! CSI migration in the provisioner: a driver that stands in for an in-tree plugin (by its
//! name: `ebs.csi.aws.com` for `kubernetes.io/aws-ebs`...) provisions for classes naming that
//! plugin, with the class translated as the plugin's; the PV it writes is the in-tree one, its
//! `pv.kubernetes.io/provisioned-by` the plugin's name; and it deletes in-tree PVs of that
//! plugin, through the CSI handle they translate to. Off with `--feature-gates=CSIMigration=false`.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use sidecar_kit::migration::{self, ANN_MIGRATED_TO, Plugin, TranslateError};
use sidecar_kit::vocabulary::annotation;

use super::provision::ANN_PROVISIONED_BY;

/// The class the driver provisions with: the class itself when it names the driver, the
/// in-tree class translated when it names the plugin the driver stands in for; `None` when it
/// names neither.
pub fn provisioning_class(
    driver: &str,
    migrated_from: Option<Plugin>,
    class: &StorageClass,
) -> Option<Result<(StorageClass, Option<Plugin>), TranslateError>> {
    if !provisions_for(driver, migrated_from, class) {
        return None;
    }
    match migrated_from.filter(|p| p.in_tree_name() == class.provisioner) {
        None => Some(Ok((class.clone(), None))),
        Some(plugin) => {
            Some(migration::class_to_csi(plugin.in_tree_name(), class).map(|c| (c, Some(plugin))))
        }
    }
}

/// Whether the class is one the driver provisions for: it names the driver, or the in-tree
/// plugin the driver stands in for (upstream's `knownProvisioner` of the class).
pub fn provisions_for(driver: &str, migrated_from: Option<Plugin>, class: &StorageClass) -> bool {
    class.provisioner == driver
        || migrated_from.is_some_and(|p| p.in_tree_name() == class.provisioner)
}

/// The PV to write for a volume of a migrated class: the in-tree PV, provisioned by the plugin.
pub fn in_tree_pv(
    pv: PersistentVolume,
    plugin: Plugin,
) -> Result<PersistentVolume, TranslateError> {
    let mut pv = migration::pv_to_in_tree(&pv)?;
    pv.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANN_PROVISIONED_BY.into(), plugin.in_tree_name().into());
    Ok(pv)
}

/// Whether a PV is ours to delete under migration: it says it was provisioned by the plugin
/// we stand in for (or is marked migrated to our driver), or, with no provisioner recorded,
/// it has that plugin's in-tree source and is marked migrated to us.
pub fn is_migrated_ours(pv: &PersistentVolume, driver: &str, plugin: Plugin) -> bool {
    let known = |name: Option<&str>| name == Some(driver) || name == Some(plugin.in_tree_name());
    let migrated_to = annotation(&pv.metadata, ANN_MIGRATED_TO);
    match annotation(&pv.metadata, ANN_PROVISIONED_BY) {
        Some(by) => (known(Some(by)) || known(migrated_to)) && in_tree_of(pv) == Some(plugin),
        None => in_tree_of(pv) == Some(plugin) && known(migrated_to),
    }
}

fn in_tree_of(pv: &PersistentVolume) -> Option<Plugin> {
    pv.spec.as_ref().and_then(Plugin::of_spec)
}

/// The CSI handle of a PV: its own, or the one its in-tree source translates to.
pub fn csi_handle(pv: &PersistentVolume) -> Result<Option<String>, TranslateError> {
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        return Ok(Some(csi.volume_handle.clone()));
    }
    if !migration::is_migratable(pv) {
        return Ok(None);
    }
    let translated = migration::pv_to_csi(pv)?;
    Ok(translated.spec.and_then(|s| s.csi).map(|c| c.volume_handle))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const EBS: &str = "ebs.csi.aws.com";

    fn class(provisioner: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "gp2"}, "provisioner": provisioner,
            "parameters": {"fsType": "xfs", "type": "gp2"}}),
        )
        .unwrap()
    }

    #[test]
    fn a_migrated_driver_provisions_for_its_plugins_classes_translated() {
        let ours = provisioning_class(EBS, Some(Plugin::AwsEbs), &class(EBS))
            .unwrap()
            .unwrap();
        assert_eq!(ours.1, None);
        let (translated, plugin) =
            provisioning_class(EBS, Some(Plugin::AwsEbs), &class("kubernetes.io/aws-ebs"))
                .unwrap()
                .unwrap();
        assert_eq!(plugin, Some(Plugin::AwsEbs));
        let params = translated.parameters.unwrap();
        assert_eq!(params["csi.storage.k8s.io/fstype"], "xfs");
        assert!(!params.contains_key("fsType"));
        // Gate off, another plugin, another driver: not ours.
        assert!(provisioning_class(EBS, None, &class("kubernetes.io/aws-ebs")).is_none());
        assert!(
            provisioning_class(EBS, Some(Plugin::AwsEbs), &class("kubernetes.io/gce-pd")).is_none()
        );
        assert!(provisioning_class(EBS, Some(Plugin::AwsEbs), &class("other.csi")).is_none());
        // provisions_for says the same, without translating.
        for (migrated, provisioner, want) in [
            (Some(Plugin::AwsEbs), EBS, true),
            (Some(Plugin::AwsEbs), "kubernetes.io/aws-ebs", true),
            (None, "kubernetes.io/aws-ebs", false),
            (Some(Plugin::AwsEbs), "kubernetes.io/gce-pd", false),
            (Some(Plugin::AwsEbs), "other.csi", false),
        ] {
            assert_eq!(
                provisions_for(EBS, migrated, &class(provisioner)),
                want,
                "{migrated:?} {provisioner}"
            );
        }
        // A class the plugin's translation refuses says why.
        let mut both = class("kubernetes.io/aws-ebs");
        both.parameters
            .as_mut()
            .unwrap()
            .insert("zone".into(), "a".into());
        both.allowed_topologies = Some(vec![Default::default()]);
        let error = provisioning_class(EBS, Some(Plugin::AwsEbs), &both)
            .unwrap()
            .unwrap_err();
        assert_eq!(error, TranslateError::ZonesAndTopologies);
    }

    #[test]
    fn the_pv_written_is_the_plugins_and_is_deleted_through_its_translated_handle() {
        let csi: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "annotations": {ANN_PROVISIONED_BY: EBS}},
            "spec": {"csi": {"driver": EBS, "volumeHandle": "vol-0abc", "fsType": "xfs",
                             "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "x"}},
                     "persistentVolumeReclaimPolicy": "Delete"},
        }))
        .unwrap();
        let written = in_tree_pv(csi.clone(), Plugin::AwsEbs).unwrap();
        let spec = written.spec.as_ref().unwrap();
        assert!(spec.csi.is_none());
        assert_eq!(
            spec.aws_elastic_block_store.as_ref().unwrap().volume_id,
            "vol-0abc"
        );
        assert_eq!(
            annotation(&written.metadata, ANN_PROVISIONED_BY),
            Some("kubernetes.io/aws-ebs")
        );
        assert_eq!(csi_handle(&written).unwrap().as_deref(), Some("vol-0abc"));
        assert_eq!(csi_handle(&csi).unwrap().as_deref(), Some("vol-0abc"));

        // (provisioned-by, migrated-to, ours)
        let table = [
            (Some("kubernetes.io/aws-ebs"), None, true),
            (Some("kubernetes.io/aws-ebs"), Some(EBS), true),
            (Some("someone-else"), Some(EBS), true),
            (Some("someone-else"), None, false),
            (None, Some(EBS), true),
            (None, None, false),
            (Some("kubernetes.io/gce-pd"), None, false),
        ];
        for (by, to, want) in table {
            let mut pv = written.clone();
            let annotations = pv.metadata.annotations.as_mut().unwrap();
            annotations.remove(ANN_PROVISIONED_BY);
            if let Some(by) = by {
                annotations.insert(ANN_PROVISIONED_BY.into(), by.into());
            }
            if let Some(to) = to {
                annotations.insert(ANN_MIGRATED_TO.into(), to.into());
            }
            assert_eq!(
                is_migrated_ours(&pv, EBS, Plugin::AwsEbs),
                want,
                "{by:?} {to:?}"
            );
        }
        // Another plugin's in-tree volume is never ours, whatever it says.
        let mut gce = written.clone();
        let spec = gce.spec.as_mut().unwrap();
        spec.aws_elastic_block_store = None;
        spec.gce_persistent_disk = Some(Default::default());
        assert!(!is_migrated_ours(&gce, EBS, Plugin::AwsEbs));
    }
}
