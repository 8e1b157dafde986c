//! The cluster side that kube-controller-manager plays in a real cluster: binding claims to
//! volumes, default classes, asking provisioners, releasing volumes.
//!
//! - [`decide`]: pure decisions (tested with tables);
//! - [`controller`]: watches, queues and the API writes that carry them out.

#![forbid(unsafe_code)]

pub mod controller;
pub mod decide;
pub mod index;
