//! The sidecar HTTP endpoint (`--http-endpoint`): metrics, `/healthz` and
//! `/healthz/leader-election`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::leader::LeaderStatus;
use crate::metrics::Metrics;

/// What the endpoint reports.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The metrics.
    pub metrics: Metrics,
    /// Leadership and the lease duration, when leader election is on.
    pub leader: Option<(LeaderStatus, std::time::Duration)>,
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Not `host:port` or `:port`.
    #[error("invalid address {0:?}: expected host:port or :port")]
    Address(String),
    /// Bind failed.
    #[error("failed to listen on {address}: {source}")]
    Bind {
        /// Address.
        address: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The metrics path cannot be routed ([`metrics_path_error`]).
    #[error("invalid metrics path {path:?}: {reason}")]
    MetricsPath {
        /// The path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Go-style listen address: `:8080` means every interface.
pub fn parse_address(text: &str) -> Result<SocketAddr, HttpError> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    if let Ok(addr) = full.parse() {
        return Ok(addr);
    }
    let (host, port) = full
        .rsplit_once(':')
        .ok_or_else(|| HttpError::Address(text.to_string()))?;
    let port: u16 = port
        .parse()
        .map_err(|_| HttpError::Address(text.to_string()))?;
    let ip = if host == "localhost" {
        [127, 0, 0, 1].into()
    } else {
        return Err(HttpError::Address(text.to_string()));
    };
    Ok(SocketAddr::new(ip, port))
}

async fn metrics(State(endpoint): State<Arc<Endpoint>>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        endpoint.metrics.render(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn leader_health(State(endpoint): State<Arc<Endpoint>>) -> (StatusCode, &'static str) {
    match &endpoint.leader {
        Some((status, lease)) if !status.healthy(*lease + std::time::Duration::from_secs(20)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "leader lease expired")
        }
        _ => (StatusCode::OK, "ok"),
    }
}

/// How long [`get_local`] waits for the whole exchange: a sidecar that accepts and never
/// answers is an error, not a hung benchmark or test.
pub const LOCAL_GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The body of an HTTP/1.0 GET of `path` on `127.0.0.1:port` (a sidecar's `/metrics` or
/// `/healthz`, which need no token): a plain TCP client for benchmarks and tests. An answer
/// other than 200, or none within [`LOCAL_GET_TIMEOUT`], is an error naming it.
pub async fn get_local(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    let exchange = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await?;
        let mut out = String::new();
        stream.read_to_string(&mut out).await?;
        Ok::<_, Error>(out)
    };
    let out = tokio::time::timeout(LOCAL_GET_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::TimedOut,
                format!("GET {path} on port {port}: no answer within {LOCAL_GET_TIMEOUT:?}"),
            )
        })??;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out.as_str(), ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("GET {path} on port {port}: answered {status:?}"),
        ));
    }
    Ok(body.to_string())
}

/// Why `path` cannot serve the metrics, if it cannot: it must start with `/`, must not be one of
/// the health endpoints' paths, and must be a plain path to the router (no `{`/`}`, no segment
/// starting with `:` or `*`), which would otherwise refuse it with a panic at start.
pub fn metrics_path_error(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must start with /");
    }
    if HEALTH_PATHS.contains(&path) {
        return Some("must not be /healthz or /healthz/leader-election, which serve health");
    }
    if path.contains(['{', '}']) || path.split('/').any(|s| s.starts_with([':', '*'])) {
        return Some("must be a plain path: no { or }, no segment starting with : or *");
    }
    None
}

/// The health endpoints' paths.
const HEALTH_PATHS: [&str; 2] = ["/healthz", "/healthz/leader-election"];

/// The endpoint's routes: the metrics at `metrics_path`, and health.
fn router(metrics_path: &str, endpoint: Endpoint) -> Result<Router, HttpError> {
    if let Some(reason) = metrics_path_error(metrics_path) {
        return Err(HttpError::MetricsPath {
            path: metrics_path.to_string(),
            reason,
        });
    }
    Ok(Router::new()
        .route(metrics_path, get(metrics))
        .route(HEALTH_PATHS[0], get(healthz))
        .route(HEALTH_PATHS[1], get(leader_health))
        .with_state(Arc::new(endpoint)))
}

/// Binds and serves in the background; returns the bound address.
pub async fn serve(
    address: &str,
    metrics_path: &str,
    endpoint: Endpoint,
) -> Result<SocketAddr, HttpError> {
    let app = router(metrics_path, endpoint)?;
    let addr = parse_address(address)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            address: address.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| HttpError::Bind {
        address: address.to_string(),
        source,
    })?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "HTTP endpoint stopped");
        }
    });
    tracing::info!(address = %bound, "serving metrics and health");
    Ok(bound)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn go_addresses_parse() {
        assert_eq!(
            parse_address(":8080").unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(
            parse_address("127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            parse_address("localhost:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert!(parse_address("nonsense").is_err());
    }

    #[tokio::test]
    async fn a_local_get_reads_the_body_and_a_closed_port_is_an_error() {
        let endpoint = Endpoint {
            metrics: Metrics::new().unwrap(),
            leader: None,
        };
        let bound = serve("127.0.0.1:0", "/metrics", endpoint).await.unwrap();
        let body = get_local(bound.port(), "/healthz").await.unwrap();
        assert_eq!(body, "ok");
        // A port held, bound but not listening: a connect to it is refused, and no other test
        // can take it meanwhile.
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = held.local_addr().unwrap().port();
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            get_local(port, "/metrics"),
        )
        .await;
        assert!(matches!(refused, Ok(Err(_))), "{refused:?}");
        drop(held);
    }

    #[test]
    fn a_metrics_path_is_refused_at_start_unless_the_router_takes_it() {
        let endpoint = || Endpoint {
            metrics: Metrics::new().unwrap(),
            leader: None,
        };
        for path in [
            "/metrics",
            "/",
            "/a/b",
            "/healthz/x",
            "/x:y",
            "/a*b",
            "//m",
            "/m/",
        ] {
            assert_eq!(metrics_path_error(path), None, "{path}");
            let built = std::panic::catch_unwind(|| router(path, endpoint()).map(drop));
            assert!(matches!(built, Ok(Ok(()))), "{path}");
        }
        for (path, words) in [
            ("metrics", "must start with /"),
            ("", "must start with /"),
            ("/healthz", "health"),
            ("/healthz/leader-election", "health"),
            ("/{name}", "plain path"),
            ("/a}", "plain path"),
            ("/:id", "plain path"),
            ("/x/*rest", "plain path"),
        ] {
            let reason = metrics_path_error(path).unwrap_or_default();
            assert!(reason.contains(words), "{path}: {reason}");
            assert!(matches!(
                router(path, endpoint()),
                Err(HttpError::MetricsPath { .. })
            ));
        }
    }

    #[tokio::test]
    async fn a_local_get_of_a_path_not_served_is_an_error_naming_the_status() {
        let endpoint = Endpoint {
            metrics: Metrics::new().unwrap(),
            leader: None,
        };
        let bound = serve("127.0.0.1:0", "/metrics", endpoint).await.unwrap();
        let error = get_local(bound.port(), "/nothing").await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("404"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_local_get_that_gets_no_answer_times_out() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(stream);
        });
        let error = get_local(port, "/metrics").await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
        hold.abort();
    }
}
