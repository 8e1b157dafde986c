//! Shared pieces of the project's binaries.

#![forbid(unsafe_code)]

pub mod apibench;
pub mod bench;
pub mod chart;
pub mod embedded;
pub mod logging;
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
