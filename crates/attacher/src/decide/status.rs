//! The status writes (merge patches of the `status` subresource), as upstream writes them.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

/// Attached, with the driver's publish context replacing the `previous` metadata (a key the
/// context lacks is removed, as upstream's merge patch of the whole map removes it); any attach
/// error cleared.
pub fn attached(
    previous: Option<&BTreeMap<String, String>>,
    publish_context: &HashMap<String, String>,
) -> Value {
    let metadata = if publish_context.is_empty() {
        Value::Null
    } else {
        let mut map: serde_json::Map<String, Value> = publish_context
            .iter()
            .map(|(key, value)| (key.clone(), json!(value)))
            .collect();
        for gone in previous
            .into_iter()
            .flat_map(BTreeMap::keys)
            .filter(|key| !publish_context.contains_key(*key))
        {
            map.insert(gone.clone(), Value::Null);
        }
        Value::Object(map)
    };
    json!({"status": {"attached": true, "attachmentMetadata": metadata, "attachError": null}})
}

/// An attach failure: when and why, and the gRPC code when asked for and known; without one,
/// a code an earlier failure left is removed (upstream replaces the whole error).
pub fn attach_error(time: &str, message: &str, code: Option<i32>) -> Value {
    let code = code.map_or(Value::Null, |code| json!(code));
    json!({"status": {"attachError": {"time": time, "message": message, "errorCode": code}}})
}

/// Detached: not attached, no metadata, no detach error.
pub fn detached() -> Value {
    json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
}

/// A detach failure.
pub fn detach_error(time: &str, message: &str) -> Value {
    json!({"status": {"detachError": {"time": time, "message": message}}})
}
