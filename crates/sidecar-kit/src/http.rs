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

/// Binds and serves in the background; returns the bound address.
pub async fn serve(
    address: &str,
    metrics_path: &str,
    endpoint: Endpoint,
) -> Result<SocketAddr, HttpError> {
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
    let app = Router::new()
        .route(metrics_path, get(metrics))
        .route("/healthz", get(healthz))
        .route("/healthz/leader-election", get(leader_health))
        .with_state(Arc::new(endpoint));
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
