//! `csi-provisioner`: drop-in replacement for the Go external-provisioner sidecar.

#![forbid(unsafe_code)]

use clap::Parser;
use provisioner::flags::ProvisionerArgs;

fn main() -> std::process::ExitCode {
    let argv = sidecar_kit::goflags::normalize_args(std::env::args());
    let args = match ProvisionerArgs::try_parse_from(&argv) {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    if let Err(error) = cli::logging::init(
        &args.common.logging_format,
        cli::logging::level_of_klog_v(args.common.verbosity),
    ) {
        eprintln!("csi-provisioner: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("csi-provisioner: failed to start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let given: Vec<String> = argv.iter().skip(1).cloned().collect();
    let env = provisioner::runner::ProcessEnv::from_env();
    match runtime.block_on(provisioner::runner::run(
        args,
        &given,
        &env,
        cli::shutdown_signal(),
    )) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "csi-provisioner failed");
            eprintln!("csi-provisioner: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
