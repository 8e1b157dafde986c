//! Server-side apply (`kubectl apply --server-side`): each field manager owns the fields of
//! the configuration it applied (recorded in `metadata.managedFields` as FieldsV1); applying
//! a value another manager owns is a 409 conflict listing the fields, unless forced, which
//! takes them over; fields a manager applied before and no longer applies are removed unless
//! another manager owns them too.
//!
//! Field sets follow FieldsV1: `f:<name>` for an object's field, `k:{"name":"x"}` for a list
//! item by its merge key, `v:<json>` for a member of a set list, `.` for the item itself.
//!
//! `fields.rs` holds the field sets, `managers.rs` the managedFields entries; this file decides
//! an apply and serves the request.

mod fields;
mod managers;

use std::collections::HashSet;

use axum::response::Response;
use serde_json::{Value, json};

pub use fields::{Path, describe, field_set, leaves, value_at};
pub use managers::{Manager, managers, record_update, update_manager};

use self::fields::{remove_at, set_from_leaves};
use crate::objects::now_rfc3339;
use crate::patch;
use crate::server::{Query, Shared, Target, WriteMode, apply_update, create_object};
use crate::status::{ApiError, Cause};

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
    // Sets, not lists, for every membership test: an apply of tens of thousands of fields
    // against as many owned ones stays linear.
    let mut conflicts = Vec::new();
    {
        let owned_by: Vec<HashSet<&Path>> =
            others.iter().map(|m| m.owned.iter().collect()).collect();
        for path in &applied {
            if path.last().is_some_and(|s| s == ".") {
                continue;
            }
            let differs = value_at(live, path).is_some_and(|v| Some(v) != value_at(config, path));
            if !differs {
                continue;
            }
            for (other, owned) in others.iter().zip(&owned_by) {
                if owned.contains(path) {
                    conflicts.push(Conflict {
                        manager: other.name.clone(),
                        operation: other.operation.clone(),
                        api_version: other.api_version.clone(),
                        path: path.clone(),
                    });
                }
            }
        }
    }
    if force {
        let taken: HashSet<Path> = conflicts.iter().map(|c| c.path.clone()).collect();
        for other in &mut others {
            other.owned.retain(|p| !taken.contains(p));
        }
    }
    let mut object = live.clone();
    patch::strategic(&mut object, config);
    let applied_set: HashSet<&Path> = applied.iter().collect();
    let shared: HashSet<&Path> = others.iter().flat_map(|m| &m.owned).collect();
    for path in previous.iter().filter(|p| !applied_set.contains(p)) {
        if !shared.contains(path) {
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

/// PATCH with `application/apply-patch+yaml`.
pub(crate) async fn server_side_apply(
    app: &Shared,
    t: &Target,
    name: &str,
    query: &Query,
    config: Value,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid_options(
            "PatchOptions",
            "fieldManager: Required value: is required for apply patch",
        ));
    };
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    // Its name is set in, and its managed fields written to, its metadata.
    if !(config["metadata"].is_object() || config["metadata"].is_null()) {
        return Err(ApiError::bad_request(
            "the metadata of the applied configuration must be an object",
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
    // An applied field the kind does not have is refused, whatever `fieldValidation` says, as
    // kube-apiserver's typed apply refuses it (a custom resource's are left to its schema).
    if t.rt.schema.is_none()
        && let Some(schema) = crate::unknown_fields::schema_of(&t.rt)
        && let Some(first) = crate::unknown_fields::find(&schema, &mut config.clone(), None, false)
            .named
            .first()
    {
        let group_version = format!("{}/{}", t.rt.group, t.rt.version);
        return Err(ApiError::internal(format!(
            "failed to create typed patch object ({}/{name}; {group_version}, Kind={}): .{first}: field not declared in schema",
            t.namespace.as_deref().unwrap_or_default(),
            t.rt.kind,
        )));
    }
    let force = query.flag("force");
    let api_version = t.rt.api_version();
    let ns = t.namespace.clone().unwrap_or_default();
    // Applied to the newest version, durable or not (the one the write checks).
    for _ in 0..crate::server::PATCH_TRIES {
        let live = app
            .store
            .newest(&t.rt.key(), &ns, name)
            .map(|stored| crate::event_versions::served(&t.rt, stored));
        let Some(live) = live else {
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
            match create_object(app, t, mode, object, Some(managed)).await {
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
        match apply_update(app, t, name, object, None, mode).await {
            Err(e) if e.code == 409 && e.extra.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::keeps_changing(&t.rt.group, &t.rt.plural, name))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
