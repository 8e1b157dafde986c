//! Server-side apply (`kubectl apply --server-side`): each field manager owns the fields of
//! the configuration it applied (recorded in `metadata.managedFields` as FieldsV1); applying
//! a value another manager owns is a 409 conflict listing the fields, unless forced, which
//! takes them over; fields a manager applied before and no longer applies are removed unless
//! another manager owns them too.
//!
//! Field sets follow FieldsV1: `f:<name>` for an object's field, `k:{"name":"x"}` for a list
//! item by its merge key, `v:<json>` for a member of a set list, `.` for the item itself.

use axum::response::Response;
use serde_json::{Map, Value, json};

use crate::objects::now_rfc3339;
use crate::patch::{self, merge_key};
use crate::server::{Query, Shared, Target, apply_update, create_object};
use crate::status::{ApiError, Cause};

/// Metadata that is the server's, never owned by a manager.
const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// One path of a field set, as FieldsV1 keys.
pub type Path = Vec<String>;

/// The FieldsV1 set of an applied configuration.
pub fn field_set(config: &Value) -> Value {
    let Value::Object(map) = config else {
        return json!({});
    };
    let mut out = Map::new();
    for (k, v) in map {
        if k == "apiVersion" || k == "kind" || k.starts_with('$') {
            continue;
        }
        let inner = if k == "metadata" {
            let mut meta = v.clone();
            if let Some(m) = meta.as_object_mut() {
                m.retain(|key, _| !SYSTEM_METADATA.contains(&key.as_str()));
                if m.is_empty() {
                    continue;
                }
            }
            fields_of(&meta, k)
        } else {
            fields_of(v, k)
        };
        out.insert(format!("f:{k}"), inner);
    }
    Value::Object(out)
}

fn fields_of(value: &Value, name: &str) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if !k.starts_with('$') {
                    out.insert(format!("f:{k}"), fields_of(v, k));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Map::new();
            match merge_key(name) {
                Some(key) if items.iter().all(Value::is_object) => {
                    for item in items {
                        let Some(id) = item.get(key) else { continue };
                        let mut inner = match fields_of(item, name) {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        inner.insert(".".into(), json!({}));
                        out.insert(format!("k:{}", json!({ key: id })), Value::Object(inner));
                    }
                }
                _ if name == "finalizers" => {
                    for item in items {
                        out.insert(format!("v:{item}"), json!({}));
                    }
                }
                // Any other list is atomic: owned as a whole.
                _ => {}
            }
            Value::Object(out)
        }
        _ => json!({}),
    }
}

/// The leaves of a field set: paths to fields (and to list items, ending in `.`).
pub fn leaves(set: &Value) -> Vec<Path> {
    let mut out = Vec::new();
    collect(set, &mut Vec::new(), &mut out);
    out
}

fn collect(set: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
    let Value::Object(map) = set else { return };
    if map.is_empty() && !prefix.is_empty() {
        out.push(prefix.clone());
        return;
    }
    for (k, v) in map {
        prefix.push(k.clone());
        if k == "." {
            out.push(prefix.clone());
        } else {
            collect(v, prefix, out);
        }
        prefix.pop();
    }
}

/// The value at a path in an object, if it is there.
pub fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut current = object;
    for segment in path {
        current = step(current, segment)?;
    }
    Some(current)
}

fn step<'a>(value: &'a Value, segment: &str) -> Option<&'a Value> {
    if segment == "." {
        return Some(value);
    }
    if let Some(field) = segment.strip_prefix("f:") {
        return value.get(field);
    }
    let items = value.as_array()?;
    if let Some(key) = segment.strip_prefix("k:") {
        let key: Value = serde_json::from_str(key).ok()?;
        let key = key.as_object()?;
        return items
            .iter()
            .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)));
    }
    if let Some(member) = segment.strip_prefix("v:") {
        let member: Value = serde_json::from_str(member).ok()?;
        return items.iter().find(|item| **item == member);
    }
    None
}

/// Removes the field or list item at `path`.
fn remove_at(object: &mut Value, path: &[String]) {
    let (last, parent_path) = match path {
        [parent @ .., last] if last == "." => match parent {
            [grand @ .., item] => (item.as_str(), grand),
            [] => return,
        },
        [parent @ .., last] => (last.as_str(), parent),
        [] => return,
    };
    let mut parent = object;
    for segment in parent_path {
        let next = if let Some(field) = segment.strip_prefix("f:") {
            parent.get_mut(field)
        } else {
            let found = step(parent, segment).cloned();
            parent
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|i| Some(&**i) == found.as_ref()))
        };
        let Some(next) = next else { return };
        parent = next;
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = parent.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(found) = step(parent, last).cloned()
        && let Some(items) = parent.as_array_mut()
    {
        items.retain(|i| *i != found);
    }
}

/// A path written as kube-apiserver writes it in conflicts (`.spec.containers[name="a"].image`).
pub fn describe(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if let Some(field) = segment.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = segment.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).unwrap_or(Value::Null);
            let parts: Vec<String> = key
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(member) = segment.strip_prefix("v:") {
            out.push_str(&format!("[={member}]"));
        }
    }
    out
}

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
pub struct Manager {
    /// The manager's name.
    pub name: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// The apiVersion it wrote in.
    pub api_version: String,
    /// The leaves it owns.
    pub owned: Vec<Path>,
    /// The entry as stored (time, subresource...).
    pub entry: Value,
}

/// Reads `metadata.managedFields`.
pub fn managers(object: &Value) -> Vec<Manager> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|e| Manager {
                    name: e["manager"].as_str().unwrap_or_default().to_string(),
                    operation: e["operation"].as_str().unwrap_or_default().to_string(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
                    owned: leaves(&e["fieldsV1"]),
                    entry: e.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A field another manager owns with another value.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    /// The other manager.
    pub manager: String,
    /// Its operation and apiVersion, for the message.
    pub operation: String,
    /// Its apiVersion.
    pub api_version: String,
    /// The field.
    pub path: Path,
}

/// What an apply decides: the object to store and the conflicts (empty when it may go on).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The object with the configuration merged in and field ownership updated.
    pub object: Value,
    /// Fields owned by other managers with other values (refused unless forced).
    pub conflicts: Vec<Conflict>,
}

/// Applies `config` for `manager` to `live` (pure).
pub fn decide(
    live: &Value,
    config: &Value,
    manager: &str,
    api_version: &str,
    force: bool,
) -> Outcome {
    let set = field_set(config);
    let applied = leaves(&set);
    let mut others = managers(live);
    let previous: Vec<Path> = others
        .iter()
        .filter(|m| m.name == manager && m.operation == "Apply")
        .flat_map(|m| m.owned.clone())
        .collect();
    others.retain(|m| !(m.name == manager && m.operation == "Apply"));
    let mut conflicts = Vec::new();
    for path in &applied {
        if path.last().is_some_and(|s| s == ".") {
            continue;
        }
        let differs = value_at(live, path).is_some_and(|v| Some(v) != value_at(config, path));
        if !differs {
            continue;
        }
        for other in &others {
            if other.owned.contains(path) {
                conflicts.push(Conflict {
                    manager: other.name.clone(),
                    operation: other.operation.clone(),
                    api_version: other.api_version.clone(),
                    path: path.clone(),
                });
            }
        }
    }
    if force {
        for other in &mut others {
            other
                .owned
                .retain(|p| !conflicts.iter().any(|c| &c.path == p));
        }
    }
    let mut object = live.clone();
    patch::strategic(&mut object, config);
    for path in previous.iter().filter(|p| !applied.contains(p)) {
        let shared = others.iter().any(|m| m.owned.contains(path));
        if !shared {
            remove_at(&mut object, path);
        }
    }
    let mut entries: Vec<Value> = Vec::new();
    entries.push(json!({
        "manager": manager, "operation": "Apply", "apiVersion": api_version,
        "time": now_rfc3339(), "fieldsType": "FieldsV1", "fieldsV1": set,
    }));
    for other in others {
        if other.owned.is_empty() {
            continue;
        }
        let mut entry = other.entry;
        entry["fieldsV1"] = set_from_leaves(&other.owned);
        entries.push(entry);
    }
    object["metadata"]["managedFields"] = Value::Array(entries);
    if force {
        conflicts.clear();
    }
    Outcome { object, conflicts }
}

fn set_from_leaves(leaves: &[Path]) -> Value {
    let mut root = json!({});
    for path in leaves {
        let mut node = &mut root;
        for segment in path {
            node = match node {
                Value::Object(map) => map.entry(segment.clone()).or_insert(json!({})),
                _ => break,
            };
        }
    }
    root
}

/// The 409 kube-apiserver answers for conflicts.
pub fn conflict_error(conflicts: &[Conflict]) -> ApiError {
    let describe_one = |c: &Conflict| {
        if c.operation == "Apply" {
            format!("conflict with {:?}", c.manager)
        } else {
            format!("conflict with {:?} using {}", c.manager, c.api_version)
        }
    };
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{}: {}", describe_one(c), describe(&c.path)))
        .collect();
    let plural = if conflicts.len() == 1 { "" } else { "s" };
    let message = format!(
        "Apply failed with {} conflict{plural}: {}",
        conflicts.len(),
        lines.join("\n")
    );
    ApiError::conflict_with_causes(
        message,
        conflicts
            .iter()
            .map(|c| Cause {
                reason: "FieldManagerConflict",
                message: describe_one(c),
                field: Some(describe(&c.path)),
            })
            .collect(),
    )
}

/// Records a plain update (PUT or a patch that is not an apply) by `manager` on an object
/// whose fields are managed (someone applied it): the fields the update changed become the
/// manager's (an `Update` entry) and no longer any other manager's, so a later apply of
/// another value conflicts with it, as in kube-apiserver. An update that changes nothing, or an
/// object nobody applied, is left as it is.
pub fn record_update(old: &Value, new: &mut Value, manager: &str, api_version: &str) {
    let mut entries = managers(new);
    if entries.is_empty() {
        return;
    }
    // Sets: an object has many leaves, and this runs inside the store's write.
    let before: std::collections::BTreeSet<Path> = leaves(&field_set(old)).into_iter().collect();
    let after: std::collections::BTreeSet<Path> = leaves(&field_set(new)).into_iter().collect();
    let changed: std::collections::BTreeSet<Path> = after
        .iter()
        .filter(|p| value_at(old, p) != value_at(new, p))
        .cloned()
        .collect();
    let removed: std::collections::BTreeSet<&Path> = before.difference(&after).collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    for entry in &mut entries {
        entry
            .owned
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    let mine = entries
        .iter()
        .position(|m| m.name == manager && m.operation == "Update");
    let index = match mine {
        Some(i) => i,
        None => {
            entries.push(Manager {
                name: manager.to_string(),
                operation: "Update".into(),
                api_version: api_version.to_string(),
                owned: Vec::new(),
                entry: json!({"manager": manager, "operation": "Update", "apiVersion": api_version, "fieldsType": "FieldsV1"}),
            });
            entries.len() - 1
        }
    };
    let owned: std::collections::BTreeSet<Path> = entries[index].owned.iter().cloned().collect();
    entries[index]
        .owned
        .extend(changed.into_iter().filter(|p| !owned.contains(p)));
    entries[index].entry["time"] = json!(now_rfc3339());
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|m| !m.owned.is_empty())
        .map(|m| {
            let mut entry = m.entry;
            entry["fieldsV1"] = set_from_leaves(&m.owned);
            entry
        })
        .collect();
    // Nobody owns anything any more: the field goes, as kube-apiserver leaves it out.
    match new["metadata"].as_object_mut() {
        Some(meta) if list.is_empty() => {
            meta.remove("managedFields");
        }
        _ => new["metadata"]["managedFields"] = Value::Array(list),
    }
}

/// The field manager of a request that is not an apply: `fieldManager`, else the program name
/// of its User-Agent (as kube-apiserver derives it).
pub fn update_manager(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    field_manager
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .or_else(|| {
            user_agent
                .and_then(|ua| ua.split('/').next())
                .filter(|p| !p.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// PATCH with `application/apply-patch+yaml`.
pub(crate) async fn server_side_apply(
    app: &Shared,
    t: &Target,
    name: &str,
    query: &Query,
    config: Value,
) -> Result<Response, ApiError> {
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid(
            "PatchOptions",
            "",
            "fieldManager: Required value: is required for apply patch",
        ));
    };
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    if config["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n != name)
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            config["metadata"]["name"]
        )));
    }
    let force = query.flag("force");
    let api_version = t.rt.api_version();
    let ns = t.namespace.clone().unwrap_or_default();
    for _ in 0..5 {
        let Some(live) = app.store.get(&t.rt.key(), &ns, name) else {
            // Applying to a subresource of a missing object creates nothing: 404, as
            // kube-apiserver answers.
            if t.subresource.is_some() {
                return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name));
            }
            let mut object = config.clone();
            object["metadata"]["name"] = json!(name);
            let managed = json!([{
                "manager": manager, "operation": "Apply", "apiVersion": api_version,
                "time": now_rfc3339(), "fieldsType": "FieldsV1", "fieldsV1": field_set(&config),
            }]);
            match create_object(app, t, query, object, Some(managed)).await {
                Err(e) if e.code == 409 => continue,
                other => return other,
            }
        };
        let outcome = decide(&live, &config, manager, &api_version, force);
        if !outcome.conflicts.is_empty() {
            return Err(conflict_error(&outcome.conflicts));
        }
        let mut object = outcome.object;
        object["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
        match apply_update(app, t, name, object, None).await {
            Err(e) if e.code == 409 && e.extra.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::keeps_changing(&t.rt.group, &t.rt.plural, name))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"app": "d"}},
               "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
    }

    #[test]
    fn field_sets_are_written_as_fields_v1() {
        let set = field_set(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "labels": {"a": "b"}, "finalizers": ["x"]},
            "data": {"k": "v"}, "spec": {"containers": [{"name": "n", "image": "i"}], "args": ["a"]}}));
        assert_eq!(
            set,
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"x\"": {}}},
                "f:data": {"f:k": {}},
                "f:spec": {"f:containers": {"k:{\"name\":\"n\"}": {".": {}, "f:name": {}, "f:image": {}}}, "f:args": {}}
            })
        );
        let paths: Vec<String> = leaves(&set).iter().map(|p| describe(p)).collect();
        assert!(
            paths.contains(&".spec.containers[name=\"n\"].image".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&".metadata.finalizers[=\"x\"]".to_string()),
            "{paths:?}"
        );
        assert!(paths.contains(&".spec.args".to_string()), "{paths:?}");
    }

    #[test]
    fn applies_conflict_on_values_other_managers_own_unless_forced() {
        let first = decide(
            &json!({"metadata": {"name": "d"}}),
            &deployment(1, "a:1"),
            "a",
            "apps/v1",
            false,
        );
        assert!(first.conflicts.is_empty());
        let live = first.object;
        // The same values under another manager: shared ownership, no conflict.
        let same = decide(&live, &deployment(1, "a:1"), "b", "apps/v1", false);
        assert!(same.conflicts.is_empty());
        // Another value: a conflict for each field, naming the owner.
        let other = decide(&live, &deployment(2, "a:2"), "b", "apps/v1", false);
        let described: Vec<String> = other
            .conflicts
            .iter()
            .map(|c| format!("{} {}", c.manager, describe(&c.path)))
            .collect();
        assert_eq!(
            described,
            vec![
                "a .spec.replicas",
                "a .spec.template.spec.containers[name=\"app\"].image"
            ]
        );
        let error = conflict_error(&other.conflicts);
        assert_eq!(error.code, 409);
        assert!(
            error
                .message
                .starts_with("Apply failed with 2 conflicts: conflict with \"a\": .spec.replicas"),
            "{}",
            error.message
        );
        // Forced: b takes the fields over; a keeps the rest.
        let forced = decide(&live, &deployment(2, "a:2"), "b", "apps/v1", true);
        assert!(forced.conflicts.is_empty());
        assert_eq!(forced.object["spec"]["replicas"], 2);
        let owners = managers(&forced.object);
        let a = owners.iter().find(|m| m.name == "a").unwrap();
        assert!(!a.owned.iter().any(|p| describe(p) == ".spec.replicas"));
        assert!(
            a.owned
                .iter()
                .any(|p| describe(p) == ".metadata.labels.app")
        );
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_so_a_later_apply_conflicts() {
        let live = decide(&json!({}), &deployment(1, "a:1"), "alice", "apps/v1", false).object;
        let mut edited = live.clone();
        edited["spec"]["replicas"] = json!(3);
        record_update(&live, &mut edited, "kubectl-edit", "apps/v1");
        let owners = managers(&edited);
        let editor = owners.iter().find(|m| m.name == "kubectl-edit").unwrap();
        assert_eq!(editor.operation, "Update");
        let owned: Vec<String> = editor.owned.iter().map(|p| describe(p)).collect();
        assert_eq!(owned, [".spec.replicas"]);
        let alice = owners.iter().find(|m| m.name == "alice").unwrap();
        assert!(!alice.owned.iter().any(|p| describe(p) == ".spec.replicas"));
        let again = decide(&edited, &deployment(1, "a:1"), "alice", "apps/v1", false);
        assert_eq!(
            conflict_error(&again.conflicts).message,
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: .spec.replicas"
        );
        // Nothing changed, or nobody applied: left as it is.
        let mut same = edited.clone();
        record_update(&edited, &mut same, "other", "apps/v1");
        assert_eq!(same, edited);
        let mut plain = json!({"spec": {"replicas": 1}});
        let old = plain.clone();
        plain["spec"]["replicas"] = json!(2);
        record_update(&old, &mut plain, "other", "apps/v1");
        assert!(plain["metadata"]["managedFields"].is_null());
        assert_eq!(
            update_manager(None, Some("kubectl-edit/v1.32.0 (linux/amd64)")),
            "kubectl-edit"
        );
        assert_eq!(update_manager(Some("mine"), Some("kubectl/v1")), "mine");
    }

    #[test]
    fn an_update_that_removes_every_owned_field_leaves_no_field_ownership() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "m"}, "data": {"k": "v"}});
        let live = decide(&json!({}), &config, "alice", "v1", false).object;
        assert_eq!(managers(&live).len(), 1);
        let mut emptied = live.clone();
        if let Some(meta) = emptied["metadata"].as_object_mut() {
            meta.remove("name");
        }
        if let Some(object) = emptied.as_object_mut() {
            object.remove("data");
            object.remove("apiVersion");
            object.remove("kind");
        }
        record_update(&live, &mut emptied, "editor", "v1");
        assert!(
            emptied["metadata"].get("managedFields").is_none(),
            "{}",
            emptied["metadata"]
        );
    }

    #[test]
    fn fields_a_manager_stops_applying_are_removed_unless_shared() {
        let live = decide(
            &json!({}),
            &json!({"metadata": {"labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}}),
            "a",
            "v1",
            false,
        )
        .object;
        let live = decide(
            &live,
            &json!({"metadata": {"labels": {"y": "2"}}}),
            "b",
            "v1",
            false,
        )
        .object;
        let after = decide(&live, &json!({"data": {"k": "v"}}), "a", "v1", false).object;
        assert_eq!(
            after["metadata"]["labels"],
            json!({"y": "2"}),
            "x removed, y kept (b owns it)"
        );
        assert_eq!(after["data"], json!({"k": "v"}));
        let items = decide(
            &json!({}),
            &json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
            "m",
            "v1",
            false,
        )
        .object;
        let fewer = decide(
            &items,
            &json!({"spec": {"containers": [{"name": "a"}]}}),
            "m",
            "v1",
            false,
        )
        .object;
        assert_eq!(fewer["spec"]["containers"], json!([{"name": "a"}]));
    }
}
