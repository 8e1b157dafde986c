//! What a PersistentVolume tells the attacher and the node about its CSI volume, by the rules
//! kubelet and the external-attacher share: the CSI source (refusing in-tree sources, whose
//! migration this project does not do), the one volume capability the PV's access modes make,
//! and the name kube-controller-manager gives the VolumeAttachment of a volume on a node.

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

/// Why a PV spec gives no CSI volume or no capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeSpecError {
    /// An in-tree source that upstream would translate to CSI.
    #[error("failed to translate in tree pv to CSI: migration of {0} volumes is not supported")]
    InTree(&'static str),
    /// Neither CSI nor migratable.
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    /// ReadWriteOncePod with another mode.
    #[error(
        "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume"
    )]
    ReadWriteOncePodWithOthers,
    /// ReadOnlyMany with ReadWriteOnce.
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    ReadOnlyManyWithReadWriteOnce,
    /// No mode CSI can express.
    /// The modes as Go's `%+v` prints a slice: `[A B]`.
    #[error("unsupported AccessMode combination: [{}]", .0.join(" "))]
    Unsupported(Vec<String>),
}

/// The CSI source of a PV spec.
pub fn csi_source(
    spec: &PersistentVolumeSpec,
) -> Result<&CSIPersistentVolumeSource, VolumeSpecError> {
    if let Some(source) = &spec.csi {
        return Ok(source);
    }
    let in_tree = [
        (
            spec.aws_elastic_block_store.is_some(),
            "awsElasticBlockStore",
        ),
        (spec.gce_persistent_disk.is_some(), "gcePersistentDisk"),
        (spec.azure_disk.is_some(), "azureDisk"),
        (spec.azure_file.is_some(), "azureFile"),
        (spec.cinder.is_some(), "cinder"),
        (spec.vsphere_volume.is_some(), "vsphereVolume"),
        (spec.portworx_volume.is_some(), "portworxVolume"),
    ];
    match in_tree.iter().find(|(set, _)| *set) {
        Some((_, kind)) => Err(VolumeSpecError::InTree(kind)),
        None => Err(VolumeSpecError::NotCsi),
    }
}

/// The one CSI access mode a PV's access modes make (the attacher's and kubelet's rule; the
/// provisioner maps each mode on its own instead).
pub fn access_mode(
    modes: &[String],
    single_node_multi_writer: bool,
) -> Result<Mode, VolumeSpecError> {
    let has = |m: &str| modes.iter().any(|x| x == m);
    if has("ReadWriteOncePod") {
        if modes.len() > 1 {
            return Err(VolumeSpecError::ReadWriteOncePodWithOthers);
        }
        return Ok(if single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    if has("ReadOnlyMany") && has("ReadWriteOnce") {
        return Err(VolumeSpecError::ReadOnlyManyWithReadWriteOnce);
    }
    if has("ReadOnlyMany") {
        return Ok(Mode::MultiNodeReaderOnly);
    }
    if has("ReadWriteOnce") {
        return Ok(if single_node_multi_writer {
            Mode::SingleNodeMultiWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    Err(VolumeSpecError::Unsupported(modes.to_vec()))
}

/// The capability of a PV: block for `volumeMode: Block`, else a mount with the source's
/// fsType (or `default_fstype`) and the PV's mount options.
pub fn capability(
    spec: &PersistentVolumeSpec,
    single_node_multi_writer: bool,
    default_fstype: &str,
) -> Result<csi::VolumeCapability, VolumeSpecError> {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let mode = access_mode(
        spec.access_modes.as_deref().unwrap_or_default(),
        single_node_multi_writer,
    )?;
    let access_type = if spec.volume_mode.as_deref() == Some("Block") {
        AccessType::Block(BlockVolume {})
    } else {
        let fs_type = spec
            .csi
            .as_ref()
            .and_then(|c| c.fs_type.clone())
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| default_fstype.to_string());
        AccessType::Mount(MountVolume {
            fs_type,
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            volume_mount_group: String::new(),
        })
    };
    Ok(csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(access_type),
    })
}

/// The VolumeAttachment name kube-controller-manager and kubelet use for a volume on a node:
/// `csi-` and the hex SHA-256 of handle, driver and node joined without a separator.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(format!("{volume_handle}{driver}{node}").as_bytes())
    )
}

/// The unique name kubelet reports in a Node's `status.volumesInUse` for a CSI volume (and
/// the attach/detach controller waits for).
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// Whether volumes of a driver need a VolumeAttachment: its CSIDriver says so, or there is
/// no CSIDriver object (kube-controller-manager's and kubelet's rule).
pub fn attach_required(driver: Option<&k8s_openapi::api::storage::v1::CSIDriver>) -> bool {
    driver.is_none_or(|d| d.spec.attach_required.unwrap_or(true))
}

/// The lowercase hex SHA-256 of `data` (names kubelet and kube-controller-manager derive
/// from volume handles).
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut hex = String::with_capacity(64);
    for byte in digest.as_ref() {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn modes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn access_modes_make_one_csi_mode_or_a_named_refusal() {
        use VolumeSpecError as E;
        let cases: Vec<(&[&str], bool, Result<Mode, E>)> = vec![
            (&["ReadWriteOnce"], false, Ok(Mode::SingleNodeWriter)),
            (&["ReadWriteOnce"], true, Ok(Mode::SingleNodeMultiWriter)),
            (&["ReadWriteOncePod"], false, Ok(Mode::SingleNodeWriter)),
            (
                &["ReadWriteOncePod"],
                true,
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                false,
                Err(E::ReadWriteOncePodWithOthers),
            ),
            (
                &["ReadWriteMany", "ReadOnlyMany"],
                false,
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (&["ReadOnlyMany"], false, Ok(Mode::MultiNodeReaderOnly)),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                false,
                Err(E::ReadOnlyManyWithReadWriteOnce),
            ),
            (&[], false, Err(E::Unsupported(vec![]))),
            (
                &["Sideways"],
                false,
                Err(E::Unsupported(modes(&["Sideways"]))),
            ),
        ];
        for (list, snmw, want) in cases {
            assert_eq!(
                access_mode(&modes(list), snmw),
                want,
                "{list:?} snmw={snmw}"
            );
        }
        // As Go prints the slice.
        assert_eq!(
            E::Unsupported(modes(&["Sideways", "Upwards"])).to_string(),
            "unsupported AccessMode combination: [Sideways Upwards]"
        );
    }

    #[test]
    fn the_capability_is_block_or_a_mount_with_the_fstype_and_options() {
        use csi::volume_capability::AccessType;
        let mut spec = PersistentVolumeSpec {
            access_modes: Some(modes(&["ReadWriteOnce"])),
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "v".into(),
                ..Default::default()
            }),
            mount_options: Some(modes(&["noatime"])),
            ..Default::default()
        };
        let cap = capability(&spec, false, "ext4").unwrap();
        let Some(AccessType::Mount(m)) = cap.access_type else {
            panic!("a mount")
        };
        assert_eq!(
            (m.fs_type.as_str(), m.mount_flags),
            ("ext4", modes(&["noatime"]))
        );
        spec.csi.as_mut().unwrap().fs_type = Some("xfs".into());
        let Some(AccessType::Mount(m)) = capability(&spec, false, "ext4").unwrap().access_type
        else {
            panic!("a mount")
        };
        assert_eq!(m.fs_type, "xfs");
        spec.volume_mode = Some("Block".into());
        assert!(matches!(
            capability(&spec, false, "").unwrap().access_type,
            Some(AccessType::Block(_))
        ));
        spec.access_modes = Some(modes(&["ReadOnlyMany", "ReadWriteOnce"]));
        assert_eq!(
            capability(&spec, false, "").unwrap_err().to_string(),
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
        );
    }

    #[test]
    fn only_csi_sources_are_volumes_and_in_tree_ones_are_named() {
        let spec = PersistentVolumeSpec {
            gce_persistent_disk: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(
            csi_source(&spec),
            Err(VolumeSpecError::InTree("gcePersistentDisk"))
        );
        let spec = PersistentVolumeSpec {
            nfs: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(csi_source(&spec), Err(VolumeSpecError::NotCsi));
    }

    #[test]
    fn attachment_names_are_kube_controller_managers() {
        // sha256("vol-1" + "hostpath.csi.k8s.io" + "node-1"), computed independently.
        let name = attachment_name("vol-1", "hostpath.csi.k8s.io", "node-1");
        assert_eq!(
            name,
            "csi-a5a2e67339ab5660a390dc86be397e784322823ff01f40cf2c01a72c3cab1374"
        );
        assert_ne!(
            name,
            attachment_name("vol-1", "hostpath.csi.k8s.io", "node-2")
        );
    }
}
