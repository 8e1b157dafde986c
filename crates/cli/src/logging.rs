//! Structured logs: text or JSON, to stderr, verbosity from -v or RUST_LOG.

use tracing_subscriber::EnvFilter;

/// Logging flags shared by every subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Verbosity: 0 warnings, 1 info (default), 2 debug, 3+ trace. RUST_LOG overrides it.
    #[arg(long = "verbosity", global = true, default_value_t = 1)]
    pub verbosity: u8,
}

/// Installs the global subscriber.
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let level = match args.verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => EnvFilter::try_new(spec)?,
        _ => EnvFilter::new(format!("{level},h2=warn,tower=warn,hyper=warn")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = if args.log_format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| anyhow::anyhow!("failed to initialise logging: {e}"))
}
