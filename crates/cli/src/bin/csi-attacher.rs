//! `csi-attacher`: drop-in replacement for the Go external-attacher sidecar.

#![forbid(unsafe_code)]

use attacher::flags::AttacherArgs;
use clap::Parser;

fn main() -> std::process::ExitCode {
    let argv = sidecar_kit::goflags::normalize_args(std::env::args());
    let args = match AttacherArgs::try_parse_from(&argv) {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    if let Err(error) = cli::logging::init(
        &args.common.logging_format,
        cli::logging::level_of_klog_v(args.common.verbosity),
    ) {
        eprintln!("csi-attacher: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("csi-attacher: failed to start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(attacher::runner::run(args, cli::shutdown_signal())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "csi-attacher failed");
            eprintln!("csi-attacher: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
