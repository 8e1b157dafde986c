//! A real Kubernetes control plane for end-to-end tests: etcd, kube-apiserver (RBAC, an audit
//! log unless turned off), kube-controller-manager and kube-scheduler, started on loopback
//! from the binaries in `../shared/kube/bin` (see that folder's README), one per test. Our
//! binaries run beside it under their own ServiceAccount identities; [`ControlPlane::refusals`]
//! lists every request that was answered 403.
//!
//! There is no kubelet: a Node is whatever object a test creates.

#![forbid(unsafe_code)]

pub mod audit;
pub mod binaries;
pub mod control_plane;
pub mod pki;
pub mod process;

pub use audit::Refusal;
pub use control_plane::{ControlPlane, Options, kubectl_with, service_account_user};
pub use process::Process;

use std::path::PathBuf;

/// Why the control plane could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary of the control plane is not where it is looked for.
    #[error(
        "failed to find {program} at {path} ({source}); the real control plane's binaries live in ../shared/kube/bin (or set VOLSTACK_KUBE_BIN)"
    )]
    Missing {
        /// The binary looked for (`kube-apiserver`, `etcd`, ...).
        program: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file or process operation failed.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// The operation.
        action: &'static str,
        /// Its file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Key or certificate generation failed.
    #[error("failed to generate keys: {0}")]
    Pki(String),
    /// A process of the control plane exited while it was starting.
    #[error("{program} exited ({status}) while the control plane started:\n{log}")]
    Exited {
        /// The binary that exited.
        program: String,
        /// How.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// The control plane did not get ready in time.
    #[error("timed out waiting for {what}:\n{logs}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The end of every process's log.
        logs: String,
    },
    /// A client could not be built or a request failed.
    #[error("failed to use the API: {0}")]
    Client(String),
    /// The audit log was asked for and kube-apiserver was started without one.
    #[error("the control plane was started without an audit log (Options::audit is false)")]
    NoAuditLog,
    /// kubectl failed.
    #[error("kubectl {args} failed: {stderr}")]
    Kubectl {
        /// Its arguments.
        args: String,
        /// What it printed.
        stderr: String,
    },
}
