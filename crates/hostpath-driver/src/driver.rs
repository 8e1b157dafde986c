//! The driver: configuration, the durable table and the faults, shared by the three services,
//! and the server that puts them on a unix socket.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use csi_proto::v1::controller_server::ControllerServer;
use csi_proto::v1::group_controller_server::GroupControllerServer;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::node_server::NodeServer;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::Instrument;

use crate::config::{DriverConfig, PublishMode};
use crate::error::Error;
use crate::faults::{Faults, Injection};
use crate::state::{Store, StoreError, VolumeRecord};

/// Why the driver could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The volume table could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another process serves the socket.
    #[error("socket {0} is in use by another process")]
    SocketInUse(String),
    /// The socket could not be created.
    #[error("failed to listen on {path}: {source}")]
    Listen {
        /// Socket path.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("CSI server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Shared state of the three CSI services.
#[derive(Clone)]
pub struct Driver {
    pub(crate) cfg: Arc<DriverConfig>,
    pub(crate) store: Arc<Store>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) bind_mounts: bool,
    pub(crate) creating: Arc<crate::name_locks::NameLocks>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.cfg.name)
            .finish_non_exhaustive()
    }
}

/// The name of the thread that writes the driver's state log.
pub const LOG_THREAD: &str = "csi-driver-log";

impl Driver {
    /// A volume's record, or NOT_FOUND, once every change made so far is durable: a request
    /// answered from the table (an idempotent repeat, a target already gone) must not answer
    /// from a change a crash could still undo (a retried NodeUnpublish answered OK from an
    /// unlogged removal would leave the target recorded after a restart, and NodeUnstage
    /// refused for ever).
    pub(crate) async fn volume(&self, volume_id: &str) -> crate::error::Result<VolumeRecord> {
        let (record, seq) = self.store.read(|t| t.get(volume_id).cloned());
        self.store.wait_durable(seq).await?;
        record.ok_or_else(|| Error::VolumeNotFound(volume_id.to_string()))
    }

    /// Whether this node may use the volume: it lives here and (with attach on) is
    /// ControllerPublished here (an ephemeral inline volume never is: nothing attaches it).
    pub(crate) fn check_local(&self, record: &VolumeRecord) -> crate::error::Result<()> {
        let me = &self.cfg.node.id;
        if record.node.as_ref().is_some_and(|home| home != me) {
            return Err(Error::Precondition(format!(
                "volume {:?} lives on node {:?}, not on this node {me:?}",
                record.id, record.node
            )));
        }
        if self.cfg.enable_attach && !record.ephemeral && !record.published.contains_key(me) {
            return Err(Error::Precondition(format!(
                "volume {:?} is not ControllerPublished to node {me:?}",
                record.id
            )));
        }
        Ok(())
    }

    /// The directory of a mount volume, made first if the volume was created without it
    /// ([`VolumeRecord::lazy_content`]); the caller then logs the record with
    /// `lazy_content` cleared. Made durable before any record says it exists.
    pub(crate) async fn content_dir(&self, record: &VolumeRecord) -> crate::error::Result<PathBuf> {
        let dir = self.store.volume_dir(&record.id);
        if record.lazy_content {
            let (made, parent) = (dir.clone(), self.store.volumes_dir().to_path_buf());
            on_disk("create volume directory", &dir, move || {
                crate::content::make_empty_dir(&made, &parent)
            })
            .await?;
        }
        Ok(dir)
    }

    /// Opens the state directory and prepares the services.
    pub async fn open(cfg: DriverConfig) -> Result<Driver, ServeError> {
        let dir = cfg.state_dir.clone();
        let options = durable_log::Options {
            compact_min_bytes: (cfg.compact_after as u64).saturating_mul(256),
            thread_name: LOG_THREAD,
        };
        let store = tokio::task::spawn_blocking(move || Store::open(&dir, options))
            .await
            .map_err(|e| StoreError::Failed(format!("opening the store panicked: {e}").into()))??;
        let bind_mounts = match cfg.publish_mode {
            PublishMode::Bind => true,
            PublishMode::Symlink => false,
            PublishMode::Auto => crate::node::bind_mounts_work(&cfg.state_dir).await,
        };
        let faults = Faults::new(cfg.faults.clone(), cfg.fault_file.clone(), cfg.hang_poll);
        tracing::info!(
            name = %cfg.name,
            node = %cfg.node.id,
            volumes = store.read(|t| t.len()).0,
            publish = if bind_mounts { "bind" } else { "symlink" },
            "driver state loaded"
        );
        Ok(Driver {
            cfg: Arc::new(cfg),
            store: Arc::new(store),
            faults: Arc::new(faults),
            bind_mounts,
            creating: Arc::default(),
        })
    }

    /// Runs one RPC: applies the injected faults, the work, and logs a refusal.
    pub(crate) async fn call<T, F>(
        &self,
        method: &'static str,
        work: F,
    ) -> Result<tonic::Response<T>, tonic::Status>
    where
        F: Future<Output = Result<T, Error>>,
    {
        let span = tracing::debug_span!("csi", method);
        async move {
            let injection = self.faults.inject(method).await?;
            let result = work.await;
            match (&result, injection) {
                (Ok(_), Injection::FailAfter(status)) => return Err(status),
                (Err(error), _) => {
                    tracing::info!(code = sidecar_kit::csi::go_code_name(error.code()), %error, "request refused")
                }
                (Ok(_), Injection::Proceed) => {}
            }
            result.map(tonic::Response::new).map_err(tonic::Status::from)
        }
        .instrument(span)
        .await
    }

    /// Runs `work` as a task of its own that finishes even if the caller goes away. A gRPC
    /// deadline drops the handler's future; a create dropped between reserving a volume and
    /// logging (or cancelling) it would leave a reservation that a retry answers as a volume
    /// that is neither listed nor durable.
    pub(crate) async fn detached<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        tokio::spawn(work.in_current_span())
            .await
            .map_err(|e| Error::Task(e.to_string()))?
    }

    /// Serves Identity, Controller and Node on the configured socket until `shutdown`.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let listener = bind_socket(&self.cfg.socket_path).await?;
        self.serve_on(listener, shutdown).await
    }

    /// The same driver as seen from another of its nodes (`--extra-node`): the Node service
    /// of the result answers as that node, on the shared volume table. None for an unknown
    /// node. The embedded multi-node stack serves one per node on a socket of its own, as a
    /// cluster runs one driver pod per node (a per-node provisioner talks to it too).
    pub fn for_node(&self, id: &str) -> Option<Driver> {
        let node = self.cfg.nodes.iter().find(|n| n.id == id)?.clone();
        let mut cfg = (*self.cfg).clone();
        cfg.node = node;
        Some(Driver {
            cfg: Arc::new(cfg),
            ..self.clone()
        })
    }

    /// Serves on an already bound listener (tests bind first to know when the driver is up).
    pub async fn serve_on(
        self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            .unwrap_or_else(|| self.cfg.socket_path.clone());
        tracing::info!(endpoint = %path, node = %self.cfg.node.id, "serving CSI");
        let result = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_service(ControllerServer::new(self.clone()))
            .add_service(GroupControllerServer::new(self.clone()))
            .add_service(NodeServer::new(self))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
            .await;
        let _ = std::fs::remove_file(&path);
        result.map_err(ServeError::from)
    }
}

/// Binds the socket, replacing a stale socket file but never one a live process serves.
pub async fn bind_socket(path: &str) -> Result<UnixListener, ServeError> {
    if Path::new(path).exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ServeError::SocketInUse(path.to_string()));
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(parent) = Path::new(path).parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    UnixListener::bind(path).map_err(|source| ServeError::Listen {
        path: path.to_string(),
        source,
    })
}

/// Whether bind mounts work on this machine (root with CAP_SYS_ADMIN); `--publish-mode auto`
/// uses them when they do.
pub async fn bind_mounts_permitted(scratch: &Path) -> bool {
    crate::node::bind_mounts_work(scratch).await
}

/// Runs blocking file work on the blocking pool. A failure, or a task that died, is
/// [`Error::Filesystem`] naming `action` and `path`.
pub(crate) async fn on_disk<T: Send + 'static>(
    action: &'static str,
    path: &Path,
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(fs_error(action, path))
}

/// [`Error::Filesystem`] naming `action` and `path`, from the failure's text.
pub(crate) fn fs_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(String) -> Error + 'a {
    move |detail| Error::Filesystem {
        action,
        path: path.display().to_string(),
        detail,
    }
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
