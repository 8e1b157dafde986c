//! Writes: create, update (optimistic concurrency, spec/status split), patch.

use super::*;

pub(crate) fn namespace_active(app: &App, rt: &ResourceType, ns: &str) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    match app.store.get("/namespaces", "", ns) {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(n) if !n["metadata"]["deletionTimestamp"].is_null() => {
            Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            )))
        }
        Some(_) => Ok(()),
    }
}

/// Waits until a write of `rt` is durable (and visible); a written CustomResourceDefinition
/// changes what the server serves, so the registry follows it here, for every write path.
pub(crate) async fn commit(app: &App, rt: &ResourceType, rv: u64) -> Result<(), ApiError> {
    app.store.wait_durable(rv).await.map_err(ApiError::from)?;
    if rt.plural == "customresourcedefinitions" {
        refresh_crds(app);
    }
    Ok(())
}

pub(crate) async fn create(
    app: &Shared,
    t: &Target,
    query: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    if t.subresource.is_some() {
        return Err(ApiError::method_not_allowed(
            "create is not allowed on a subresource",
        ));
    }
    let ns = t.namespace.clone().unwrap_or_default();
    if t.rt.namespaced && ns.is_empty() {
        return Err(ApiError::bad_request(
            "the namespace of the object is required (POST to /namespaces/{ns}/...)",
        ));
    }
    let obj = parse_body(&body)?;
    create_object(app, t, query, obj, None).await
}

/// Creates `obj`; `managed_fields` is the field ownership of a server-side apply that creates.
pub(crate) async fn create_object(
    app: &Shared,
    t: &Target,
    query: &Query,
    mut obj: Value,
    managed_fields: Option<Value>,
) -> Result<Response, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    // A generated name that is taken is generated again, as kube-apiserver does (up to 8 tries).
    let generated = obj["metadata"]["name"].as_str().is_none_or(str::is_empty);
    let mut name = prepare_create(&t.rt, &ns, &mut obj)?;
    if let Some(managed) = managed_fields {
        obj["metadata"]["managedFields"] = managed;
    }
    validate(&t.rt, &obj, None)?;
    namespace_active(app, &t.rt, &ns)?;
    if query.get("dryRun") == Some("All") {
        if app.store.get(&t.rt.key(), &ns, &name).is_some() {
            return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
        }
        return Ok(json_response(StatusCode::CREATED, &obj));
    }
    let rt = t.rt.clone();
    let mut attempt = 1;
    let (stored, rv) = loop {
        let candidate = obj.clone();
        let written = app
            .store
            .write(&rt.key(), &ns, &name, |current, _| match current {
                Some(_) => Err(ApiError::already_exists(&rt.group, &rt.plural, &name)),
                None => Ok(Write2::Put(candidate)),
            });
        match written {
            Err(e) if generated && attempt < 8 && e.code == 409 => {
                attempt += 1;
                obj["metadata"]["name"] = Value::Null;
                name = prepare_create(&t.rt, &ns, &mut obj)?;
            }
            other => break other?,
        }
    };
    commit(app, &rt, rv).await?;
    let stored = stored.ok_or_else(|| ApiError::internal("object vanished"))?;
    Ok(json_response(StatusCode::CREATED, &stored))
}

pub(crate) fn refresh_crds(app: &App) {
    let (crds, _) = app
        .store
        .list("apiextensions.k8s.io/customresourcedefinitions", None);
    let crds: Vec<Value> = crds.iter().map(|c| (**c).clone()).collect();
    app.registry.set_custom(&crds);
}

/// Applies an update (full object) under optimistic concurrency; deletes the object when it is
/// being deleted and has no finalizers left.
pub(crate) async fn apply_update(
    app: &Shared,
    t: &Target,
    name: &str,
    incoming: Value,
    manager: Option<&str>,
) -> Result<Response, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let api_version = rt.api_version();
    let status_only = t.subresource.as_deref() == Some("status");
    if incoming["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n != name)
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            incoming["metadata"]["name"]
        )));
    }
    let wanted_rv = incoming["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let (result, rv) = app.store.write(&rt.key(), &ns, name, |current, _| {
        let Some(current) = current else { return Err(ApiError::not_found(&rt.group, &rt.plural, name)) };
        let current_rv = current["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !wanted_rv.is_empty() && wanted_rv != current_rv {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let mut next = merge_update(&rt, current, incoming, status_only)?;
        validate(&rt, &next, Some(current))?;
        if let Some(manager) = manager {
            crate::apply::record_update(current, &mut next, manager, &api_version);
        }
        let deleting = !next["metadata"]["deletionTimestamp"].is_null();
        let no_finalizers = next["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if deleting && no_finalizers {
            return Ok(Write2::Delete);
        }
        let mut a = next.clone();
        let mut b = current.clone();
        if let (Some(ma), Some(mb)) = (a["metadata"].as_object_mut(), b["metadata"].as_object_mut()) {
            ma.remove("resourceVersion");
            mb.remove("resourceVersion");
        }
        if a == b {
            return Ok(Write2::Keep);
        }
        Ok(Write2::Put(next))
    })?;
    commit(app, &rt, rv).await?;
    let object = result.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    Ok(json_response(StatusCode::OK, &object))
}

pub(crate) async fn update(
    app: &Shared,
    t: &Target,
    name: &str,
    body: Bytes,
    manager: &str,
) -> Result<Response, ApiError> {
    let incoming = parse_body(&body)?;
    apply_update(app, t, name, incoming, Some(manager)).await
}

/// A patch may not turn the object or its metadata into something other than a JSON object.
pub(crate) fn patched_is_an_object(t: &Target, name: &str, next: &Value) -> Result<(), ApiError> {
    if next.is_object() && next["metadata"].is_object() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &t.rt.kind,
        name,
        "metadata: Invalid value: the patched object and its metadata must be JSON objects",
    ))
}

pub(crate) async fn patch(
    app: &Shared,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    query: &Query,
    body: Bytes,
    manager: &str,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let kind = PatchKind::from_content_type(content_type)?;
    let patch_value = parse_body(&body)?;
    if kind == PatchKind::Apply {
        return crate::apply::server_side_apply(app, t, name, query, patch_value).await;
    }
    let ns = t.namespace.clone().unwrap_or_default();
    // A patch that names a resourceVersion is a precondition; otherwise the patch applies to
    // what was just read, and a concurrent change makes it read again and retry.
    let patched_rv = patch_value["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    for _ in 0..5 {
        let current = app
            .store
            .get(&t.rt.key(), &ns, name)
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        let mut next = patch::apply(kind, &current, &patch_value).map_err(|e| match e {
            PatchError::Parse(message) => ApiError::bad_request(message),
            PatchError::Apply(_) => ApiError::invalid(&t.rt.kind, name, &e.to_string()),
        })?;
        patched_is_an_object(t, name, &next)?;
        if patched_rv.is_none() {
            next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        }
        match apply_update(app, t, name, next, Some(manager)).await {
            Err(e) if e.code == 409 && patched_rv.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::keeps_changing(&t.rt.group, &t.rt.plural, name))
}
