//! The flags of `csi-provisioner`, with upstream's names, defaults and Go syntax.

use std::time::Duration;

use crate::decide::names::{NameError, VolumeNaming};

pub use sidecar_kit::flags::GateList;
use sidecar_kit::flags::{Gate, Stage, gates, go_bool, go_duration, resolve_gates};

/// `csi-provisioner` flags (upstream v6 names and defaults).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "csi-provisioner",
    version,
    about = "CSI external-provisioner (drop-in replacement)"
)]
pub struct ProvisionerArgs {
    /// The flags every sidecar shares.
    #[command(flatten)]
    pub common: sidecar_kit::flags::CommonArgs,
    /// QPS for CSIStorageCapacity updates.
    #[arg(long, default_value_t = 1.0)]
    pub kube_api_capacity_qps: f32,
    /// Burst for CSIStorageCapacity updates.
    #[arg(long, default_value_t = 5)]
    pub kube_api_capacity_burst: u32,
    /// Timeout of every call to the CSI driver.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub timeout: Duration,
    /// Number of CreateVolume and (separately) DeleteVolume calls in flight at once.
    #[arg(long, default_value_t = 100)]
    pub worker_threads: u32,
    /// Initial retry interval of a failed provisioning or deletion; doubles on each failure.
    #[arg(long, default_value = "1s", value_parser = go_duration)]
    pub retry_interval_start: Duration,
    /// Maximum retry interval of a failed provisioning or deletion.
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub retry_interval_max: Duration,
    /// Workers removing the cloning-protection finalizer from source claims whose clones are
    /// done.
    #[arg(long, default_value_t = 1)]
    pub cloning_protection_threads: u32,
    /// Interval of the orphaned-snapshot sweep (snapshots are not supported yet).
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub snapshot_orphan_sweep_interval: Duration,
    /// Prefix of PV names.
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,
    /// Characters of the claim UID in PV names (-1: the whole UID with dashes).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub volume_name_uuid_length: i32,
    /// fsType for mount volumes whose class sets none.
    #[arg(long, default_value = "")]
    pub default_fstype: String,
    /// Pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub extra_create_metadata: bool,
    /// Mark PVs read-only when every access mode is ReadOnlyMany.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub controller_publish_readonly: bool,
    /// Refuse to change the volume mode of a snapshot source.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool)]
    pub prevent_volume_mode_conversion: bool,
    /// Late binding: send only the selected node's segment.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub strict_topology: bool,
    /// Immediate binding: send the cluster's aggregated topology.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool)]
    pub immediate_topology: bool,
    /// Feature gates, NAME=true|false,...
    #[arg(long, default_value = "", value_parser = gates)]
    pub feature_gates: GateList,
    /// Go's GOMAXPROCS from the cgroup CPU quota (accepted and logged: the runtime's threads
    /// already follow the quota).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub automaxprocs: bool,
    /// Publish CSIStorageCapacity objects (needs the NAMESPACE or POD_NAMESPACE env variable,
    /// and POD_NAME unless --capacity-ownerref-level=-1). Also `central` (= true) and
    /// `immediate-binding` (= true with --capacity-for-immediate-binding), the older forms.
    /// Absent: off, unless the older `--capacity-controller-deployment-mode=central` is given;
    /// given (`false` included), it decides ([`ProvisionerArgs::capacity`]).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = capacity_mode)]
    enable_capacity: Option<CapacityMode>,
    /// The oldest form of --enable-capacity: `central` enables it.
    #[arg(long, hide = true, default_value = "")]
    pub capacity_controller_deployment_mode: String,
    /// Owner of CSIStorageCapacity objects.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub capacity_ownerref_level: i32,
    /// Capacity workers.
    #[arg(long, default_value_t = 1)]
    pub capacity_threads: u32,
    /// Capacity poll interval.
    #[arg(long, default_value = "1m", value_parser = go_duration)]
    pub capacity_poll_interval: Duration,
    /// Capacity objects also for Immediate classes.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub capacity_for_immediate_binding: bool,
    /// Run one provisioner per node (needs the NODE_NAME env variable).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub node_deployment: bool,
    /// Node deployment: also provision Immediate claims.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool)]
    pub node_deployment_immediate_binding: bool,
    /// Node deployment: base delay.
    #[arg(long, default_value = "20s", value_parser = go_duration)]
    pub node_deployment_base_delay: Duration,
    /// Node deployment: maximum delay.
    #[arg(long, default_value = "1m", value_parser = go_duration)]
    pub node_deployment_max_delay: Duration,
    /// Run the PersistentVolumeSet manager (not an upstream flag): keep the pools of volumes
    /// that `persistentvolumesets.storage.volstack.dev` objects describe. The definition must be
    /// installed (`deploy/kubernetes/persistentvolumeset-crd.json`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub enable_volume_sets: bool,
    /// PersistentVolumeSets: CreateVolume calls in flight per set at most (1: one volume at a
    /// time, as the seed describes; a driver whose CreateVolume takes seconds needs more to
    /// keep a pool full).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub volume_set_creates: u32,
    /// How volumes that may exist without a PV are found after a crash (not an upstream flag):
    /// `auto` lists the driver's volumes when it follows the recoverable-volumes convention
    /// (no API write before CreateVolume) and uses the intent log otherwise; `intent-log`
    /// always records each CreateVolume first; `list-volumes` refuses to start without a
    /// driver that follows the convention.
    #[arg(long, value_enum, default_value = "auto")]
    pub in_flight_recovery: crate::decide::recovery::RecoveryFlag,
    /// Go pprof endpoints (not available in this implementation).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub enable_pprof: bool,
}

/// Known feature gates and their defaults.
pub const FEATURE_GATES: [Gate; 5] = [
    ("Topology", true, Stage::Ga),
    ("CSIMigration", true, Stage::Ga),
    ("VolumeAttributesClass", true, Stage::Ga),
    ("CrossNamespaceVolumeDataSource", false, Stage::Alpha),
    ("ReleaseLeaderElectionOnExit", true, Stage::Alpha),
];

/// A flag combination we refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// Naming flags.
    #[error(transparent)]
    Naming(#[from] NameError),
    /// A value out of range or a feature not available.
    #[error("{flag}: {reason}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> FlagError {
    FlagError::Invalid {
        flag,
        reason: reason.into(),
    }
}

/// Validated settings derived from the flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// PV naming.
    pub naming: VolumeNaming,
    /// Topology gate.
    pub topology: bool,
    /// VolumeAttributesClass gate.
    pub volume_attributes_class: bool,
    /// Release the lease on exit.
    pub release_on_exit: bool,
    /// CrossNamespaceVolumeDataSource gate.
    pub cross_namespace: bool,
    /// CSIMigration gate: a driver that stands in for an in-tree plugin serves its classes and
    /// volumes (the seed's README lists it Beta, on; upstream has no gate for it any more).
    pub csi_migration: bool,
    /// HTTP address (metrics, health), if any.
    pub http_address: Option<String>,
}

impl ProvisionerArgs {
    /// Checks values and combinations; names the flag in every refusal.
    pub fn validate(&self) -> Result<Settings, FlagError> {
        let naming = VolumeNaming::new(&self.volume_name_prefix, self.volume_name_uuid_length)?;
        if self.worker_threads == 0 {
            return Err(invalid("--worker-threads", "must be at least 1"));
        }
        sidecar_kit::flags::check_timeout_and_retries(
            self.timeout,
            self.retry_interval_start,
            self.retry_interval_max,
        )
        .map_err(|e| invalid(e.flag, e.reason))?;
        if self.kube_api_capacity_qps.is_nan() || self.kube_api_capacity_qps < 0.0 {
            return Err(invalid("--kube-api-capacity-qps", "must not be negative"));
        }
        if self.capacity_threads == 0 {
            return Err(invalid("--capacity-threads", "must be at least 1"));
        }
        if self.capacity_poll_interval.is_zero() {
            return Err(invalid(
                "--capacity-poll-interval",
                "must be greater than 0",
            ));
        }
        if self.capacity_ownerref_level < -1 {
            return Err(invalid(
                "--capacity-ownerref-level",
                "must be -1 (no owner), 0 (the Pod), 1 (its controller) or higher",
            ));
        }
        if self.node_deployment_base_delay.is_zero()
            || self.node_deployment_base_delay > self.node_deployment_max_delay
        {
            return Err(invalid(
                "--node-deployment-base-delay",
                "must be greater than 0 and at most --node-deployment-max-delay",
            ));
        }
        if self.enable_pprof {
            return Err(invalid(
                "--enable-pprof",
                "Go pprof endpoints do not exist in this implementation; use --http-endpoint for metrics",
            ));
        }
        let gates = resolve_gates(&FEATURE_GATES, &self.feature_gates)
            .map_err(|reason| invalid("--feature-gates", reason))?;
        match self.capacity_controller_deployment_mode.as_str() {
            "" | "central" => {}
            _ => {
                return Err(invalid(
                    "--capacity-controller-deployment-mode",
                    "only \"central\" is supported; the current flag is --enable-capacity",
                ));
            }
        }
        if self.cloning_protection_threads == 0 {
            return Err(invalid(
                "--cloning-protection-threads",
                "must be at least 1",
            ));
        }
        let http_address = self
            .common
            .validate()
            .map_err(|e| invalid(e.flag, e.reason))?;
        Ok(Settings {
            naming,
            topology: gates["Topology"],
            volume_attributes_class: gates["VolumeAttributesClass"],
            release_on_exit: gates["ReleaseLeaderElectionOnExit"],
            cross_namespace: gates["CrossNamespaceVolumeDataSource"],
            csi_migration: gates["CSIMigration"],
            http_address,
        })
    }

    /// Tuning flags that were changed but have no effect: those of a feature that is off, and
    /// of one that is not supported.
    pub fn inert_flags(&self, given: &[String]) -> Vec<&'static str> {
        const CAPACITY: [&str; 6] = [
            "--capacity-ownerref-level",
            "--capacity-threads",
            "--capacity-poll-interval",
            "--capacity-for-immediate-binding",
            "--kube-api-capacity-qps",
            "--kube-api-capacity-burst",
        ];
        const NODE_DEPLOYMENT: [&str; 3] = [
            "--node-deployment-immediate-binding",
            "--node-deployment-base-delay",
            "--node-deployment-max-delay",
        ];
        let mut inert = vec!["--snapshot-orphan-sweep-interval"];
        if self.automaxprocs {
            inert.push("--automaxprocs");
        }
        if !self.capacity().on() {
            inert.extend(CAPACITY);
        }
        if !self.node_deployment {
            inert.extend(NODE_DEPLOYMENT);
        }
        inert
            .into_iter()
            .filter(|f| {
                given
                    .iter()
                    .any(|g| g == f || g.starts_with(&format!("{f}=")))
            })
            .collect()
    }
}

/// `--enable-capacity`: off, on, or on for classes with immediate binding too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityMode {
    /// No CSIStorageCapacity objects.
    Off,
    /// Objects for classes with late binding (`true`, or the older `central`).
    On,
    /// Also for classes with immediate binding (the older `immediate-binding`).
    WithImmediateBinding,
}

impl CapacityMode {
    /// Whether capacity is published at all.
    pub fn on(self) -> bool {
        self != CapacityMode::Off
    }
}

/// clap's parser of `--enable-capacity`: a Go boolean, or an older form of the seed's README.
fn capacity_mode(text: &str) -> Result<CapacityMode, String> {
    match text {
        "central" => Ok(CapacityMode::On),
        "immediate-binding" => Ok(CapacityMode::WithImmediateBinding),
        other => go_bool(other)
            .map(|on| {
                if on {
                    CapacityMode::On
                } else {
                    CapacityMode::Off
                }
            })
            .map_err(|e| format!("{e}; expected true, false, central or immediate-binding")),
    }
}

impl ProvisionerArgs {
    /// Capacity as the flags ask for it, the older forms included.
    pub fn capacity(&self) -> CapacityMode {
        match self.enable_capacity {
            Some(mode) => mode,
            None if self.capacity_controller_deployment_mode == "central" => CapacityMode::On,
            None => CapacityMode::Off,
        }
    }

    /// Whether classes with immediate binding get capacity objects too.
    pub fn capacity_for_immediate_binding(&self) -> bool {
        self.capacity_for_immediate_binding || self.capacity() == CapacityMode::WithImmediateBinding
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<ProvisionerArgs, clap::Error> {
        let argv = std::iter::once("csi-provisioner".to_string())
            .chain(args.iter().map(|s| s.to_string()));
        ProvisionerArgs::try_parse_from(sidecar_kit::goflags::normalize_args(argv))
    }

    #[test]
    fn the_older_capacity_flag_forms_of_the_seed_are_accepted() {
        // (flags, capacity, immediate binding)
        let rows: [(&[&str], CapacityMode, bool); 9] = [
            (&[], CapacityMode::Off, false),
            (&["--enable-capacity"], CapacityMode::On, false),
            (&["--enable-capacity=central"], CapacityMode::On, false),
            (
                &["--enable-capacity=immediate-binding"],
                CapacityMode::WithImmediateBinding,
                true,
            ),
            (
                &["--enable-capacity", "--capacity-for-immediate-binding"],
                CapacityMode::On,
                true,
            ),
            (
                &["-capacity-controller-deployment-mode=central"],
                CapacityMode::On,
                false,
            ),
            (&["--enable-capacity=false"], CapacityMode::Off, false),
            // An explicit --enable-capacity decides over the older form.
            (
                &[
                    "--enable-capacity=false",
                    "--capacity-controller-deployment-mode=central",
                ],
                CapacityMode::Off,
                false,
            ),
            (&[], CapacityMode::Off, false),
        ];
        for (flags, capacity, immediate) in rows {
            let a = parse(flags).unwrap();
            assert_eq!(a.capacity(), capacity, "{flags:?}");
            assert_eq!(a.capacity_for_immediate_binding(), immediate, "{flags:?}");
            assert!(a.validate().is_ok(), "{flags:?}");
        }
        let e = parse(&["--enable-capacity=local"]).unwrap_err().to_string();
        assert!(e.contains("central or immediate-binding"), "{e}");
        let refused = parse(&["--capacity-controller-deployment-mode=local"])
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--capacity-controller-deployment-mode")
                && refused.contains("--enable-capacity"),
            "{refused}"
        );
    }

    #[test]
    fn defaults_match_upstream() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.common.csi_address, "/run/csi/socket");
        assert_eq!(a.timeout, Duration::from_secs(10));
        assert_eq!(a.worker_threads, 100);
        assert_eq!((a.common.kube_api_qps, a.common.kube_api_burst), (5.0, 10));
        assert_eq!(a.retry_interval_start, Duration::from_secs(1));
        assert_eq!(a.retry_interval_max, Duration::from_secs(300));
        assert_eq!(a.volume_name_prefix, "pvc");
        assert_eq!(a.volume_name_uuid_length, -1);
        assert!(
            !a.extra_create_metadata
                && !a.strict_topology
                && a.immediate_topology
                && a.prevent_volume_mode_conversion
        );
        assert_eq!(
            a.common.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            a.common.leader_election_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            a.common.leader_election_retry_period,
            Duration::from_secs(5)
        );
        assert_eq!(a.common.metrics_path, "/metrics");
        let s = a.validate().unwrap();
        assert!(s.topology && s.volume_attributes_class && s.release_on_exit);
    }

    #[test]
    fn go_syntax_is_accepted() {
        let a = parse(&[
            "-csi-address=/csi/sock",
            "-v=5",
            "--extra-create-metadata",
            "--immediate-topology=false",
            "-leader-election",
            "--timeout=1m30s",
            "--feature-gates=Topology=false",
            "--automaxprocs",
        ])
        .unwrap();
        assert!(a.automaxprocs);
        assert_eq!(
            a.inert_flags(&["--automaxprocs".to_string()]),
            vec!["--automaxprocs"]
        );
        assert_eq!(a.common.csi_address, "/csi/sock");
        assert_eq!(a.common.verbosity, 5);
        assert!(a.extra_create_metadata && a.common.leader_election && !a.immediate_topology);
        assert_eq!(a.timeout, Duration::from_secs(90));
        assert!(!a.validate().unwrap().topology);
        let a = parse(&["--strict-topology=t", "--volume-name-uuid-length=16"]).unwrap();
        assert!(a.strict_topology);
        assert_eq!(a.volume_name_uuid_length, 16);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--volume-name-uuid-length=40"],
                "--volume-name-uuid-length",
            ),
            (&["--volume-name-prefix="], "--volume-name-prefix"),
            (&["--worker-threads=0"], "--worker-threads"),
            (&["--capacity-threads=0"], "--capacity-threads"),
            (&["--capacity-poll-interval=0s"], "--capacity-poll-interval"),
            (
                &["--capacity-ownerref-level=-2"],
                "--capacity-ownerref-level",
            ),
            (&["--kube-api-capacity-qps=-1"], "--kube-api-capacity-qps"),
            (
                &["--node-deployment-base-delay=2m"],
                "--node-deployment-base-delay",
            ),
            (&["--enable-pprof"], "--enable-pprof"),
            (
                &["--http-endpoint=:8080", "--metrics-address=:8081"],
                "--metrics-address",
            ),
            (&["--feature-gates=Bogus=true"], "--feature-gates"),
            (&["--metrics-path=/healthz"], "--metrics-path"),
            (&["--metrics-path=/{x}"], "--metrics-path"),
            (
                &["--leader-election", "--leader-election-renew-deadline=20s"],
                "--leader-election-renew-deadline",
            ),
        ];
        for (args, flag) in cases {
            let err = parse(args).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(flag), "{args:?}: {err}");
        }
        for (args, flag) in [
            (&["--timeout=10"][..], "--timeout"),
            (
                &["--extra-create-metadata=maybe"][..],
                "--extra-create-metadata",
            ),
            (&["--no-such-flag"][..], "--no-such-flag"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn inert_tuning_flags_are_reported() {
        let a = parse(&["--capacity-threads=4"]).unwrap();
        assert_eq!(
            a.inert_flags(&["--capacity-threads=4".into()]),
            vec!["--capacity-threads"],
            "capacity tuning without --enable-capacity"
        );
        let a = parse(&["--capacity-threads=4", "--enable-capacity"]).unwrap();
        assert!(
            a.inert_flags(&["--capacity-threads=4".into()]).is_empty(),
            "with --enable-capacity it works"
        );
        let a = parse(&["--node-deployment-max-delay=2m"]).unwrap();
        assert_eq!(
            a.inert_flags(&["--node-deployment-max-delay=2m".into()]),
            vec!["--node-deployment-max-delay"]
        );
    }
}
