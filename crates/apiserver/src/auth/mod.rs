//! Who may ask for what, as kube-apiserver decides it: bearer tokens name a user
//! ([`tokens`]), `Impersonate-*` headers switch to another when allowed ([`impersonation`]),
//! and RBAC decides every request ([`policy`], [`rules`]) from the Roles, ClusterRoles and
//! bindings stored here (the defaults kube-apiserver makes are made at start, [`bootstrap`]).
//! Members of `system:masters` may do everything. Writes of RBAC objects cannot grant more
//! than their writer holds ([`escalation`]). The reviews (`kubectl auth whoami`, `can-i`,
//! `can-i --list`) answer from the same decisions ([`reviews`]).

pub mod attributes;
pub mod bootstrap;
pub mod escalation;
pub mod impersonation;
pub mod policy;
pub mod reviews;
pub mod rules;
pub mod tokens;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::change::Change;
use crate::status::ApiError;
use crate::store::Store;
use attributes::Attributes;
use policy::{Policy, User};
use tokens::{Authenticator, Identity};

/// The storage keys of the RBAC objects (a change to any recompiles the policy).
pub const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/clusterroles";
/// The resource key of Roles in the store.
pub const ROLES: &str = "rbac.authorization.k8s.io/roles";
/// The resource key of ClusterRoleBindings in the store.
pub const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
/// The resource key of RoleBindings in the store.
pub const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";
/// ServiceAccounts (their tokens are checked against them).
pub const SERVICE_ACCOUNTS: &str = "/serviceaccounts";

tokio::task_local! {
    /// The user a request is served for, set around its handling: the writes of RBAC objects
    /// check it ([`escalation`]). Writes the server makes itself run without it.
    pub static REQUESTER: User;
}

/// Authentication and authorization state.
#[derive(Debug)]
pub struct Auth {
    /// Who a bearer token is (static tokens and ServiceAccount tokens).
    pub authenticator: Authenticator,
    /// Bumped by the store's observer on every change of an RBAC object.
    generation: Arc<AtomicU64>,
    /// The policy and the generation it was compiled at.
    policy: RwLock<(u64, Arc<Policy>)>,
    /// ServiceAccount tokens already verified (their signature is checked once, not on every
    /// request; expiry on every request, the account again whenever any ServiceAccount
    /// changed since it was last found).
    verified: RwLock<std::collections::HashMap<String, Verified>>,
    /// Bumped by the store's observer on every change of a ServiceAccount: an account found
    /// with its token's uid at this generation is still there, unchanged, so a request does not
    /// read the store (and take its lock) to check it again. Any account's change makes every
    /// remembered user be looked for again, once.
    accounts: Arc<AtomicU64>,
}

/// A verified ServiceAccount token.
#[derive(Debug)]
struct Verified {
    claims: tokens::AccountClaims,
    /// Its user, when its account was last looked for and found with the token's uid, and the
    /// generation of the accounts ([`Auth::accounts`]) read before that lookup; `None` when it
    /// was not found (looked for again on the next request).
    user: Option<(u64, User)>,
}

/// Verified tokens remembered before the memory is cleared.
const VERIFIED_REMEMBERED: usize = 4096;

impl Auth {
    /// Authorization over the objects of `store` (it tells this of their changes).
    pub fn new(authenticator: Authenticator, store: &Store) -> Auth {
        let generation = Arc::new(AtomicU64::new(1));
        let accounts = Arc::new(AtomicU64::new(1));
        let (bump, bump_accounts) = (generation.clone(), accounts.clone());
        store.observe(Box::new(move |change: &Change| {
            match change.resource.as_str() {
                CLUSTER_ROLES | ROLES | CLUSTER_ROLE_BINDINGS | ROLE_BINDINGS => {
                    bump.fetch_add(1, Ordering::Release);
                }
                SERVICE_ACCOUNTS => {
                    bump_accounts.fetch_add(1, Ordering::Release);
                }
                _ => {}
            }
        }));
        Auth {
            authenticator,
            generation,
            // Generation 0 is never current: the first use compiles.
            policy: RwLock::new((0, Arc::new(Policy::default()))),
            verified: RwLock::new(std::collections::HashMap::new()),
            accounts,
        }
    }

    /// The user a bearer token stands for, if any (a ServiceAccount's token only while the
    /// account exists with the uid it was issued for).
    pub fn authenticate(&self, token: &str, store: &Store) -> Option<User> {
        let now = now();
        // The administrator first: the common case of the embedded tools, without a lookup.
        if self.authenticator.is_admin(token) {
            return Some(tokens::admin());
        }
        // Read before the account is: a change of any account after this makes what is found
        // now stale.
        let accounts = self.accounts.load(Ordering::Acquire);
        let remembered = match self.verified.read().get(token) {
            Some(v) if v.claims.expires > now => match &v.user {
                Some((seen, user)) if *seen == accounts => return Some(user.clone()),
                Some(_) | None => Some(v.claims.clone()),
            },
            Some(_) | None => None,
        };
        let claims = match remembered {
            Some(claims) => claims,
            None => match self.authenticator.identify(token, now)? {
                Identity::User(user) => return Some(user),
                Identity::ServiceAccount(claims) => claims,
            },
        };
        let account = store.get(SERVICE_ACCOUNTS, &claims.namespace, &claims.name);
        let uid = account
            .as_ref()
            .and_then(|a| a["metadata"]["uid"].as_str())
            .unwrap_or_default();
        // The token is remembered either way (its signature is not checked again); its user
        // only while its account is there with its uid.
        let user = (account.is_some() && uid == claims.uid)
            .then(|| User::service_account(&claims.namespace, &claims.name, uid));
        let mut verified = self.verified.write();
        if verified.len() >= VERIFIED_REMEMBERED {
            verified.retain(|_, v| v.claims.expires > now);
        }
        if verified.len() < VERIFIED_REMEMBERED || verified.contains_key(token) {
            let entry = Verified {
                claims,
                user: user.clone().map(|user| (accounts, user)),
            };
            verified.insert(token.to_string(), entry);
        }
        user
    }

    /// The policy in force (compiled again after any RBAC change).
    pub fn policy(&self, store: &Store) -> Arc<Policy> {
        let generation = self.generation.load(Ordering::Acquire);
        {
            let current = self.policy.read();
            if current.0 == generation {
                return current.1.clone();
            }
        }
        let list = |resource| store.list(resource, None).0;
        let compiled = Arc::new(Policy::compile(
            &list(CLUSTER_ROLES),
            &list(ROLES),
            &list(CLUSTER_ROLE_BINDINGS),
            &list(ROLE_BINDINGS),
        ));
        {
            let mut current = self.policy.write();
            // A newer compile may have raced this one: keep the newest.
            if current.0 < generation {
                *current = (generation, compiled.clone());
            }
        }
        write_aggregated(store, &compiled);
        compiled
    }

    /// The binding that allows `user` the request (`system:masters` for its members), or
    /// kube-apiserver's 403.
    pub fn authorize(
        &self,
        store: &Store,
        user: &User,
        attributes: &Attributes,
    ) -> Result<String, ApiError> {
        if user.is_master() {
            return Ok(format!("{} is in {}", user.name, policy::MASTERS));
        }
        self.policy(store)
            .allowed_by(user, attributes)
            .ok_or_else(|| attributes::forbidden(&user.name, attributes, ""))
    }
}

/// Writes into each aggregated ClusterRole the rules it holds, as kube-controller-manager's
/// aggregation controller does (so `kubectl get clusterrole -o yaml` shows them). A write
/// changes the policy's generation: the next request compiles again and finds nothing to write.
fn write_aggregated(store: &Store, policy: &Policy) {
    for (name, rules) in policy.aggregated() {
        let wanted = if rules.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::Array(rules.clone())
        };
        let written = store.write(CLUSTER_ROLES, "", name, |current, _| {
            Ok::<_, crate::store::StoreError>(match current {
                Some(role) if role["rules"] != wanted => {
                    let mut next = role.clone();
                    next["rules"] = wanted.clone();
                    crate::store::Write2::Put(next)
                }
                _ => crate::store::Write2::Keep,
            })
        });
        if let Err(error) = written {
            tracing::warn!(%error, role = %name, "failed to write an aggregated ClusterRole's rules");
        }
    }
}

/// Now, in Unix seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
