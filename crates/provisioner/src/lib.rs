//! The CSI external-provisioner.
//!
//! - [`decide`]: pure decisions (which claims and volumes are ours, the CreateVolume request,
//!   the PV, topology, secrets, error classification, recovery after a crash);
//! - [`controller`]: the controller around them (watches, work queues, the in-flight ledger
//!   and intent log, CSI calls, API writes);
//! - [`capacity`]: storage-capacity tracking (CSIStorageCapacity objects from GetCapacity);
//! - [`volume_sets`]: the PersistentVolumeSet manager (warm pools);
//! - [`flags`] and [`runner`]: the command line and the process around the controllers.

#![forbid(unsafe_code)]

pub mod capacity;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod runner;
pub mod volume_sets;
