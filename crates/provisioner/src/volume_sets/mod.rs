//! PersistentVolumeSets (seed 001): warm pools of volumes. A set keeps at least
//! `minimumReplicas` Available PersistentVolumes made from its template, up to
//! `maximumReplicas` in total, counting the matching volumes made by hand, and deletes the
//! largest Available volume first when above the maximum, never a bound one.
//!
//! - [`types`]: the `storage.volstack.dev/v1alpha1` object; [`crd`]: its definition;
//! - [`decide`]: the set manager's pure decisions (tables in `decide_tests.rs`).
//!
//! The manager around them (behind a `csi-provisioner` flag) and the recycler follow.

pub mod crd;
pub mod decide;
pub mod types;

#[cfg(test)]
mod decide_tests;
