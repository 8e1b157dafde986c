//! The CSI external-provisioner.
//!
//! - [`decide`]: pure decisions (which claims and volumes are ours, the CreateVolume request,
//!   the PV, topology, secrets, error classification);
//! - the controller around them (watches, work queue, CSI calls, API writes) follows.

#![forbid(unsafe_code)]

pub mod controller;
pub mod decide;
pub mod flags;
pub mod runner;
