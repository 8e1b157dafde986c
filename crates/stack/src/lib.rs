//! The rest of a cluster for the embedded stack, built on the shared controller runtime and
//! talking to the API server only (never to the provisioner or the PV controller directly):
//!
//! - `snapshots`: the snapshot.storage.k8s.io/v1 definitions and a snapshot controller doing
//!   what the community snapshot-controller and csi-snapshotter do together for one driver.
//! - `scheduler`: kube-scheduler's volume binding for Pods (capacity-aware node choice for
//!   late-binding claims), binding Pods to nodes; containers do not run.
//! - `resizer`: what external-resizer does for one driver (ControllerExpandVolume and
//!   ControllerModifyVolume for claims that grew or name another VolumeAttributesClass); the
//!   node agent does the node's part of an expansion.

#![forbid(unsafe_code)]

pub mod node;
pub mod resizer;
pub mod scheduler;
pub mod snapshots;
