//! The cluster side that kube-controller-manager plays in a real cluster: binding claims to
//! volumes, default classes, asking provisioners, releasing volumes.

#![forbid(unsafe_code)]

pub mod decide;
