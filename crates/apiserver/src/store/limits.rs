//! What the store refuses to keep: objects larger than etcd stores, or nested deeper than
//! can be read back.

use serde_json::Value;

/// Deepest object accepted (levels of objects and arrays). serde_json reads back 127.
pub const MAX_DEPTH: usize = 100;

/// etcd's default `--max-request-bytes` (1.5 MiB): a real cluster cannot store a larger
/// object, so neither does this server (our own controllers must notice).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// The size an object takes in etcd: kube-apiserver stores built-in kinds as protobuf and
/// custom resources as JSON.
pub(super) fn etcd_size(object: &Value) -> usize {
    match crate::protobuf::encode_object(object) {
        Ok(bytes) => bytes.len(),
        Err(_) => serde_json::to_vec(object).map_or(usize::MAX, |v| v.len()),
    }
}

/// Levels of objects and arrays, counted without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, level)) = stack.pop() {
        match v {
            Value::Object(map) => {
                deepest = deepest.max(level);
                stack.extend(map.values().map(|c| (c, level + 1)));
            }
            Value::Array(items) => {
                deepest = deepest.max(level);
                stack.extend(items.iter().map(|c| (c, level + 1)));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }
    deepest
}
