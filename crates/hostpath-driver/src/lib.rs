//! The reference CSI driver: volumes are directories under a state directory, with exact
//! capacity accounting per class `kind` and node, topology, attach limits, a durable volume
//! table, and fault injection for the reliability tests.
//!
//! - `plan`: pure decisions (request validation, placement, idempotency, publish rules);
//! - `state`: the durable table (journal with group commit, snapshot, torn-tail recovery);
//! - `identity`, `controller`, `node`: the three CSI services;
//! - `snapshots`: snapshots and group snapshots (copies of volumes);
//! - `content`: copying a volume's content and measuring its usage;
//! - `ephemeral`: CSI ephemeral inline volumes, made and removed by the node service;
//! - `staging`, `expansion`, `stats`, `modify`: the optional node and controller features,
//!   each switchable with `--disable` (`features`);
//! - `faults`: latency, errors and hangs per method, switchable at run time.

#![forbid(unsafe_code)]

mod capacity;
pub mod config;
pub mod content;
mod controller;
pub mod driver;
pub mod ephemeral;
pub mod error;
pub mod expansion;
pub mod faults;
pub mod features;
mod identity;
pub mod modify;
pub mod name_locks;
mod node;
pub mod plan;
pub mod snapshots;
mod staging;
pub mod state;
pub mod stats;

pub use config::{DriverArgs, DriverConfig};
pub use driver::{Driver, ServeError, bind_socket};
