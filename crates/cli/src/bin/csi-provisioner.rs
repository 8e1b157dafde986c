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
    let given: Vec<String> = argv.iter().skip(1).cloned().collect();
    let env = provisioner::runner::ProcessEnv::from_env();
    let (format, verbosity) = (args.common.logging_format.clone(), args.common.verbosity);
    cli::sidecar_main("csi-provisioner", &format, verbosity, || async move {
        provisioner::runner::run(args, &given, &env, cli::shutdown_signal()).await
    })
}
