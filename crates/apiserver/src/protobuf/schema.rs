//! The protobuf shape of the built-in types, read from `messages.txt`, and which message each
//! (apiVersion, kind) is.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// The table of messages, as written in `messages.txt`.
const MESSAGES: &str = include_str!("messages.txt");

/// Which message a kind is; lists are `<Kind>List` with `metadata` and `items`.
const KINDS: &[(&str, &str, &str)] = &[
    ("v1", "Namespace", "Namespace"),
    ("v1", "ConfigMap", "ConfigMap"),
    ("v1", "Secret", "Secret"),
    ("v1", "ServiceAccount", "ServiceAccount"),
    ("v1", "Event", "Event"),
    ("v1", "PersistentVolume", "PersistentVolume"),
    ("v1", "PersistentVolumeClaim", "PersistentVolumeClaim"),
    ("v1", "Node", "Node"),
    ("v1", "Pod", "Pod"),
    ("storage.k8s.io/v1", "StorageClass", "StorageClass"),
    ("storage.k8s.io/v1", "CSIDriver", "CSIDriver"),
    ("storage.k8s.io/v1", "CSINode", "CSINode"),
    (
        "storage.k8s.io/v1",
        "CSIStorageCapacity",
        "CSIStorageCapacity",
    ),
    ("storage.k8s.io/v1", "VolumeAttachment", "VolumeAttachment"),
    (
        "storage.k8s.io/v1",
        "VolumeAttributesClass",
        "VolumeAttributesClass",
    ),
    ("coordination.k8s.io/v1", "Lease", "Lease"),
    ("events.k8s.io/v1", "Event", "events.Event"),
    (
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        "SelfSubjectReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        "SelfSubjectAccessReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        "SelfSubjectRulesReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        "SubjectAccessReview",
    ),
    (
        "authentication.k8s.io/v1",
        "TokenRequest",
        "authentication.TokenRequest",
    ),
    ("rbac.authorization.k8s.io/v1", "Role", "Role"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "RoleBinding"),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
    ),
    ("apps/v1", "Deployment", "Deployment"),
    ("apps/v1", "StatefulSet", "StatefulSet"),
    ("apps/v1", "DaemonSet", "DaemonSet"),
    ("apps/v1", "ReplicaSet", "ReplicaSet"),
];

/// Kinds every group version has (kube-apiserver registers them in each).
const SHARED_KINDS: &[&str] = &["Status", "DeleteOptions"];

/// What a field holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A UTF-8 string.
    String,
    /// Bytes: base64 in JSON.
    Bytes,
    /// int32 (varint).
    I32,
    /// int64 (varint).
    I64,
    /// bool (varint).
    Bool,
    /// metav1.Time: RFC 3339 with seconds in JSON, {seconds, nanos} in protobuf.
    Time,
    /// metav1.MicroTime: RFC 3339 with microseconds in JSON.
    MicroTime,
    /// resource.Quantity: a string in JSON, {string} in protobuf.
    Quantity,
    /// intstr.IntOrString: a number or a string in JSON, {type, intVal, strVal} in protobuf.
    IntOrString,
    /// metav1.FieldsV1: a JSON object, its JSON text in protobuf.
    Fields,
    /// authentication ExtraValue: a JSON list of strings, {items} in protobuf.
    Extra,
    /// Another message of the table.
    Message(String),
}

impl Kind {
    /// Whether values are times (`metav1.Time` or `metav1.MicroTime`).
    pub fn is_time(&self) -> bool {
        matches!(self, Kind::Time | Kind::MicroTime)
    }

    /// Whether values travel length-delimited (wire type 2).
    pub fn delimited(&self) -> bool {
        !matches!(self, Kind::I32 | Kind::I64 | Kind::Bool)
    }
}

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    /// At most one.
    One,
    /// A list.
    Repeated,
    /// A map from strings.
    Map,
    /// One message whose fields are inlined into the JSON object that holds it.
    Inline,
}

/// One field of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The JSON name (also the protobuf name).
    pub json: String,
    /// The field number.
    pub number: u32,
    /// What it holds.
    pub kind: Kind,
    /// How many.
    pub cardinality: Cardinality,
    /// A zero value that arrives in protobuf stays in JSON (a Go pointer, or no omitempty).
    pub keep_zero: bool,
    /// Whether it holds a time: is one, or a message holding one at any depth (set when the
    /// table is read; checks of times pass over the others).
    pub timed: bool,
}

/// A message: its fields in field-number order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// The name in the table.
    pub name: String,
    /// Fields, ascending by number.
    pub fields: Vec<Field>,
}

impl Message {
    /// The field with a number.
    pub fn by_number(&self, number: u32) -> Option<&Field> {
        self.fields.iter().find(|f| f.number == number)
    }
}

/// Why the table could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchemaError {
    /// A field is not written `name=number[:type]`.
    #[error("line {line}: field {text:?} is not name=number[:type]")]
    ParseField {
        /// Line of the table.
        line: usize,
        /// The field as written.
        text: String,
    },
    /// A continuation line comes before any message.
    #[error("line {line}: a continuation line before any message")]
    ParseContinuation {
        /// Line of the table.
        line: usize,
    },
    /// A field names a message the table does not have.
    #[error("{message}.{field} names the unknown message {target}")]
    ResolveMessage {
        /// The message whose field names the unknown message.
        message: String,
        /// Which field.
        field: String,
        /// The name that is missing.
        target: String,
    },
    /// Two fields of a message share a number or a name.
    #[error("{message} has two fields numbered {number} or named {field}")]
    CheckDuplicate {
        /// The message with the duplicate.
        message: String,
        /// The number.
        number: u32,
        /// The name.
        field: String,
    },
}

/// All messages plus the kind table.
#[derive(Debug, Default)]
pub struct Schema {
    messages: HashMap<String, Message>,
}

impl Schema {
    /// The built-in table (read once). If it could not be read (a defect caught by this
    /// module's tests), the server speaks JSON only and says why in its log.
    pub fn builtin() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| match Schema::parse(MESSAGES) {
            Ok(schema) => schema,
            Err(error) => {
                tracing::error!(%error, "the protobuf table is broken; serving JSON only");
                Schema::default()
            }
        })
    }

    /// Reads a table.
    pub fn parse(text: &str) -> Result<Schema, SchemaError> {
        let mut messages: Vec<Message> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.split('#').next().unwrap_or("");
            if content.trim().is_empty() {
                continue;
            }
            let continuation = content.starts_with(' ');
            let mut words = content.split_whitespace();
            if !continuation {
                let name = words.next().unwrap_or_default().to_string();
                messages.push(Message {
                    name,
                    fields: Vec::new(),
                });
            }
            let Some(message) = messages.last_mut() else {
                return Err(SchemaError::ParseContinuation { line });
            };
            for word in words {
                message.fields.push(parse_field(word, line)?);
            }
        }
        let names: HashSet<String> = messages.iter().map(|m| m.name.clone()).collect();
        let mut by_name = HashMap::new();
        for mut message in messages {
            message.fields.sort_by_key(|f| f.number);
            for (i, field) in message.fields.iter().enumerate() {
                if let Kind::Message(target) = &field.kind
                    && !names.contains(target)
                {
                    return Err(SchemaError::ResolveMessage {
                        message: message.name.clone(),
                        field: field.json.clone(),
                        target: target.clone(),
                    });
                }
                let duplicate = message.fields[..i]
                    .iter()
                    .any(|f| f.number == field.number || f.json == field.json);
                if duplicate {
                    return Err(SchemaError::CheckDuplicate {
                        message: message.name.clone(),
                        number: field.number,
                        field: field.json.clone(),
                    });
                }
            }
            by_name.insert(message.name.clone(), message);
        }
        mark_timed(&mut by_name);
        Ok(Schema { messages: by_name })
    }

    /// A message by its table name.
    pub fn message(&self, name: &str) -> Option<&Message> {
        self.messages.get(name)
    }

    /// The message of an object of `kind` in `api_version`, or of a list of them.
    pub fn for_kind(&self, api_version: &str, kind: &str) -> Option<Shape<'_>> {
        if SHARED_KINDS.contains(&kind) {
            return self.message(kind).map(Shape::Object);
        }
        let find = |k: &str| {
            KINDS
                .iter()
                .find(|(v, kk, _)| *v == api_version && *kk == k)
                .and_then(|(_, _, m)| self.message(m))
        };
        if let Some(message) = find(kind) {
            return Some(Shape::Object(message));
        }
        kind.strip_suffix("List")
            .and_then(find)
            .map(|items| Shape::List(self.message("ListMeta"), items))
    }

    /// Every (apiVersion, kind) with a message, for messages naming what is supported.
    pub fn kinds() -> impl Iterator<Item = (&'static str, &'static str)> {
        KINDS.iter().map(|(v, k, _)| (*v, *k))
    }
}

/// What an (apiVersion, kind) is encoded as.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// One object.
    Object(&'a Message),
    /// A list: ListMeta at 1, items at 2.
    List(Option<&'a Message>, &'a Message),
}

/// Marks the fields holding a time ([`Field::timed`]): the messages holding one are found to a
/// fixed point (a message joins once one of its fields is a time or a message that joined).
fn mark_timed(messages: &mut HashMap<String, Message>) {
    let holds = |kind: &Kind, timed: &HashSet<String>| match kind {
        Kind::Message(inner) => timed.contains(inner),
        other => other.is_time(),
    };
    let mut timed = HashSet::new();
    loop {
        let before = timed.len();
        for message in messages.values() {
            if message.fields.iter().any(|f| holds(&f.kind, &timed)) {
                timed.insert(message.name.clone());
            }
        }
        if timed.len() == before {
            break;
        }
    }
    for field in messages.values_mut().flat_map(|m| m.fields.iter_mut()) {
        field.timed = holds(&field.kind, &timed);
    }
}

fn parse_field(word: &str, line: usize) -> Result<Field, SchemaError> {
    let bad = || SchemaError::ParseField {
        line,
        text: word.to_string(),
    };
    let (json, rest) = word.split_once('=').ok_or_else(bad)?;
    let (number, ty) = match rest.split_once(':') {
        Some((n, t)) => (n, t),
        None => (rest, "string"),
    };
    let (number, keep_number) = match number.strip_suffix('*') {
        Some(n) => (n, true),
        None => (number, false),
    };
    let (ty, keep_type) = match ty.strip_suffix('*') {
        Some(t) => (t, true),
        None => (ty, false),
    };
    let number: u32 = number.parse().map_err(|_| bad())?;
    let (cardinality, ty) =
        if let Some(inner) = ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            (Cardinality::Repeated, inner)
        } else if let Some(inner) = ty.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            (Cardinality::Map, inner)
        } else if let Some(inner) = ty.strip_prefix('~') {
            (Cardinality::Inline, inner)
        } else {
            (Cardinality::One, ty)
        };
    let kind = match ty {
        "string" => Kind::String,
        "bytes" => Kind::Bytes,
        "i32" => Kind::I32,
        "i64" => Kind::I64,
        "bool" => Kind::Bool,
        "time" => Kind::Time,
        "microtime" => Kind::MicroTime,
        "quantity" => Kind::Quantity,
        "intorstring" => Kind::IntOrString,
        "fields" => Kind::Fields,
        "extra" => Kind::Extra,
        "" => return Err(bad()),
        other => Kind::Message(other.to_string()),
    };
    if json.is_empty() || (cardinality == Cardinality::Inline && !matches!(kind, Kind::Message(_)))
    {
        return Err(bad());
    }
    Ok(Field {
        json: json.to_string(),
        number,
        kind,
        cardinality,
        keep_zero: keep_number || keep_type,
        timed: false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_table_reads_and_every_kind_has_its_message() {
        let schema = Schema::parse(MESSAGES).unwrap();
        for (version, kind) in Schema::kinds() {
            assert!(
                matches!(schema.for_kind(version, kind), Some(Shape::Object(_))),
                "{version} {kind}"
            );
            let list = format!("{kind}List");
            assert!(
                matches!(
                    schema.for_kind(version, &list),
                    Some(Shape::List(Some(_), _))
                ),
                "{version} {list}"
            );
        }
        assert!(schema.for_kind("apps/v1", "Status").is_some());
        assert!(schema.for_kind("example.com/v1", "Widget").is_none());
        let meta = schema.message("ObjectMeta").unwrap();
        assert_eq!(meta.by_number(17).unwrap().json, "managedFields");
        let pvc = schema.message("PersistentVolumeClaimSpec").unwrap();
        assert!(pvc.fields.windows(2).all(|w| w[0].number < w[1].number));
        assert!(
            pvc.fields
                .iter()
                .any(|f| f.json == "storageClassName" && f.keep_zero)
        );
    }

    #[test]
    fn fields_holding_a_time_are_known_through_their_messages() {
        let timed = |schema: &Schema, message: &str, field: &str| {
            let message = schema.message(message).unwrap();
            message
                .fields
                .iter()
                .find(|f| f.json == field)
                .unwrap()
                .timed
        };
        // D holds C holds B holds a time; E holds only a string; R holds only itself.
        let schema = Schema::parse("D c=1:C\nC b=1:B s=2\nB t=1:time\nE s=1\nR r=1:R").unwrap();
        for (message, field, holds) in [
            ("B", "t", true),
            ("C", "b", true),
            ("C", "s", false),
            ("D", "c", true),
            ("E", "s", false),
            ("R", "r", false),
        ] {
            assert_eq!(timed(&schema, message, field), holds, "{message}.{field}");
        }
        let builtin = Schema::builtin();
        assert!(timed(builtin, "PersistentVolume", "metadata"));
        assert!(timed(builtin, "PersistentVolume", "status"));
        assert!(!timed(builtin, "PersistentVolumeSource", "csi"));
        assert!(!timed(
            builtin,
            "PersistentVolumeSpec",
            "persistentVolumeSource"
        ));
    }

    #[test]
    fn broken_tables_are_refused_with_the_place() {
        let cases = [
            ("A x=1:B", "names the unknown message B"),
            ("A x", "line 1: field \"x\""),
            ("A x=one", "line 1"),
            ("  x=1", "continuation"),
            ("A x=1 y=1", "two fields numbered 1"),
            ("A x=1 x=2", "named x"),
            ("A x=1:~i32", "line 1"),
        ];
        for (text, expected) in cases {
            let error = Schema::parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
