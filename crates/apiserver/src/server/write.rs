//! Writes: create, update (optimistic concurrency, spec/status split), patch.

use super::*;
use crate::event_versions::{served, stored};

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

/// A create's or update's body read for fields its kind does not have
/// ([`crate::unknown_fields::judge`], `stored` being the object an update replaces): the write
/// is refused under `Strict`, as kube-apiserver refuses it; otherwise they are dropped and the
/// body written again. Also the `Warning` headers to answer with. A body that does not parse is
/// left to the write to refuse.
pub(crate) fn checked_body(
    rt: &ResourceType,
    validation: FieldValidation,
    body: Bytes,
    stored: Option<&Value>,
) -> Result<(Bytes, Vec<String>), ApiError> {
    if validation == FieldValidation::Unset || body.is_empty() {
        return Ok((body, Vec::new()));
    }
    let (Ok(mut object), Some(schema)) = (
        serde_json::from_slice::<Value>(&body),
        crate::unknown_fields::schema_of(rt),
    ) else {
        return Ok((body, Vec::new()));
    };
    match crate::unknown_fields::judge(&schema, validation, &mut object, stored) {
        Verdict::Refuse(unknown) => Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            unknown.listed(),
            kind = rt.kind,
            version = rt.version,
        ))),
        Verdict::Write {
            warnings,
            dropped: false,
        } => Ok((body, warnings)),
        Verdict::Write {
            warnings,
            dropped: true,
        } => {
            let body =
                serde_json::to_vec(&object).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok((Bytes::from(body), warnings))
        }
    }
}

/// `response` with a `Warning` header for each of `warnings`.
pub(crate) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        // UTF-8 text passes as it is (kube-apiserver sends it so); control characters were
        // escaped when the warning was written.
        if let Ok(value) = header::HeaderValue::from_bytes(warning.as_bytes()) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// Writes (or, in a dry run, works out) what `decide` chooses for one object: see
/// [`crate::store::Store::write_change`] and [`crate::store::Store::dry_run_change`].
pub(crate) fn write_object(
    app: &App,
    mode: WriteMode,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    decide: impl FnOnce(Option<&Value>, u64) -> Result<Write2, ApiError>,
) -> Result<Written, ApiError> {
    if !rt.stored_as_core_events() {
        return match mode {
            WriteMode::Store => app.store.write_change(&rt.key(), ns, name, decide),
            WriteMode::DryRun => app.store.dry_run_change(&rt.key(), ns, name, decide),
        };
    }
    // An events.k8s.io/v1 Event: `decide` sees and returns that version, the store keeps the
    // core/v1 form, and the answer is that version again.
    let decide_served = |current: Option<&Value>, rv: u64| {
        let served = current.map(|c| served(rt, Arc::new(c.clone())));
        Ok::<_, ApiError>(match decide(served.as_deref(), rv)? {
            Write2::Put(object) => Write2::Put(stored(rt, object)),
            other @ (Write2::Delete | Write2::Keep) => other,
        })
    };
    let written = match mode {
        WriteMode::Store => app.store.write_change(&rt.key(), ns, name, decide_served),
        WriteMode::DryRun => app.store.dry_run_change(&rt.key(), ns, name, decide_served),
    }?;
    // The change's JSON (which answers other writes) is the stored form: answered from the
    // converted object instead.
    Ok(Written {
        object: written.object.map(|object| served(rt, object)),
        change: None,
        rv: written.rv,
    })
}

pub(crate) async fn create(
    app: &Shared,
    t: &Target,
    mode: WriteMode,
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
    create_object(app, t, mode, obj, None).await
}

/// Creates `obj`; `managed_fields` is the field ownership of a server-side apply that creates.
pub(crate) async fn create_object(
    app: &Shared,
    t: &Target,
    mode: WriteMode,
    mut obj: Value,
    managed_fields: Option<Value>,
) -> Result<Response, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    // A generated name that is taken is generated again, as kube-apiserver does (up to 8 tries).
    let generated = obj["metadata"]["name"].as_str().is_none_or(str::is_empty);
    let mut name = prepare_create(&t.rt, &ns, &mut obj)?;
    // NamespaceLifecycle comes first among kube-apiserver's admission plugins.
    namespace_active(app, &t.rt, &ns)?;
    admit(app, t, &mut obj, generated)?;
    if let Some(managed) = managed_fields {
        obj["metadata"]["managedFields"] = managed;
    }
    objects::decodes(&t.rt, &obj)?;
    validate(&t.rt, &obj, None)?;
    crate::auth::escalation::check(&app.auth, &app.store, &t.rt, &ns, &obj)?;
    super::definitions::definition_active(app, &t.rt, &name)?;
    let rt = t.rt.clone();
    let mut attempt = 1;
    let Written {
        object: stored,
        change,
        rv,
    } = loop {
        // Kept for another try only where a generated name may collide.
        let candidate = if generated {
            obj.clone()
        } else {
            std::mem::take(&mut obj)
        };
        let written = write_object(app, mode, &rt, &ns, &name, |current, _| match current {
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
    Ok(written_response(
        StatusCode::CREATED,
        &stored,
        change.as_deref(),
    ))
}

/// The mutating admission kube-apiserver runs by default on a create. Only objects are created
/// here: `create` refuses subresources and an apply to a missing object's subresource is a 404.
/// A refusal names the object as it was asked for, as kube-apiserver's admission errors do: by
/// its generateName when its name was `generated`.
fn admit(app: &App, t: &Target, obj: &mut Value, generated: bool) -> Result<(), ApiError> {
    // Most claims name their class: the classes are listed only for those that do not.
    if t.rt.group.is_empty()
        && t.rt.plural == "persistentvolumeclaims"
        && !crate::admission::chooses_its_class(obj)
    {
        let (classes, _) = app.store.list(crate::admission::STORAGE_CLASSES, None);
        if let Some(class) = crate::admission::default_storage_class(obj, &classes) {
            tracing::debug!(%class, "DefaultStorageClass: the claim gets the default class");
        }
    }
    if t.rt.group.is_empty() && t.rt.plural == "pods" {
        crate::admission::pod(obj).map_err(|why| {
            let asked_as = if generated { "generateName" } else { "name" };
            let name = obj["metadata"][asked_as].as_str().unwrap_or_default();
            ApiError::forbidden_object("", "pods", name, &why)
        })?;
    }
    if t.rt.group.is_empty()
        && app
            .storage_protection
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        crate::admission::storage_object_in_use_protection(&t.rt.plural, obj);
    }
    Ok(())
}

pub(crate) fn refresh_crds(app: &App) {
    let (crds, _) = app.store.list(super::definitions::DEFINITIONS, None);
    let crds: Vec<Value> = crds.iter().map(|c| (**c).clone()).collect();
    app.registry.set_custom(&crds);
}

/// Applies an update (full object) under optimistic concurrency; deletes the object when it is
/// being deleted and has no finalizers left. Answers the object as written.
pub(crate) async fn apply_update(
    app: &Shared,
    t: &Target,
    name: &str,
    incoming: Value,
    manager: Option<&str>,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let (object, change) = update_object(app, t, name, incoming, manager, mode).await?;
    Ok(written_response(StatusCode::OK, &object, change.as_deref()))
}

/// [`apply_update`], giving the object as written (or as it would be, in a dry run) and the
/// change made. An update that removes the object (its last finalizer gone while it is being
/// deleted) gives the object as the update left it, at the version it had, and no change to
/// answer with: kube-apiserver answers so (not with the object as last stored).
pub(crate) async fn update_object(
    app: &Shared,
    t: &Target,
    name: &str,
    incoming: Value,
    manager: Option<&str>,
    mode: WriteMode,
) -> Result<(Arc<Value>, Option<Arc<Change>>), ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let api_version = rt.api_version();
    let status_only = t.subresource.as_deref() == Some("status");
    let finalize = t.subresource.as_deref() == Some("finalize");
    if incoming["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n != name)
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            incoming["metadata"]["name"]
        )));
    }
    objects::decodes(&rt, &incoming)?;
    // Checked before the store's lock is taken (the policy may have to be read from it).
    crate::auth::escalation::check(&app.auth, &app.store, &rt, &ns, &incoming)?;
    let wanted_rv = incoming["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let resize = (rt.group.is_empty() && rt.plural == "persistentvolumeclaims" && !status_only)
        .then(|| allows_expansion(app, crate::claim_rules::claim_class(&incoming)));
    let mut removed_as = None;
    let Written {
        object: result,
        change,
        rv,
    } = write_object(app, mode, &rt, &ns, name, |current, _| {
        let Some(current) = current else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        let current_rv = current["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("");
        if !wanted_rv.is_empty() && wanted_rv != current_rv {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let finalizers = finalize
            .then(|| json!({"spec": {"finalizers": incoming["spec"]["finalizers"].clone()}}));
        let mut next = merge_update(&rt, current, incoming, status_only)?;
        if let Some(finalizers) = finalizers {
            crate::namespace_rules::finalize_update(&finalizers, &mut next);
        }
        // An events.k8s.io/v1 Event as its version renders it, as `current` is: the zero values
        // a client left out change no field's ownership and no version.
        if rt.stored_as_core_events() {
            next = Arc::unwrap_or_clone(served(&rt, Arc::new(stored(&rt, next))));
        }
        validate(&rt, &next, Some(current))?;
        if let Some(allowed) = resize
            && let Some(why) = crate::claim_rules::refuse_resize(&next, current, |class| {
                allowed.as_deref() == Some(class)
            })
        {
            return Err(ApiError::forbidden_object(&rt.group, &rt.plural, name, why));
        }
        if let Some(manager) = manager {
            crate::apply::record_update(current, &mut next, manager, &api_version);
        }
        if crate::namespace_rules::gone_once_written(&rt, &next) {
            next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            removed_as = Some(next);
            return Ok(Write2::Delete);
        }
        if same_but_version(&next, current) {
            return Ok(Write2::Keep);
        }
        Ok(Write2::Put(next))
    })?;
    commit(app, &rt, rv).await?;
    if let Some(answer) = removed_as {
        return Ok((Arc::new(answer), None));
    }
    let object = result.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    Ok((object, change))
}

/// The class named `class` when it exists and its `allowVolumeExpansion` is true (read
/// before the claim's write: `PersistentVolumeClaimResize` reads classes from a cache too).
fn allows_expansion(app: &App, class: &str) -> Option<String> {
    if class.is_empty() {
        return None;
    }
    let object = app
        .store
        .get(crate::admission::STORAGE_CLASSES, "", class)?;
    (object["allowVolumeExpansion"].as_bool() == Some(true)).then(|| class.to_string())
}

/// Whether two objects are equal apart from `metadata.resourceVersion` (an update that
/// changes nothing else is not written), compared in place.
fn same_but_version(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.iter().all(|(key, va)| match b.get(key) {
            None => false,
            Some(vb) if key == "metadata" => objects::same_apart_from(va, vb, &["resourceVersion"]),
            Some(vb) => va == vb,
        })
}

pub(crate) async fn update(
    app: &Shared,
    t: &Target,
    name: &str,
    body: Bytes,
    manager: &str,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let incoming = parse_body(&body)?;
    apply_update(app, t, name, incoming, Some(manager), mode).await
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

/// Reads and writes a patch (an apply, a scale) without a resourceVersion tries before
/// answering 409 (each try loses only to a write that came between its read and its write).
pub(crate) const PATCH_TRIES: usize = 16;

pub(crate) async fn patch(
    app: &Shared,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    query: &Query,
    body: Bytes,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let kind = PatchKind::from_content_type(content_type)?;
    let patch_value = parse_body(&body)?;
    if kind == PatchKind::Apply {
        return crate::apply::server_side_apply(app, t, name, query, patch_value, mode).await;
    }
    let manager = writer_manager(query, headers);
    let validation =
        crate::unknown_fields::field_validation(&Method::PATCH, query.get("fieldValidation"))?;
    let schema = (validation != FieldValidation::Unset)
        .then(|| crate::unknown_fields::schema_of(&t.rt))
        .flatten();
    let mut warnings = Vec::new();
    let ns = t.namespace.clone().unwrap_or_default();
    // A patch that names a resourceVersion is a precondition; otherwise the patch applies to
    // the newest version (durable or not: the one the write checks against), and a concurrent
    // change makes it read again and retry.
    let patched_rv = patch_value["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    for _ in 0..PATCH_TRIES {
        let current = app
            .store
            .newest(&t.rt.key(), &ns, name)
            .map(|stored| served(&t.rt, stored))
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        let mut next = patch::apply(kind, &current, &patch_value).map_err(|e| match e {
            PatchError::Parse(message) => ApiError::bad_request(message),
            PatchError::TooLarge(message) => ApiError::too_large_because(message),
            PatchError::Apply(_) => ApiError::invalid(&t.rt.kind, name, &e.to_string()),
        })?;
        patched_is_an_object(t, name, &next)?;
        if let Some(schema) = &schema {
            // Read against the object patched: only what the patch brings is its doing.
            match crate::unknown_fields::judge(schema, validation, &mut next, Some(&*current)) {
                Verdict::Refuse(unknown) => {
                    // kube-apiserver's words: the value shown is the patched object, or for a
                    // strategic merge patch the patch as Go prints it.
                    let shown = match kind {
                        PatchKind::Strategic => crate::go_format::go_text(&patch_value),
                        _ => next.to_string(),
                    };
                    return Err(ApiError::invalid(
                        "",
                        "",
                        &format!(
                            "patch: Invalid value: {shown:?}: strict decoding error: {}",
                            unknown.listed()
                        ),
                    ));
                }
                Verdict::Write {
                    warnings: found, ..
                } => warnings = found,
            }
        }
        if patched_rv.is_none() {
            next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        }
        match apply_update(app, t, name, next, Some(&manager), mode).await {
            Err(e) if e.code == 409 && patched_rv.is_none() => continue,
            other => return other.map(|response| with_warnings(response, &warnings)),
        }
    }
    Err(ApiError::keeps_changing(&t.rt.group, &t.rt.plural, name))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::same_but_version;
    use serde_json::json;

    #[test]
    fn objects_are_the_same_when_only_their_resource_version_differs() {
        let base = json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"v": 1}});
        let cases = [
            (
                json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "2"}, "spec": {"v": 1}}),
                true,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "a"}, "spec": {"v": 1}}),
                true,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"v": 2}}),
                false,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "1", "labels": {}}, "spec": {"v": 1}}),
                false,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "b", "resourceVersion": "1"}, "spec": {"v": 1}}),
                false,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "1"}}),
                false,
            ),
            (
                json!({"kind": "X", "metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"v": 1}, "status": {}}),
                false,
            ),
            (
                json!({"kind": "X", "metadata": "a", "spec": {"v": 1}}),
                false,
            ),
        ];
        for (other, same) in cases {
            assert_eq!(same_but_version(&base, &other), same, "{other}");
            assert_eq!(same_but_version(&other, &base), same, "{other}");
        }
    }
}
