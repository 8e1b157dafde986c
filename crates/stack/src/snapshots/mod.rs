//! Volume snapshots for the embedded stack.
//!
//! - `crds`: the VolumeSnapshotClass, VolumeSnapshotContent and VolumeSnapshot definitions;
//! - `types`: those objects, typed;
//! - `decide`: what to do with a snapshot or a content (pure);
//! - `controller`: the watches, queues and the steps carried out, on the shared runtime.

pub mod controller;
pub mod crds;
pub mod decide;
pub mod types;

pub use controller::{SnapshotController, SnapshotSettings, SyncError};
