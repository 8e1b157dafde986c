//! The application state every handler shares, and how it is built: the built-in namespaces
//! and the default RBAC policy written before the first request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::write::refresh_crds;
use super::{definitions, namespaces};
use crate::objects::prepare_create;
use crate::registry::Registry;
use crate::store::{Store, StoreError, Write2};

/// Shared state of the handlers.
pub struct App {
    /// Every object, durable.
    pub store: Store,
    /// The kinds served, built-in and custom.
    pub registry: Registry,
    /// Bearer token.
    pub token: String,
    /// Who may ask for what.
    pub auth: crate::auth::Auth,
    /// Requests by (verb, resource, code, client).
    pub requests: Mutex<BTreeMap<(String, String, u16, String), u64>>,
    /// Address clients use (discovery).
    pub address: Mutex<Option<SocketAddr>>,
    /// Injected faults (empty: none).
    pub faults: Mutex<Vec<crate::faults::FaultRule>>,
    /// The draws that decide whether a fault with a probability fires (seedable, so a chaos
    /// run can be replayed).
    pub fault_draws: Mutex<rand::rngs::StdRng>,
    /// How many times the watches of each resource (or `*`, all) were closed.
    pub close_watches: tokio::sync::watch::Sender<crate::watch::Closes>,
    /// Whether `StorageObjectInUseProtection` admission runs: on where the pvc- and
    /// pv-protection controllers run to take the finalizers off again.
    pub storage_protection: std::sync::atomic::AtomicBool,
    /// Namespaces whose contents a task is deleting now (one task each, however often the
    /// namespace is deleted again meanwhile).
    pub finishing: Mutex<std::collections::HashSet<String>>,
    /// How many such tasks were started.
    pub finishing_started: std::sync::atomic::AtomicU64,
    /// CustomResourceDefinitions whose custom resources a task is deleting now.
    pub finishing_definitions: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

pub(crate) type Shared = Arc<App>;

/// Builds the application state with the built-in namespaces and the default RBAC policy,
/// and returns once they are durable and visible (a client that connects first must find
/// `default`, and be allowed what the defaults allow).
pub async fn new_app(
    store: Store,
    token: String,
    authenticator: crate::auth::tokens::Authenticator,
) -> Result<Shared, StoreError> {
    let auth = crate::auth::Auth::new(authenticator, &store);
    let app = Arc::new(App {
        store,
        registry: Registry::default(),
        token,
        auth,
        requests: Mutex::new(BTreeMap::new()),
        address: Mutex::new(None),
        faults: Mutex::new(Vec::new()),
        fault_draws: Mutex::new(rand::SeedableRng::from_os_rng()),
        close_watches: tokio::sync::watch::channel(crate::watch::Closes::default()).0,
        finishing: Mutex::default(),
        finishing_started: Default::default(),
        finishing_definitions: Mutex::default(),
        storage_protection: std::sync::atomic::AtomicBool::new(false),
    });
    refresh_crds(&app);
    let mut last = 0;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if app.store.get("/namespaces", "", ns).is_some() {
            continue;
        }
        let Some(rt) = app.registry.find("", "v1", "namespaces") else {
            continue;
        };
        let mut obj = json!({"metadata": {"name": ns}});
        if prepare_create(&rt, "", &mut obj).is_ok() {
            let (_, rv) = app.store.write("/namespaces", "", ns, |_, _| {
                Ok::<_, StoreError>(Write2::Put(obj))
            })?;
            last = last.max(rv);
        }
    }
    for (key, default) in crate::auth::bootstrap::defaults() {
        last = last.max(write_default(&app, key, &default)?);
    }
    app.store.wait_durable(last).await?;
    // Deletions a restart interrupted go on: namespaces being emptied, definitions whose
    // custom resources were being deleted.
    namespaces::resume(&app);
    definitions::resume(&app);
    Ok(app)
}

/// Makes or restores one default RBAC object ([`crate::auth::bootstrap::reconcile`]); the
/// resourceVersion written (0: none).
fn write_default(app: &App, key: &str, default: &Value) -> Result<u64, StoreError> {
    let name = default["metadata"]["name"].as_str().unwrap_or_default();
    let plural = key.rsplit('/').next().unwrap_or_default();
    let Some(rt) = app.registry.find("rbac.authorization.k8s.io", "v1", plural) else {
        return Ok(0);
    };
    let (_, rv) = app.store.write(key, "", name, |current, _| {
        let Some(mut next) = crate::auth::bootstrap::reconcile(default, current) else {
            return Ok::<_, StoreError>(Write2::Keep);
        };
        if current.is_none() && prepare_create(&rt, "", &mut next).is_err() {
            return Ok(Write2::Keep);
        }
        Ok(Write2::Put(next))
    })?;
    Ok(rv)
}
