//! The reference CSI driver: volumes are directories under a state directory, with exact
//! capacity accounting per class `kind` and node, topology, attach limits, a durable volume
//! table, and fault injection for the reliability tests.
//!
//! - `plan`: pure decisions (request validation, placement, idempotency, publish rules);
//! - `state`: the durable table (journal with group commit, snapshot, torn-tail recovery);
//! - `identity`, `controller`, `node`: the three CSI services;
//! - `faults`: latency, errors and hangs per method, switchable at run time.

#![forbid(unsafe_code)]

pub mod config;
mod controller;
pub mod driver;
pub mod error;
pub mod faults;
mod identity;
pub mod name_locks;
mod node;
pub mod plan;
pub mod state;

pub use config::{DriverArgs, DriverConfig};
pub use driver::{Driver, ServeError, bind_socket};
