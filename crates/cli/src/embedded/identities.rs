//! Who each component of the embedded stack is, as on a real cluster: `csi-provisioner`,
//! `csi-attacher`, `pv-controller`, the snapshot controller, the resizer and the controller manager's
//! protection and attach/detach controllers are ServiceAccounts of `kube-system` with the
//! RBAC of `deploy/kubernetes` (and `embedded/rbac.yaml` for what only the stack runs), given
//! tokens by the TokenRequest API; the scheduler is `system:kube-scheduler` and each node
//! agent `system:node:<node>` (group `system:nodes`), as kube-scheduler and kubelet are, with
//! tokens of the server's token file. Only the stack's own set-up and the user's kubeconfig
//! are the administrator. The control-plane controllers share a watch per kind
//! (`controllers::start`): a shared watch lists under the identity of the first controller
//! that asked for the kind; each of them may list and watch it, and all their writes are
//! their own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use apiserver::auth::policy::{AUTHENTICATED, User};
use apiserver::auth::tokens::StaticToken;

use crate::manifests;

/// The namespace of the stack's components.
pub const NAMESPACE: &str = "kube-system";
/// The scheduler's user (kube-scheduler's).
pub const SCHEDULER: &str = "system:kube-scheduler";
/// How long the components' ServiceAccount tokens are valid (each start issues new ones).
const TOKEN_SECONDS: i64 = 366 * 24 * 3600;

/// The stack's components that are clients of the API server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    /// The PV controller (binder, reclaimer): ServiceAccount `pv-controller`.
    PvController,
    /// The protection and attach/detach controllers: ServiceAccount
    /// `volstack-controller-manager`.
    ControllerManager,
    /// The snapshot controller: ServiceAccount `snapshot-controller`.
    SnapshotController,
    /// The resizer: ServiceAccount `csi-resizer`.
    Resizer,
    /// The scheduler: `system:kube-scheduler`.
    Scheduler,
    /// The node agent of one node: `system:node:<node>`.
    Node(String),
}

impl Component {
    /// Its ServiceAccount in [`NAMESPACE`], if it is one.
    fn service_account(&self) -> Option<&'static str> {
        match self {
            Component::PvController => Some("pv-controller"),
            Component::ControllerManager => Some("volstack-controller-manager"),
            Component::SnapshotController => Some("snapshot-controller"),
            Component::Resizer => Some("csi-resizer"),
            Component::Scheduler | Component::Node(_) => None,
        }
    }
}

/// The tokens the server is started with (scheduler and node agents) and the users they
/// name, made before the server starts (new each start).
pub fn static_tokens(nodes: &[String]) -> Vec<(Component, StaticToken)> {
    let token = || {
        (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect::<String>()
    };
    let mut tokens = vec![(
        Component::Scheduler,
        StaticToken {
            token: token(),
            user: User {
                name: SCHEDULER.to_string(),
                uid: String::new(),
                groups: vec![AUTHENTICATED.to_string()],
            },
        },
    )];
    for node in nodes {
        tokens.push((
            Component::Node(node.clone()),
            StaticToken {
                token: token(),
                user: User {
                    name: format!("system:node:{node}"),
                    uid: String::new(),
                    groups: vec!["system:nodes".to_string(), AUTHENTICATED.to_string()],
                },
            },
        ));
    }
    tokens
}

/// The RBAC objects the stack applies: every manifest, with the optional rules of the
/// features the stack turns on, in [`NAMESPACE`].
pub fn rbac_objects() -> anyhow::Result<Vec<serde_json::Value>> {
    let mut objects = Vec::new();
    for text in [
        manifests::PROVISIONER_RBAC,
        manifests::VOLUME_SETS_RBAC,
        manifests::ATTACHER_RBAC,
        manifests::PV_CONTROLLER_RBAC,
        manifests::EMBEDDED_RBAC,
    ] {
        objects.extend(manifests::parse(&manifests::with_optional_rules(text))?);
    }
    manifests::in_namespace(&mut objects, NAMESPACE);
    Ok(objects)
}

/// Where a sidecar's kubeconfig is kept (`<dir>/identities/<name>.kubeconfig`, known before
/// the stack starts).
pub fn kubeconfig_path(dir: &Path, sidecar: &str) -> PathBuf {
    dir.join("identities").join(format!("{sidecar}.kubeconfig"))
}

/// The components' tokens, once the stack's RBAC is applied.
#[derive(Clone)]
pub struct Identities {
    tokens: BTreeMap<Component, String>,
}

impl std::fmt::Debug for Identities {
    /// Without the tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identities")
            .field("components", &self.tokens.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Identities {
    /// Applies the RBAC (as the administrator, `admin`), issues the ServiceAccounts' tokens and
    /// writes the sidecars' kubeconfigs under `dir`.
    pub async fn establish(
        server: &apiserver::RunningServer,
        admin: &kube::Client,
        dir: &Path,
        static_tokens: &[(Component, StaticToken)],
    ) -> anyhow::Result<Identities> {
        manifests::apply(admin, &rbac_objects()?).await?;
        let mut tokens: BTreeMap<Component, String> = static_tokens
            .iter()
            .map(|(component, t)| (component.clone(), t.token.clone()))
            .collect();
        for component in [
            Component::PvController,
            Component::ControllerManager,
            Component::SnapshotController,
            Component::Resizer,
        ] {
            let account = component.service_account().unwrap_or_default();
            tokens.insert(component, issue(server, account)?);
        }
        let identities = dir.join("identities");
        durable_log::files::create_durable_private_dir(&identities)
            .with_context(|| format!("create {}", identities.display()))?;
        for sidecar in ["csi-provisioner", "csi-attacher"] {
            let token = issue(server, sidecar)?;
            let text = apiserver::server::kubeconfig(server.local_addr(), &token, server.ca_data());
            let path = kubeconfig_path(dir, sidecar);
            durable_log::files::write_private_atomic(&path, text.as_bytes())
                .with_context(|| format!("write {}", path.display()))?;
        }
        Ok(Identities { tokens })
    }

    /// The token of `component`.
    pub fn token(&self, component: &Component) -> anyhow::Result<&str> {
        self.tokens
            .get(component)
            .map(String::as_str)
            .with_context(|| format!("no identity for {component:?}"))
    }
}

fn issue(server: &apiserver::RunningServer, account: &str) -> anyhow::Result<String> {
    server
        .service_account_token(NAMESPACE, account, TOKEN_SECONDS)
        .map_err(|e| anyhow::anyhow!("issue a token for {NAMESPACE}/{account}: {}", e.message))
}
