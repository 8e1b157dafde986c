//! Emptying a terminating namespace, as kube-controller-manager's namespace controller does:
//! a task per namespace deletes its contents, then takes the `kubernetes` finalizer off
//! (`crate::namespace_rules`).

use super::delete::delete;
use super::*;
use crate::namespace_rules;

/// Starts emptying every namespace a DELETE marked before a restart (and not yet emptied).
pub(crate) fn resume(app: &Shared) {
    let (namespaces, _) = app.store.list("/namespaces", None);
    for namespace in namespaces {
        if namespace_rules::needs_emptying(Some(&namespace))
            && let Some(name) = namespace["metadata"]["name"].as_str()
        {
            finish_namespace(app.clone(), name.to_string());
        }
    }
}

/// Deletes everything in a terminating namespace, then takes its `kubernetes` finalizer off
/// (which removes it unless its own finalizers hold it), as kube-controller-manager's
/// namespace controller does; and like it keeps at it while an object's finalizer holds the
/// namespace (every 200 ms at first, then less often). The task ends when the namespace no
/// longer needs it or the server is dropped.
pub(crate) fn finish_namespace(app: Shared, namespace: String) {
    if !app.finishing.lock().insert(namespace.clone()) {
        return;
    }
    app.finishing_started
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Held weakly: a server that stops (a restart in the same process) ends the task instead of
    // being kept alive by it.
    let weak = Arc::downgrade(&app);
    drop(app);
    tokio::spawn(async move {
        let leaves = LeavesSet::new(weak.clone(), |app| &app.finishing, namespace.clone());
        let mut round: u32 = 0;
        let mut uid = String::new();
        let mut unknown = std::collections::BTreeSet::new();
        loop {
            let Some(app) = weak.upgrade() else {
                return;
            };
            let stored = app.store.get("/namespaces", "", &namespace);
            if !namespace_rules::needs_emptying(stored.as_deref()) {
                if leave_finishing(&app, &namespace) {
                    leaves.defuse();
                    return;
                }
                // Deleted again meanwhile (re-created under the same name): its turn now.
                round = 0;
                continue;
            }
            // A namespace deleted, re-created and deleted again starts again at short pauses.
            let now_uid = stored
                .as_deref()
                .and_then(|ns| ns["metadata"]["uid"].as_str())
                .unwrap_or_default();
            if now_uid != uid {
                uid = now_uid.to_string();
                round = 0;
            }
            let contents = app.store.in_namespace(&namespace);
            if contents.is_empty() {
                let finalize = app
                    .store
                    .write("/namespaces", "", &namespace, |current, _| {
                        Ok::<_, ApiError>(match current {
                            Some(ns) if namespace_rules::needs_emptying(Some(ns)) => {
                                namespace_rules::finalized(ns)
                            }
                            _ => Write2::Keep,
                        })
                    });
                if let Err(error) = finalize {
                    tracing::warn!(namespace = %namespace, error = %error.message, "failed to finalize an emptied namespace; trying again");
                }
            }
            // The served types, read once a round (not once an object).
            let types = app.registry.all();
            for (resource, name) in contents {
                if !delete_content(&app, &types, &namespace, &resource, &name).await
                    && unknown.insert(resource.clone())
                {
                    tracing::warn!(namespace = %namespace, resource = %resource, "a terminating namespace holds objects of a type this server no longer serves; it stays until they are gone");
                }
            }
            drop(app);
            round = round.saturating_add(1);
            tokio::time::sleep(super::leaves::round_pause(round)).await;
        }
    });
}

/// Leaves the set of namespaces being emptied unless namespace `name` needs emptying again,
/// decided under the set's lock: a DELETE marks the namespace before it takes that lock to
/// start a task, so either this task sees the mark or the DELETE finds the name gone.
fn leave_finishing(app: &App, name: &str) -> bool {
    let mut finishing = app.finishing.lock();
    if namespace_rules::needs_emptying(app.store.get("/namespaces", "", name).as_deref()) {
        return false;
    }
    finishing.remove(name);
    true
}

/// Deletes object `name` of store key `resource` in a terminating namespace, unless it is
/// already being deleted; false when no served type stores objects under `resource`.
async fn delete_content(
    app: &Shared,
    types: &[Arc<ResourceType>],
    namespace: &str,
    resource: &str,
    name: &str,
) -> bool {
    let marked = app
        .store
        .get(resource, namespace, name)
        .is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null());
    if marked {
        return true;
    }
    // events.k8s.io/v1 Events are the core ones: removed as those.
    let stored_here = |t: &ResourceType| t.key() == resource && !t.stored_as_core_events();
    let Some(rt) = types.iter().find(|t| stored_here(t)) else {
        return false;
    };
    if let Err(error) = delete(app, rt, namespace, name, &Bytes::new(), WriteMode::Store).await
        && error.code != 404
    {
        tracing::warn!(namespace = %namespace, resource = %resource, name = %name, error = %error.message, "failed to delete an object of a terminating namespace");
    }
    true
}
