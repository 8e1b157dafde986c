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
mod tests;
