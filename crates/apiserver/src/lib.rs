//! A Kubernetes-API-compatible server: the embedded default of the single-machine stack and
//! the test bed of every controller. JSON over HTTP on loopback, bearer-token auth, one
//! cluster-wide resourceVersion, watches with resume and 410, finalizers, status
//! subresources, merge/JSON/strategic patches, discovery and tables for kubectl, and a
//! durable write-ahead log.

#![forbid(unsafe_code)]

pub mod access;
mod admission;
pub mod apply;
pub mod auth;
pub mod change;
pub mod claim_rules;
pub mod config_rules;
pub mod discovery;
pub mod event_versions;
pub mod faults;
pub mod go_format;
pub mod list_versions;
pub mod listener;
pub mod local;
pub mod media;
pub mod meta_rules;
pub mod namespace_rules;
pub mod node_defaults;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod pod_defaults;
pub mod protobuf;
pub mod quantities;
mod rbac_rules;
mod record;
pub mod registry;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod status;
pub mod storage_defaults;
pub mod storage_rules;
pub mod store;
mod tables;
pub mod time;
pub mod tls;
pub mod unknown_fields;
mod watch;

/// The name of the thread that writes the server's log (`--data-dir`).
pub const LOG_THREAD: &str = "apiserver-log";

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to bind (loopback by default).
    pub bind: SocketAddr,
    /// Durable state directory; None keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// Where to write a kubeconfig for clients (mode 0600).
    pub kubeconfig_path: Option<PathBuf>,
    /// The bearer token; None makes a random one (kept in `data_dir` across restarts).
    pub token: Option<String>,
    /// Tokens of other users (`--token-auth-file`; the embedded stack's components).
    pub static_tokens: Vec<auth::tokens::StaticToken>,
    /// Changes kept for watch resumption.
    pub history: usize,
    /// Bytes of changed objects kept for watch resumption.
    pub history_bytes: usize,
    /// When the log is compacted into a snapshot.
    pub log: durable_log::Options,
    /// Connection limits and deadlines.
    pub listener: listener::Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            kubeconfig_path: None,
            token: None,
            static_tokens: Vec::new(),
            history: 100_000,
            history_bytes: 128 << 20,
            log: durable_log::Options {
                thread_name: LOG_THREAD,
                ..durable_log::Options::default()
            },
            listener: listener::Limits::for_this_process(),
        }
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// TLS setup failed.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Binding or writing files failed.
    #[error("failed to {action}: {source}")]
    Io {
        /// What was being done (as the message says it).
        action: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// A running server.
pub struct RunningServer {
    addr: SocketAddr,
    token: String,
    kubeconfig: Option<PathBuf>,
    app: Arc<server::App>,
    ca_data: String,
    task: tokio::task::JoinHandle<()>,
    /// Where in-process clients are served ([`RunningServer::local_service`]).
    runtime: tokio::runtime::Handle,
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for RunningServer {
    /// Without the token: a server printed for debugging must not hand out its credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("addr", &self.addr)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl RunningServer {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }
    /// `https://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
    /// Base64 PEM of the CA clients must trust.
    pub fn ca_data(&self) -> &str {
        &self.ca_data
    }
    /// The kubeconfig written, if any.
    pub fn kubeconfig_path(&self) -> Option<&PathBuf> {
        self.kubeconfig.as_ref()
    }
    /// The kubeconfig text.
    pub fn kubeconfig(&self) -> String {
        server::kubeconfig(self.addr, &self.token, &self.ca_data)
    }
    /// Namespaces whose contents a task is deleting now, and how many such tasks were started.
    pub fn finishing_namespaces(&self) -> (Vec<String>, u64) {
        let started = self
            .app
            .finishing_started
            .load(std::sync::atomic::Ordering::Relaxed);
        (self.app.finishing.lock().iter().cloned().collect(), started)
    }
    /// Requests served so far by (verb, resource, code, client).
    pub fn request_counts(&self) -> std::collections::BTreeMap<(String, String, u16, String), u64> {
        self.app.requests.lock().clone()
    }
    /// Turns kube-apiserver's `StorageObjectInUseProtection` admission on or off (off by
    /// default): claims and volumes created get `kubernetes.io/pvc-protection` and
    /// `kubernetes.io/pv-protection`. Only with the pvc- and pv-protection controllers running,
    /// which take them off again (kube-controller-manager runs them beside kube-apiserver).
    pub fn set_storage_protection(&self, on: bool) {
        self.app
            .storage_protection
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
    /// Replaces the fault rules (an empty list switches faults off).
    pub fn set_faults(&self, rules: Vec<faults::FaultRule>) {
        *self.app.faults.lock() = rules;
    }
    /// Seeds the draws that decide whether a fault with a probability fires: the same seed
    /// and the same requests in the same order fire the same faults.
    pub fn set_fault_seed(&self, seed: u64) {
        *self.app.fault_draws.lock() = rand::SeedableRng::seed_from_u64(seed);
    }
    /// Closes every open watch (of one resource, or all); clients re-list or resume.
    pub fn close_watches(&self, resource: Option<&str>) {
        self.app.close_open_watches(resource.unwrap_or("*"));
    }
    /// A client transport for code in this process: requests go to the server's handler on
    /// its runtime without TCP or TLS, with this server's token and `user_agent` (see
    /// [`local`]). It refuses requests once the server has stopped.
    pub fn local_service(
        &self,
        user_agent: &str,
    ) -> Result<local::LocalService, local::LocalError> {
        self.local_service_with(user_agent, &self.token)
    }

    /// [`RunningServer::local_service`] presenting `token` (another user's).
    pub fn local_service_with(
        &self,
        user_agent: &str,
        token: &str,
    ) -> Result<local::LocalService, local::LocalError> {
        local::LocalService::new(
            router(self.app.clone()),
            self.runtime.clone(),
            self.stopped.clone(),
            token,
            user_agent,
        )
    }

    /// A token of the ServiceAccount `namespace/name` (which must exist) valid for
    /// `seconds`, as the TokenRequest API issues it.
    pub fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        seconds: i64,
    ) -> Result<String, status::ApiError> {
        let answer = server::token_request_for(
            &self.app,
            namespace,
            name,
            serde_json::json!({"spec": {"expirationSeconds": seconds}}),
        )?;
        Ok(answer["status"]["token"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
    /// Waits for the server to stop.
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

fn random_token() -> String {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// A random secret kept in `<data_dir>/<file>` (0600, made on first use), or a new one each
/// start without a data directory.
fn secret(data_dir: Option<&std::path::Path>, file: &str) -> Result<String, Error> {
    let Some(dir) = data_dir else {
        return Ok(random_token());
    };
    let path = dir.join(file);
    if let Ok(text) = std::fs::read_to_string(&path)
        && !text.trim().is_empty()
    {
        return Ok(text.trim().to_string());
    }
    let made = random_token();
    durable_log::files::create_durable_private_dir(dir).map_err(|source| Error::Io {
        action: format!("create {}", dir.display()),
        source,
    })?;
    durable_log::files::write_private_atomic(&path, made.as_bytes()).map_err(|source| {
        Error::Io {
            action: format!("write {}", path.display()),
            source,
        }
    })?;
    Ok(made)
}

/// Every request, from the network or in process, goes to [`server::handle`].
fn router(app: Arc<server::App>) -> axum::Router {
    axum::Router::new().fallback(server::handle).with_state(app)
}

/// Starts the server; it stops when `shutdown` resolves.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, Error> {
    let token = match &config.token {
        Some(t) => t.clone(),
        None => secret(config.data_dir.as_deref(), "token")?,
    };
    // ServiceAccount tokens stay valid across restarts: their key is kept with the data.
    let signing_key = secret(config.data_dir.as_deref(), "serviceaccount-signing.key")?;
    let authenticator =
        auth::tokens::Authenticator::new(&token, &config.static_tokens, signing_key.as_bytes());
    let data_dir = config.data_dir.clone();
    let history = store::HistoryLimits {
        count: config.history,
        bytes: config.history_bytes,
    };
    let log_options = config.log;
    let store = tokio::task::spawn_blocking(move || {
        store::Store::open(data_dir.as_deref(), history, log_options)
    })
    .await
    .map_err(|e| Error::Io {
        action: "open the store".into(),
        source: std::io::Error::other(e.to_string()),
    })??;
    let app = server::new_app(store, token.clone(), authenticator).await?;
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|source| Error::Io {
            action: format!("listen on {}", config.bind),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Io {
        action: "read the bound address".into(),
        source,
    })?;
    *app.address.lock() = Some(addr);
    let identity = tls::Identity::load_or_create(config.data_dir.as_deref())?;
    let acceptor = identity.acceptor()?;
    let ca_data = identity.ca_data();
    if let Some(path) = &config.kubeconfig_path {
        server::write_kubeconfig(path, addr, &token, &ca_data).map_err(|source| Error::Io {
            action: format!("write {}", path.display()),
            source,
        })?;
    }
    // Stopping is seen by the accept loop and by in-process clients alike: the network's
    // connections close, and so do the in-process clients' watches.
    let (stop_tx, stopped) = tokio::sync::watch::channel(false);
    let stopping = app.clone();
    let task = tokio::spawn(listener::accept_loop(
        listener,
        acceptor,
        router(app.clone()),
        config.listener,
        async move {
            shutdown.await;
            let _ = stop_tx.send(true);
            stopping.close_open_watches("*");
        },
    ));
    tracing::info!(address = %addr, "API server listening");
    Ok(RunningServer {
        addr,
        token,
        kubeconfig: config.kubeconfig_path,
        app,
        ca_data,
        task,
        runtime: tokio::runtime::Handle::current(),
        stopped,
    })
}
