//! The CSI external-attacher.
//!
//! - [`decide`]: pure decisions (which VolumeAttachments are ours, what ControllerPublishVolume
//!   gets, the finalizers and status writes, the repairs of the periodic reconcile);
//! - [`controller`]: watches, the attach and the detach queues, CSI calls and API writes;
//! - [`flags`] and [`runner`]: the drop-in command line and start-up.

#![forbid(unsafe_code)]

pub mod controller;
pub mod decide;
pub mod flags;
pub mod runner;
