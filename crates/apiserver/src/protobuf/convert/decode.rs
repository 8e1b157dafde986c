//! Protobuf bytes to JSON, as kube-apiserver's Go types read them.

use base64::Engine;
use serde_json::{Map, Value};

use super::super::schema::{Cardinality, Kind, Message, Schema};
use super::super::wire::{self, Reader, WireError};
use super::{ConvertError, lookup};
use crate::objects::rfc3339;

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

pub(super) fn format_time(seconds: i64, nanos: i64, micro: bool) -> Value {
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
