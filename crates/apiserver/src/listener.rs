//! Accepting connections without letting unauthenticated clients exhaust the server: a limit
//! on open connections below the process's file limit, a deadline for the TLS handshake and for
//! each request's headers, and a pause after accept errors (running out of file descriptors
//! must not turn the loop into a spin).
//!
//! A connection is *unauthenticated* until the handler finds a request on it with a valid token
//! and says so through [`Authenticated`]. Unauthenticated connections
//! (which every connection is at first) hold at most [`Limits::unauthenticated`] slots, the
//! oldest making way for a new one, and live at most [`Limits::unauthenticated_life`] from
//! accept: health checks without a token, or clients that say nothing, cannot keep the slots
//! kubectl needs. Any connection, HTTP/1 or HTTP/2, with no request in flight for
//! [`Limits::idle`] is closed (a watch's stream is a request in flight).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio::time::Instant;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once; further clients wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time a client has to complete the TLS handshake.
    pub handshake: Duration,
    /// Time a client has to send a request's headers.
    pub headers: Duration,
    /// Most connections without an authenticated request at once (a new one closes the
    /// oldest).
    pub unauthenticated: usize,
    /// Time from accept a connection has to make an authenticated request.
    pub unauthenticated_life: Duration,
    /// Time a connection with no request in flight is kept (kube-apiserver's 90 s, which
    /// client-go's keep-alive pool matches).
    pub idle: Duration,
}

impl Limits {
    /// 4096 connections, or fewer when the open-file limit is lower (a quarter of it is kept
    /// for the log, watches' peers and health checks), a quarter of them for unauthenticated
    /// ones living 15 s, 10 s handshakes, 30 s headers, 90 s idle.
    pub fn for_this_process() -> Limits {
        let files = open_file_limit().unwrap_or(1024);
        let max_connections =
            (files.saturating_sub(files / 4).saturating_sub(16)).clamp(8, 4096) as usize;
        Limits {
            max_connections,
            handshake: Duration::from_secs(10),
            headers: Duration::from_secs(30),
            unauthenticated: Limits::unauthenticated_share(max_connections),
            unauthenticated_life: Duration::from_secs(15),
            idle: Duration::from_secs(90),
        }
    }

    /// The slots unauthenticated connections may hold out of `max_connections`: a quarter, at
    /// least one.
    pub fn unauthenticated_share(max_connections: usize) -> usize {
        (max_connections / 4).max(1)
    }
}

/// The soft `Max open files` limit from `/proc/self/limits`.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A request extension the listener sets: the handler calls [`Authenticated::mark`] as soon as
/// it has found the request's token valid (before it is served: a slow first request still
/// counts), and the connection is no longer unauthenticated.
#[derive(Clone)]
pub struct Authenticated {
    activity: Arc<Activity>,
    on_authenticated: Arc<dyn Fn() + Send + Sync>,
}

impl Authenticated {
    /// The connection made a request with a valid token.
    pub fn mark(&self) {
        if self.activity.authenticate() {
            (self.on_authenticated)();
        }
    }
}

impl std::fmt::Debug for Authenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticated").finish_non_exhaustive()
    }
}

/// The unauthenticated connections, oldest first, each with the sender that closes it.
#[derive(Debug, Default)]
struct Pending {
    queue: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
}

impl Pending {
    /// Adds connection `id`; when `limit` are pending already, the oldest is told to close.
    fn add(&self, id: u64, limit: usize) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut queue = self.queue.lock();
        while queue.len() >= limit.max(1) {
            if let Some((_, evict)) = queue.pop_front() {
                let _ = evict.send(());
            }
        }
        queue.push_back((id, tx));
        rx
    }

    /// Connection `id` authenticated or closed.
    fn remove(&self, id: u64) {
        self.queue.lock().retain(|(other, _)| *other != id);
    }
}

/// What a connection's watchdog knows about it.
#[derive(Debug)]
struct Activity {
    authenticated: AtomicBool,
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
    changed: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            authenticated: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        *self.last.lock() = Instant::now();
    }

    fn finished(&self) {
        *self.last.lock() = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Whether this call authenticated it (false: it was already).
    fn authenticate(&self) -> bool {
        let first = !self.authenticated.swap(true, Ordering::SeqCst);
        if first {
            self.changed.notify_one();
        }
        first
    }

    /// Resolves when the connection has been unauthenticated past `life` from `accepted`, or
    /// idle (nothing in flight) for `idle`.
    async fn expired(&self, accepted: Instant, life: Duration, idle: Duration) -> &'static str {
        loop {
            let notified = self.changed.notified();
            let deadline = if !self.authenticated.load(Ordering::SeqCst) {
                accepted + life
            } else if self.in_flight.load(Ordering::SeqCst) == 0 {
                *self.last.lock() + idle
            } else {
                // Busy: nothing expires until a request finishes.
                notified.await;
                continue;
            };
            if Instant::now() >= deadline {
                return if self.authenticated.load(Ordering::SeqCst) {
                    "idle"
                } else {
                    "unauthenticated"
                };
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// A response body that tells its connection's [`Activity`] when it is done (dropped).
struct Tracked<B> {
    inner: B,
    activity: Arc<Activity>,
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.activity.finished();
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
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
    let pending = Arc::new(Pending::default());
    let ids = AtomicU64::new(0);
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
        let id = ids.fetch_add(1, Ordering::Relaxed);
        let mut evicted = pending.add(id, limits.unauthenticated);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let stop = stop_rx.clone();
        let pending = pending.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let accepted = Instant::now();
            let handshake = tokio::time::timeout(limits.handshake, acceptor.accept(tcp));
            let tls = tokio::select! {
                tls = handshake => tls,
                Ok(()) = &mut evicted => {
                    pending.remove(id);
                    return;
                }
            };
            if let Ok(Ok(tls)) = tls {
                let on_authenticated = pending.clone();
                let connection = Connection {
                    router,
                    limits,
                    accepted,
                    evicted,
                    on_authenticated: Arc::new(move || on_authenticated.remove(id)),
                };
                connection.serve(tls, stop).await;
            }
            pending.remove(id);
        });
    }
    let _ = stop_tx.send(true);
}

/// One accepted connection and what ends it.
struct Connection {
    router: axum::Router,
    limits: Limits,
    accepted: Instant,
    /// Fires when newer unauthenticated connections need its slot.
    evicted: oneshot::Receiver<()>,
    /// Called once, when a request on it is [`Authenticated`].
    on_authenticated: Arc<dyn Fn() + Send + Sync>,
}

impl Connection {
    /// Serves until the connection closes, the server stops, it is evicted or expires.
    async fn serve<I>(self, io: I, mut stop: tokio::sync::watch::Receiver<bool>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            router,
            limits,
            accepted,
            mut evicted,
            on_authenticated,
        } = self;
        let activity = Arc::new(Activity::new());
        let inner = TowerToHyperService::new(router);
        let mark = Authenticated {
            activity: activity.clone(),
            on_authenticated,
        };
        let tracker = activity.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            tracker.started();
            request.extensions_mut().insert(mark.clone());
            // Counted from the request until its body is done, whatever happens between.
            let guard = Tracked {
                inner: (),
                activity: tracker.clone(),
            };
            let answer = hyper::service::Service::call(&inner, request);
            let tracker = tracker.clone();
            async move {
                let response = answer.await?.map(|body| Tracked {
                    inner: body,
                    activity: tracker.clone(),
                });
                // The body's guard has taken over.
                tracker.started();
                drop(guard);
                Ok::<_, std::convert::Infallible>(response)
            }
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
        let expired = activity.expired(accepted, limits.unauthenticated_life, limits.idle);
        let still_unauthenticated = async {
            if (&mut evicted).await.is_err() {
                // The sender went with authentication: never evicted.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = connection => {}
            _ = stop.wait_for(|s| *s) => {}
            why = expired => tracing::debug!(why, "closing a connection"),
            () = still_unauthenticated => tracing::debug!("closing the oldest unauthenticated connection for a new one"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits() -> Limits {
        Limits {
            max_connections: 8,
            handshake: Duration::from_secs(1),
            headers: Duration::from_secs(5),
            unauthenticated: 2,
            unauthenticated_life: Duration::from_secs(5),
            idle: Duration::from_secs(20),
        }
    }

    /// `/healthz` answers anyone; `/authed` marks its connection as the handler does for a
    /// request with a valid token; `/watch` too, and its body never ends.
    fn router() -> axum::Router {
        let authed = |request: &axum::extract::Request| {
            request.extensions().get::<Authenticated>().unwrap().mark();
        };
        axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route(
                "/authed",
                axum::routing::get(move |request: axum::extract::Request| async move {
                    authed(&request);
                    "yes"
                }),
            )
            .route(
                "/watch",
                axum::routing::get(move |request: axum::extract::Request| async move {
                    authed(&request);
                    let never = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
                    axum::body::Body::from_stream(never)
                }),
            )
    }

    /// A connection served in the background, and the sender that evicts it; the task
    /// resolves when the server lets the connection go.
    fn serve(
        server_side: tokio::io::DuplexStream,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (evict, evicted) = oneshot::channel();
        let connection = Connection {
            router: router(),
            limits: limits(),
            accepted: Instant::now(),
            evicted,
            on_authenticated: Arc::new(|| {}),
        };
        let task = tokio::spawn(connection.serve(server_side, stopped));
        (stop, evict, task)
    }

    async fn get(client: &mut tokio::io::DuplexStream, path: &str) -> String {
        client
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = vec![0u8; 512];
        let n = client.read(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer[..n]).into_owned()
    }

    async fn closed_within(task: tokio::task::JoinHandle<()>, within: Duration, what: &str) {
        tokio::time::timeout(within, task)
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_sends_a_request_is_cut_off() {
        // Nothing at all after the handshake.
        let (_client, server) = tokio::io::duplex(4096);
        let (_stop, _evict, task) = serve(server);
        closed_within(
            task,
            Duration::from_secs(60),
            "a silent connection must be closed",
        )
        .await;
        // HTTP/2: the preface, then silence (the HTTP/1 header timeout does not apply).
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, _evict, task) = serve(server);
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let what = "an HTTP/2 connection without a request must be closed";
        closed_within(task, Duration::from_secs(60), what).await;
    }

    #[tokio::test(start_paused = true)]
    async fn unauthenticated_health_checks_do_not_keep_a_connection() {
        // Health checks every 2 s, each within HTTP/1's header limit: the connection is still
        // closed when its unauthenticated life (5 s) is over.
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, _evict, task) = serve(server);
        let started = Instant::now();
        while !task.is_finished() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "an unauthenticated connection that keeps asking must still be closed"
            );
            let answer = get(&mut client, "/healthz").await;
            assert!(
                answer.is_empty() || answer.starts_with("HTTP/1.1 200"),
                "{answer}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        assert!(
            started.elapsed() >= Duration::from_secs(5),
            "not before its life is over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_authenticated_client_is_kept_past_the_unauthenticated_life_until_it_is_idle() {
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, _evict, task) = serve(server);
        // Requests at 0 s and 4 s; at 8 s the connection is past its unauthenticated life
        // and not idle for 20 s: it must still be open.
        for _ in 0..2 {
            let answer = get(&mut client, "/authed").await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        assert!(
            !task.is_finished(),
            "a connection that authenticated is kept"
        );
        // Idle HTTP/1 closes at the header limit (5 s here) or the idle limit, whichever comes
        // first.
        closed_within(
            task,
            Duration::from_secs(60),
            "an idle connection must be closed",
        )
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn http2_connections_close_when_idle_and_not_while_a_watch_streams() {
        use http_body_util::BodyExt;
        let (client, server) = tokio::io::duplex(1 << 16);
        let (_stop, _evict, task) = serve(server);
        let (mut sender, connection) =
            hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(client))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = |path: &str| {
            hyper::Request::get(format!("http://x{path}"))
                .body(http_body_util::Empty::new())
                .unwrap()
        };
        let answer = sender.send_request(request("/authed")).await.unwrap();
        assert_eq!(
            answer.into_body().collect().await.unwrap().to_bytes(),
            "yes"
        );
        // A watch: its stream is a request in flight, for much longer than the idle limit.
        let watch = sender.send_request(request("/watch")).await.unwrap();
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(
            !task.is_finished(),
            "a streaming watch keeps its connection"
        );
        // Once it ends, the connection is idle and closed.
        drop(watch);
        closed_within(
            task,
            Duration::from_secs(60),
            "an idle HTTP/2 connection must be closed",
        )
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_closes() {
        let (mut client, server) = tokio::io::duplex(4096);
        let (_stop, evict, task) = serve(server);
        assert!(
            get(&mut client, "/healthz")
                .await
                .starts_with("HTTP/1.1 200")
        );
        evict.send(()).unwrap();
        closed_within(
            task,
            Duration::from_secs(1),
            "an evicted connection must close",
        )
        .await;
    }

    #[test]
    fn new_unauthenticated_connections_close_the_oldest_beyond_the_share() {
        let pending = Pending::default();
        let mut first = pending.add(1, 2);
        let mut second = pending.add(2, 2);
        pending.remove(2); // authenticated
        let mut third = pending.add(3, 2);
        assert!(first.try_recv().is_err(), "two pending: room for the third");
        assert!(matches!(
            second.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        let _fourth = pending.add(4, 2);
        assert_eq!(first.try_recv(), Ok(()), "the oldest makes way");
        assert!(third.try_recv().is_err());
        assert_eq!(Limits::unauthenticated_share(8), 2);
        assert_eq!(Limits::unauthenticated_share(1), 1);
    }

    #[test]
    fn the_connection_limit_stays_below_the_file_limit() {
        let limits = Limits::for_this_process();
        let files = open_file_limit().unwrap_or(1024);
        assert!((limits.max_connections as u64) < files.max(16));
        assert!(limits.max_connections >= 8);
        assert!(limits.unauthenticated < limits.max_connections);
    }
}
