//! Deletes: preconditions, finalizers, the namespace cascade, delete-collection.

use super::*;

/// The namespaces that cannot be deleted (kube-apiserver's NamespaceLifecycle admission:
/// `kube-node-lease` can be).
const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Deletes an object, or marks it as being deleted. Returns the object as it now is (the
/// deleted one with its last resourceVersion) and the change made, if any, whose JSON answers.
pub(crate) async fn delete(
    app: &Shared,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    body: &Bytes,
    mode: WriteMode,
) -> Result<Deleted, ApiError> {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(body)?
    };
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    // kube-apiserver's NamespaceLifecycle admission keeps these.
    if is_namespace && IMMORTAL_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden_object(
            &rt.group,
            &rt.plural,
            name,
            "this namespace may not be deleted",
        ));
    }
    let mut removed = false;
    let Written { object, change, rv } = write_object(app, mode, rt, ns, name, |current, _| {
        let current = current.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let write = deletion(rt, name, current, &options, &objects::now_rfc3339())?;
        removed = matches!(write, Write2::Delete);
        Ok(write)
    })?;
    commit(app, rt, rv).await?;
    if is_namespace && mode == WriteMode::Store {
        finish_namespace(app.clone(), name.to_string());
    }
    if definitions::is_definitions(rt) && mode == WriteMode::Store && !removed {
        definitions::finish_definition(app, name);
    }
    let object = object.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    Ok(Deleted {
        object,
        change,
        removed,
    })
}

/// What a DELETE did.
pub(crate) struct Deleted {
    /// The object: its last state when removed, else as marked.
    pub object: Arc<Value>,
    /// The change written (None in a dry run or when nothing changed).
    pub change: Option<Arc<Change>>,
    /// Removed, not only marked as being deleted.
    pub removed: bool,
}

impl Deleted {
    /// The answer kube-apiserver gives: the object, or a `Status` of success for a kind that
    /// answers a removal so.
    pub(crate) fn response(&self, rt: &ResourceType) -> Response {
        if self.removed && !rt.answers_deletion_with_object() {
            return json_response(StatusCode::OK, &rt.deletion_status(&self.object));
        }
        written_response(StatusCode::OK, &self.object, self.change.as_deref())
    }
}

/// What deleting `current` writes, given the request's options (preconditions, a Pod's grace
/// period) at time `now`: a conflict when a precondition fails; a Pod with a grace period and
/// an object with finalizers (or a namespace) are marked as being deleted (once); anything else
/// goes.
fn deletion(
    rt: &ResourceType,
    name: &str,
    current: &Value,
    options: &Value,
    now: &str,
) -> Result<Write2, ApiError> {
    let meta = &current["metadata"];
    let preconditions = &options["preconditions"];
    let failed = if let Some(uid) = preconditions["uid"].as_str()
        && meta["uid"].as_str() != Some(uid)
    {
        Some(format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            meta["uid"].as_str().unwrap_or("")
        ))
    } else if let Some(want) = preconditions["resourceVersion"].as_str()
        && meta["resourceVersion"].as_str() != Some(want)
    {
        Some("Precondition failed: the resourceVersion does not match".to_string())
    } else {
        None
    };
    if let Some(message) = failed {
        return Err(ApiError::conflict(&rt.group, &rt.plural, name, &message));
    }
    if rt.group.is_empty() && rt.plural == "pods" {
        let grace = objects::pod_grace_seconds(current, options["gracePeriodSeconds"].as_i64());
        if grace > 0 {
            return Ok(match objects::graceful_deletion(current, grace) {
                Some(next) => Write2::Put(next),
                None => Write2::Keep,
            });
        }
    }
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    // A definition goes after its custom resources (`definitions`).
    let is_definition = definitions::is_definitions(rt);
    let has_finalizers = meta["finalizers"].as_array().is_some_and(|f| !f.is_empty());
    if !has_finalizers && !is_namespace && !is_definition {
        return Ok(Write2::Delete);
    }
    if !meta["deletionTimestamp"].is_null() {
        return Ok(Write2::Keep);
    }
    let mut next = current.clone();
    next["metadata"]["deletionTimestamp"] = json!(now);
    // kube-apiserver's definition storage marks it itself: no grace period, the same generation.
    if is_definition {
        definitions::mark(&mut next, now);
        return Ok(Write2::Put(next));
    }
    next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    // As kube-apiserver marks an object: a kind with a generation counts the change.
    if let Some(generation) = meta["generation"].as_i64().filter(|g| *g > 0) {
        next["metadata"]["generation"] = json!(generation.saturating_add(1));
    }
    if is_namespace {
        next["status"]["phase"] = json!("Terminating");
    }
    Ok(Write2::Put(next))
}

/// Starts emptying every namespace a DELETE marked before a restart (and not yet emptied).
pub(crate) fn resume(app: &Shared) {
    let (namespaces, _) = app.store.list("/namespaces", None);
    for namespace in namespaces {
        if needs_emptying(Some(&namespace))
            && let Some(name) = namespace["metadata"]["name"].as_str()
        {
            finish_namespace(app.clone(), name.to_string());
        }
    }
}

/// The finalizer of `spec.finalizers` that kube-apiserver puts on every namespace and its
/// namespace controller takes off once the namespace is empty.
const NAMESPACE_FINALIZER: &str = "kubernetes";

/// Whether an object written with `next` is removed instead: one being deleted that no
/// finalizer holds; a namespace also needs its `spec.finalizers` gone (kube-apiserver's
/// ShouldDeleteNamespaceDuringUpdate), so dropping its own finalizers while it still has
/// contents does not remove it.
pub(crate) fn gone_once_written(rt: &ResourceType, next: &Value) -> bool {
    let empty = |list: &Value| list.as_array().is_none_or(Vec::is_empty);
    let deleting = !next["metadata"]["deletionTimestamp"].is_null();
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    deleting
        && empty(&next["metadata"]["finalizers"])
        && (!is_namespace || empty(&next["spec"]["finalizers"]))
}

/// Whether stored namespace `stored` is for its emptying task: being deleted and still held by
/// the `kubernetes` finalizer.
fn needs_emptying(stored: Option<&Value>) -> bool {
    stored.is_some_and(|ns| {
        !ns["metadata"]["deletionTimestamp"].is_null()
            && ns["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == NAMESPACE_FINALIZER))
    })
}

/// What finalizing emptied namespace `stored` writes: the `kubernetes` finalizer taken off,
/// and the namespace removed when no other finalizer (of its spec or metadata) holds it.
fn finalized(stored: &Value) -> Write2 {
    let mut next = stored.clone();
    if let Some(list) = next["spec"]["finalizers"].as_array_mut() {
        list.retain(|f| f != NAMESPACE_FINALIZER);
    }
    let empty = |list: &Value| list.as_array().is_none_or(Vec::is_empty);
    if empty(&next["spec"]["finalizers"]) {
        if let Some(spec) = next["spec"].as_object_mut() {
            spec.remove("finalizers");
        }
        if empty(&next["metadata"]["finalizers"]) {
            return Write2::Delete;
        }
    }
    Write2::Put(next)
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
            if !needs_emptying(stored.as_deref()) {
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
                            Some(ns) if needs_emptying(Some(ns)) => finalized(ns),
                            _ => Write2::Keep,
                        })
                    });
                if let Err(error) = finalize {
                    tracing::warn!(namespace = %namespace, error = %error.message, "failed to finalize an emptied namespace; trying again");
                }
            }
            for (resource, name) in contents {
                if !delete_content(&app, &namespace, &resource, &name).await
                    && unknown.insert(resource.clone())
                {
                    tracing::warn!(namespace = %namespace, resource = %resource, "a terminating namespace holds objects of a type this server no longer serves; it stays until they are gone");
                }
            }
            drop(app);
            round = round.saturating_add(1);
            tokio::time::sleep(namespace_pause(round)).await;
        }
    });
}

/// Leaves the set of namespaces being emptied unless namespace `name` needs emptying again,
/// decided under the set's lock: a DELETE marks the namespace before it takes that lock to
/// start a task, so either this task sees the mark or the DELETE finds the name gone.
fn leave_finishing(app: &App, name: &str) -> bool {
    let mut finishing = app.finishing.lock();
    if needs_emptying(app.store.get("/namespaces", "", name).as_deref()) {
        return false;
    }
    finishing.remove(name);
    true
}

/// The pause after round `round` of a namespace's emptying: soon at first, then every second,
/// then every 5 seconds (each round reads every stored key).
fn namespace_pause(round: u32) -> Duration {
    match round {
        0..10 => Duration::from_millis(200),
        10..60 => Duration::from_secs(1),
        _ => Duration::from_secs(5),
    }
}

/// Deletes object `name` of store key `resource` in a terminating namespace, unless it is
/// already being deleted; false when no served type stores objects under `resource`.
async fn delete_content(app: &Shared, namespace: &str, resource: &str, name: &str) -> bool {
    let marked = app
        .store
        .get(resource, namespace, name)
        .is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null());
    if marked {
        return true;
    }
    // events.k8s.io/v1 Events are the core ones: removed as those.
    let stored_here = |t: &ResourceType| t.key() == resource && !t.stored_as_core_events();
    let Some(rt) = app.registry.all().into_iter().find(|t| stored_here(t)) else {
        return false;
    };
    if let Err(error) = delete(app, &rt, namespace, name, &Bytes::new(), WriteMode::Store).await
        && error.code != 404
    {
        tracing::warn!(namespace = %namespace, resource = %resource, name = %name, error = %error.message, "failed to delete an object of a terminating namespace");
    }
    true
}

pub(crate) async fn delete_collection(
    app: &Shared,
    t: &Target,
    query: &Query,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query, &t.rt)?;
    let (items, _) = app.store.list(&t.rt.key(), t.namespace.as_deref());
    let mut deleted = Vec::new();
    for item in items
        .iter()
        .filter(|o| labels.matches_object(o) && fields.matches(o))
    {
        let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
        let ns = item["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if let Ok(Deleted { object: obj, .. }) =
            delete(app, &t.rt, &ns, &name, &Bytes::new(), mode).await
        {
            deleted.push((*obj).clone());
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.rt.kind), "apiVersion": t.rt.api_version(), "metadata": {}, "items": deleted}),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rt(plural: &str) -> std::sync::Arc<ResourceType> {
        Registry::default().find("", "v1", plural).unwrap()
    }

    /// The kind of write (or the error code) `deletion` decides.
    fn decided(plural: &str, current: Value, options: Value) -> Result<String, u16> {
        match deletion(&rt(plural), "x", &current, &options, "2026-11-24T00:00:00Z") {
            Ok(Write2::Delete) => Ok("delete".into()),
            Ok(Write2::Keep) => Ok("keep".into()),
            Ok(Write2::Put(next)) => Ok(format!(
                "mark {} {}",
                next["metadata"]["deletionTimestamp"], next["status"]["phase"]
            )),
            Err(e) => Err(e.code),
        }
    }

    #[test]
    fn a_deletion_checks_preconditions_then_marks_or_deletes() {
        let plain = json!({"metadata": {"name": "x", "uid": "u1", "resourceVersion": "5"}});
        let held = json!({"metadata": {"name": "x", "uid": "u1", "finalizers": ["f"]}});
        let marked =
            json!({"metadata": {"name": "x", "finalizers": ["f"], "deletionTimestamp": "t"}});
        let cases = [
            (
                "configmaps",
                plain.clone(),
                json!({}),
                Ok("delete".to_string()),
            ),
            (
                "configmaps",
                plain.clone(),
                json!({"preconditions": {"uid": "u1", "resourceVersion": "5"}}),
                Ok("delete".into()),
            ),
            (
                "configmaps",
                plain.clone(),
                json!({"preconditions": {"uid": "u2"}}),
                Err(409),
            ),
            (
                "configmaps",
                plain.clone(),
                json!({"preconditions": {"resourceVersion": "4"}}),
                Err(409),
            ),
            (
                "configmaps",
                held.clone(),
                json!({}),
                Ok("mark \"2026-11-24T00:00:00Z\" null".into()),
            ),
            ("configmaps", marked, json!({}), Ok("keep".into())),
            (
                "configmaps",
                held,
                json!({"preconditions": {"uid": "u2"}}),
                Err(409),
            ),
            (
                "namespaces",
                plain,
                json!({}),
                Ok("mark \"2026-11-24T00:00:00Z\" \"Terminating\"".into()),
            ),
        ];
        for (plural, current, options, want) in cases {
            assert_eq!(
                decided(plural, current.clone(), options.clone()),
                want,
                "{plural} {current} {options}"
            );
        }
        // Marking counts as a change of a kind with a generation, as in kube-apiserver.
        for (generation, want) in [(json!(3), json!(4)), (json!(null), json!(null))] {
            let held =
                json!({"metadata": {"name": "x", "finalizers": ["f"], "generation": generation}});
            let Ok(Write2::Put(marked)) = deletion(
                &rt("pods"),
                "x",
                &held,
                &json!({"gracePeriodSeconds": 0}),
                "t",
            ) else {
                panic!("marked");
            };
            assert_eq!(marked["metadata"]["generation"], want);
        }
    }

    #[test]
    fn a_namespace_is_emptied_finalized_and_removed_as_kube_does() {
        let ns = |deleting: bool, spec: Value, meta: Value| {
            let mut ns = json!({"metadata": {"name": "n"}, "spec": {"finalizers": spec}});
            if deleting {
                ns["metadata"]["deletionTimestamp"] = json!("t");
            }
            if !meta.is_null() {
                ns["metadata"]["finalizers"] = meta;
            }
            ns
        };
        let held = json!(["kubernetes"]);
        let none = json!([]);
        let own = json!(["example.com/keep"]);
        // (namespace, needs its task, what finalizing writes, removed when written as is)
        let rows = [
            (ns(false, held.clone(), Value::Null), false, "delete", false),
            (ns(true, held.clone(), Value::Null), true, "delete", false),
            (ns(true, held.clone(), own.clone()), true, "put", false),
            (
                ns(true, json!(["kubernetes", "other"]), Value::Null),
                true,
                "put",
                false,
            ),
            (ns(true, none.clone(), Value::Null), false, "delete", true),
            (ns(true, none.clone(), own.clone()), false, "put", false),
            (ns(true, Value::Null, Value::Null), false, "delete", true),
        ];
        let namespaces = rt("namespaces");
        for (i, (stored, needs, finalizing, gone)) in rows.into_iter().enumerate() {
            assert_eq!(
                needs_emptying(Some(&stored)),
                needs,
                "row {i}: needs emptying"
            );
            let written = match finalized(&stored) {
                Write2::Delete => "delete",
                Write2::Put(next) => {
                    let left = next["spec"]["finalizers"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    assert!(!left.contains(&json!("kubernetes")), "row {i}: {next}");
                    "put"
                }
                Write2::Keep => "keep",
            };
            assert_eq!(written, finalizing, "row {i}: finalizing");
            assert_eq!(
                gone_once_written(&namespaces, &stored),
                gone,
                "row {i}: removed"
            );
        }
        assert!(!needs_emptying(None));
        // Any other kind goes with its last finalizer, whatever its spec holds.
        let map = json!({"metadata": {"deletionTimestamp": "t"}, "spec": {"finalizers": ["x"]}});
        assert!(gone_once_written(&rt("configmaps"), &map));
    }

    #[test]
    fn a_namespace_task_pauses_longer_as_it_waits() {
        let rows = [
            (0, 200),
            (9, 200),
            (10, 1000),
            (59, 1000),
            (60, 5000),
            (u32::MAX, 5000),
        ];
        for (round, millis) in rows {
            assert_eq!(
                namespace_pause(round),
                Duration::from_millis(millis),
                "round {round}"
            );
        }
    }
}
