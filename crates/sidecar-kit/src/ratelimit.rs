//! Client-side QPS/burst limiting, as client-go's token bucket: `burst` requests at once, then
//! `qps` per second. A tower layer, so it sits under the kube client and counts every request
//! (watches included, once each when they start).
//!
//! Unlike client-go, Event writes yield: they take a token only when no other request is
//! waiting for one. Under a low QPS a burst of `ProvisioningSucceeded` events would otherwise
//! delay every PV write queued behind it (measured: deleting 100 volumes at QPS 5 took 58 s
//! instead of 40 s, with the events of their provisioning sent in between).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tower::buffer::Buffer;
use tower::{BoxError, Service, ServiceExt};

/// A token bucket whose tokens can be reserved ahead (the balance then goes below zero), so
/// waiting requests are served in the order they asked.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps <= 0` disables limiting.
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
    }

    /// Reserves the next token: how long to wait before using it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            wait(-self.tokens / self.qps)
        }
    }

    /// Takes a token only if one is free and nobody has reserved it; otherwise says how long
    /// to wait before asking again.
    pub fn take_if_idle(&mut self, now: Instant) -> Result<(), Duration> {
        if self.qps <= 0.0 {
            return Ok(());
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(wait((1.0 - self.tokens) / self.qps))
        }
    }
}

/// The longest a request is told to wait for its token: under a QPS so small that its wait
/// would not fit a `Duration` (`--kube-api-qps=1e-20`), it goes once an hour.
pub const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// `seconds` as a wait, at most [`LONGEST_WAIT`].
fn wait(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds).map_or(LONGEST_WAIT, |d| d.min(LONGEST_WAIT))
}

/// Whether a request waits its turn or yields to every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// In order of arrival.
    Normal,
    /// Only when no other request waits: Event writes.
    Yielding,
}

/// The priority of a request, from its method and path: writes of `events` (core or
/// `events.k8s.io`) yield.
pub fn priority(method: &http::Method, path: &str) -> Priority {
    if method == http::Method::GET {
        return Priority::Normal;
    }
    let rest = if let Some(rest) = path.strip_prefix("/api/") {
        rest.split_once('/').map(|(_version, rest)| rest)
    } else if let Some(rest) = path.strip_prefix("/apis/") {
        rest.splitn(3, '/').nth(2)
    } else {
        None
    };
    let Some(rest) = rest else {
        return Priority::Normal;
    };
    let resource = match rest.strip_prefix("namespaces/") {
        Some(namespaced) => namespaced.split('/').nth(1),
        None => rest.split('/').next(),
    };
    if resource == Some("events") {
        Priority::Yielding
    } else {
        Priority::Normal
    }
}

/// The bucket shared by every clone of a client.
#[derive(Debug, Clone)]
pub struct Limiter {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl Limiter {
    /// `qps` requests per second after an initial `burst`.
    pub fn new(qps: f32, burst: u32) -> Self {
        Limiter {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self, priority: Priority) {
        match priority {
            Priority::Normal => {
                let wait = self.bucket.lock().reserve(Instant::now());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            Priority::Yielding => loop {
                let taken = self.bucket.lock().take_if_idle(Instant::now());
                match taken {
                    Ok(()) => return,
                    Err(wait) => tokio::time::sleep(wait).await,
                }
            },
        }
    }
}

/// The layer.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Limiter,
}

impl RateLimitLayer {
    /// `qps` requests per second after an initial `burst`.
    pub fn new(qps: f32, burst: u32) -> Self {
        RateLimitLayer {
            limiter: Limiter::new(qps, burst),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

type Body = kube::client::Body;

impl<S> tower::Layer<S> for RateLimitLayer
where
    S: Service<http::Request<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = RateLimited<S, Body>;
    /// Needs a Tokio runtime: the inner service is shared through a [`Buffer`].
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner: Buffer::new(inner, 1024),
            limiter: self.limiter.clone(),
        }
    }
}

/// The service: every request first waits for a token at its priority.
pub struct RateLimited<S, B>
where
    S: Service<http::Request<B>>,
{
    inner: Buffer<http::Request<B>, S::Future>,
    limiter: Limiter,
}

impl<S, B> Clone for RateLimited<S, B>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    fn clone(&self) -> Self {
        RateLimited {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

impl<S, B> std::fmt::Debug for RateLimited<S, B>
where
    S: Service<http::Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<http::Request<B>> for RateLimited<S, B>
where
    S: Service<http::Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per request, after its token.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let priority = priority(request.method(), request.uri().path());
        let limiter = self.limiter.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            limiter.acquire(priority).await;
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tower::Layer;

    fn request(method: http::Method, path: &str) -> http::Request<Body> {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap()
    }

    /// Answers each request with its path and the instant it got through.
    struct Clock;

    impl Service<http::Request<Body>> for Clock {
        type Response = (String, Instant);
        type Error = BoxError;
        type Future = std::future::Ready<Result<(String, Instant), BoxError>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, r: http::Request<Body>) -> Self::Future {
            std::future::ready(Ok((r.uri().to_string(), Instant::now())))
        }
    }

    fn timed() -> Clock {
        Clock
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let start = Instant::now();
        let svc = RateLimitLayer::new(5.0, 10).layer(timed());
        let mut times = Vec::new();
        for _ in 0..20 {
            let (_, at) = svc
                .clone()
                .oneshot(request(http::Method::POST, "/api/v1/persistentvolumes"))
                .await
                .unwrap();
            times.push(at - start);
        }
        assert!(
            times[..10].iter().all(|t| *t < Duration::from_millis(1)),
            "the burst goes at once"
        );
        // The next ten follow at 5 per second: the 20th at about 2 s.
        let last = times[19].as_secs_f64();
        assert!((1.9..=2.1).contains(&last), "20th request at {last}s");
        let gap = (times[15] - times[14]).as_secs_f64();
        assert!((0.19..=0.21).contains(&gap), "gap {gap}s");
    }

    #[tokio::test(start_paused = true)]
    async fn events_wait_until_no_other_request_waits() {
        let svc = RateLimitLayer::new(5.0, 1).layer(timed());
        let start = Instant::now();
        let mut all = tokio::task::JoinSet::new();
        // Ten events asked first, then ten PV deletions.
        for i in 0..10 {
            let call = svc.clone().oneshot(request(
                http::Method::POST,
                &format!("/api/v1/namespaces/default/events?{i}"),
            ));
            all.spawn(call);
            tokio::task::yield_now().await;
        }
        for i in 0..10 {
            let call = svc.clone().oneshot(request(
                http::Method::DELETE,
                &format!("/api/v1/persistentvolumes/pv-{i}"),
            ));
            all.spawn(call);
        }
        let mut done = Vec::new();
        while let Some(result) = all.join_next().await {
            let (path, at) = result.unwrap().unwrap();
            done.push((at - start, path));
        }
        done.sort();
        // The burst token went to the first event; every deletion precedes every other event.
        let order: Vec<bool> = done.iter().map(|(_, p)| p.contains("events")).collect();
        assert!(order[0], "{done:?}");
        assert!(order[1..11].iter().all(|e| !e), "{done:?}");
        assert!(order[11..].iter().all(|e| *e), "{done:?}");
        // Still 5 per second in all: 20 requests, one at once, the 20th at about 3.8 s.
        let last = done[19].0.as_secs_f64();
        assert!((3.7..=4.0).contains(&last), "last at {last}s");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_means_unlimited() {
        let start = Instant::now();
        let svc = RateLimitLayer::new(0.0, 1).layer(timed());
        for _ in 0..1000 {
            svc.clone()
                .oneshot(request(http::Method::GET, "/api/v1/persistentvolumes"))
                .await
                .unwrap();
        }
        assert_eq!(Instant::now(), start);
    }

    #[test]
    fn reservations_are_served_in_order_and_idle_takers_wait_for_them() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        let third = b.reserve(t0);
        assert!((third.as_secs_f64() - 0.1).abs() < 1e-6);
        let fourth = b.reserve(t0);
        assert!((fourth.as_secs_f64() - 0.2).abs() < 1e-6);
        // Nothing is idle until both reservations are served and a token is free again.
        let wait = b.take_if_idle(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.3).abs() < 1e-6, "{wait:?}");
        assert!(b.take_if_idle(t0 + Duration::from_millis(300)).is_ok());
    }

    #[test]
    fn a_qps_too_small_for_a_duration_waits_an_hour() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1e-20, 1);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0), LONGEST_WAIT);
        assert_eq!(b.take_if_idle(t0), Err(LONGEST_WAIT));
    }

    #[test]
    fn only_event_writes_yield() {
        use http::Method;
        let table = [
            (
                Method::POST,
                "/api/v1/namespaces/default/events",
                Priority::Yielding,
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/events/pvc.1",
                Priority::Yielding,
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                Priority::Yielding,
            ),
            (Method::POST, "/api/v1/events", Priority::Yielding),
            (
                Method::GET,
                "/api/v1/namespaces/ns/events",
                Priority::Normal,
            ),
            (
                Method::POST,
                "/api/v1/namespaces/events/persistentvolumeclaims",
                Priority::Normal,
            ),
            (
                Method::DELETE,
                "/api/v1/persistentvolumes/events",
                Priority::Normal,
            ),
            (
                Method::PATCH,
                "/apis/storage.k8s.io/v1/volumeattachments/x",
                Priority::Normal,
            ),
            (Method::POST, "/healthz", Priority::Normal),
        ];
        for (method, path, want) in table {
            assert_eq!(priority(&method, path), want, "{method} {path}");
        }
    }
}
