//! Reads: lists (selectors, resourceVersion semantics, pages from one snapshot).

use super::*;

/// Checks a list's `resourceVersion`/`resourceVersionMatch`; a version the store has not
/// reached is waited for, as kube-apiserver's watch cache does.
pub(crate) async fn list_version_reached(app: &App, query: &Query) -> Result<(), ApiError> {
    use crate::list_versions::{ListAt, decide, refusal};
    let check = || {
        let current = app.store.current_rv();
        let at = decide(
            query.get("resourceVersion"),
            query.get("resourceVersionMatch"),
            current,
        );
        (at, current)
    };
    let (mut at, mut current) = check();
    if let ListAt::NotYet(rv) = at {
        app.store
            .wait_visible(rv, crate::store::FUTURE_VERSION_WAIT)
            .await;
        (at, current) = check();
    }
    refusal(&at, current).map_or(Ok(()), Err)
}

pub(crate) fn selectors(
    query: &Query,
    rt: &ResourceType,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), rt)
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

pub(crate) fn list(
    app: &App,
    t: &Target,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    use crate::list_versions::{Continue, expired_continue};
    let (labels, fields) = selectors(query, &t.rt)?;
    let continued = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(Continue::decode(token)?),
        None => None,
    };
    if continued.is_some() && query.get("resourceVersion").is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let (items, rv) = match &continued {
        Some(c) => {
            let items = app
                .store
                .list_at(&t.rt.key(), t.namespace.as_deref(), c.rv)
                .map_err(|e| match e {
                    crate::store::ResumeError::Gone(_) => expired_continue(),
                    crate::store::ResumeError::TooLarge(_) => ApiError::bad_request(
                        "continue key is not valid: its version is newer than this server's",
                    ),
                })?;
            (items, c.rv)
        }
        None => app.store.list(&t.rt.key(), t.namespace.as_deref()),
    };
    let list_key = |o: &Value| {
        format!(
            "{}\u{0}{}",
            o["metadata"]["namespace"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    let after = continued.map(|c| c.after);
    let items: Vec<Arc<Value>> = items
        .into_iter()
        .filter(|o| labels.matches_object(o) && fields.matches(o))
        .filter(|o| {
            after
                .as_ref()
                .is_none_or(|a| list_key(o).as_str() > a.as_str())
        })
        .collect();
    if wants_table(headers) {
        return Ok(json_response(StatusCode::OK, &table(&t.rt, &items, rv)));
    }
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page: Vec<Arc<Value>> = items
        .iter()
        .take(limit)
        .map(|item| crate::event_versions::served(&t.rt, item.clone()))
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(last) = page.last().filter(|_| page.len() < items.len()) {
        let token = Continue {
            rv,
            after: list_key(last),
        };
        metadata["continue"] = json!(token.encode());
        metadata["remainingItemCount"] = json!(items.len() - page.len());
    }
    let page: Vec<&Value> = page.iter().map(AsRef::as_ref).collect();
    let body = json!({
        "kind": format!("{}List", t.rt.kind),
        "apiVersion": t.rt.api_version(),
        "metadata": metadata,
        "items": page,
    });
    Ok(json_response(StatusCode::OK, &body))
}
