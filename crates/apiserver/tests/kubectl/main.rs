//! The server driven by the real kubectl, and fed bad input.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod apply;
mod bad_input;
mod commands;
mod defaults;
mod deletes;
mod dry_run;

use common::{Fixture, kubectl, start};

use std::process::{Command, Stdio};
use std::time::Duration;

const CLAIM: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n";
