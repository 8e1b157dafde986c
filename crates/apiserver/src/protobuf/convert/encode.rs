//! JSON to protobuf bytes.

use base64::Engine;
use serde_json::{Map, Value};

use super::super::schema::{Cardinality, Field, Kind, Message, Schema};
use super::super::wire;
use super::{ConvertError, lookup, parse_time};

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
                        timed: field.timed,
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
