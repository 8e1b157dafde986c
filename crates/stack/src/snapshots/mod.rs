//! Volume snapshots for the embedded stack.
//!
//! - `crds`: the VolumeSnapshotClass, VolumeSnapshotContent and VolumeSnapshot definitions;
//! - `types`: those objects, typed;
//! - `decide`: what to do with a snapshot or a content (pure);

pub mod crds;
pub mod decide;
pub mod types;
