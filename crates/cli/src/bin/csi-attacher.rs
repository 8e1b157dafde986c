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
    let (format, verbosity) = (args.common.logging_format.clone(), args.common.verbosity);
    let klog = args.common.klog.clone();
    cli::sidecar_main("csi-attacher", &format, verbosity, &klog, || {
        attacher::runner::run(args, cli::shutdown_signal())
    })
}
