//! Accepting connections without letting unauthenticated clients exhaust the server: a limit
//! on open connections below the process's file limit, a deadline for the TLS handshake, for
//! the first request of a connection (HTTP/1 and HTTP/2 alike: a client that completes the
//! handshake and then says nothing is cut off) and for each request's headers, and a pause
//! after accept errors (running out of file descriptors must not turn the loop into a spin).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Time a client has to send a request's headers (and, after the handshake, its first
    /// request).
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
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(Ok(tls)) = tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await
            else {
                return;
            };
            serve_connection(tls, router, limits, stop).await;
        });
    }
    let _ = stop_tx.send(true);
}

/// Serves one connection until it closes, the server stops, or it sends no request within
/// `limits.headers` of being handed over.
async fn serve_connection<I>(
    io: I,
    router: axum::Router,
    limits: Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let asked = Arc::new(AtomicBool::new(false));
    let inner = TowerToHyperService::new(router);
    let flag = asked.clone();
    let service = hyper::service::service_fn(move |request| {
        flag.store(true, Ordering::Relaxed);
        hyper::service::Service::call(&inner, request)
    });
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
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let silent = async {
        tokio::time::sleep(limits.headers).await;
        if asked.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = connection => {}
        _ = stop.wait_for(|s| *s) => {}
        () = silent => tracing::debug!("closing a connection that sent no request in time"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 8,
            handshake: Duration::from_secs(1),
            headers: Duration::from_secs(5),
        }
    }

    fn router() -> axum::Router {
        axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }))
    }

    /// A connection served in the background; resolves when the server lets it go.
    fn serve(
        server_side: tokio::io::DuplexStream,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(serve_connection(server_side, router(), limits(), stopped));
        (stop, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_sends_a_request_is_cut_off() {
        // Nothing at all after the handshake.
        let (_client, server) = tokio::io::duplex(4096);
        let (_stop, task) = serve(server);
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a silent connection must be closed")
            .unwrap();
        // HTTP/2: the preface, then silence (the HTTP/1 header timeout does not apply).
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, task) = serve(server);
        use tokio::io::AsyncWriteExt;
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("an HTTP/2 connection without a request must be closed")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_asks_is_answered_and_kept() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(4096);
        let (stop, task) = serve(server);
        // Requests at 0 s and 4 s; at 8 s the connection is past the 5 s first-request
        // deadline but not idle for 5 s (HTTP/1's own idle limit): it must still be open.
        for _ in 0..2 {
            client
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let mut answer = vec![0u8; 256];
            let n = client.read(&mut answer).await.unwrap();
            let text = String::from_utf8_lossy(&answer[..n]);
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        assert!(
            !task.is_finished(),
            "a connection that asked is not cut off"
        );
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    #[test]
    fn the_connection_limit_stays_below_the_file_limit() {
        let limits = Limits::for_this_process();
        let files = open_file_limit().unwrap_or(1024);
        assert!((limits.max_connections as u64) < files.max(16));
        assert!(limits.max_connections >= 8);
    }
}
