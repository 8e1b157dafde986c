//! Volume handles made whole with a node's id (csi-translation-lib's `RepairVolumeHandle`): a GCE
//! PD handle translated from an in-tree volume names its project (and maybe its zone) as
//! `UNSPECIFIED`, while the driver lists it under the real ones, which the node id carries
//! (`projects/<project>/zones/<zone>/instances/<name>`). Every other driver's handle is whole.

use super::Plugin;

/// The placeholder csi-translation-lib writes for a project or zone it does not know.
const UNSPECIFIED: &str = "UNSPECIFIED";

/// Why a handle cannot be made whole (csi-translation-lib's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairError {
    /// The handle is not `projects/…/zones|regions/…/disks/…`.
    #[error("volume handle has wrong number of elements; got {0}, wanted 6 or more")]
    Handle(usize),
    /// The node id is not `projects/…/zones/…/instances/…`.
    #[error("node handle has wrong number of elements; got {0}, wanted 6 or more")]
    NodeId(usize),
    /// The handle's third element is neither `zones` nor `regions`.
    #[error("expected volume handle to have zones or regions regionality value, got: {0}")]
    Regionality(String),
    /// The node's zone does not name a region.
    #[error("zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {0}")]
    Zone(String),
}

/// `handle` of `driver` as the driver lists it once attached to the node `node_id`.
pub fn repair_volume_handle(
    driver: &str,
    handle: &str,
    node_id: &str,
) -> Result<String, RepairError> {
    if driver != Plugin::GcePd.csi_name() {
        return Ok(handle.to_string());
    }
    let parts: Vec<&str> = handle.split('/').collect();
    if parts.len() < 6 {
        return Err(RepairError::Handle(parts.len()));
    }
    if parts[1] != UNSPECIFIED {
        return Ok(handle.to_string());
    }
    let node: Vec<&str> = node_id.split('/').collect();
    if node.len() < 6 {
        return Err(RepairError::NodeId(node.len()));
    }
    let (project, disk) = (node[1], parts[5]);
    match parts[2] {
        "zones" => {
            let zone = if parts[3] == UNSPECIFIED {
                node[3]
            } else {
                parts[3]
            };
            Ok(format!("projects/{project}/zones/{zone}/disks/{disk}"))
        }
        "regions" => {
            let region = if parts[3] == UNSPECIFIED {
                region_of(node[3])?
            } else {
                parts[3].to_string()
            };
            Ok(format!("projects/{project}/regions/{region}/disks/{disk}"))
        }
        other => Err(RepairError::Regionality(other.to_string())),
    }
}

/// The region of a zone `<locale>-<region>-<zone>` (`us-central1-a` → `us-central1`).
fn region_of(zone: &str) -> Result<String, RepairError> {
    let parts: Vec<&str> = zone.split('-').collect();
    if parts.len() != 3 {
        return Err(RepairError::Zone(zone.to_string()));
    }
    Ok(format!("{}-{}", parts[0], parts[1]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PD: &str = "pd.csi.storage.gke.io";
    const NODE: &str = "projects/p1/zones/us-central1-a/instances/vm-1";

    #[test]
    fn gce_pd_handles_take_the_project_and_zone_of_the_node() {
        let table = [
            (
                "projects/UNSPECIFIED/zones/us-central1-b/disks/d",
                Ok("projects/p1/zones/us-central1-b/disks/d".to_string()),
            ),
            (
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                Ok("projects/p1/zones/us-central1-a/disks/d".to_string()),
            ),
            (
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                Ok("projects/p1/regions/us-central1/disks/d".to_string()),
            ),
            (
                "projects/UNSPECIFIED/regions/europe-west1/disks/d",
                Ok("projects/p1/regions/europe-west1/disks/d".to_string()),
            ),
            // Whole already: as it is.
            (
                "projects/p9/zones/us-central1-b/disks/d",
                Ok("projects/p9/zones/us-central1-b/disks/d".to_string()),
            ),
        ];
        for (handle, want) in table {
            assert_eq!(repair_volume_handle(PD, handle, NODE), want, "{handle}");
        }
        assert!(repair_volume_handle(PD, "disk-1", NODE).is_err());
        assert!(repair_volume_handle(PD, "projects/UNSPECIFIED/zones/z/disks/d", "vm-1").is_err());
        assert_eq!(
            repair_volume_handle(PD, "projects/UNSPECIFIED/lands/z/disks/d", NODE),
            Err(RepairError::Regionality("lands".into()))
        );
        assert_eq!(
            repair_volume_handle(
                PD,
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                "projects/p1/zones/moon/instances/vm-1"
            ),
            Err(RepairError::Zone("moon".into()))
        );
    }

    #[test]
    fn other_drivers_handles_are_whole() {
        assert_eq!(
            repair_volume_handle("ebs.csi.aws.com", "projects/UNSPECIFIED/x", NODE),
            Ok("projects/UNSPECIFIED/x".to_string())
        );
    }
}
