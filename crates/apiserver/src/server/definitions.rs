//! Deleting a CustomResourceDefinition, as kube-apiserver does: the definition is marked
//! (`deletionTimestamp`, the `customresourcecleanup.apiextensions.k8s.io` finalizer, a
//! `Terminating` condition), its custom resources are deleted (those with finalizers wait for
//! them), no new one may be created meanwhile, and the definition goes once none is left.
//! Before, it went at once and its objects stayed stored, to come back with a definition of
//! the same name.

use super::*;

/// The finalizer kube-apiserver puts on a definition being deleted.
pub(crate) const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Whether `rt` is the CustomResourceDefinition type.
pub(crate) fn is_definitions(rt: &ResourceType) -> bool {
    !rt.custom && rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions"
}

/// Marks `next` (a definition a DELETE is to mark) as kube-apiserver marks it: its finalizer
/// and the `Terminating` condition.
pub(crate) fn mark(next: &mut Value, now: &str) {
    let finalizers = &mut next["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == CLEANUP_FINALIZER)
    {
        list.push(json!(CLEANUP_FINALIZER));
    }
    let condition = json!({
        "type": "Terminating",
        "status": "True",
        "reason": "InstanceDeletionInProgress",
        "message": "CustomResource deletion is in progress",
        "lastTransitionTime": now,
    });
    let conditions = &mut next["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c["type"] != "Terminating");
        list.push(condition);
    }
}

/// kube-apiserver's refusal of a custom resource created while its definition is being
/// deleted.
pub(crate) fn definition_active(app: &App, rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    if !rt.custom {
        return Ok(());
    }
    let definition = format!("{}.{}", rt.plural, rt.group);
    match app.store.get(DEFINITIONS, "", &definition) {
        Some(crd) if !crd["metadata"]["deletionTimestamp"].is_null() => {
            Err(ApiError::forbidden_object(
                &rt.group,
                &rt.plural,
                name,
                "create not allowed while custom resource definition is terminating",
            ))
        }
        _ => Ok(()),
    }
}

/// Where definitions are stored.
const DEFINITIONS: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// Deletes the custom resources of definition `name` (being deleted), then takes its finalizer
/// off, which removes it unless another finalizer holds it. One task per definition; it ends
/// when the definition is gone, no longer being deleted or no longer holds the finalizer.
pub(crate) fn finish_definition(app: Shared, name: String) {
    if !app.finishing_definitions.lock().insert(name.clone()) {
        return;
    }
    tokio::spawn(async move {
        struct Done(Shared, String);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.finishing_definitions.lock().remove(&self.1);
            }
        }
        let _done = Done(app.clone(), name.clone());
        let mut round: u32 = 0;
        loop {
            let Some(crd) = app.store.get(DEFINITIONS, "", &name) else {
                return;
            };
            let held = crd["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
            if crd["metadata"]["deletionTimestamp"].is_null() || !held {
                return;
            }
            let group = crd["spec"]["group"].as_str().unwrap_or_default();
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
            // Every served version is stored under the same key; any of them deletes.
            let served = app
                .registry
                .all()
                .into_iter()
                .find(|t| t.custom && t.group == group && t.plural == plural);
            let left = match &served {
                Some(rt) => app.store.list(&rt.key(), None).0,
                None => Vec::new(),
            };
            if left.is_empty() {
                release(&app, &name).await;
                return;
            }
            if let Some(rt) = served {
                for object in left
                    .iter()
                    .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
                {
                    let meta = &object["metadata"];
                    let ns = meta["namespace"].as_str().unwrap_or_default();
                    let object_name = meta["name"].as_str().unwrap_or_default();
                    if let Err(error) =
                        delete::delete(&app, &rt, ns, object_name, &Bytes::new(), WriteMode::Store)
                            .await
                    {
                        tracing::warn!(definition = %name, object = object_name, error = %error.message, "failed to delete a custom resource of a definition being deleted");
                    }
                }
            }
            // Those held by finalizers are waited for; soon at first, then every second.
            round = round.saturating_add(1);
            let pause = if round < 10 { 200 } else { 1000 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    });
}

/// Takes the cleanup finalizer off definition `name`; removed when it was the last.
async fn release(app: &Shared, name: &str) {
    let Some(rt) = app.registry.all().into_iter().find(|t| is_definitions(t)) else {
        return;
    };
    let written = write_object(app, WriteMode::Store, &rt, "", name, |current, _| {
        let Some(current) = current else {
            return Ok(Write2::Keep);
        };
        let mut next = current.clone();
        if let Some(list) = next["metadata"]["finalizers"].as_array_mut() {
            list.retain(|f| f != CLEANUP_FINALIZER);
        }
        let none_left = next["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
        Ok(if none_left {
            Write2::Delete
        } else {
            Write2::Put(next)
        })
    });
    match written {
        Ok(Written { rv, .. }) => {
            if let Err(error) = commit(app, &rt, rv).await {
                tracing::warn!(definition = name, error = %error.message, "failed to remove a deleted definition");
            }
        }
        Err(error) => {
            tracing::warn!(definition = name, error = %error.message, "failed to remove a deleted definition");
        }
    }
}

/// Starts the cleanup of every definition a DELETE marked before a restart.
pub(crate) fn resume(app: &Shared) {
    let (definitions, _) = app.store.list(DEFINITIONS, None);
    for crd in definitions {
        if !crd["metadata"]["deletionTimestamp"].is_null()
            && let Some(name) = crd["metadata"]["name"].as_str()
        {
            finish_definition(app.clone(), name.to_string());
        }
    }
}
