//! JSON objects to protobuf messages and back, driven by the table in `schema.rs`.
//!
//! JSON is what the server stores; protobuf is converted at the boundary. Decoding follows
//! what kube-apiserver's Go types do with a protobuf body before writing JSON: a zero scalar
//! is dropped unless the Go field is a pointer or has no omitempty; an empty nested message
//! stays `{}`; a zero time is dropped.

use base64::Engine;
use serde_json::{Map, Value};

use super::schema::{Cardinality, Field, Kind, Message, Schema};
use super::wire::{self, Reader, WireError};
use crate::objects::rfc3339;

/// Why a message and a JSON object could not be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// The protobuf bytes are broken.
    #[error("{path}: {source}")]
    Read {
        /// Where.
        path: String,
        /// What.
        source: WireError,
    },
    /// The protobuf has a field this server does not know, with a value that is not zero.
    #[error(
        "{path}: field number {number} of {message} is not supported by this server's protobuf codec; send JSON"
    )]
    ReadUnknownField {
        /// Where.
        path: String,
        /// The message.
        message: String,
        /// The field number.
        number: u32,
    },
    /// A field arrived with a wire type its kind does not have, or bytes that are not its kind.
    #[error("{path}: not a valid {expected}")]
    ReadValue {
        /// Where.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The JSON object has a field the message does not have.
    #[error("{path}: no protobuf field for this JSON field")]
    WriteUnknownField {
        /// Where.
        path: String,
    },
    /// A JSON value is not of the field's type.
    #[error("{path}: expected {expected}")]
    WriteValue {
        /// Where.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
}

fn read_error(path: &str) -> impl Fn(WireError) -> ConvertError + '_ {
    move |source| ConvertError::Read {
        path: path.to_string(),
        source,
    }
}

/// Decodes `bytes` as `message` into a JSON object.
pub fn decode(
    schema: &Schema,
    message: &Message,
    bytes: &[u8],
    path: &str,
) -> Result<Map<String, Value>, ConvertError> {
    let mut object = Map::new();
    decode_into(schema, message, bytes, path, &mut object)?;
    Ok(object)
}

fn decode_into(
    schema: &Schema,
    message: &Message,
    bytes: &[u8],
    path: &str,
    object: &mut Map<String, Value>,
) -> Result<(), ConvertError> {
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.next_field().map_err(read_error(path))? {
        let Some(field) = message.by_number(number) else {
            if value.is_zero() {
                continue;
            }
            return Err(ConvertError::ReadUnknownField {
                path: path.to_string(),
                message: message.name.clone(),
                number,
            });
        };
        let here = format!("{path}.{}", field.json);
        match field.cardinality {
            Cardinality::One => {
                let v = decode_value(schema, &field.kind, value, &here)?;
                object.insert(field.json.clone(), v);
            }
            Cardinality::Repeated => {
                let list = object
                    .entry(field.json.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                let Value::Array(list) = list else {
                    continue;
                };
                match value {
                    wire::Value::Delimited(packed) if !field.kind.delimited() => {
                        for v in Reader::packed_varints(packed).map_err(read_error(&here))? {
                            list.push(decode_value(
                                schema,
                                &field.kind,
                                wire::Value::Varint(v),
                                &here,
                            )?);
                        }
                    }
                    _ => list.push(decode_value(schema, &field.kind, value, &here)?),
                }
            }
            Cardinality::Map => {
                let wire::Value::Delimited(entry) = value else {
                    return Err(ConvertError::ReadValue {
                        path: here,
                        expected: "map entry",
                    });
                };
                let (key, v) = decode_entry(schema, &field.kind, entry, &here)?;
                if let Value::Object(map) = object
                    .entry(field.json.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
                {
                    map.insert(key, v);
                }
            }
            Cardinality::Inline => {
                let (Kind::Message(name), wire::Value::Delimited(inner)) = (&field.kind, value)
                else {
                    return Err(ConvertError::ReadValue {
                        path: here,
                        expected: "embedded message",
                    });
                };
                let inner_message = lookup(schema, name, &here)?;
                decode_into(schema, inner_message, inner, path, object)?;
            }
        }
    }
    for field in &message.fields {
        if field.cardinality != Cardinality::One {
            continue;
        }
        let drop = match object.get(&field.json) {
            Some(Value::Null) => true,
            Some(v) => !field.keep_zero && is_zero_scalar(v),
            None => false,
        };
        if drop {
            object.remove(&field.json);
        }
    }
    Ok(())
}

fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_i64() == Some(0),
        _ => false,
    }
}

fn lookup<'a>(schema: &'a Schema, name: &str, path: &str) -> Result<&'a Message, ConvertError> {
    schema.message(name).ok_or_else(|| ConvertError::ReadValue {
        path: path.to_string(),
        expected: "message known to the table",
    })
}

fn decode_entry(
    schema: &Schema,
    kind: &Kind,
    bytes: &[u8],
    path: &str,
) -> Result<(String, Value), ConvertError> {
    let mut key = String::new();
    let mut value = None;
    let mut reader = Reader::new(bytes);
    while let Some((number, v)) = reader.next_field().map_err(read_error(path))? {
        match number {
            1 => {
                if let Value::String(s) = decode_value(schema, &Kind::String, v, path)? {
                    key = s;
                }
            }
            2 => value = Some(decode_value(schema, kind, v, path)?),
            _ => {}
        }
    }
    let value = match value {
        Some(v) => v,
        // An absent value is the zero value of the kind.
        None => decode_value(schema, kind, wire::Value::Delimited(&[]), path)
            .or_else(|_| decode_value(schema, kind, wire::Value::Varint(0), path))?,
    };
    Ok((key, value))
}

fn bytes_of<'a>(
    value: wire::Value<'a>,
    path: &str,
    expected: &'static str,
) -> Result<&'a [u8], ConvertError> {
    match value {
        wire::Value::Delimited(b) => Ok(b),
        _ => Err(ConvertError::ReadValue {
            path: path.to_string(),
            expected,
        }),
    }
}

fn varint_of(
    value: wire::Value<'_>,
    path: &str,
    expected: &'static str,
) -> Result<u64, ConvertError> {
    match value {
        wire::Value::Varint(v) => Ok(v),
        _ => Err(ConvertError::ReadValue {
            path: path.to_string(),
            expected,
        }),
    }
}

fn utf8(bytes: &[u8], path: &str) -> Result<String, ConvertError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ConvertError::ReadValue {
        path: path.to_string(),
        expected: "UTF-8 string",
    })
}

/// The (number → varint or bytes) fields of a small well-known message.
fn small_fields<'a>(
    bytes: &'a [u8],
    path: &str,
) -> Result<Vec<(u32, wire::Value<'a>)>, ConvertError> {
    let mut out = Vec::new();
    let mut reader = Reader::new(bytes);
    while let Some(field) = reader.next_field().map_err(read_error(path))? {
        out.push(field);
    }
    Ok(out)
}

fn decode_value(
    schema: &Schema,
    kind: &Kind,
    value: wire::Value<'_>,
    path: &str,
) -> Result<Value, ConvertError> {
    Ok(match kind {
        Kind::String => Value::String(utf8(bytes_of(value, path, "string")?, path)?),
        Kind::Bytes => Value::String(
            base64::engine::general_purpose::STANDARD.encode(bytes_of(value, path, "bytes")?),
        ),
        Kind::I32 => Value::from(i64::from(varint_of(value, path, "int32")? as u32 as i32)),
        Kind::I64 => Value::from(varint_of(value, path, "int64")? as i64),
        Kind::Bool => Value::Bool(varint_of(value, path, "bool")? != 0),
        Kind::Time | Kind::MicroTime => {
            let (mut seconds, mut nanos) = (0i64, 0i64);
            for (n, v) in small_fields(bytes_of(value, path, "time")?, path)? {
                match n {
                    1 => seconds = varint_of(v, path, "time seconds")? as i64,
                    2 => nanos = i64::from(varint_of(v, path, "time nanos")? as u32 as i32),
                    _ => {}
                }
            }
            format_time(seconds, nanos, *kind == Kind::MicroTime)
        }
        Kind::Quantity => {
            let mut text = String::new();
            for (n, v) in small_fields(bytes_of(value, path, "quantity")?, path)? {
                if n == 1 {
                    text = utf8(bytes_of(v, path, "quantity")?, path)?;
                }
            }
            Value::String(text)
        }
        Kind::IntOrString => {
            let (mut is_string, mut int, mut text) = (false, 0i64, String::new());
            for (n, v) in small_fields(bytes_of(value, path, "int-or-string")?, path)? {
                match n {
                    1 => is_string = varint_of(v, path, "int-or-string type")? == 1,
                    2 => int = i64::from(varint_of(v, path, "int-or-string intVal")? as u32 as i32),
                    3 => text = utf8(bytes_of(v, path, "int-or-string strVal")?, path)?,
                    _ => {}
                }
            }
            if is_string {
                Value::String(text)
            } else {
                Value::from(int)
            }
        }
        Kind::Fields => {
            let mut raw: &[u8] = b"{}";
            for (n, v) in small_fields(bytes_of(value, path, "fieldsV1")?, path)? {
                if n == 1 {
                    raw = bytes_of(v, path, "fieldsV1")?;
                }
            }
            serde_json::from_slice(raw).map_err(|_| ConvertError::ReadValue {
                path: path.to_string(),
                expected: "fieldsV1 holding JSON",
            })?
        }
        Kind::Extra => {
            let mut items = Vec::new();
            for (n, v) in small_fields(bytes_of(value, path, "extra value")?, path)? {
                if n == 1 {
                    items.push(Value::String(utf8(bytes_of(v, path, "string")?, path)?));
                }
            }
            Value::Array(items)
        }
        Kind::Message(name) => {
            let message = lookup(schema, name, path)?;
            Value::Object(decode(
                schema,
                message,
                bytes_of(value, path, "embedded message")?,
                path,
            )?)
        }
    })
}

fn format_time(seconds: i64, nanos: i64, micro: bool) -> Value {
    if seconds == 0 && nanos == 0 {
        return Value::Null;
    }
    let Ok(secs) = u64::try_from(seconds) else {
        return Value::Null;
    };
    let text = rfc3339(secs);
    if micro {
        let stem = text.trim_end_matches('Z');
        Value::String(format!("{stem}.{:06}Z", nanos.clamp(0, 999_999_999) / 1000))
    } else {
        Value::String(text)
    }
}

/// Seconds and nanoseconds of an RFC 3339 time (`Z` or a numeric offset, any fraction).
pub fn parse_time(text: &str) -> Option<(i64, i64)> {
    crate::time::parse(text, false).ok()
}

/// Encodes a JSON object as `message`. `skip` names top-level keys that travel elsewhere
/// (apiVersion and kind, which the envelope carries).
pub fn encode(
    schema: &Schema,
    message: &Message,
    object: &Map<String, Value>,
    skip: &[&str],
    path: &str,
) -> Result<Vec<u8>, ConvertError> {
    for key in object.keys() {
        if !skip.contains(&key.as_str()) && !knows(schema, message, key) {
            return Err(ConvertError::WriteUnknownField {
                path: format!("{path}.{key}"),
            });
        }
    }
    let mut out = Vec::new();
    encode_fields(schema, message, object, path, &mut out)?;
    Ok(out)
}

fn knows(schema: &Schema, message: &Message, key: &str) -> bool {
    message
        .fields
        .iter()
        .any(|f| match (&f.cardinality, &f.kind) {
            (Cardinality::Inline, Kind::Message(name)) => schema
                .message(name)
                .is_some_and(|inner| knows(schema, inner, key)),
            _ => f.json == key,
        })
}

fn encode_fields(
    schema: &Schema,
    message: &Message,
    object: &Map<String, Value>,
    path: &str,
    out: &mut Vec<u8>,
) -> Result<(), ConvertError> {
    for field in &message.fields {
        if field.cardinality == Cardinality::Inline {
            let Kind::Message(name) = &field.kind else {
                continue;
            };
            let inner = lookup(schema, name, path)?;
            let mut bytes = Vec::new();
            encode_fields(schema, inner, object, path, &mut bytes)?;
            wire::put_delimited(out, field.number, &bytes);
            continue;
        }
        let value = match object.get(&field.json) {
            None | Some(Value::Null) => continue,
            Some(v) => v,
        };
        let here = format!("{path}.{}", field.json);
        match field.cardinality {
            Cardinality::One | Cardinality::Inline => {
                encode_value(schema, field, value, &here, out)?;
            }
            Cardinality::Repeated => {
                let Value::Array(items) = value else {
                    return Err(ConvertError::WriteValue {
                        path: here,
                        expected: "a list",
                    });
                };
                for (i, item) in items.iter().enumerate() {
                    encode_value(schema, field, item, &format!("{here}[{i}]"), out)?;
                }
            }
            Cardinality::Map => {
                let Value::Object(map) = value else {
                    return Err(ConvertError::WriteValue {
                        path: here,
                        expected: "an object",
                    });
                };
                // Go writes map entries sorted by key; serde_json's map is sorted already.
                for (key, v) in map {
                    let mut entry = Vec::new();
                    wire::put_delimited(&mut entry, 1, key.as_bytes());
                    let value_field = Field {
                        json: key.clone(),
                        number: 2,
                        kind: field.kind.clone(),
                        cardinality: Cardinality::One,
                        keep_zero: true,
                    };
                    if !v.is_null() {
                        encode_value(
                            schema,
                            &value_field,
                            v,
                            &format!("{here}.{key}"),
                            &mut entry,
                        )?;
                    }
                    wire::put_delimited(out, field.number, &entry);
                }
            }
        }
    }
    Ok(())
}

fn expect_str<'a>(
    value: &'a Value,
    path: &str,
    expected: &'static str,
) -> Result<&'a str, ConvertError> {
    value.as_str().ok_or_else(|| ConvertError::WriteValue {
        path: path.to_string(),
        expected,
    })
}

fn integer(value: &Value, path: &str, expected: &'static str) -> Result<i64, ConvertError> {
    let n = match value {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    n.ok_or_else(|| ConvertError::WriteValue {
        path: path.to_string(),
        expected,
    })
}

fn encode_value(
    schema: &Schema,
    field: &Field,
    value: &Value,
    path: &str,
    out: &mut Vec<u8>,
) -> Result<(), ConvertError> {
    let number = field.number;
    match &field.kind {
        Kind::String => {
            wire::put_delimited(out, number, expect_str(value, path, "a string")?.as_bytes());
        }
        Kind::Bytes => {
            let text = expect_str(value, path, "base64 bytes")?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| ConvertError::WriteValue {
                    path: path.to_string(),
                    expected: "base64 bytes",
                })?;
            wire::put_delimited(out, number, &bytes);
        }
        Kind::I32 => {
            let n = integer(value, path, "a 32-bit integer")?;
            let n = i32::try_from(n).map_err(|_| ConvertError::WriteValue {
                path: path.to_string(),
                expected: "a 32-bit integer",
            })?;
            wire::put_varint_field(out, number, i64::from(n) as u64);
        }
        Kind::I64 => {
            let n = integer(value, path, "an integer")?;
            wire::put_varint_field(out, number, n as u64);
        }
        Kind::Bool => {
            let b = value.as_bool().ok_or_else(|| ConvertError::WriteValue {
                path: path.to_string(),
                expected: "a boolean",
            })?;
            wire::put_varint_field(out, number, u64::from(b));
        }
        Kind::Time | Kind::MicroTime => {
            let text = expect_str(value, path, "an RFC 3339 time")?;
            let (seconds, nanos) = parse_time(text).ok_or_else(|| ConvertError::WriteValue {
                path: path.to_string(),
                expected: "an RFC 3339 time",
            })?;
            let mut inner = Vec::new();
            wire::put_varint_field(&mut inner, 1, seconds as u64);
            wire::put_varint_field(&mut inner, 2, nanos as u64);
            wire::put_delimited(out, number, &inner);
        }
        Kind::Quantity => {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => {
                    return Err(ConvertError::WriteValue {
                        path: path.to_string(),
                        expected: "a quantity",
                    });
                }
            };
            let mut inner = Vec::new();
            wire::put_delimited(&mut inner, 1, text.as_bytes());
            wire::put_delimited(out, number, &inner);
        }
        Kind::IntOrString => {
            let mut inner = Vec::new();
            match value {
                Value::String(s) => {
                    wire::put_varint_field(&mut inner, 1, 1);
                    wire::put_varint_field(&mut inner, 2, 0);
                    wire::put_delimited(&mut inner, 3, s.as_bytes());
                }
                _ => {
                    let n = integer(value, path, "an integer or a string")?;
                    let n = i32::try_from(n).map_err(|_| ConvertError::WriteValue {
                        path: path.to_string(),
                        expected: "a 32-bit integer or a string",
                    })?;
                    wire::put_varint_field(&mut inner, 1, 0);
                    wire::put_varint_field(&mut inner, 2, i64::from(n) as u64);
                    wire::put_delimited(&mut inner, 3, b"");
                }
            }
            wire::put_delimited(out, number, &inner);
        }
        Kind::Fields => {
            let mut inner = Vec::new();
            wire::put_delimited(&mut inner, 1, value.to_string().as_bytes());
            wire::put_delimited(out, number, &inner);
        }
        Kind::Extra => {
            let Value::Array(items) = value else {
                return Err(ConvertError::WriteValue {
                    path: path.to_string(),
                    expected: "a list of strings",
                });
            };
            let mut inner = Vec::new();
            for item in items {
                wire::put_delimited(
                    &mut inner,
                    1,
                    expect_str(item, path, "a string")?.as_bytes(),
                );
            }
            wire::put_delimited(out, number, &inner);
        }
        Kind::Message(name) => {
            let Value::Object(object) = value else {
                return Err(ConvertError::WriteValue {
                    path: path.to_string(),
                    expected: "an object",
                });
            };
            let message = lookup(schema, name, path)?;
            let inner = encode(schema, message, object, &[], path)?;
            wire::put_delimited(out, number, &inner);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> &'static Schema {
        Schema::builtin()
    }

    fn round_trip(message: &str, object: Value) -> Value {
        let s = schema();
        let m = s.message(message).unwrap();
        let bytes = encode(s, m, object.as_object().unwrap(), &[], "").unwrap();
        Value::Object(decode(s, m, &bytes, "").unwrap())
    }

    #[test]
    fn objects_survive_json_to_protobuf_and_back() {
        let cases = [
            (
                "PersistentVolume",
                json!({"metadata": {"name": "pv1", "labels": {"a": "b"}, "creationTimestamp": "2026-11-23T10:00:00Z",
                        "managedFields": [{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
                       "spec": {"capacity": {"storage": "1Gi"}, "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"k": "v"}},
                                "accessModes": ["ReadWriteOnce"], "claimRef": {"name": "c", "namespace": "default", "uid": "u"},
                                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "sc", "volumeMode": "Filesystem",
                                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["x"]}]}]}}},
                       "status": {"phase": "Bound"}}),
            ),
            (
                "PersistentVolumeClaim",
                json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "", "resources": {"requests": {"storage": "5Gi"}}}}),
            ),
            (
                "Secret",
                json!({"metadata": {"name": "s"}, "data": {"p": "cQ=="}, "type": "Opaque"}),
            ),
            (
                "Lease",
                json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                        "renewTime": "2026-11-23T10:00:00.123456Z"}}),
            ),
            (
                "CSIDriver",
                json!({"metadata": {"name": "d"}, "spec": {"attachRequired": false, "podInfoOnMount": true}}),
            ),
            (
                "Deployment",
                json!({"metadata": {"name": "d"}, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d"}},
                        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}]}},
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}}}, "status": {}}),
            ),
            (
                "Pod",
                json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}, {"name": "cm", "configMap": {"name": "x"}}],
                        "securityContext": {"supplementalGroups": [1, 2]}}}),
            ),
            (
                "VolumeAttachment",
                json!({"metadata": {"name": "va"}, "spec": {"attacher": "a", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
                       "status": {"attached": false, "attachError": {"message": "m", "time": "2026-11-23T10:00:00Z"}}}),
            ),
            (
                "SelfSubjectReview",
                json!({"metadata": {}, "status": {"userInfo": {"username": "u", "groups": ["g"], "extra": {"k": ["a", "b"]}}}}),
            ),
        ];
        for (message, object) in cases {
            assert_eq!(round_trip(message, object.clone()), object, "{message}");
        }
    }

    #[test]
    fn zero_values_from_go_are_dropped_unless_the_go_field_is_a_pointer() {
        // What a Go client sends for a claim with an explicit empty class: every string of
        // ObjectMeta is written, empty ones too.
        let s = schema();
        let m = s.message("PersistentVolumeClaim").unwrap();
        let mut meta = Vec::new();
        wire::put_delimited(&mut meta, 1, b"c");
        wire::put_delimited(&mut meta, 2, b"");
        wire::put_delimited(&mut meta, 6, b"");
        wire::put_varint_field(&mut meta, 7, 0);
        let mut time = Vec::new();
        wire::put_varint_field(&mut time, 1, 0);
        wire::put_varint_field(&mut time, 2, 0);
        wire::put_delimited(&mut meta, 8, &time);
        let mut spec = Vec::new();
        wire::put_delimited(&mut spec, 3, b"");
        wire::put_delimited(&mut spec, 5, b"");
        let mut resources = Vec::new();
        wire::put_delimited(&mut spec, 2, &resources);
        resources.clear();
        let mut pvc = Vec::new();
        wire::put_delimited(&mut pvc, 1, &meta);
        wire::put_delimited(&mut pvc, 2, &spec);
        wire::put_delimited(&mut pvc, 3, &[]);
        // A field this server does not know, zero: nothing is lost by skipping it.
        wire::put_varint_field(&mut pvc, 99, 0);
        let object = decode(s, m, &pvc, "").unwrap();
        assert_eq!(
            Value::Object(object),
            json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "", "resources": {}}, "status": {}})
        );
    }

    #[test]
    fn what_cannot_be_converted_is_an_error_naming_the_place() {
        let s = schema();
        let pvc = s.message("PersistentVolumeClaim").unwrap();
        let mut unknown = Vec::new();
        wire::put_varint_field(&mut unknown, 99, 1);
        let e = decode(s, pvc, &unknown, "PersistentVolumeClaim").unwrap_err();
        assert!(
            e.to_string()
                .contains("field number 99 of PersistentVolumeClaim"),
            "{e}"
        );
        let mut wrong = Vec::new();
        wire::put_varint_field(&mut wrong, 1, 1);
        let e = decode(s, pvc, &wrong, "x").unwrap_err();
        assert_eq!(e.to_string(), "x.metadata: not a valid embedded message");
        let cases = [
            (
                json!({"spec": {"bogus": 1}}),
                "x.spec.bogus: no protobuf field",
            ),
            (
                json!({"spec": {"accessModes": "RWO"}}),
                "x.spec.accessModes: expected a list",
            ),
            (
                json!({"metadata": {"creationTimestamp": "yesterday"}}),
                "expected an RFC 3339 time",
            ),
            (
                json!({"metadata": {"generation": "1"}}),
                "expected an integer",
            ),
        ];
        for (object, expected) in cases {
            let e = encode(s, pvc, object.as_object().unwrap(), &[], "x").unwrap_err();
            assert!(e.to_string().contains(expected), "{e}");
        }
    }

    #[test]
    fn times_parse_with_fractions_and_offsets() {
        assert_eq!(parse_time("1970-01-01T00:00:10Z"), Some((10, 0)));
        assert_eq!(
            parse_time("1970-01-01T00:00:10.5Z"),
            Some((10, 500_000_000))
        );
        assert_eq!(parse_time("1970-01-01T01:00:10+01:00"), Some((10, 0)));
        assert_eq!(parse_time("1970-01-01T00:00:10"), None);
        assert_eq!(parse_time("1970-01-01T00:00:10+1"), None);
        assert_eq!(
            format_time(10, 123_456_789, true),
            json!("1970-01-01T00:00:10.123456Z")
        );
        assert_eq!(format_time(0, 0, false), Value::Null);
    }
}
