//! `…/{plural}/{name}/scale` for custom resources whose definition declares a scale
//! subresource, as kube-apiserver serves it: an `autoscaling/v1` Scale whose `spec.replicas`
//! and `status.replicas` are read from (and `spec.replicas` written to) the declared paths, so
//! `kubectl scale` works. Get, update and patch (merge, JSON, strategic); a negative count is
//! refused.

use super::*;

/// The declared paths, from a definition's `subresources.scale`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// `specReplicasPath` (`.spec.replicas`).
    pub spec: String,
    /// `statusReplicasPath` (`.status.replicas`).
    pub status: String,
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
}

fn read(object: &Value, path: &str) -> Value {
    let mut cur = object;
    for part in segments(path) {
        cur = &cur[part];
    }
    cur.clone()
}

fn write(object: &mut Value, path: &str, value: Value) {
    let parts: Vec<&str> = segments(path).collect();
    let mut cur = object;
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            cur[*part] = value;
            return;
        }
        if !cur[*part].is_object() {
            cur[*part] = json!({});
        }
        cur = &mut cur[*part];
    }
}

/// The Scale of `object`.
pub(crate) fn scale_of(paths: &ScalePaths, object: &Value) -> Value {
    let meta = &object["metadata"];
    let mut metadata = json!({
        "name": meta["name"],
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
        "creationTimestamp": meta["creationTimestamp"],
    });
    if !meta["namespace"].is_null() {
        metadata["namespace"] = meta["namespace"].clone();
    }
    let count = |v: Value| if v.is_i64() { v } else { json!(0) };
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": metadata,
        "spec": {"replicas": count(read(object, &paths.spec))},
        "status": {"replicas": count(read(object, &paths.status))},
    })
}

/// Serves a scale request on `t` (whose type declares `paths`).
pub(crate) async fn scale(
    app: &Shared,
    method: &Method,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    body: Bytes,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let Some(paths) = t.rt.scale.as_ref() else {
        return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name));
    };
    let ns = t.namespace.clone().unwrap_or_default();
    let get = || {
        app.store
            .get(&t.rt.key(), &ns, name)
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))
    };
    if method == Method::GET {
        return Ok(json_response(StatusCode::OK, &scale_of(paths, &*get()?)));
    }
    let request = parse_body(&body)?;
    let kind = if method == Method::PATCH {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        Some(PatchKind::from_content_type(content_type)?)
    } else {
        None
    };
    // The object itself, not its status, takes the new count.
    let whole = Target {
        subresource: None,
        ..t.clone()
    };
    // Changed from the newest version, durable or not (the one the write checks).
    for _ in 0..super::PATCH_TRIES {
        let current = app
            .store
            .newest(&t.rt.key(), &ns, name)
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        let before = scale_of(paths, &current);
        let wanted = match kind {
            None => request.clone(),
            Some(kind) => patch::apply(kind, &before, &request).map_err(|e| match e {
                PatchError::Parse(message) => ApiError::bad_request(message),
                PatchError::TooLarge(message) => ApiError::too_large_because(message),
                PatchError::Apply(_) => ApiError::invalid("Scale", name, &e.to_string()),
            })?,
        };
        let replicas = wanted["spec"]["replicas"]
            .as_i64()
            .ok_or_else(|| ApiError::invalid("Scale", name, "spec.replicas: Required value"))?;
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale",
                name,
                &format!(
                    "spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"
                ),
            ));
        }
        let precondition = wanted["metadata"]["resourceVersion"]
            .as_str()
            .filter(|rv| !rv.is_empty() && kind.is_none())
            .map(str::to_string);
        let mut next = (*current).clone();
        write(&mut next, &paths.spec, json!(replicas));
        next["metadata"]["resourceVersion"] = match &precondition {
            Some(rv) => json!(rv),
            None => current["metadata"]["resourceVersion"].clone(),
        };
        match update_object(app, &whole, name, next, Some("kubectl"), mode).await {
            Err(e) if e.code == 409 && precondition.is_none() => continue,
            Err(e) => return Err(e),
            // The object as written (or as a dry run would write it).
            Ok((object, _)) => return Ok(json_response(StatusCode::OK, &scale_of(paths, &object))),
        }
    }
    Err(ApiError::keeps_changing(&t.rt.group, &t.rt.plural, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_reads_and_writes_the_declared_paths() {
        let paths = ScalePaths {
            spec: ".spec.maximumReplicas".into(),
            status: ".status.replicas".into(),
        };
        let mut object = json!({"metadata": {"name": "pool", "uid": "u", "resourceVersion": "7"}, "spec": {"maximumReplicas": 10}, "status": {"replicas": 4}});
        let s = scale_of(&paths, &object);
        assert_eq!(s["kind"], "Scale");
        assert_eq!(
            (
                s["spec"]["replicas"].clone(),
                s["status"]["replicas"].clone()
            ),
            (json!(10), json!(4))
        );
        assert_eq!(s["metadata"]["resourceVersion"], "7");
        write(&mut object, &paths.spec, json!(3));
        assert_eq!(object["spec"]["maximumReplicas"], 3);
        let mut empty = json!({"metadata": {"name": "x"}});
        write(&mut empty, ".spec.deep.count", json!(1));
        assert_eq!(empty["spec"]["deep"]["count"], 1);
        assert_eq!(
            scale_of(&paths, &empty)["spec"]["replicas"],
            0,
            "no count yet reads as 0"
        );
    }
}
