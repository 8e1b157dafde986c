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
        super::namespaces::finish_namespace(app.clone(), name.to_string());
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
    // A namespace is marked by its first DELETE whatever it holds, and held by its spec's
    // finalizers too; one marked whose spec holds none (finalized, or written without) goes at
    // a later DELETE, its contents left, as in kube-apiserver.
    let held_namespace = is_namespace
        && (meta["deletionTimestamp"].is_null()
            || current["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty()));
    // A definition goes after its custom resources (`definitions`).
    let is_definition = definitions::is_definitions(rt);
    let has_finalizers = meta["finalizers"].as_array().is_some_and(|f| !f.is_empty());
    if !has_finalizers && !held_namespace && !is_definition {
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
                json!({"metadata": {"name": "x"}, "spec": {"finalizers": ["kubernetes"]}}),
                json!({}),
                Ok("mark \"2026-11-24T00:00:00Z\" \"Terminating\"".into()),
            ),
            // No finalizer in its spec (finalized, or written without): marked first, then
            // gone at a later DELETE.
            (
                "namespaces",
                plain,
                json!({}),
                Ok("mark \"2026-11-24T00:00:00Z\" \"Terminating\"".into()),
            ),
            (
                "namespaces",
                json!({"metadata": {"name": "x", "deletionTimestamp": "t"}, "spec": {}}),
                json!({}),
                Ok("delete".into()),
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
}
