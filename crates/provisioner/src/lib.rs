//! The CSI external-provisioner.
//!
//! - [`decide`]: pure decisions (which claims and volumes are ours, the CreateVolume request,
//!   the PV, topology, secrets, error classification);
//! - the controller around them (watches, work queue, CSI calls, API writes) follows;
//! - [`capacity`]: storage-capacity tracking (its decisions; not wired yet).

#![forbid(unsafe_code)]

pub mod capacity;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod runner;
pub mod volume_sets;
