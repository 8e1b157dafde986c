//! The cluster side that kube-controller-manager plays in a real cluster: binding claims to
//! volumes, default classes, asking provisioners, releasing volumes; the attach/detach
//! controller (VolumeAttachments for the volumes Pods use on their nodes); the pvc- and
//! pv-protection controllers; the claims of Pods' generic ephemeral volumes (`ephemeral`).
//!
//! - [`decide`]: pure decisions (tested with tables);
//! - [`controller`]: watches, queues and the API writes that carry them out.

#![forbid(unsafe_code)]

pub mod attach_detach;
pub mod controller;
pub mod decide;
pub mod ephemeral;
pub mod host_path;
pub mod index;
pub mod metrics;
pub mod pods;
pub mod protection;
pub mod runner;
