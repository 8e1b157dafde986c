//! `csi-provisioner`: drop-in replacement for the Go external-provisioner sidecar.

#![forbid(unsafe_code)]

use clap::Parser;
use provisioner::flags::ProvisionerArgs;

fn main() -> std::process::ExitCode {
    one_malloc_arena();
    let argv = sidecar_kit::goflags::normalize_args(std::env::args());
    let args = match ProvisionerArgs::try_parse_from(&argv) {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    let given: Vec<String> = argv.iter().skip(1).cloned().collect();
    let env = provisioner::runner::ProcessEnv::from_env();
    let (format, verbosity) = (args.common.logging_format.clone(), args.common.verbosity);
    let klog = args.common.klog.clone();
    cli::sidecar_main(
        "csi-provisioner",
        &format,
        verbosity,
        &klog,
        || async move { provisioner::runner::run(args, &given, &env, cli::shutdown_signal()).await },
    )
}

/// One glibc malloc arena instead of up to eight per core, unless `MALLOC_ARENA_MAX` is set:
/// the sidecar's threads allocate little at once, and each extra arena keeps its own free
/// pages. glibc reads the setting only at start, so the process runs itself again with it
/// (same PID, same arguments); if that fails it goes on as it is. Measured on 2026-11-25,
/// backlogs of 10,000 claims, alternately 2 runs each: peak RSS 35.7 and 36.2 MiB against
/// 36.8 and 37.1 MiB, CPU 6.5 and 6.2 s against 7.5 and 6.5 s.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && let Ok(exe) = std::env::current_exe()
    {
        use std::os::unix::process::CommandExt;
        let error = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("MALLOC_ARENA_MAX", "1")
            .exec();
        eprintln!("csi-provisioner: running with one malloc arena failed ({error}); going on");
    }
}
