//! Shared pieces of the project's binaries.

#![forbid(unsafe_code)]

pub mod apibench;
pub mod bench;
pub mod binderbench;
pub mod chart;
pub mod conformance;
pub mod embedded;
pub mod logging;
pub mod manifests;
pub mod stack;

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}

/// The `main` of a sidecar binary after its flags are parsed: logging (`--logging-format`,
/// klog's `-v`), the async runtime, then `run` until it returns; an error is logged and
/// printed as `<name>: <error>` and the process exits non-zero.
pub fn sidecar_main<F, Fut, E>(
    name: &str,
    logging_format: &str,
    verbosity: u8,
    klog: &sidecar_kit::klog::KlogArgs,
    run: F,
) -> std::process::ExitCode
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let destination = klog.destination(name);
    if let Err(error) = logging::init_to(
        logging_format,
        logging::level_of_klog_v(verbosity),
        &destination,
    ) {
        eprintln!("{name}: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    if let Some(refused) = klog.alpha_refusal() {
        // Once, on stderr, as upstream says it (its logs may be on stderr too).
        eprintln!("{name}: LoggingConfiguration is invalid: {refused}");
        return std::process::ExitCode::FAILURE;
    }
    let ignored = klog.without_effect();
    if !ignored.is_empty() {
        tracing::warn!(
            flags = %ignored.join(", "),
            "klog flags accepted for compatibility; they have no effect here"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("{name}: failed to start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "{name} failed");
            eprintln!("{name}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
