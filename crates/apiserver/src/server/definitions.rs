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
/// deleted (read from the newest state, so a mark not yet durable counts).
pub(crate) fn definition_active(app: &App, rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    if !rt.custom {
        return Ok(());
    }
    let definition = format!("{}.{}", rt.plural, rt.group);
    match app.store.newest(DEFINITIONS, "", &definition) {
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
pub(crate) const DEFINITIONS: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// Whether the cleanup of definition `crd` started for `uid` still stands: the same definition,
/// being deleted, still held by the cleanup finalizer.
fn cleanup_stands(crd: &Value, uid: &str) -> bool {
    let meta = &crd["metadata"];
    let held = meta["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
    held && !meta["deletionTimestamp"].is_null() && meta["uid"].as_str() == Some(uid)
}

/// What taking the cleanup finalizer off `current` (of `uid`) writes: nothing for another
/// definition of that name, its removal when no other finalizer holds it.
fn released(current: Option<&Value>, uid: &str) -> Write2 {
    let Some(current) = current.filter(|c| c["metadata"]["uid"].as_str() == Some(uid)) else {
        return Write2::Keep;
    };
    let mut next = current.clone();
    if let Some(list) = next["metadata"]["finalizers"].as_array_mut() {
        list.retain(|f| f != CLEANUP_FINALIZER);
    }
    let none_left = next["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty);
    if none_left {
        Write2::Delete
    } else {
        Write2::Put(next)
    }
}

/// What one round of a definition's cleanup found.
enum Round {
    /// The definition is gone, no longer being deleted, another one (another uid) or no
    /// longer held by the finalizer: nothing left to do.
    Over,
    /// Its custom resources, as stored (the key of every version), and the group and plural
    /// of its spec, which name their type and key (a definition stored before names were
    /// checked may be named otherwise than `plural.group`).
    Left(Vec<Arc<Value>>, String, String),
}

/// Reads definition `name` (of `uid`) and what is left of its custom resources.
fn round(app: &App, name: &str, uid: &str) -> Round {
    let Some(crd) = app.store.get(DEFINITIONS, "", name) else {
        return Round::Over;
    };
    if !cleanup_stands(&crd, uid) {
        return Round::Over;
    }
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    let left = app.store.list(&format!("{group}/{plural}"), None).0;
    Round::Left(left, group.to_string(), plural.to_string())
}

/// Deletes the custom resources of definition `name` (being deleted), then takes its finalizer
/// off, which removes it unless another finalizer holds it. One task per definition (by uid);
/// it ends when the definition is gone, no longer being deleted or no longer holds the
/// finalizer, or when the server it belongs to is dropped (it holds the server weakly).
pub(crate) fn finish_definition(app: &Shared, name: &str) {
    let Some(uid) = app
        .store
        .get(DEFINITIONS, "", name)
        .and_then(|crd| crd["metadata"]["uid"].as_str().map(str::to_string))
    else {
        return;
    };
    if !app.finishing_definitions.lock().insert(uid.clone()) {
        return;
    }
    let weak = Arc::downgrade(app);
    let name = name.to_string();
    tokio::spawn(async move {
        let _leaves = LeavesSet::new(weak.clone(), |app| &app.finishing_definitions, uid.clone());
        let mut pause: u32 = 0;
        // Released only after two empty rounds in a row: a create that passed its check just
        // before the mark lands within one.
        let mut empty_rounds = 0;
        loop {
            let Some(app) = weak.upgrade() else {
                return;
            };
            let (left, group, plural) = match round(&app, &name, &uid) {
                Round::Over => break,
                Round::Left(left, group, plural) => (left, group, plural),
            };
            if left.is_empty() {
                empty_rounds += 1;
                if empty_rounds >= 2 && release(&app, &name, &uid).await {
                    break;
                }
            } else {
                empty_rounds = 0;
                delete_all(&app, &name, (&group, &plural), &left).await;
            }
            drop(app);
            // Those held by finalizers are waited for; soon at first, then less often.
            pause = pause.saturating_add(1);
            tokio::time::sleep(super::leaves::round_pause(pause)).await;
        }
    });
}

/// Deletes custom resources `left` of definition `name` that are not being deleted yet.
/// Through a served version's type when there is one (finalizers honoured); with no version
/// served nobody could take a finalizer off, so they are removed outright.
async fn delete_all(app: &Shared, name: &str, (group, plural): (&str, &str), left: &[Arc<Value>]) {
    let served = app
        .registry
        .all()
        .into_iter()
        .find(|t| t.custom && t.group == group && t.plural == plural);
    for object in left
        .iter()
        .filter(|o| o["metadata"]["deletionTimestamp"].is_null() || served.is_none())
    {
        let meta = &object["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or_default();
        let object_name = meta["name"].as_str().unwrap_or_default();
        let deleted = match &served {
            Some(rt) => delete::delete(app, rt, ns, object_name, &Bytes::new(), WriteMode::Store)
                .await
                .map(|_| ()),
            None => remove_unserved(app, (group, plural), ns, object_name),
        };
        if let Err(error) = deleted {
            tracing::warn!(definition = %name, object = object_name, error = %error.message, "failed to delete a custom resource of a definition being deleted");
        }
    }
}

/// Removes a custom resource of `group` and `plural`, none of whose versions is served, from
/// the store.
fn remove_unserved(
    app: &App,
    (group, plural): (&str, &str),
    ns: &str,
    object: &str,
) -> Result<(), ApiError> {
    app.store
        .write(&format!("{group}/{plural}"), ns, object, |_, _| {
            Ok::<_, ApiError>(Write2::Delete)
        })
        .map(|_| ())
}

/// Takes the cleanup finalizer off definition `name` (of `uid`); removed when it was the last.
/// Whether that was done (or there was nothing to do): on failure the task tries again.
async fn release(app: &Shared, name: &str, uid: &str) -> bool {
    let Some(rt) = app
        .registry
        .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return true;
    };
    let written = write_object(app, WriteMode::Store, &rt, "", name, |current, _| {
        Ok(released(current, uid))
    });
    let committed = match written {
        Ok(Written { rv, .. }) => commit(app, &rt, rv).await,
        Err(error) => Err(error),
    };
    match committed {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(definition = name, error = %error.message, "failed to remove a deleted definition; trying again");
            false
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
            finish_definition(app, name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cleanup_stands_for_the_same_definition_marked_and_held() {
        let crd = |uid: &str, deleted: bool, finalizers: Value| {
            let mut c = json!({"metadata": {"name": "pools.example.dev", "uid": uid,
                "finalizers": finalizers}});
            if deleted {
                c["metadata"]["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
            }
            c
        };
        let ours = json!([CLEANUP_FINALIZER]);
        let rows = [
            (crd("u1", true, ours.clone()), true),
            (crd("u2", true, ours.clone()), false),
            (crd("u1", false, ours.clone()), false),
            (crd("u1", true, json!(["example.dev/hold"])), false),
            (crd("u1", true, Value::Null), false),
        ];
        for (crd, want) in rows {
            assert_eq!(cleanup_stands(&crd, "u1"), want, "{crd}");
        }
    }

    #[test]
    fn releasing_removes_the_definition_unless_another_finalizer_holds_it() {
        let with = |finalizers: Value| json!({"metadata": {"uid": "u1", "finalizers": finalizers}});
        assert!(matches!(
            released(Some(&with(json!([CLEANUP_FINALIZER]))), "u1"),
            Write2::Delete
        ));
        match released(
            Some(&with(json!(["example.dev/keep", CLEANUP_FINALIZER]))),
            "u1",
        ) {
            Write2::Put(next) => {
                assert_eq!(next["metadata"]["finalizers"], json!(["example.dev/keep"]));
            }
            _ => panic!("the other finalizer keeps it"),
        }
        assert!(matches!(
            released(Some(&with(json!([CLEANUP_FINALIZER]))), "u2"),
            Write2::Keep
        ));
        assert!(matches!(released(None, "u1"), Write2::Keep));
    }
}
