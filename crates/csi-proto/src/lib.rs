//! Container Storage Interface v1.12.0, generated from `proto/csi.proto`.
//!
//! The protocol definition is vendored unchanged from the CSI specification
//! repository; its license is in `proto/LICENSE`. This crate holds nothing but
//! the generated messages, clients (`*_client`) and servers (`*_server`).

#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// The `csi.v1` protobuf package.
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

pub use v1::*;
