//! PersistentVolumeSets (seed 001): warm pools of volumes. A set keeps at least
//! `minimumReplicas` Available PersistentVolumes made from its template, up to
//! `maximumReplicas` in total, counting the matching volumes made by hand, and deletes the
//! largest Available volume first when above the maximum, never a bound one.
//!
//! - [`types`]: the `storage.volstack.dev/v1alpha1` object; [`crd`]: its definition;
//! - [`decide`]: the set manager's pure decisions (tables in `decide_tests.rs`);
//! - [`make`]: how one volume of a set is planned and what its PV looks like;
//! - [`status`]: the status and its `Ready` condition, and when it is written;
//! - [`manager`]: the manager's state (watch, queue, metrics); `index.rs`: its index of labelled
//!   volumes and of the volumes it made that the index does not show yet; `sync.rs`: one pass over a set
//!   (`csi-provisioner --enable-volume-sets`); `delete.rs`: how a set's volume is deleted.

pub mod crd;
pub mod decide;
mod delete;
mod index;
pub mod make;
pub mod manager;
pub mod status;
pub(crate) mod sync;
pub mod types;

pub use sync::SetError;

#[cfg(test)]
mod decide_tests;
