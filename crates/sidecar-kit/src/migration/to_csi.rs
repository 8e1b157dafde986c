//! PersistentVolume translation, in-tree → CSI, per plugin: the in-tree source is replaced by
//! `spec.csi` (handle, attributes, filesystem, read-only, secrets) and the zones move to the
//! driver's topology key. Everything else about the PV is kept.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, SecretReference};

use super::topology::{self, BETA_ZONE, GA_ZONE};
use super::{Plugin, TranslateError};

/// The PV annotation holding an Azure file share's resource group.
pub(super) const AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";
/// The Portworx PV annotations naming its secret.
pub(super) const PORTWORX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
pub(super) const PORTWORX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
/// vSphere's CSI region key.
pub(super) const VSPHERE_REGION: &str = "topology.csi.vmware.com/region";
/// The project or zone a GCE handle does not know.
pub(super) const UNSPECIFIED: &str = "UNSPECIFIED";

fn attributes(pairs: &[(&str, String)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

/// An EBS volume id as the CSI driver knows it: `aws://<zone>/vol-…` and `aws:///vol-…`
/// become `vol-…`; an id without the scheme is taken as it is.
pub(super) fn ebs_volume_id(id: &str) -> Result<String, TranslateError> {
    let Some(rest) = id.strip_prefix("aws://") else {
        return Ok(id.to_string());
    };
    let path = rest
        .split_once('/')
        .map(|(_, path)| path)
        .unwrap_or_default();
    let volume = path.trim_matches('/');
    if !volume.starts_with("vol-") || volume.contains('/') {
        return Err(TranslateError::EbsVolumeId(format!(
            "Invalid format for AWS volume ({id})"
        )));
    }
    Ok(volume.to_string())
}

/// The storage account of an Azure file secret `azure-storage-account-<account>-secret`, or
/// the secret's name when it is not of that form.
pub(super) fn azure_account(secret: &str) -> String {
    const PREFIX: &str = "azure-storage-account-";
    const SUFFIX: &str = "-secret";
    if let Some(start) = secret.find(PREFIX) {
        let rest = &secret[start + PREFIX.len()..];
        if let Some(end) = rest.rfind(SUFFIX)
            && end > 0
        {
            return rest[..end].to_string();
        }
    }
    secret.to_string()
}

/// GCE's access modes: ReadWriteMany is served as ReadWriteOnce; any writer mode gives
/// `[ReadWriteOnce]`, read-only alone `[ReadOnlyMany]`.
fn gce_access_modes(modes: Option<&Vec<String>>) -> Option<Vec<String>> {
    let modes = modes?;
    let writer = modes
        .iter()
        .any(|m| m == "ReadWriteOnce" || m == "ReadWriteMany");
    let reader = modes.iter().any(|m| m == "ReadOnlyMany");
    let mode = if !writer && reader {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    Some(vec![mode.to_string()])
}

/// The PV as a CSI PV of `plugin`'s driver.
pub(super) fn pv(
    plugin: Plugin,
    pv: &PersistentVolume,
) -> Result<PersistentVolume, TranslateError> {
    let mut pv = pv.clone();
    let name = pv.metadata.name.clone().unwrap_or_default();
    let driver = plugin.csi_name().to_string();
    let Some(spec) = pv.spec.as_mut() else {
        return Err(TranslateError::NoInTreeSource(name));
    };
    let missing = || TranslateError::NoInTreeSource(name.clone());
    let csi = match plugin {
        Plugin::AwsEbs => {
            let ebs = spec.aws_elastic_block_store.take().ok_or_else(missing)?;
            CSIPersistentVolumeSource {
                driver,
                volume_handle: ebs_volume_id(&ebs.volume_id)?,
                read_only: ebs.read_only,
                fs_type: ebs.fs_type,
                volume_attributes: attributes(&[(
                    "partition",
                    ebs.partition.unwrap_or(0).to_string(),
                )]),
                ..Default::default()
            }
        }
        Plugin::GcePd => {
            let pd = spec.gce_persistent_disk.take().ok_or_else(missing)?;
            let labels = pv.metadata.labels.clone().unwrap_or_default();
            let zone_label = labels
                .get(BETA_ZONE)
                .filter(|z| !z.is_empty())
                .or_else(|| labels.get(GA_ZONE))
                .cloned()
                .unwrap_or_default();
            let zones: Vec<String> = zone_label
                .split("__")
                .filter(|z| !z.is_empty())
                .map(str::to_string)
                .collect();
            let volume_handle = match zones.as_slice() {
                [] => format!(
                    "projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}",
                    pd.pd_name
                ),
                [zone] => format!("projects/{UNSPECIFIED}/zones/{zone}/disks/{}", pd.pd_name),
                _ => {
                    let region = topology::gce_region(&zones).map_err(TranslateError::Region)?;
                    format!(
                        "projects/{UNSPECIFIED}/regions/{region}/disks/{}",
                        pd.pd_name
                    )
                }
            };
            let partition = match pd.partition.unwrap_or(0) {
                0 => String::new(),
                n => n.to_string(),
            };
            let spec = pv.spec.as_mut().ok_or_else(missing)?;
            spec.access_modes = gce_access_modes(spec.access_modes.as_ref());
            CSIPersistentVolumeSource {
                driver,
                volume_handle,
                read_only: pd.read_only,
                fs_type: pd.fs_type,
                volume_attributes: attributes(&[("partition", partition)]),
                ..Default::default()
            }
        }
        Plugin::AzureDisk => {
            let disk = spec.azure_disk.take().ok_or_else(missing)?;
            if let Some(kind) = disk
                .kind
                .as_ref()
                .filter(|k| !k.eq_ignore_ascii_case("Managed"))
            {
                return Err(TranslateError::AzureDiskKind(kind.clone()));
            }
            let mut attrs = vec![("kind", "Managed".to_string())];
            if let Some(caching) = &disk.caching_mode {
                attrs.push(("cachingmode", caching.clone()));
            }
            if let Some(fs_type) = &disk.fs_type {
                attrs.push(("fstype", fs_type.clone()));
            }
            CSIPersistentVolumeSource {
                driver,
                volume_handle: disk.disk_uri,
                read_only: disk.read_only,
                fs_type: disk.fs_type,
                volume_attributes: attributes(&attrs),
                ..Default::default()
            }
        }
        Plugin::AzureFile => {
            let file = spec.azure_file.take().ok_or_else(missing)?;
            let namespace = file
                .secret_namespace
                .clone()
                .filter(|n| !n.is_empty())
                .or_else(|| spec.claim_ref.as_ref().and_then(|c| c.namespace.clone()))
                .filter(|n| !n.is_empty())
                .ok_or(TranslateError::AzureFileNamespace)?;
            let group = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(AZURE_FILE_RESOURCE_GROUP))
                .cloned()
                .unwrap_or_default();
            let account = azure_account(&file.secret_name);
            CSIPersistentVolumeSource {
                driver,
                volume_handle: format!("{group}#{account}#{}#{name}#{namespace}", file.share_name),
                read_only: file.read_only,
                volume_attributes: attributes(&[("sharename", file.share_name.clone())]),
                node_stage_secret_ref: Some(SecretReference {
                    name: Some(file.secret_name),
                    namespace: Some(namespace),
                }),
                ..Default::default()
            }
        }
        Plugin::Cinder => {
            let cinder = spec.cinder.take().ok_or_else(missing)?;
            CSIPersistentVolumeSource {
                driver,
                volume_handle: cinder.volume_id,
                read_only: cinder.read_only,
                fs_type: cinder.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                ..Default::default()
            }
        }
        Plugin::VsphereVolume => {
            let disk = spec.vsphere_volume.take().ok_or_else(missing)?;
            let mut attrs = Vec::new();
            if let Some(policy) = disk.storage_policy_name.filter(|p| !p.is_empty()) {
                attrs.push(("storagepolicyname", policy));
            }
            CSIPersistentVolumeSource {
                driver,
                volume_handle: disk.volume_path,
                fs_type: disk.fs_type,
                volume_attributes: attributes(&attrs),
                ..Default::default()
            }
        }
        Plugin::Portworx => {
            let px = spec.portworx_volume.take().ok_or_else(missing)?;
            let annotations = pv.metadata.annotations.clone().unwrap_or_default();
            let secret = match (
                annotations.get(PORTWORX_SECRET_NAME),
                annotations.get(PORTWORX_SECRET_NAMESPACE),
            ) {
                (Some(name), Some(namespace)) => Some(SecretReference {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                }),
                _ => None,
            };
            CSIPersistentVolumeSource {
                driver,
                volume_handle: px.volume_id,
                fs_type: px.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                controller_publish_secret_ref: secret.clone(),
                node_stage_secret_ref: secret.clone(),
                node_publish_secret_ref: secret.clone(),
                controller_expand_secret_ref: secret.clone(),
                node_expand_secret_ref: secret,
                ..Default::default()
            }
        }
    };
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = Some(csi);
    }
    match plugin {
        Plugin::AwsEbs | Plugin::GcePd | Plugin::Cinder => {
            topology::to_csi(&mut pv, plugin.zone_key().unwrap_or_default());
        }
        Plugin::VsphereVolume => {
            topology::vsphere_to_csi(
                &mut pv,
                plugin.zone_key().unwrap_or_default(),
                VSPHERE_REGION,
            );
        }
        Plugin::AzureDisk | Plugin::AzureFile | Plugin::Portworx => {}
    }
    Ok(pv)
}
