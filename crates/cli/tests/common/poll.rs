//! The tests' polls: `sidecar_kit::testing`'s, one step and one failure message for every
//! wait on observable state.

#![allow(unused_imports)]

pub use sidecar_kit::testing::{STEP, poll_blocking, poll_for, poll_until};
