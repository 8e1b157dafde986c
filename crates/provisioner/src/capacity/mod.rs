//! Storage-capacity tracking (CSIStorageCapacity), upstream's `--enable-capacity`.
//!
//! - `decide`: segments, tracked classes, the changes to the objects, poll phases (pure).
//! - `owner`: the owner reference per `--capacity-ownerref-level`.
//! - `controller`: GetCapacity and the API writes, on the shared runtime.
//! - `gauges`: upstream's three gauges.
//! - `topology_events`: which watch events make the segments worth working out again (pure).

pub mod controller;
pub mod decide;
mod gauges;
pub mod owner;
mod topology_events;
