//! Accepting connections without letting unauthenticated clients exhaust the server: a limit
//! on open connections below the process's file limit, a deadline for the TLS handshake and for
//! each request's headers, and a pause after accept errors (running out of file descriptors
//! must not turn the loop into a spin).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once; further clients wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time a client has to complete the TLS handshake.
    pub handshake: Duration,
    /// Time a client has to send a request's headers.
    pub headers: Duration,
}

impl Limits {
    /// 4096 connections, or fewer when the open-file limit is lower (a quarter of it is kept
    /// for the log, watches' peers and health checks), 10 s handshakes, 30 s headers.
    pub fn for_this_process() -> Limits {
        let files = open_file_limit().unwrap_or(1024);
        Limits {
            max_connections: (files.saturating_sub(files / 4).saturating_sub(16)).clamp(8, 4096)
                as usize,
            handshake: Duration::from_secs(10),
            headers: Duration::from_secs(30),
        }
    }
}

/// The soft `Max open files` limit from `/proc/self/limits`.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Accepts until `shutdown`; then closes every connection.
pub async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut pause = Duration::from_millis(10);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                pause = Duration::from_millis(10);
                tcp
            }
            Err(error) => {
                tracing::warn!(%error, pause_ms = pause.as_millis() as u64, "accept failed; pausing");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(Ok(tls)) = tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = TowerToHyperService::new(router);
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.headers);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .keep_alive_timeout(Duration::from_secs(20));
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::select! {
                _ = connection => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
    let _ = stop_tx.send(true);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_stays_below_the_file_limit() {
        let limits = Limits::for_this_process();
        let files = open_file_limit().unwrap_or(1024);
        assert!((limits.max_connections as u64) < files.max(16));
        assert!(limits.max_connections >= 8);
    }
}
