//! Storage-capacity tracking (CSIStorageCapacity), upstream's `--enable-capacity`.
//!
//! - `decide`: segments, tracked classes, the changes to the objects, poll phases (pure).
//! - `owner`: the owner reference per `--capacity-ownerref-level`.
//! - `controller`: GetCapacity and the API writes, on the shared runtime.
//! - `gauges`: upstream's three gauges.

pub mod controller;
pub mod decide;
mod gauges;
pub mod owner;
