//! PersistentVolume translation, CSI → in-tree, per plugin: what the provisioner of a migrated
//! driver writes (the PV the in-tree plugin would have written).

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
    PortworxVolumeSource, VsphereVirtualDiskVolumeSource,
};

use super::to_csi::{AZURE_FILE_RESOURCE_GROUP, VSPHERE_REGION};
use super::topology;
use super::{Plugin, TranslateError};

/// The forms of an Azure disk URI (unmanaged blob, managed disk), as the error names them.
const AZURE_UNMANAGED: &str = "http(?:.*)://(?:.*)/vhds/(.+)";
const AZURE_MANAGED: &str =
    ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";

fn partition(value: Option<&String>, empty_is_zero: bool) -> Result<Option<i32>, TranslateError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() && empty_is_zero => Ok(None),
        Some(v) => v
            .parse::<i32>()
            .map(Some)
            .map_err(|e| TranslateError::Partition(v.clone(), e.to_string())),
    }
}

/// An Azure disk's name from its URI.
pub(super) fn azure_disk_name(uri: &str) -> Result<String, TranslateError> {
    let (marker, pattern) = if uri.to_ascii_lowercase().starts_with("http") {
        ("/vhds/", AZURE_UNMANAGED)
    } else {
        ("/providers/Microsoft.Compute/disks/", AZURE_MANAGED)
    };
    let valid_prefix = pattern == AZURE_UNMANAGED
        || (uri.contains("/subscriptions/") && uri.contains("/resourceGroups/"));
    match uri.rfind(marker) {
        Some(at) if valid_prefix && at + marker.len() < uri.len() => {
            Ok(uri[at + marker.len()..].to_string())
        }
        _ => Err(TranslateError::AzureDiskUri(uri.to_string(), pattern)),
    }
}

/// An attribute by a key compared without regard to case, if not empty.
fn attribute<'a>(
    attrs: &'a std::collections::BTreeMap<String, String>,
    key: &str,
) -> Option<&'a String> {
    attrs
        .iter()
        .find(|(k, v)| k.eq_ignore_ascii_case(key) && !v.is_empty())
        .map(|(_, v)| v)
}

/// The CSI PV as `plugin`'s in-tree PV.
pub(super) fn pv(
    plugin: Plugin,
    pv: &PersistentVolume,
) -> Result<PersistentVolume, TranslateError> {
    let mut pv = pv.clone();
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
        return Err(TranslateError::NoCsiSource);
    };
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    let topology_error = |error: String| TranslateError::Topology(name.clone(), error);
    match plugin {
        Plugin::AwsEbs => {
            let source = AWSElasticBlockStoreVolumeSource {
                volume_id: csi.volume_handle,
                fs_type: csi.fs_type,
                read_only: csi.read_only,
                partition: partition(attrs.get("partition"), false)?,
            };
            set(&mut pv, |s| s.aws_elastic_block_store = Some(source));
            topology::to_in_tree(
                &mut pv,
                plugin.zone_key().unwrap_or_default(),
                Some(topology::aws_region),
            )
            .map_err(topology_error)?;
        }
        Plugin::GcePd => {
            let parts: Vec<&str> = csi.volume_handle.split('/').collect();
            if parts.len() < 6 {
                return Err(TranslateError::GceHandle(parts.len()));
            }
            let source = GCEPersistentDiskVolumeSource {
                pd_name: parts[5].to_string(),
                fs_type: csi.fs_type,
                read_only: csi.read_only,
                partition: partition(attrs.get("partition"), true)?,
            };
            set(&mut pv, |s| s.gce_persistent_disk = Some(source));
            topology::to_in_tree(
                &mut pv,
                plugin.zone_key().unwrap_or_default(),
                Some(topology::gce_region),
            )
            .map_err(topology_error)?;
        }
        Plugin::AzureDisk => {
            let disk_name = azure_disk_name(&csi.volume_handle)?;
            let fs_type = attribute(&attrs, "fstype")
                .cloned()
                .or_else(|| Some(csi.fs_type.clone().unwrap_or_default()));
            let source = AzureDiskVolumeSource {
                disk_name,
                disk_uri: csi.volume_handle,
                caching_mode: attribute(&attrs, "cachingmode").cloned(),
                fs_type,
                read_only: Some(csi.read_only.unwrap_or(false)),
                kind: Some("Managed".into()),
            };
            set(&mut pv, |s| s.azure_disk = Some(source));
        }
        Plugin::AzureFile => {
            let mut share = attribute(&attrs, "sharename").cloned().unwrap_or_default();
            let mut secret = attribute(&attrs, "secretname").cloned().unwrap_or_default();
            let mut namespace = attribute(&attrs, "secretnamespace").cloned();
            if let Some(stage) = csi
                .node_stage_secret_ref
                .as_ref()
                .filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
            {
                secret = stage.name.clone().unwrap_or_default();
                namespace = stage.namespace.clone();
            }
            let mut group = String::new();
            if share.is_empty() || secret.is_empty() {
                let parts: Vec<&str> = csi.volume_handle.split('#').collect();
                if parts.len() < 3 {
                    return Err(TranslateError::AzureFileHandle(csi.volume_handle.clone()));
                }
                group = parts[0].to_string();
                if share.is_empty() {
                    share = parts[2].to_string();
                }
                if secret.is_empty() {
                    secret = format!("azure-storage-account-{}-secret", parts[1]);
                }
            }
            let source = AzureFilePersistentVolumeSource {
                share_name: share,
                secret_name: secret,
                secret_namespace: Some(
                    namespace
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| "default".into()),
                ),
                read_only: csi.read_only,
            };
            set(&mut pv, |s| s.azure_file = Some(source));
            let annotations = pv.metadata.annotations.get_or_insert_with(Default::default);
            if !group.is_empty() {
                annotations.insert(AZURE_FILE_RESOURCE_GROUP.into(), group);
            }
        }
        Plugin::Cinder => {
            let source = CinderPersistentVolumeSource {
                volume_id: csi.volume_handle,
                fs_type: csi.fs_type,
                read_only: csi.read_only,
                secret_ref: None,
            };
            set(&mut pv, |s| s.cinder = Some(source));
            topology::to_in_tree(&mut pv, plugin.zone_key().unwrap_or_default(), None)
                .map_err(topology_error)?;
        }
        Plugin::VsphereVolume => {
            let source = VsphereVirtualDiskVolumeSource {
                volume_path: attrs
                    .get("initialvolumefilepath")
                    .cloned()
                    .unwrap_or_default(),
                fs_type: csi.fs_type,
                storage_policy_id: None,
                storage_policy_name: None,
            };
            set(&mut pv, |s| s.vsphere_volume = Some(source));
            topology::vsphere_to_in_tree(
                &mut pv,
                plugin.zone_key().unwrap_or_default(),
                VSPHERE_REGION,
            );
        }
        Plugin::Portworx => {
            let source = PortworxVolumeSource {
                volume_id: csi.volume_handle,
                fs_type: csi.fs_type,
                read_only: csi.read_only,
            };
            set(&mut pv, |s| s.portworx_volume = Some(source));
        }
    }
    Ok(pv)
}

fn set(
    pv: &mut PersistentVolume,
    f: impl FnOnce(&mut k8s_openapi::api::core::v1::PersistentVolumeSpec),
) {
    if let Some(spec) = pv.spec.as_mut() {
        f(spec);
    }
}
