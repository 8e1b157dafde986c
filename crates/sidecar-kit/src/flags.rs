//! The flags every sidecar shares (csi-lib-utils' standard flags: API access, the driver's
//! socket, leader election, the HTTP endpoint, logging), with upstream's names, defaults and Go
//! syntax; each binary flattens them into its own.

use std::time::Duration;

use crate::duration::parse_go_duration;
use crate::goflags::{parse_bool_map, parse_go_bool, parse_label_list};
use crate::leader::{ElectionConfig, lease_namespace};

/// clap's parser of a Go boolean flag value (`true`, `t`, `1`, `false`...).
pub fn go_bool(text: &str) -> Result<bool, String> {
    parse_go_bool(text)
}

/// clap's parser of a Go duration (`1m30s`).
pub fn go_duration(text: &str) -> Result<Duration, String> {
    parse_go_duration(text).map_err(|e| e.to_string())
}

/// `KEY:VALUE` pairs (an alias, so clap takes the flag as one value).
pub type LabelList = Vec<(String, String)>;

fn labels(text: &str) -> Result<LabelList, String> {
    parse_label_list(text)
}

/// `NAME=bool` pairs (an alias, so clap takes the flag as one value).
pub type GateList = Vec<(String, bool)>;

/// clap's parser of `--feature-gates`.
pub fn gates(text: &str) -> Result<GateList, String> {
    parse_bool_map(text)
}

/// A feature gate's maturity (component-base's `PreRelease`): `AllAlpha` and `AllBeta` set the
/// gates of theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available.
    Ga,
}

/// A known gate: its name, its default and its stage.
pub type Gate = (&'static str, bool, Stage);

/// The value of every known gate: its default unless `given` sets it, as component-base's
/// feature gates do: `AllAlpha=<bool>` and `AllBeta=<bool>` set every alpha (beta) gate not set
/// by name; an unknown gate is refused with the list of known ones.
pub fn resolve_gates(
    known: &[Gate],
    given: &GateList,
) -> Result<std::collections::BTreeMap<&'static str, bool>, String> {
    let mut gates: std::collections::BTreeMap<&'static str, bool> =
        known.iter().map(|(name, on, _)| (*name, *on)).collect();
    let mut all = Vec::new();
    for (name, value) in given {
        let stage = match name.as_str() {
            "AllAlpha" => Some(Stage::Alpha),
            "AllBeta" => Some(Stage::Beta),
            _ => None,
        };
        if let Some(stage) = stage {
            all.push((stage, *value));
            continue;
        }
        match gates.get_mut(name.as_str()) {
            Some(slot) => *slot = *value,
            None => {
                let names: Vec<&str> = known.iter().map(|(n, _, _)| *n).collect();
                return Err(format!(
                    "unknown feature gate {name:?}; known: {}, AllAlpha, AllBeta",
                    names.join(", ")
                ));
            }
        }
    }
    for (stage, value) in all {
        for (name, _, of) in known {
            if *of == stage && !given.iter().any(|(n, _)| n == name) {
                gates.insert(name, value);
            }
        }
    }
    Ok(gates)
}

/// The shared flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Absolute path to the kubeconfig file. Required only when running out of cluster.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,
    /// Address of the Kubernetes API server (overrides the kubeconfig's).
    #[arg(long, default_value = "")]
    pub master: String,
    /// QPS to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f32,
    /// Burst to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
    /// The gRPC endpoint of the CSI driver.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,
    /// Enable leader election.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,
    /// Lease duration.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub leader_election_lease_duration: Duration,
    /// Renew deadline.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub leader_election_renew_deadline: Duration,
    /// Retry period.
    #[arg(long, default_value = "5s", value_parser = go_duration)]
    pub leader_election_retry_period: Duration,
    /// Labels of the Lease, KEY:VALUE,...
    #[arg(long, default_value = "", value_parser = labels)]
    pub leader_election_labels: LabelList,
    /// host:port of the HTTP server for metrics and health (empty: off).
    #[arg(long, default_value = "")]
    pub http_endpoint: String,
    /// Deprecated: host:port for metrics only; exclusive with --http-endpoint.
    #[arg(long, default_value = "")]
    pub metrics_address: String,
    /// Path of the metrics endpoint.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,
    /// Log verbosity (klog -v).
    #[arg(long = "v", default_value_t = 0)]
    pub verbosity: u8,
    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,
    /// klog's flags, accepted as the Go sidecars accept them.
    #[command(flatten)]
    pub klog: crate::klog::KlogArgs,
}

/// A refused value of a shared flag: the flag and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct CommonFlagError {
    /// The flag.
    pub flag: &'static str,
    /// What is wrong with the value.
    pub reason: &'static str,
}

/// Checks the call timeout and the per-item retry range every sidecar has (`--timeout`,
/// `--retry-interval-start`, `--retry-interval-max`).
pub fn check_timeout_and_retries(
    timeout: Duration,
    retry_start: Duration,
    retry_max: Duration,
) -> Result<(), CommonFlagError> {
    if timeout.is_zero() {
        return Err(CommonFlagError {
            flag: "--timeout",
            reason: "must be greater than 0",
        });
    }
    if retry_start.is_zero() || retry_start > retry_max {
        return Err(CommonFlagError {
            flag: "--retry-interval-start",
            reason: "must be greater than 0 and at most --retry-interval-max",
        });
    }
    Ok(())
}

/// client-go's `JitterFactor`: the renew deadline must exceed the retry period by this factor.
const LEADER_ELECTION_JITTER: f64 = 1.2;

/// Checks the leader election's durations as client-go's `NewLeaderElector` does (upstream
/// panics on the first two; we refuse to start with the flag's name): the lease outlasts the
/// renew deadline, which outlasts 1.2 retry periods, and none is zero.
pub fn check_leader_election(
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<(), CommonFlagError> {
    let refuse = |flag, reason| Err(CommonFlagError { flag, reason });
    if lease.is_zero() {
        return refuse("--leader-election-lease-duration", "must be greater than 0");
    }
    if retry.is_zero() {
        return refuse("--leader-election-retry-period", "must be greater than 0");
    }
    if renew >= lease {
        return refuse(
            "--leader-election-renew-deadline",
            "must be shorter than --leader-election-lease-duration",
        );
    }
    if renew.as_secs_f64() <= retry.as_secs_f64() * LEADER_ELECTION_JITTER {
        return refuse(
            "--leader-election-renew-deadline",
            "must be longer than 1.2 times --leader-election-retry-period (client-go's jitter factor)",
        );
    }
    Ok(())
}

impl CommonArgs {
    /// Checks the shared flags; returns the HTTP address to serve, if any.
    pub fn validate(&self) -> Result<Option<String>, CommonFlagError> {
        let refuse = |flag, reason| Err(CommonFlagError { flag, reason });
        if self.kube_api_qps.is_nan() || self.kube_api_qps < 0.0 {
            return refuse("--kube-api-qps", "must not be negative");
        }
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return refuse(
                "--metrics-address",
                "cannot be used together with --http-endpoint",
            );
        }
        if let Some(reason) = crate::http::metrics_path_error(&self.metrics_path) {
            return refuse("--metrics-path", reason);
        }
        if self.leader_election {
            check_leader_election(
                self.leader_election_lease_duration,
                self.leader_election_renew_deadline,
                self.leader_election_retry_period,
            )?;
        }
        Ok([&self.http_endpoint, &self.metrics_address]
            .into_iter()
            .find(|a| !a.is_empty())
            .cloned())
    }

    /// The election of the Lease `name`, when `--leader-election` is on (`events`: see
    /// [`ElectionConfig::events`]).
    pub fn election(
        &self,
        name: String,
        release_on_exit: bool,
        events: Option<String>,
    ) -> Option<ElectionConfig> {
        self.leader_election.then(|| ElectionConfig {
            namespace: lease_namespace(&self.leader_election_namespace),
            name,
            identity: format!("{}_{}", crate::vocabulary::hostname(), uuid::Uuid::new_v4()),
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
            labels: self.leader_election_labels.iter().cloned().collect(),
            release_on_exit,
            events,
            // csi-lib-utils sets no election name.
            metric_name: String::new(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn all_alpha_and_all_beta_set_the_gates_of_their_stage_not_set_by_name() {
        const KNOWN: [Gate; 4] = [
            ("A1", false, Stage::Alpha),
            ("A2", false, Stage::Alpha),
            ("B1", true, Stage::Beta),
            ("G1", true, Stage::Ga),
        ];
        let given = |pairs: &[(&str, bool)]| -> GateList {
            pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
        };
        let on = |pairs: &[(&str, bool)]| -> Vec<&'static str> {
            resolve_gates(&KNOWN, &given(pairs))
                .unwrap()
                .into_iter()
                .filter(|(_, on)| *on)
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(on(&[]), vec!["B1", "G1"]);
        assert_eq!(on(&[("AllAlpha", true)]), vec!["A1", "A2", "B1", "G1"]);
        // A gate set by name wins, before or after AllAlpha.
        assert_eq!(
            on(&[("A2", false), ("AllAlpha", true)]),
            vec!["A1", "B1", "G1"]
        );
        assert_eq!(
            on(&[("AllAlpha", true), ("A2", false)]),
            vec!["A1", "B1", "G1"]
        );
        assert_eq!(on(&[("AllBeta", false)]), vec!["G1"]);
        let unknown = resolve_gates(&KNOWN, &given(&[("Bogus", true)])).unwrap_err();
        assert!(
            unknown.contains("known: A1, A2, B1, G1, AllAlpha, AllBeta"),
            "{unknown}"
        );
    }

    #[test]
    fn leader_election_durations_follow_client_go() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let rows: [(Duration, Duration, Duration, Option<&str>); 8] = [
            // Upstream's defaults.
            (s(15), s(10), s(5), None),
            (s(3), s(2), ms(500), None),
            (s(15), s(15), s(5), Some("--leader-election-renew-deadline")),
            (s(15), s(20), s(5), Some("--leader-election-renew-deadline")),
            // 10 s is not more than 1.2 × 9 s: a renewal would have one retry at most.
            (s(15), s(10), s(9), Some("--leader-election-renew-deadline")),
            (
                s(15),
                ms(1200),
                s(1),
                Some("--leader-election-renew-deadline"),
            ),
            (s(0), s(10), s(5), Some("--leader-election-lease-duration")),
            (s(15), s(10), s(0), Some("--leader-election-retry-period")),
        ];
        for (lease, renew, retry, refused) in rows {
            let got = check_leader_election(lease, renew, retry)
                .err()
                .map(|e| e.flag);
            assert_eq!(
                got, refused,
                "lease {lease:?} renew {renew:?} retry {retry:?}"
            );
        }
    }
}
