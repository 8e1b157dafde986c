//! Requests from clients in the server's own process (the embedded stack's controllers): they
//! go to the router directly, without TCP, TLS or HTTP framing. Everything else is as for a
//! client on the network: the bearer token is checked, the request is counted under its
//! User-Agent, and the handler runs on the server's runtime, so its work stays the server's.
//! A watch's events come through the same channel a network watch's connection reads.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, Request, Response, header};
use bytes::Bytes;
use tokio::sync::watch;
use tower::ServiceExt;

/// Why an in-process request got no response.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The server has stopped: as for a network client whose connection is refused.
    #[error("the API server has stopped")]
    Stopped,
    /// The handler's task ended without an answer: its runtime shut down under it, or it
    /// panicked.
    #[error("the API server dropped the request: {0}")]
    Dropped(#[source] tokio::task::JoinError),
    /// The token or the User-Agent is not a valid header value.
    #[error("invalid {header} for an in-process client")]
    Header {
        /// Which header.
        header: &'static str,
    },
}

/// A `tower::Service` that serves requests in process; clone it for each client.
#[derive(Clone)]
pub struct LocalService {
    router: axum::Router,
    runtime: tokio::runtime::Handle,
    stopped: watch::Receiver<bool>,
    authorization: HeaderValue,
    user_agent: HeaderValue,
}

impl std::fmt::Debug for LocalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalService")
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

impl LocalService {
    /// A client of `router` (served on `runtime` until `stopped` turns true) that presents
    /// `token` and calls itself `user_agent`.
    pub(crate) fn new(
        router: axum::Router,
        runtime: tokio::runtime::Handle,
        stopped: watch::Receiver<bool>,
        token: &str,
        user_agent: &str,
    ) -> Result<LocalService, LocalError> {
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| LocalError::Header {
                header: "Authorization",
            })?;
        authorization.set_sensitive(true);
        let user_agent = HeaderValue::from_str(user_agent).map_err(|_| LocalError::Header {
            header: "User-Agent",
        })?;
        Ok(LocalService {
            router,
            runtime,
            stopped,
            authorization,
            user_agent,
        })
    }
}

impl<B> tower::Service<Request<B>> for LocalService
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = LocalError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, LocalError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LocalError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if *self.stopped.borrow() {
            return Box::pin(async { Err(LocalError::Stopped) });
        }
        let (mut parts, body) = request.into_parts();
        // The client's own credentials and name, as its kubeconfig would give them.
        parts
            .headers
            .insert(header::AUTHORIZATION, self.authorization.clone());
        parts
            .headers
            .entry(header::USER_AGENT)
            .or_insert_with(|| self.user_agent.clone());
        let request = Request::from_parts(parts, Body::new(body));
        let router = self.router.clone();
        let answer = self.runtime.spawn(router.oneshot(request));
        Box::pin(async move {
            match answer.await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(never)) => match never {},
                Err(error) => Err(LocalError::Dropped(error)),
            }
        })
    }
}
