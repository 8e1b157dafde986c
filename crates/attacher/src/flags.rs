//! The flags of `csi-attacher`, with upstream's (external-attacher v4) names, defaults and Go
//! syntax.

use std::time::Duration;

pub use sidecar_kit::flags::GateList;
use sidecar_kit::flags::{Gate, Stage, gates, go_bool, go_duration, resolve_gates};

/// `csi-attacher` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "csi-attacher",
    version,
    about = "CSI external-attacher (drop-in replacement)"
)]
pub struct AttacherArgs {
    /// The flags every sidecar shares.
    #[command(flatten)]
    pub common: sidecar_kit::flags::CommonArgs,
    /// Timeout of each ControllerPublishVolume, ControllerUnpublishVolume and ListVolumes pass.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub timeout: Duration,
    /// Workers attaching, and (separately) workers detaching.
    #[arg(long, default_value_t = 10)]
    pub worker_threads: u32,
    /// Initial retry interval of a failed attach or detach; doubles on each failure.
    #[arg(long, default_value = "1s", value_parser = go_duration)]
    pub retry_interval_start: Duration,
    /// Maximum retry interval of a failed attach or detach.
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub retry_interval_max: Duration,
    /// Interval at which every VolumeAttachment is looked at again.
    #[arg(long, default_value = "10m", value_parser = go_duration)]
    pub resync: Duration,
    /// Interval of the reconcile against the driver's published nodes (ListVolumes).
    #[arg(long, default_value = "1m", value_parser = go_duration)]
    pub reconcile_sync: Duration,
    /// ListVolumes page size (0: the driver's choice).
    #[arg(long, default_value_t = 0)]
    pub max_entries: i32,
    /// fsType for mount volumes whose PV sets none.
    #[arg(long, default_value = "")]
    pub default_fstype: String,
    /// Longest gRPC request logged (0 or less: no limit, the default -1).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_grpc_log_length: i32,
    /// Feature gates, NAME=true|false,...
    #[arg(long, default_value = "", value_parser = gates)]
    pub feature_gates: GateList,
    /// Go's GOMAXPROCS from the cgroup quota (no effect here: accepted and logged).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub automaxprocs: bool,
}

/// Known feature gates and their defaults (external-attacher v4.12).
pub const FEATURE_GATES: [Gate; 2] = [
    ("ReleaseLeaderElectionOnExit", false, Stage::Alpha),
    ("MutableCSINodeAllocatableCount", true, Stage::Ga),
];

/// A refused flag value, naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct FlagError {
    /// The flag.
    pub flag: &'static str,
    /// What is wrong with the value.
    pub reason: String,
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> FlagError {
    FlagError {
        flag,
        reason: reason.into(),
    }
}

/// What the flags decide beyond their values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The HTTP address (metrics, health), if any.
    pub http_address: Option<String>,
    /// Release the lease on exit.
    pub release_on_exit: bool,
    /// Write `attachError.errorCode`.
    pub error_codes: bool,
}

impl AttacherArgs {
    /// Checks values and combinations; names the flag in every refusal.
    pub fn validate(&self) -> Result<Settings, FlagError> {
        if self.worker_threads == 0 {
            return Err(invalid("--worker-threads", "must be greater than zero"));
        }
        sidecar_kit::flags::check_timeout_and_retries(
            self.timeout,
            self.retry_interval_start,
            self.retry_interval_max,
        )
        .map_err(|e| invalid(e.flag, e.reason))?;
        if self.resync.is_zero() {
            return Err(invalid("--resync", "must be greater than 0"));
        }
        if self.reconcile_sync.is_zero() {
            return Err(invalid("--reconcile-sync", "must be greater than 0"));
        }
        if self.max_entries < 0 {
            return Err(invalid("--max-entries", "must not be negative"));
        }
        let http_address = self
            .common
            .validate()
            .map_err(|e| invalid(e.flag, e.reason))?;
        let gates = resolve_gates(&FEATURE_GATES, &self.feature_gates)
            .map_err(|reason| invalid("--feature-gates", reason))?;
        Ok(Settings {
            http_address,
            release_on_exit: gates["ReleaseLeaderElectionOnExit"],
            error_codes: gates["MutableCSINodeAllocatableCount"],
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<AttacherArgs, clap::Error> {
        let argv =
            std::iter::once("csi-attacher".to_string()).chain(args.iter().map(|s| s.to_string()));
        AttacherArgs::try_parse_from(sidecar_kit::goflags::normalize_args(argv))
    }

    #[test]
    fn defaults_match_upstream() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.common.csi_address, "/run/csi/socket");
        assert_eq!(a.timeout, Duration::from_secs(15));
        assert_eq!(a.worker_threads, 10);
        assert_eq!(a.max_entries, 0);
        assert_eq!(a.max_grpc_log_length, -1);
        assert_eq!(a.retry_interval_start, Duration::from_secs(1));
        assert_eq!(a.retry_interval_max, Duration::from_secs(300));
        assert_eq!(a.resync, Duration::from_secs(600));
        assert_eq!(a.reconcile_sync, Duration::from_secs(60));
        assert_eq!(a.default_fstype, "");
        assert_eq!((a.common.kube_api_qps, a.common.kube_api_burst), (5.0, 10));
        assert_eq!(
            a.common.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        let s = a.validate().unwrap();
        assert!(!s.release_on_exit && s.error_codes && s.http_address.is_none());
    }

    #[test]
    fn go_syntax_is_accepted() {
        let a = parse(&[
            "-csi-address=/csi/sock",
            "-v=5",
            "--leader-election",
            "--http-endpoint=:8080",
            "--timeout=1m30s",
            "--automaxprocs",
            "--feature-gates=ReleaseLeaderElectionOnExit=true",
        ])
        .unwrap();
        assert_eq!(a.common.csi_address, "/csi/sock");
        assert_eq!(a.common.verbosity, 5);
        assert_eq!(a.timeout, Duration::from_secs(90));
        let s = a.validate().unwrap();
        assert!(s.release_on_exit && a.automaxprocs);
        assert_eq!(s.http_address.as_deref(), Some(":8080"));
    }

    #[test]
    fn bad_values_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--worker-threads=0"], "--worker-threads"),
            (&["--timeout=0s"], "--timeout"),
            (&["--retry-interval-start=10m"], "--retry-interval-start"),
            (&["--reconcile-sync=0s"], "--reconcile-sync"),
            (&["--resync=0s"], "--resync"),
            (&["--max-entries=-1"], "--max-entries"),
            (&["--feature-gates=Bogus=true"], "--feature-gates"),
            (
                &["--http-endpoint=:8080", "--metrics-address=:8081"],
                "--metrics-address",
            ),
            (&["--kube-api-qps=-1"], "--kube-api-qps"),
        ];
        for (args, flag) in cases {
            let err = parse(args).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(flag), "{args:?}: {err}");
        }
        let err = parse(&["--timeout=15"]).unwrap_err().to_string();
        assert!(err.contains("--timeout"), "{err}");
    }
}
