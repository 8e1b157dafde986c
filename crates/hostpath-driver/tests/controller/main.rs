//! The Controller service over a real unix socket: every RPC, the error codes the CSI spec
//! names for it, idempotency, paging and capacity accounting.

#![allow(clippy::unwrap_used)]

#[path = "../harness/mod.rs"]
mod harness;

mod capacity;
mod publish;
mod volumes;

use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use harness::{Harness, block, create_request, mount, params, segment};
use hostpath_driver::config::DEFAULT_TOPOLOGY_KEY as KEY;
use tonic::Code;

const GI: i64 = 1 << 30;
