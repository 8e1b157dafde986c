//! `metadata.managedFields`: reading the managers of an object and recording a plain update
//! (a PUT or a patch that is not an apply) as the fields its manager now owns.

use serde_json::{Value, json};

use super::fields::{Path, field_set, leaves, set_from_leaves, value_at};
use crate::objects::now_rfc3339;

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
