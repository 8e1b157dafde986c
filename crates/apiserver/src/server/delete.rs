//! Deletes: preconditions, finalizers, the namespace cascade, delete-collection.

use super::*;

/// Deletes an object, or marks it as being deleted. Returns the object as it now is (the
/// deleted one with its last resourceVersion) and the change made, if any, whose JSON answers.
pub(crate) async fn delete(
    app: &Shared,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    body: &Bytes,
) -> Result<(Arc<Value>, Option<Arc<Change>>), ApiError> {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(body)?
    };
    let pre_uid = options["preconditions"]["uid"].as_str().map(str::to_string);
    let pre_rv = options["preconditions"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    let is_namespace = rt.plural == "namespaces";
    let Written { object, change, rv } =
        app.store.write_change(&rt.key(), ns, name, |current, _| {
            let Some(current) = current else {
                return Err(ApiError::not_found(&rt.group, &rt.plural, name));
            };
            if let Some(uid) = &pre_uid
                && current["metadata"]["uid"].as_str() != Some(uid.as_str())
            {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        current["metadata"]["uid"].as_str().unwrap_or("")
                    ),
                ));
            }
            if let Some(want) = &pre_rv
                && current["metadata"]["resourceVersion"].as_str() != Some(want.as_str())
            {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    name,
                    "Precondition failed: the resourceVersion does not match",
                ));
            }
            if rt.group.is_empty() && rt.plural == "pods" {
                let grace =
                    objects::pod_grace_seconds(current, options["gracePeriodSeconds"].as_i64());
                if grace > 0 {
                    return Ok(match objects::graceful_deletion(current, grace) {
                        Some(next) => Write2::Put(next),
                        None => Write2::Keep,
                    });
                }
            }
            let has_finalizers = current["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            if has_finalizers || is_namespace {
                if !current["metadata"]["deletionTimestamp"].is_null() {
                    return Ok(Write2::Keep);
                }
                let mut next = current.clone();
                next["metadata"]["deletionTimestamp"] = json!(objects::now_rfc3339());
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                if is_namespace {
                    next["status"]["phase"] = json!("Terminating");
                }
                return Ok(Write2::Put(next));
            }
            Ok(Write2::Delete)
        })?;
    commit(app, rt, rv).await?;
    if is_namespace {
        finish_namespace(app.clone(), name.to_string());
    }
    let object = object.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    Ok((object, change))
}

/// Deletes everything in a terminating namespace, then the namespace once it is empty.
pub(crate) fn finish_namespace(app: Shared, namespace: String) {
    tokio::spawn(async move {
        for _ in 0..600 {
            let contents = app.store.in_namespace(&namespace);
            if contents.is_empty() {
                let _ = app.store.write("/namespaces", "", &namespace, |_, _| {
                    Ok::<_, ApiError>(Write2::Delete)
                });
                return;
            }
            for (resource, name) in contents {
                let Some(rt) = app.registry.all().into_iter().find(|t| t.key() == resource) else {
                    continue;
                };
                let _ = delete(&app, &rt, &namespace, &name, &Bytes::new()).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

pub(crate) async fn delete_collection(
    app: &Shared,
    t: &Target,
    query: &Query,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
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
        if let Ok((obj, _)) = delete(app, &t.rt, &ns, &name, &Bytes::new()).await {
            deleted.push((*obj).clone());
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.rt.kind), "apiVersion": t.rt.api_version(), "metadata": {}, "items": deleted}),
    ))
}
