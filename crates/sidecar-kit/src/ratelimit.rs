//! Client-side QPS/burst limiting, as client-go's token bucket: `burst` requests at once, then
//! `qps` per second. A tower layer, so it sits under the kube client and counts every request
//! (watches included, once each when they start).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A token bucket.
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

    /// Takes a token, or says how long to wait for one.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.qps <= 0.0 {
            return Ok(());
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// The layer.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    /// `qps` requests per second after an initial `burst`.
    pub fn new(qps: f32, burst: u32) -> Self {
        RateLimitLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

/// The service: waits in `poll_ready` until a token is available.
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("has_token", &self.has_token)
            .finish_non_exhaustive()
    }
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let taken = self.bucket.lock().try_take(Instant::now());
            match taken {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let start = Instant::now();
        let mut svc = RateLimitLayer::new(5.0, 10).layer(tower::service_fn(|_: ()| async {
            Ok::<_, ()>(Instant::now())
        }));
        let mut times = Vec::new();
        for _ in 0..20 {
            times.push(svc.ready().await.unwrap().call(()).await.unwrap() - start);
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
    async fn zero_qps_means_unlimited() {
        let start = Instant::now();
        let mut svc =
            RateLimitLayer::new(0.0, 1).layer(tower::service_fn(|_: ()| async { Ok::<_, ()>(()) }));
        for _ in 0..1000 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        assert_eq!(Instant::now(), start);
    }

    #[test]
    fn tokens_refill_with_time() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2);
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0).is_ok());
        let wait = b.try_take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6);
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_ok());
    }
}
