//! CSI migration: the in-tree volume plugins whose volumes a CSI driver serves in their place,
//! and the translations between their objects and CSI ones (what kubernetes/csi-translation-lib
//! does, read from its behaviour and written here as tables):
//!
//! - a StorageClass naming an in-tree plugin becomes the CSI driver's (`class`);
//! - a PersistentVolume with an in-tree source becomes a CSI one and back (`to_csi`,
//!   `to_in_tree`), topology labels and node affinity included (`topology`);
//! - a translated GCE PD handle is made whole with the node's id (`repair`).
//!
//! The provisioner of a migrated driver provisions for in-tree classes, writes in-tree PVs and
//! deletes them; the attacher attaches in-tree PVs. Everything here is a pure function.

mod class;
mod repair;
mod to_csi;
mod to_in_tree;
mod topology;

#[cfg(test)]
mod tests;

pub use self::repair::{RepairError, repair_volume_handle};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::StorageClass;

/// The annotation kube-controller-manager sets on claims and PVs of a migrated plugin: the
/// CSI driver that serves them.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

/// An in-tree volume plugin that CSI migration moves to a CSI driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plugin {
    /// `kubernetes.io/aws-ebs` → `ebs.csi.aws.com`.
    AwsEbs,
    /// `kubernetes.io/gce-pd` → `pd.csi.storage.gke.io`.
    GcePd,
    /// `kubernetes.io/azure-disk` → `disk.csi.azure.com`.
    AzureDisk,
    /// `kubernetes.io/azure-file` → `file.csi.azure.com`.
    AzureFile,
    /// `kubernetes.io/cinder` → `cinder.csi.openstack.org`.
    Cinder,
    /// `kubernetes.io/vsphere-volume` → `csi.vsphere.vmware.com`.
    VsphereVolume,
    /// `kubernetes.io/portworx-volume` → `pxd.portworx.com`.
    Portworx,
}

impl Plugin {
    /// Every migrated plugin.
    pub const ALL: [Plugin; 7] = [
        Plugin::AwsEbs,
        Plugin::GcePd,
        Plugin::AzureDisk,
        Plugin::AzureFile,
        Plugin::Cinder,
        Plugin::VsphereVolume,
        Plugin::Portworx,
    ];

    /// The in-tree plugin's name (a StorageClass's `provisioner`).
    pub fn in_tree_name(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "kubernetes.io/aws-ebs",
            Plugin::GcePd => "kubernetes.io/gce-pd",
            Plugin::AzureDisk => "kubernetes.io/azure-disk",
            Plugin::AzureFile => "kubernetes.io/azure-file",
            Plugin::Cinder => "kubernetes.io/cinder",
            Plugin::VsphereVolume => "kubernetes.io/vsphere-volume",
            Plugin::Portworx => "kubernetes.io/portworx-volume",
        }
    }

    /// The CSI driver that serves its volumes.
    pub fn csi_name(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "ebs.csi.aws.com",
            Plugin::GcePd => "pd.csi.storage.gke.io",
            Plugin::AzureDisk => "disk.csi.azure.com",
            Plugin::AzureFile => "file.csi.azure.com",
            Plugin::Cinder => "cinder.csi.openstack.org",
            Plugin::VsphereVolume => "csi.vsphere.vmware.com",
            Plugin::Portworx => "pxd.portworx.com",
        }
    }

    /// The CSI driver's zone topology key, for the plugins whose topology is translated.
    pub fn zone_key(self) -> Option<&'static str> {
        match self {
            Plugin::AwsEbs => Some("topology.ebs.csi.aws.com/zone"),
            Plugin::GcePd => Some("topology.gke.io/zone"),
            Plugin::AzureDisk => Some("topology.disk.csi.azure.com/zone"),
            Plugin::Cinder => Some("topology.cinder.csi.openstack.org/zone"),
            Plugin::VsphereVolume => Some("topology.csi.vmware.com/zone"),
            Plugin::AzureFile | Plugin::Portworx => None,
        }
    }

    /// The plugin of an in-tree name (exact).
    pub fn from_in_tree_name(name: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.in_tree_name() == name)
    }

    /// The plugin a CSI driver stands in for, if it is a migrated one.
    pub fn from_csi_name(name: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.csi_name() == name)
    }

    /// The plugin whose in-tree source a PV spec has, if any.
    pub fn of_spec(spec: &PersistentVolumeSpec) -> Option<Plugin> {
        if spec.aws_elastic_block_store.is_some() {
            Some(Plugin::AwsEbs)
        } else if spec.gce_persistent_disk.is_some() {
            Some(Plugin::GcePd)
        } else if spec.azure_disk.is_some() {
            Some(Plugin::AzureDisk)
        } else if spec.azure_file.is_some() {
            Some(Plugin::AzureFile)
        } else if spec.cinder.is_some() {
            Some(Plugin::Cinder)
        } else if spec.vsphere_volume.is_some() {
            Some(Plugin::VsphereVolume)
        } else if spec.portworx_volume.is_some() {
            Some(Plugin::Portworx)
        } else {
            None
        }
    }
}

/// Why a translation failed (messages as csi-translation-lib words them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// The class names no migrated plugin.
    #[error("could not find in-tree storage class parameter translation logic for {0:?}")]
    NoClassTranslation(String),
    /// The PV has no migratable in-tree source.
    #[error("could not find in-tree plugin translation logic for {0:?}")]
    NoInTreeSource(String),
    /// The PV has no CSI source.
    #[error("CSI persistent volume was nil")]
    NoCsiSource,
    /// The PV's CSI driver is not a migrated one.
    #[error("could not find in-tree plugin translation logic for {0}")]
    NotMigrated(String),
    /// `zone`/`zones` beside `allowedTopologies`.
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZonesAndTopologies,
    /// An EBS volume id that does not parse.
    #[error("failed to translate Kubernetes ID to EBS Volume ID {0}")]
    EbsVolumeId(String),
    /// An Azure disk of a kind CSI does not serve.
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    /// An Azure file share without a namespace for its secret.
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileNamespace,
    /// An Azure file handle with fewer than three `#`-separated parts.
    #[error("error parsing volume id: {0:?}, should at least contain two #")]
    AzureFileHandle(String),
    /// An Azure disk URI of neither form.
    #[error("could not get disk name from {0}, correct format: {1}")]
    AzureDiskUri(String, &'static str),
    /// A GCE handle with fewer than six `/`-separated parts.
    #[error("failed to get id components.Got: {0}, wanted 6 components or more. ")]
    GceHandle(usize),
    /// A `partition` attribute that is not a number.
    #[error("failed to convert partition {0} to integer: {1}")]
    Partition(String, String),
    /// Zones whose region cannot be told.
    #[error("failed to get region from zones: {0}")]
    Region(String),
    /// Node affinity or labels that cannot be translated back.
    #[error("failed to translate topology. PV:{0}. Error:{1}")]
    Topology(String, String),
}

/// The driver that provisions for a class of `provisioner`: the CSI driver that stands in for a
/// migrated in-tree plugin, else the provisioner itself.
pub fn driver_of(provisioner: &str) -> &str {
    Plugin::from_in_tree_name(provisioner).map_or(provisioner, |plugin| plugin.csi_name())
}

/// A StorageClass of the in-tree plugin `in_tree_name` as the CSI driver's: parameters renamed
/// and zones turned into `allowedTopologies` as the plugin's translation does.
pub fn class_to_csi(
    in_tree_name: &str,
    class: &StorageClass,
) -> Result<StorageClass, TranslateError> {
    let plugin = Plugin::from_in_tree_name(in_tree_name)
        .ok_or_else(|| TranslateError::NoClassTranslation(in_tree_name.to_string()))?;
    class::to_csi(plugin, class)
}

/// A PV with an in-tree source as a CSI PV (the in-tree source replaced by `spec.csi`).
pub fn pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let plugin = pv
        .spec
        .as_ref()
        .and_then(Plugin::of_spec)
        .ok_or(TranslateError::NoInTreeSource(name))?;
    to_csi::pv(plugin, pv)
}

/// A CSI PV of a migrated driver as the in-tree plugin's PV.
pub fn pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .ok_or(TranslateError::NoCsiSource)?;
    let plugin = Plugin::from_csi_name(&csi.driver)
        .ok_or_else(|| TranslateError::NotMigrated(csi.driver.clone()))?;
    to_in_tree::pv(plugin, pv)
}

/// A PV's spec as the CSI driver sees it: its own when it has a CSI source, translated when it
/// has a migrated plugin's in-tree source, `None` when it has neither (or does not translate:
/// the attacher and the provisioner say why).
pub fn csi_spec(pv: &PersistentVolume) -> Option<std::borrow::Cow<'_, PersistentVolumeSpec>> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.is_some() {
        return Some(std::borrow::Cow::Borrowed(spec));
    }
    Plugin::of_spec(spec)?;
    pv_to_csi(pv).ok()?.spec.map(std::borrow::Cow::Owned)
}

/// Whether a PV has an in-tree source a CSI driver serves.
pub fn is_migratable(pv: &PersistentVolume) -> bool {
    pv.spec.as_ref().and_then(Plugin::of_spec).is_some()
}
