//! The one logging set-up of every binary: text or JSON to stderr, a level from the binary's
//! own verbosity flag, `RUST_LOG` overriding it, and the chatty HTTP/2 and client crates kept at
//! warnings.

use std::io::IsTerminal;

use sidecar_kit::klog::LogDestination;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

/// Opens a log file for appending (created 0600, as klog's are private to the process's user).
fn open_log(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    durable_log::files::open_private_append(path)
        .map_err(|e| anyhow::anyhow!("failed to open the log file {}: {e}", path.display()))
}

/// Logging flags of `volstack` (every subcommand).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Verbosity: 0 warnings, 1 info (default), 2 debug, 3+ trace. RUST_LOG overrides it.
    #[arg(long = "verbosity", global = true, default_value_t = 1)]
    pub verbosity: u8,
}

/// `volstack --verbosity`: 0 warnings, 1 info, 2 debug, 3+ trace.
pub fn level_of_verbosity(verbosity: u8) -> &'static str {
    match verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    }
}

/// The Go sidecars' klog `-v`: up to 1 info, 2 to 4 debug, 5+ trace (klog's levels 2-4 are
/// where the sidecars log each object they handle).
pub fn level_of_klog_v(v: u8) -> &'static str {
    match v {
        0..=1 => "info",
        2..=4 => "debug",
        _ => "trace",
    }
}

/// Whether text logs carry colour codes: only on a terminal, and not with `NO_COLOR` set (a
/// file or a pipe gets plain text).
pub fn colours(stderr_is_terminal: bool, no_color: bool) -> bool {
    stderr_is_terminal && !no_color
}

/// Installs the global subscriber: `format` is `text` or `json`, `level` one of the above.
pub fn init(format: &str, level: &str) -> anyhow::Result<()> {
    init_to(format, level, &LogDestination::Stderr)
}

/// [`init`] writing to `destination` (klog's `-logtostderr=false` with `-log_dir` or
/// `-log_file`, `-alsologtostderr`). A file is opened for appending, created 0600.
pub fn init_to(format: &str, level: &str, destination: &LogDestination) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => EnvFilter::try_new(spec)?,
        _ => EnvFilter::new(format!(
            "{level},h2=warn,tower=warn,hyper=warn,kube_client=warn"
        )),
    };
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let (writer, terminal) = match destination {
        LogDestination::Stderr => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
        LogDestination::File { path, also_stderr } => {
            let file = open_log(path)?;
            let writer = if *also_stderr {
                BoxMakeWriter::new(std::sync::Mutex::new(file).and(std::io::stderr))
            } else {
                BoxMakeWriter::new(std::sync::Mutex::new(file))
            };
            (writer, false)
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours(terminal, no_color))
        .with_writer(writer);
    let result = if format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| anyhow::anyhow!("failed to initialise logging: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_codes_only_on_a_terminal_without_no_color() {
        assert!(colours(true, false));
        assert!(!colours(true, true));
        assert!(!colours(false, false));
        assert!(!colours(false, true));
    }

    #[test]
    fn each_flag_maps_to_its_level() {
        let ours: Vec<&str> = (0..=4).map(level_of_verbosity).collect();
        assert_eq!(ours, ["warn", "info", "debug", "trace", "trace"]);
        let klog: Vec<&str> = [0, 1, 2, 4, 5, 9]
            .into_iter()
            .map(level_of_klog_v)
            .collect();
        assert_eq!(klog, ["info", "info", "debug", "debug", "trace", "trace"]);
    }
}
