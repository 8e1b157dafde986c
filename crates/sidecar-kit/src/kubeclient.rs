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
        /// Why.
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
}

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
        config.cluster_url = options
            .master
            .parse()
            .map_err(|_| ClientError::Master(options.master.to_string()))?;
    }
    if let Ok(value) = http::HeaderValue::from_str(options.user_agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(config)
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
    client_from_config(config, options.qps, options.burst)
}

/// Builds a rate-limited client from a configuration.
pub fn client_from_config(
    config: kube::Config,
    qps: f32,
    burst: u32,
) -> Result<kube::Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    Ok(builder.with_layer(&RateLimitLayer::new(qps, burst)).build())
}
