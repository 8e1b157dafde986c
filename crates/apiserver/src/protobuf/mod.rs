//! Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`) at the boundary:
//! objects are stored as JSON and converted on the way in and out.
//!
//! An object travels in kube-apiserver's envelope: the four bytes `k8s\0`, then a
//! `runtime.Unknown` whose `typeMeta` holds apiVersion and kind and whose `raw` holds the
//! object's message. A watch stream is a sequence of frames: a four-byte big-endian length,
//! then a `metav1.WatchEvent` whose object's raw bytes are an enveloped object.

pub mod convert;
pub mod schema;
pub mod times;
pub mod wire;

use serde_json::{Map, Value};

use self::convert::ConvertError;
use self::schema::{Schema, Shape};
use self::wire::{Reader, WireError};

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The media type of protobuf watch streams.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// The prefix of every enveloped object.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    /// The body does not start with the `k8s\0` prefix.
    #[error("the body is not a Kubernetes protobuf object (it does not start with k8s\\0)")]
    ReadMagic,
    /// The envelope is broken.
    #[error("the protobuf envelope (runtime.Unknown) is broken: {0}")]
    ReadEnvelope(#[source] WireError),
    /// The envelope names no kind.
    #[error("the protobuf envelope names no kind")]
    ReadKind,
    /// The envelope's raw bytes are in another encoding.
    #[error("the protobuf envelope holds {0:?}, not a protobuf object")]
    ReadEncoding(String),
    /// The server has no protobuf form for this kind (custom resources are JSON only).
    #[error("{kind} in {api_version} is served as JSON only")]
    Unsupported {
        /// The apiVersion asked for.
        api_version: String,
        /// The kind asked for.
        kind: String,
    },
    /// The object is not a JSON object with apiVersion and kind.
    #[error("the object has no apiVersion and kind")]
    WriteTypeMeta,
    /// The message or the JSON object could not be converted.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

/// Reads an enveloped object as a JSON object with its apiVersion and kind.
pub fn decode_object(bytes: &[u8]) -> Result<Value, ProtobufError> {
    let body = bytes.strip_prefix(MAGIC).ok_or(ProtobufError::ReadMagic)?;
    let (api_version, kind, raw) = read_envelope(body)?;
    let schema = Schema::builtin();
    let shape = schema
        .for_kind(&api_version, &kind)
        .ok_or_else(|| ProtobufError::Unsupported {
            api_version: api_version.clone(),
            kind: kind.clone(),
        })?;
    let mut object = match shape {
        Shape::Object(message) => convert::decode(schema, message, raw, &kind)?,
        Shape::List(meta, items) => {
            let mut object = Map::new();
            let mut list = Vec::new();
            let mut reader = Reader::new(raw);
            while let Some((number, value)) =
                reader.next_field().map_err(ProtobufError::ReadEnvelope)?
            {
                match (number, value, meta) {
                    (1, wire::Value::Delimited(b), Some(meta)) => {
                        object.insert(
                            "metadata".into(),
                            Value::Object(convert::decode(schema, meta, b, "metadata")?),
                        );
                    }
                    (2, wire::Value::Delimited(b), _) => {
                        list.push(Value::Object(convert::decode(schema, items, b, "items")?));
                    }
                    _ => {}
                }
            }
            object.insert("items".into(), Value::Array(list));
            object
        }
    };
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(object))
}

fn read_envelope(body: &[u8]) -> Result<(String, String, &[u8]), ProtobufError> {
    let (mut api_version, mut kind, mut raw, mut encoding) =
        (String::new(), String::new(), &[][..], String::new());
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut reader = Reader::new(body);
    while let Some((number, value)) = reader.next_field().map_err(ProtobufError::ReadEnvelope)? {
        let wire::Value::Delimited(b) = value else {
            continue;
        };
        match number {
            1 => {
                let mut meta = Reader::new(b);
                while let Some((n, v)) = meta.next_field().map_err(ProtobufError::ReadEnvelope)? {
                    match (n, v) {
                        (1, wire::Value::Delimited(s)) => api_version = text(s),
                        (2, wire::Value::Delimited(s)) => kind = text(s),
                        _ => {}
                    }
                }
            }
            2 => raw = b,
            3 => encoding = text(b),
            4 if !b.is_empty() && b != MEDIA_TYPE.as_bytes() => {
                return Err(ProtobufError::ReadEncoding(text(b)));
            }
            _ => {}
        }
    }
    if !encoding.is_empty() {
        return Err(ProtobufError::ReadEncoding(encoding));
    }
    if kind.is_empty() {
        return Err(ProtobufError::ReadKind);
    }
    Ok((api_version, kind, raw))
}

/// Writes a JSON object (with apiVersion and kind; a list or a Status too) enveloped.
pub fn encode_object(object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let Some(map) = object.as_object() else {
        return Err(ProtobufError::WriteTypeMeta);
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    let kind = map.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (api_version, kind) else {
        return Err(ProtobufError::WriteTypeMeta);
    };
    let schema = Schema::builtin();
    let shape = schema
        .for_kind(api_version, kind)
        .ok_or_else(|| ProtobufError::Unsupported {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })?;
    let type_meta = ["apiVersion", "kind"];
    let raw = match shape {
        Shape::Object(message) => convert::encode(schema, message, map, &type_meta, kind)?,
        Shape::List(meta, items) => {
            let mut raw = Vec::new();
            if let (Some(meta), Some(Value::Object(m))) = (meta, map.get("metadata")) {
                let bytes = convert::encode(schema, meta, m, &[], "metadata")?;
                wire::put_delimited(&mut raw, 1, &bytes);
            }
            if let Some(Value::Array(list)) = map.get("items") {
                for (i, item) in list.iter().enumerate() {
                    let Value::Object(item) = item else {
                        return Err(ConvertError::WriteValue {
                            path: format!("items[{i}]"),
                            expected: "an object",
                        }
                        .into());
                    };
                    let bytes =
                        convert::encode(schema, items, item, &type_meta, &format!("items[{i}]"))?;
                    wire::put_delimited(&mut raw, 2, &bytes);
                }
            }
            raw
        }
    };
    let mut meta = Vec::new();
    wire::put_delimited(&mut meta, 1, api_version.as_bytes());
    wire::put_delimited(&mut meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    wire::put_delimited(&mut out, 1, &meta);
    wire::put_delimited(&mut out, 2, &raw);
    wire::put_delimited(&mut out, 3, b"");
    wire::put_delimited(&mut out, 4, b"");
    Ok(out)
}

/// Whether objects of this kind have a protobuf form.
pub fn supports(api_version: &str, kind: &str) -> bool {
    Schema::builtin().for_kind(api_version, kind).is_some()
}

/// One frame of a protobuf watch stream: length, then a WatchEvent.
pub fn watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let enveloped = encode_object(object)?;
    let mut raw_extension = Vec::new();
    wire::put_delimited(&mut raw_extension, 1, &enveloped);
    let mut event = Vec::new();
    wire::put_delimited(&mut event, 1, event_type.as_bytes());
    wire::put_delimited(&mut event, 2, &raw_extension);
    let len = u32::try_from(event.len()).unwrap_or(u32::MAX);
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(&event);
    Ok(frame)
}

/// Reads the frames of a protobuf watch stream (for tests and clients): (type, object).
pub fn read_watch_frames(mut bytes: &[u8]) -> Result<Vec<(String, Value)>, ProtobufError> {
    let mut events = Vec::new();
    while bytes.len() >= 4 {
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[..4]);
        let len = u32::from_be_bytes(len) as usize;
        let frame = bytes
            .get(4..4 + len)
            .ok_or(ProtobufError::ReadEnvelope(WireError::Truncated))?;
        bytes = &bytes[4 + len..];
        let (mut event_type, mut object) = (String::new(), None);
        let mut reader = Reader::new(frame);
        while let Some((n, v)) = reader.next_field().map_err(ProtobufError::ReadEnvelope)? {
            match (n, v) {
                (1, wire::Value::Delimited(t)) => {
                    event_type = String::from_utf8_lossy(t).into_owned();
                }
                (2, wire::Value::Delimited(raw)) => {
                    let mut inner = Reader::new(raw);
                    while let Some((n, v)) =
                        inner.next_field().map_err(ProtobufError::ReadEnvelope)?
                    {
                        if let (1, wire::Value::Delimited(o)) = (n, v) {
                            object = Some(decode_object(o)?);
                        }
                    }
                }
                _ => {}
            }
        }
        events.push((event_type, object.unwrap_or(Value::Null)));
    }
    Ok(events)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_lists_and_statuses_round_trip_through_the_envelope() {
        let cases = [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "b"}}),
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": "m", "reason": "NotFound", "code": 404,
                   "details": {"name": "x", "kind": "pods", "causes": [{"reason": "FieldValueInvalid", "field": "spec"}]}, "metadata": {}}),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClassList", "metadata": {"resourceVersion": "7", "continue": "x"},
                   "items": [{"metadata": {"name": "a"}, "provisioner": "p"}, {"metadata": {"name": "b"}, "provisioner": "q"}]}),
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"}, "eventTime": "2026-11-23T10:00:00.000001Z",
                   "reason": "R", "regarding": {"kind": "Pod", "name": "p"}, "series": {"count": 0, "lastObservedTime": "2026-11-23T10:00:00.000000Z"}}),
        ];
        for object in cases {
            let bytes = encode_object(&object).unwrap();
            assert_eq!(&bytes[..4], MAGIC);
            assert_eq!(decode_object(&bytes).unwrap(), object);
        }
    }

    #[test]
    fn custom_resources_and_broken_bodies_are_refused() {
        let widget =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
        assert!(matches!(
            encode_object(&widget),
            Err(ProtobufError::Unsupported { .. })
        ));
        assert_eq!(decode_object(b"{}"), Err(ProtobufError::ReadMagic));
        assert!(matches!(
            decode_object(b"k8s\0\x0a\x05ab"),
            Err(ProtobufError::ReadEnvelope(_))
        ));
        let mut unknown = MAGIC.to_vec();
        let mut meta = Vec::new();
        wire::put_delimited(&mut meta, 1, b"v1");
        wire::put_delimited(&mut meta, 2, b"ConfigMap");
        wire::put_delimited(&mut unknown, 1, &meta);
        wire::put_delimited(&mut unknown, 2, b"{}");
        wire::put_delimited(&mut unknown, 4, b"application/json");
        assert!(matches!(
            decode_object(&unknown),
            Err(ProtobufError::ReadEncoding(_))
        ));
    }

    #[test]
    fn watch_frames_read_back() {
        let a = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "resourceVersion": "3"}});
        let mut stream = watch_frame("ADDED", &a).unwrap();
        stream.extend(watch_frame("DELETED", &a).unwrap());
        let events = read_watch_frames(&stream).unwrap();
        assert_eq!(
            events,
            vec![("ADDED".to_string(), a.clone()), ("DELETED".to_string(), a)]
        );
    }
}
