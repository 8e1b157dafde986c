//! Pure decisions of the provisioner: observed objects in, data out. No I/O, no clock, no
//! randomness: the controller passes those in. Most of the protocol lives here.

pub mod claim;
pub mod classify;
pub mod cloning;
pub mod data_source;
pub mod delete;
pub mod migration;
pub mod names;
pub mod node_deployment;
pub mod parameters;
pub mod provision;
pub mod recovery;
pub mod secrets;
pub mod topology;

#[cfg(test)]
pub(crate) mod testing;
