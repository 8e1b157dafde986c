//! The flags of `volstack bench-binder`, and the QPS flags each client of a run gets from them.

use std::time::Duration;

/// Which binder binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Binder {
    /// kube-controller-manager's persistentvolume-binder-controller.
    Kcm,
    /// `volstack pv-controller`, kube-controller-manager started without its binder.
    Ours,
}

/// Flags of `volstack bench-binder`.
#[derive(Debug, Clone, clap::Args)]
pub struct BinderBenchArgs {
    /// Claims created before the sidecars start (a backlog).
    #[arg(long, default_value_t = 1000)]
    pub claims: usize,
    /// The binders to measure, one run each, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kcm,ours")]
    pub binders: Vec<Binder>,
    /// `--kube-api-qps` of every client (kube-controller-manager, the provisioner, ours); 0
    /// lifts the limit of ours and sets kube-controller-manager's to 10,000.
    #[arg(long, default_value_t = 0.0)]
    pub qps: f32,
    /// Give no client a `--kube-api-qps` or `--kube-api-burst`: each runs at its own defaults
    /// (kube-controller-manager 20/30, csi-provisioner 5/10, `volstack pv-controller` 20/30).
    #[arg(long, conflicts_with = "qps")]
    pub default_qps: bool,
    /// `--workers` of `volstack pv-controller` (its own default is 8; with the QPS limits
    /// lifted more keep kube-apiserver busier: 1,000 claims Bound in 6.0 s with 8, 4.6 s with 64).
    #[arg(long, default_value_t = 64)]
    pub workers: usize,
    /// Copy every process's log (the control plane's, the driver's, csi-provisioner's, ours)
    /// and kube-apiserver's audit log (with `--audit-log`) into this directory after each run,
    /// failed or not, named `<run>-<binder>-<file>` (`1-kcm-kube-controller-manager.log`).
    #[arg(long)]
    pub logs: Option<std::path::PathBuf>,
    /// Start kube-apiserver with the test suite's audit log of every request (Metadata level,
    /// blocking), to count requests in it. Off by default, as on a cluster without an audit
    /// policy: writing it took 3.5 to 4% of kube-apiserver's CPU in profiles of 2026-11-28.
    #[arg(long)]
    pub audit_log: bool,
    /// Give up waiting for all Bound after this long.
    #[arg(long, default_value = "15m", value_parser = sidecar_kit::flags::go_duration)]
    pub timeout: Duration,
}

/// The QPS flags of a client: none with `--default-qps`, `lifted` without `--qps`.
pub(super) fn qps_flags(args: &BinderBenchArgs, lifted: f32) -> Vec<String> {
    if args.default_qps {
        return Vec::new();
    }
    let qps = if args.qps <= 0.0 { lifted } else { args.qps };
    vec![
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={}", (qps * 2.0).max(1.0) as u64),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BinderBenchArgs,
    }

    fn parse(argv: &[&str]) -> Result<BinderBenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench-binder").chain(argv.iter().copied()))
            .map(|cli| cli.args)
    }

    #[test]
    fn each_qps_mode_gives_its_flags() {
        let lifted = parse(&[]).unwrap();
        assert_eq!(
            qps_flags(&lifted, 10_000.0),
            ["--kube-api-qps=10000", "--kube-api-burst=20000"]
        );
        let twenty = parse(&["--qps", "20"]).unwrap();
        assert_eq!(
            qps_flags(&twenty, 0.0),
            ["--kube-api-qps=20", "--kube-api-burst=40"]
        );
        // Each client at its own defaults: no flag at all.
        let defaults = parse(&["--default-qps"]).unwrap();
        assert!(qps_flags(&defaults, 10_000.0).is_empty());
        assert!(parse(&["--default-qps", "--qps", "20"]).is_err());
    }
}
