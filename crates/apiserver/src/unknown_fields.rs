//! Fields an object's kind does not have, as kube-apiserver's `fieldValidation` treats them:
//! `Strict` (what kubectl asks for) refuses the write naming every one, `Warn` drops them and
//! says so in `Warning` headers, `Ignore` drops them. Built-in kinds are read against their
//! Kubernetes types' schemas (k8s-openapi's, the ones `kubectl explain` reads), custom
//! resources against their definition's `openAPIV3Schema` (honouring
//! `x-kubernetes-preserve-unknown-fields`).
//!
//! Unlike kube-apiserver, a write that does not name `fieldValidation` is not read for unknown
//! fields at all (kube-apiserver drops them then, with a warning): the stack's own clients
//! write typed objects, and reading every write against its schema would cost every write.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use axum::http::Method;
use serde_json::{Map, Value};

use crate::registry::ResourceType;
use crate::status::{ApiError, WriteOptions};

/// What a write asks to be done with unknown fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Not named: nothing is checked here.
    Unset,
    /// Dropped.
    Ignore,
    /// Dropped, each named in a `Warning` header.
    Warn,
    /// The write is refused.
    Strict,
}

/// The `fieldValidation` of a request; any other value than the four kube-apiserver knows is
/// its 422 naming the verb's options.
pub fn field_validation(method: &Method, value: Option<&str>) -> Result<FieldValidation, ApiError> {
    // A delete has no body to read.
    let options = match WriteOptions::of(method) {
        Some(WriteOptions::Delete) | None => return Ok(FieldValidation::Unset),
        Some(options) => options.kind(),
    };
    match value.unwrap_or("") {
        "" => Ok(FieldValidation::Unset),
        "Ignore" => Ok(FieldValidation::Ignore),
        "Warn" => Ok(FieldValidation::Warn),
        "Strict" => Ok(FieldValidation::Strict),
        other => Err(ApiError::invalid_options(
            options,
            &format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
            ),
        )),
    }
}

/// The named schemas `$ref`s point to.
type Definitions = Arc<Map<String, Value>>;

/// A kind's schema: the root and the definitions its `$ref`s name.
#[derive(Debug)]
pub struct KindSchema {
    root: Arc<Value>,
    definitions: Definitions,
    /// A custom resource's: the schema of ObjectMeta, which its root's and its embedded
    /// resources' `metadata` are read against whatever its own schema says of them, as
    /// kube-apiserver reads them.
    object_meta: Option<Arc<Value>>,
}

/// The schema of `rt`'s objects (made once per built-in kind), if there is one.
pub fn schema_of(rt: &ResourceType) -> Option<Arc<KindSchema>> {
    if let Some(schema) = &rt.schema {
        let (definitions, object_meta) = object_meta()?;
        return Some(Arc::new(KindSchema {
            root: schema.clone(),
            definitions,
            object_meta: Some(object_meta),
        }));
    }
    static BUILTIN: OnceLock<parking_lot::Mutex<HashMap<String, Option<Arc<KindSchema>>>>> =
        OnceLock::new();
    let key = format!("{}/{}", rt.api_version(), rt.kind);
    BUILTIN
        .get_or_init(Default::default)
        .lock()
        .entry(key)
        .or_insert_with(|| built_in(&rt.api_version(), &rt.kind))
        .clone()
}

fn built_in(api_version: &str, kind: &str) -> Option<Arc<KindSchema>> {
    let (name, definitions) = crate::openapi::kind_definitions(api_version, kind)?;
    let root = definitions.get(&name)?.clone();
    Some(Arc::new(KindSchema {
        root: Arc::new(root),
        definitions: Arc::new(definitions),
        object_meta: None,
    }))
}

/// ObjectMeta's schema (a ConfigMap's `metadata`) and the definitions it refers to, made once.
fn object_meta() -> Option<(Definitions, Arc<Value>)> {
    static META: OnceLock<Option<(Definitions, Arc<Value>)>> = OnceLock::new();
    META.get_or_init(|| {
        let config_maps = built_in("v1", "ConfigMap")?;
        let meta = config_maps.root.get("properties")?.get("metadata")?.clone();
        Some((config_maps.definitions.clone(), Arc::new(meta)))
    })
    .clone()
}

/// At most this many unknown fields are named (all are dropped): a hostile body cannot make
/// the answer, or its `Warning` headers, as large as itself.
pub const MAX_NAMED: usize = 100;

/// A named path is cut to this many bytes.
pub const MAX_PATH: usize = 1024;

/// The unknown fields of a write.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unknown {
    /// Their paths as kube-apiserver names them (`spec.containers[0].bogus`), in the order met,
    /// the first [`MAX_NAMED`].
    pub named: Vec<String>,
    /// How many there are.
    pub count: usize,
}

impl Unknown {
    fn found(&mut self, path: &str) {
        self.count += 1;
        if self.named.len() < MAX_NAMED {
            let mut cut = path.len().min(MAX_PATH);
            while !path.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut named = path[..cut].to_string();
            if cut < path.len() {
                named.push_str("...");
            }
            self.named.push(named);
        }
    }

    /// kube-apiserver's words for them: `unknown field "a", unknown field "b"` (and how many
    /// more there are past those named).
    pub fn listed(&self) -> String {
        let mut listed = self
            .named
            .iter()
            .map(|path| format!("unknown field {path:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        if self.count > self.named.len() {
            listed.push_str(&format!(
                ", and {} more unknown fields",
                self.count - self.named.len()
            ));
        }
        listed
    }

    /// The `Warning` header values for them (`299 - "unknown field \"a\""`), within
    /// kube-apiserver's budget: [`MAX_WARNING_TEXT`] characters in all, each warning cut to
    /// [`WARNING_CUT`] once that is passed, and none after the budget is spent.
    pub fn warnings(&self) -> Vec<String> {
        let mut texts: Vec<String> = self
            .named
            .iter()
            .map(|path| format!("unknown field {path:?}"))
            .collect();
        if self.count > self.named.len() {
            texts.push(format!(
                "{} more unknown fields",
                self.count - self.named.len()
            ));
        }
        let mut spent = 0;
        let mut warnings = Vec::new();
        for mut text in texts {
            let mut length = text.chars().count();
            if spent + length > MAX_WARNING_TEXT && length > WARNING_CUT {
                text = text.chars().take(WARNING_CUT).collect();
                length = WARNING_CUT;
            }
            if spent + length > MAX_WARNING_TEXT {
                break;
            }
            spent += length;
            warnings.push(format!("299 - {text:?}"));
        }
        warnings
    }
}

/// The characters of warning text one answer carries at most (kube-apiserver's budget).
pub const MAX_WARNING_TEXT: usize = 4 * 1024;

/// A warning past the budget is cut to this many characters.
pub const WARNING_CUT: usize = 256;

/// What is done with a write whose kind has `schema`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Written (its unknown fields dropped, unless `Strict` found none); the `Warning` headers
    /// to answer with, and whether anything was dropped.
    Write {
        warnings: Vec<String>,
        dropped: bool,
    },
    /// Refused (`Strict`): the object is left as it came.
    Refuse(Unknown),
}

/// The fields of `object` its kind does not have, judged as `validation` asks. A field the
/// stored object already has at the same place with the same value is not the write's doing
/// (a write that did not name `fieldValidation` stored it) and is left where it is: an apply
/// or edit of an object read back is not refused for it, nor does it lose it silently.
pub fn judge(
    schema: &KindSchema,
    validation: FieldValidation,
    object: &mut Value,
    stored: Option<&Value>,
) -> Verdict {
    let drop = validation != FieldValidation::Strict;
    let unknown = find(schema, object, stored, drop);
    let dropped = drop && unknown.count > 0;
    match validation {
        FieldValidation::Strict if unknown.count > 0 => Verdict::Refuse(unknown),
        FieldValidation::Warn => Verdict::Write {
            warnings: unknown.warnings(),
            dropped,
        },
        FieldValidation::Strict | FieldValidation::Ignore | FieldValidation::Unset => {
            Verdict::Write {
                warnings: Vec::new(),
                dropped,
            }
        }
    }
}

/// The fields of `object` its kind does not have (those `stored` has at the same place with
/// the same value apart), removed from it when `drop`.
pub fn find(
    schema: &KindSchema,
    object: &mut Value,
    stored: Option<&Value>,
    drop: bool,
) -> Unknown {
    let mut walk = Walk {
        kind: schema,
        path: String::new(),
        unknown: Unknown::default(),
        drop,
    };
    walk.value(&schema.root, object, stored, Level::Resource);
    walk.unknown
}

/// `schema` with its `$ref` followed (through at most a few references), also one wrapped in
/// a single `allOf` (how a described field refers to its type).
fn resolved<'a>(kind: &'a KindSchema, mut schema: &'a Value) -> &'a Value {
    for _ in 0..8 {
        let reference = schema.get("$ref").or_else(|| match schema.get("allOf") {
            Some(Value::Array(all)) if all.len() == 1 => all[0].get("$ref"),
            _ => None,
        });
        let Some(name) = reference
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next())
        else {
            break;
        };
        match kind.definitions.get(name) {
            Some(next) => schema = next,
            None => break,
        }
    }
    schema
}

/// Whether an object is a resource of its own (the root, or an embedded one of a custom
/// resource), whose type and metadata are every object's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Resource,
    Field,
}

struct Walk<'a> {
    kind: &'a KindSchema,
    /// The path of the value being read; each step pushes onto it and cuts it back after.
    path: String,
    unknown: Unknown,
    drop: bool,
}

impl Walk<'_> {
    /// Reads `value` against `schema`. `level` is [`Level::Resource`] for the root; an
    /// embedded resource is one by its schema.
    fn value(&mut self, schema: &Value, value: &mut Value, stored: Option<&Value>, level: Level) {
        let schema = resolved(self.kind, schema);
        let says = |extension: &str| schema.get(extension) == Some(&Value::Bool(true));
        let level = if says("x-kubernetes-embedded-resource") {
            Level::Resource
        } else {
            level
        };
        let preserve = says("x-kubernetes-preserve-unknown-fields");
        match value {
            Value::Object(fields) => self.object(schema, fields, stored, level, preserve),
            Value::Array(items) => {
                let Some(item_schema) = schema.get("items") else {
                    return;
                };
                // A stored item is found by its name where items have one (an item added
                // before it moves it), else by its place.
                let by_name: HashMap<&str, &Value> = stored
                    .and_then(Value::as_array)
                    .map(|list| {
                        list.iter()
                            .filter_map(|item| Some((item.get("name")?.as_str()?, item)))
                            .collect()
                    })
                    .unwrap_or_default();
                let before = self.path.len();
                for (i, item) in items.iter_mut().enumerate() {
                    let _ = write!(self.path, "[{i}]");
                    let stored_item = match item.get("name").and_then(Value::as_str) {
                        Some(name) => by_name.get(name).copied(),
                        None => stored.and_then(|s| s.get(i)),
                    };
                    self.value(item_schema, item, stored_item, Level::Field);
                    self.path.truncate(before);
                }
            }
            _ => {}
        }
    }

    /// Reads an object's fields. Under `x-kubernetes-preserve-unknown-fields` a field the
    /// schema does not list is kept, but those it lists are still read, and so is an embedded
    /// resource's metadata (as kube-apiserver's pruning and metadata coercion read them).
    fn object(
        &mut self,
        schema: &Value,
        fields: &mut Map<String, Value>,
        stored: Option<&Value>,
        level: Level,
        preserve: bool,
    ) {
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        let custom = self.kind.object_meta.is_some();
        let resource = level == Level::Resource && custom;
        if !custom && properties.is_none() && additional.is_none() {
            // A built-in kind's free-form object (raw JSON, an extension): anything goes.
            return;
        }
        let mut dropped = Vec::new();
        let before = self.path.len();
        for (key, field) in fields.iter_mut() {
            let field_schema = match (resource, key.as_str(), &self.kind.object_meta) {
                // A custom resource's type is every object's, and its metadata is ObjectMeta.
                (true, "apiVersion" | "kind", _) => continue,
                (true, "metadata", Some(meta)) => Some(&**meta),
                _ => properties.and_then(|p| p.get(key)).or(additional),
            };
            let stored_field = stored.and_then(|s| s.get(key));
            let unknown = match field_schema {
                Some(_) => false,
                // Kept by the schema, or stored before unchanged (not this write's).
                None => !preserve && stored_field != Some(field),
            };
            if field_schema.is_none() && !unknown {
                continue;
            }
            if !self.path.is_empty() {
                self.path.push('.');
            }
            self.path.push_str(key);
            match field_schema {
                Some(field_schema) => self.value(field_schema, field, stored_field, Level::Field),
                None => {
                    self.unknown.found(&self.path);
                    if self.drop {
                        dropped.push(key.clone());
                    }
                }
            }
            self.path.truncate(before);
        }
        for key in dropped {
            fields.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests;
