//! klog's command-line flags, which the Go sidecars accept (their README: "all glog / klog
//! arguments are supported") and deployments pass (`-logtostderr`, `-alsologtostderr`,
//! `-log_dir`, `-stderrthreshold`...). Each is accepted; those with a meaning here choose where
//! logs go, the others are named in a warning at start-up instead of stopping the process.

use std::path::PathBuf;

use crate::flags::go_bool;

/// klog's flags (hidden from `--help`: they exist for compatibility).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct KlogArgs {
    /// klog: log to standard error instead of files (klog's default: true).
    #[arg(long = "logtostderr", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool)]
    pub logtostderr: bool,
    /// klog: log to standard error as well as files.
    #[arg(long = "alsologtostderr", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub alsologtostderr: bool,
    /// klog: write log files in this directory (with -logtostderr=false).
    #[arg(long = "log_dir", hide = true, default_value = "")]
    pub log_dir: String,
    /// klog: write logs to this file (with -logtostderr=false).
    #[arg(long = "log_file", hide = true, default_value = "")]
    pub log_file: String,
    /// klog: largest log file in MB (no effect here).
    #[arg(long = "log_file_max_size", hide = true, default_value = "")]
    pub log_file_max_size: String,
    /// klog: severity at or above which logs also go to stderr (no effect here).
    #[arg(long = "stderrthreshold", hide = true, default_value = "")]
    pub stderrthreshold: String,
    /// klog: no header prefixes (no effect here).
    #[arg(long = "skip_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub skip_headers: bool,
    /// klog: no headers in log files (no effect here).
    #[arg(long = "skip_log_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub skip_log_headers: bool,
    /// klog: each severity only in its own file (no effect here).
    #[arg(long = "one_output", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub one_output: bool,
    /// klog: the file's directory in headers (no effect here).
    #[arg(long = "add_dir_header", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub add_dir_header: bool,
    /// klog: a stack trace at file:line (no effect here).
    #[arg(long = "log_backtrace_at", hide = true, default_value = "")]
    pub log_backtrace_at: String,
    /// klog: per-file verbosity (no effect here; RUST_LOG sets per-module levels).
    #[arg(long = "vmodule", hide = true, default_value = "")]
    pub vmodule: String,
    /// component-base: how often logs are flushed (no effect here: every line is written at once).
    #[arg(long = "log-flush-frequency", hide = true, default_value = "")]
    pub log_flush_frequency: String,
    /// component-base's alpha logging flags, registered by the Go sidecars and usable there only
    /// with the LoggingAlphaOptions gate, which their command line cannot turn on: accepted at
    /// their defaults, refused otherwise (see [`KlogArgs::alpha_refusal`]).
    #[arg(long = "log-text-split-stream", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub log_text_split_stream: bool,
    /// See `log_text_split_stream`.
    #[arg(long = "log-text-info-buffer-size", hide = true, default_value = "0", value_parser = crate::quantity::Quantity::parse)]
    pub log_text_info_buffer_size: crate::quantity::Quantity,
    /// See `log_text_split_stream`.
    #[arg(long = "log-json-split-stream", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub log_json_split_stream: bool,
    /// See `log_text_split_stream`.
    #[arg(long = "log-json-info-buffer-size", hide = true, default_value = "0", value_parser = crate::quantity::Quantity::parse)]
    pub log_json_info_buffer_size: crate::quantity::Quantity,
}

/// Where logs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDestination {
    /// Standard error.
    Stderr,
    /// A file (appended to), and standard error too when `also_stderr`.
    File {
        /// The file.
        path: PathBuf,
        /// `-alsologtostderr`.
        also_stderr: bool,
    },
}

impl KlogArgs {
    /// Where `program`'s logs go, as klog decides it: standard error unless
    /// `-logtostderr=false`; then `-log_file`, else `<log_dir>/<program>.log` (klog names its
    /// files by program, host, user and severity; one file here), else standard error (klog
    /// would write to the temporary directory).
    pub fn destination(&self, program: &str) -> LogDestination {
        if self.logtostderr {
            return LogDestination::Stderr;
        }
        let path = if !self.log_file.is_empty() {
            PathBuf::from(&self.log_file)
        } else if !self.log_dir.is_empty() {
            PathBuf::from(&self.log_dir).join(format!("{program}.log"))
        } else {
            return LogDestination::Stderr;
        };
        LogDestination::File {
            path,
            also_stderr: self.alsologtostderr,
        }
    }

    /// Why the process must not start, if an alpha logging flag is set away from its default:
    /// the Go sidecars refuse it (`options.text.splitStream: Forbidden: Feature
    /// LoggingAlphaOptions is disabled`), as their command line cannot enable that gate.
    pub fn alpha_refusal(&self) -> Option<String> {
        let set = [
            (
                self.log_text_split_stream,
                "--log-text-split-stream",
                "options.text.splitStream",
            ),
            (
                !self.log_text_info_buffer_size.is_zero(),
                "--log-text-info-buffer-size",
                "options.text.infoBufferSize",
            ),
            (
                self.log_json_split_stream,
                "--log-json-split-stream",
                "options.json.splitStream",
            ),
            (
                !self.log_json_info_buffer_size.is_zero(),
                "--log-json-info-buffer-size",
                "options.json.infoBufferSize",
            ),
        ];
        let refused: Vec<String> = set
            .iter()
            .filter(|(given, _, _)| *given)
            .map(|(_, flag, path)| {
                format!("{flag}: {path}: Forbidden: Feature LoggingAlphaOptions is disabled")
            })
            .collect();
        (!refused.is_empty()).then(|| refused.join(", "))
    }

    /// The flags given that change nothing here, for one warning at start-up.
    pub fn without_effect(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut given = |set: bool, flag: &'static str| {
            if set {
                out.push(flag);
            }
        };
        given(!self.log_file_max_size.is_empty(), "-log_file_max_size");
        given(!self.stderrthreshold.is_empty(), "-stderrthreshold");
        given(self.skip_headers, "-skip_headers");
        given(self.skip_log_headers, "-skip_log_headers");
        given(self.one_output, "-one_output");
        given(self.add_dir_header, "-add_dir_header");
        given(!self.log_backtrace_at.is_empty(), "-log_backtrace_at");
        given(!self.vmodule.is_empty(), "-vmodule");
        given(
            !self.log_flush_frequency.is_empty(),
            "--log-flush-frequency",
        );
        // Files named while logs go to stderr: klog ignores them too, say so.
        given(
            self.logtostderr && !(self.log_dir.is_empty() && self.log_file.is_empty()),
            "-log_dir/-log_file (with -logtostderr=true)",
        );
        given(
            self.logtostderr && self.alsologtostderr,
            "-alsologtostderr (with -logtostderr=true)",
        );
        // klog would write to the temporary directory; the logs stay on stderr here.
        given(
            !self.logtostderr && self.log_dir.is_empty() && self.log_file.is_empty(),
            "-logtostderr=false (without -log_dir or -log_file: logs stay on stderr)",
        );
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(flatten)]
        klog: KlogArgs,
    }

    fn parse(flags: &[&str]) -> KlogArgs {
        let argv = std::iter::once("bin".to_string()).chain(flags.iter().map(|s| s.to_string()));
        Args::try_parse_from(crate::goflags::normalize_args(argv))
            .unwrap()
            .klog
    }

    #[test]
    fn klog_flags_are_accepted_in_go_syntax() {
        let k = parse(&[
            "-alsologtostderr",
            "-logtostderr=false",
            "-log_dir=/var/log/csi",
            "-stderrthreshold=INFO",
            "-vmodule=foo=5",
            "-skip_headers",
            "--log-flush-frequency=5s",
        ]);
        assert!(!k.logtostderr && k.alsologtostderr && k.skip_headers);
        assert_eq!(
            k.destination("csi-provisioner"),
            LogDestination::File {
                path: PathBuf::from("/var/log/csi/csi-provisioner.log"),
                also_stderr: true
            }
        );
        assert_eq!(
            k.without_effect(),
            [
                "-stderrthreshold",
                "-skip_headers",
                "-vmodule",
                "--log-flush-frequency"
            ]
        );
    }

    #[test]
    fn logs_go_where_klog_sends_them() {
        // (flags, destination)
        let file = |p: &str, also| LogDestination::File {
            path: PathBuf::from(p),
            also_stderr: also,
        };
        let rows = [
            (vec![], LogDestination::Stderr),
            (vec!["-logtostderr"], LogDestination::Stderr),
            (vec!["-log_dir=/d"], LogDestination::Stderr),
            (vec!["-logtostderr=false"], LogDestination::Stderr),
            (
                vec!["-logtostderr=false", "-log_dir=/d"],
                file("/d/p.log", false),
            ),
            (
                vec!["-logtostderr=false", "-log_dir=/d", "-log_file=/f.log"],
                file("/f.log", false),
            ),
            (
                vec!["-logtostderr=false", "-log_file=/f.log", "-alsologtostderr"],
                file("/f.log", true),
            ),
        ];
        for (flags, want) in rows {
            assert_eq!(parse(&flags).destination("p"), want, "{flags:?}");
        }
        assert_eq!(
            parse(&["-log_dir=/d", "-alsologtostderr"]).without_effect(),
            [
                "-log_dir/-log_file (with -logtostderr=true)",
                "-alsologtostderr (with -logtostderr=true)"
            ]
        );
        assert!(parse(&[]).without_effect().is_empty());
        assert_eq!(
            parse(&["-logtostderr=false"]).without_effect(),
            ["-logtostderr=false (without -log_dir or -log_file: logs stay on stderr)"]
        );
        assert!(
            parse(&["-logtostderr=false", "-log_dir=/d"])
                .without_effect()
                .is_empty()
        );
    }

    #[test]
    fn alpha_logging_flags_are_accepted_at_their_defaults_and_refused_otherwise() {
        for flags in [
            &[][..],
            &[
                "--log-text-split-stream=false",
                "--log-text-info-buffer-size=0",
            ][..],
            &[
                "--log-json-split-stream=false",
                "--log-json-info-buffer-size",
                "0Ki",
            ][..],
            &["--log-text-info-buffer-size=0.0"][..],
        ] {
            assert_eq!(parse(flags).alpha_refusal(), None, "{flags:?}");
        }
        // A quantity that rounds up to a byte is not zero; one that is no quantity is a bad value.
        assert!(
            parse(&["--log-text-info-buffer-size=1m"])
                .alpha_refusal()
                .is_some()
        );
        for bad in [
            "--log-text-info-buffer-size=abc",
            "--log-json-info-buffer-size=",
        ] {
            let argv = std::iter::once("x").chain(std::iter::once(bad));
            assert!(Args::try_parse_from(argv).is_err(), "{bad}");
        }
        let refused = parse(&[
            "--log-text-split-stream",
            "--log-json-info-buffer-size=64Ki",
        ])
        .alpha_refusal()
        .unwrap();
        assert_eq!(
            refused,
            "--log-text-split-stream: options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled, --log-json-info-buffer-size: options.json.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled"
        );
    }
}
