//! Building the Kubernetes client as the Go sidecars do: `--kubeconfig`, else `$KUBECONFIG`,
//! else in-cluster, else `~/.kube/config`; `--master` overrides the server; client-side
//! QPS/burst limiting under every request.

use std::path::Path;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::ratelimit::RateLimitLayer;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read.
    #[error("failed to read kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What kube-rs found wrong with the file.
        source: kube::config::KubeconfigError,
    },
    /// No configuration found.
    #[error("no Kubernetes configuration: give --kubeconfig or run in a cluster ({0})")]
    Infer(String),
    /// `--master` is not a URL.
    #[error("invalid --master {0:?}")]
    Master(String),
    /// The client could not be built (TLS setup and such).
    #[error("failed to build the Kubernetes client: {0}")]
    Build(String),
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions<'a> {
    /// `--kubeconfig`.
    pub kubeconfig: &'a str,
    /// `--master`.
    pub master: &'a str,
    /// `--kube-api-qps` (<= 0: unlimited).
    pub qps: f32,
    /// `--kube-api-burst`.
    pub burst: u32,
    /// User-Agent, e.g. `csi-provisioner/0.1.0`.
    pub user_agent: &'a str,
    /// Requests in flight at once, further ones wait ([`SIDECAR_IN_FLIGHT`] for a sidecar);
    /// `None`: no limit.
    pub in_flight: Option<usize>,
}

/// Requests a sidecar has in flight at once. Over HTTP/1.1 each request in flight holds a
/// connection of its own, and an idle connection keeps its buffers (about 50 KB): the
/// provisioner's 100 workers held 100 connections, 5 MB of a 10,000-claim storm's heap.
/// client-go multiplexes every request over one HTTP/2 connection. A request holds its place
/// until its response headers arrive, so a watch's long response does not keep one.
pub const SIDECAR_IN_FLIGHT: usize = 32;

impl<'a> ClientOptions<'a> {
    /// A client of the server in `kubeconfig` without client-side throttling (our own tools
    /// against our own API server).
    pub fn unthrottled(kubeconfig: &'a str, user_agent: &'a str) -> Self {
        ClientOptions {
            kubeconfig,
            master: "",
            qps: 0.0,
            burst: 1,
            user_agent,
            in_flight: None,
        }
    }
}

/// Loads the configuration.
pub async fn load_config(options: &ClientOptions<'_>) -> Result<kube::Config, ClientError> {
    let env = std::env::var("KUBECONFIG").ok().filter(|v| !v.is_empty());
    let mut config = if !options.kubeconfig.is_empty() {
        from_file(options.kubeconfig).await?
    } else if let Some(path) = env
        .as_deref()
        .and_then(|v| v.split(':').find(|p| !p.is_empty()))
    {
        from_file(path).await?
    } else {
        match kube::Config::incluster() {
            Ok(config) => config,
            Err(_) => kube::Config::infer()
                .await
                .map_err(|e| ClientError::Infer(e.to_string()))?,
        }
    };
    if !options.master.is_empty() {
        let auth = &config.auth_info;
        let tls = config.root_cert.is_some()
            || config.root_cert_file.is_some()
            || config.accept_invalid_certs
            || auth.client_certificate.is_some()
            || auth.client_certificate_data.is_some();
        config.cluster_url = master_url(options.master, tls)
            .ok_or_else(|| ClientError::Master(options.master.to_string()))?;
    }
    if let Ok(value) = http::HeaderValue::from_str(options.user_agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(config)
}

/// The server `--master` names, as client-go's `DefaultServerURL` reads it: a URL, or a host
/// or `host:port` given `https://` when the configuration has TLS settings (a CA, a client
/// certificate, or insecure) and `http://` otherwise. `None`: neither (no host, a path
/// without a scheme, a scheme other than http or https).
pub fn master_url(master: &str, tls: bool) -> Option<http::Uri> {
    let as_url = master
        .parse::<http::Uri>()
        .ok()
        .filter(|uri| uri.scheme().is_some() && uri.authority().is_some());
    let uri = match as_url {
        Some(uri) => uri,
        None => {
            let scheme = if tls { "https" } else { "http" };
            let uri: http::Uri = format!("{scheme}://{master}").parse().ok()?;
            // A host with a path is not a host:port pair (client-go refuses it too).
            if !matches!(uri.path(), "" | "/") {
                return None;
            }
            uri
        }
    };
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let host_ok = uri.host().is_some_and(|h| !h.is_empty());
    (scheme_ok && host_ok).then_some(uri)
}

async fn from_file(path: &str) -> Result<kube::Config, ClientError> {
    let kc = Kubeconfig::read_from(Path::new(path)).map_err(|source| ClientError::Kubeconfig {
        path: path.to_string(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::Kubeconfig {
            path: path.to_string(),
            source,
        })
}

/// Builds a client with QPS/burst limiting.
pub async fn build_client(options: &ClientOptions<'_>) -> Result<kube::Client, ClientError> {
    let config = load_config(options).await?;
    client_from_config(config, options.qps, options.burst, options.in_flight)
}

/// Builds a rate-limited client from a configuration, with at most `in_flight` requests in
/// flight when given.
pub fn client_from_config(
    config: kube::Config,
    qps: f32,
    burst: u32,
    in_flight: Option<usize>,
) -> Result<kube::Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    // The in-flight limit sits under the QPS limiter: a request takes its place in flight only
    // once it has its token, so the limiter's order (events after everything else) decides
    // which requests go first, and none holds a place while it waits for a token.
    let rate = RateLimitLayer::new(qps, burst);
    Ok(match in_flight {
        Some(limit) => builder
            .with_layer(&tower::limit::ConcurrencyLimitLayer::new(limit.max(1)))
            .with_layer(&rate)
            .build(),
        None => builder.with_layer(&rate).build(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn master_reads_as_client_go_reads_it() {
        let rows: [(&str, bool, Option<&str>); 11] = [
            (
                "https://10.0.0.1:6443",
                false,
                Some("https://10.0.0.1:6443/"),
            ),
            (
                "http://api.example:8080",
                true,
                Some("http://api.example:8080/"),
            ),
            (
                "https://api.example/prefix",
                false,
                Some("https://api.example/prefix"),
            ),
            // A host or host:port: https with TLS settings, else http.
            ("10.0.0.1:6443", true, Some("https://10.0.0.1:6443/")),
            ("10.0.0.1:6443", false, Some("http://10.0.0.1:6443/")),
            ("api.example", true, Some("https://api.example/")),
            ("[::1]:6443", true, Some("https://[::1]:6443/")),
            // Neither a URL nor a host.
            ("api.example/prefix", true, None),
            ("ftp://api.example", true, None),
            ("://", true, None),
            ("a b", true, None),
        ];
        for (master, tls, want) in rows {
            assert_eq!(
                master_url(master, tls).map(|u| u.to_string()).as_deref(),
                want,
                "{master} tls={tls}"
            );
        }
    }

    /// What the server saw: requests inside it now, the most at once, and all so far.
    #[derive(Default)]
    struct Held {
        now: AtomicUsize,
        most: AtomicUsize,
        arrived: AtomicUsize,
        all_in: AtomicBool,
        release: tokio::sync::Notify,
    }

    /// A server that holds each request until `batch` are inside it at once (or `total` have
    /// arrived), then answers those it holds.
    async fn holding_server(held: Arc<Held>, batch: usize, total: usize) -> String {
        let app = axum::Router::new().route(
            "/hold",
            axum::routing::get(move || {
                let held = held.clone();
                async move {
                    let released = held.release.notified();
                    let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
                    held.most.fetch_max(now, Ordering::SeqCst);
                    if held.arrived.fetch_add(1, Ordering::SeqCst) + 1 >= total {
                        held.all_in.store(true, Ordering::SeqCst);
                    }
                    if now >= batch || held.all_in.load(Ordering::SeqCst) {
                        held.release.notify_waiters();
                    } else {
                        released.await;
                    }
                    held.now.fetch_sub(1, Ordering::SeqCst);
                    "{}"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}")
    }

    #[tokio::test]
    async fn in_flight_limits_the_requests_a_server_sees_at_once() {
        let held = Arc::new(Held::default());
        let url = holding_server(held.clone(), 3, 9).await;
        let config = kube::Config::new(url.parse().unwrap());
        let client = client_from_config(config, 0.0, 1, Some(3)).unwrap();
        let requests: Vec<_> = (0..9)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let request = http::Request::get("/hold").body(Vec::new()).unwrap();
                    client.request_text(request).await
                })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.unwrap().unwrap(), "{}");
        }
        // The server releases nothing before three are inside it, and the client sends
        // no fourth before one is answered.
        assert_eq!(held.most.load(Ordering::SeqCst), 3);
    }
}
