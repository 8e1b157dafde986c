//! Volume snapshots for the embedded stack.
//!
//! - `crds`: the VolumeSnapshotClass, VolumeSnapshotContent and VolumeSnapshot definitions;

pub mod crds;
