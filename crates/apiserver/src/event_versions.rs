//! Events are stored once, as core/v1 Events, and served in both versions: an Event written
//! through `events.k8s.io/v1` is listed by `kubectl get events` and `kubectl describe`, and one
//! written through core/v1 is read through `events.k8s.io/v1`, as kube-apiserver keeps one
//! `events` resource in etcd and converts on the way in and out.
//!
//! The two versions differ in the names of seven fields (kube's `Convert_core_Event_To_v1_Event`
//! and its inverse); the others (metadata, `eventTime`, `series`, `reportingInstance`,
//! `action`, `reason`, `related`, `type`) are the same. An absent field is rendered as the
//! target version renders its zero value, as kube-apiserver, which decodes into Go structs,
//! answers (checked on its v1.36.2 binary).

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::registry::ResourceType;

/// The core/v1 name of a field and its events.k8s.io/v1 name.
const RENAMED: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// The apiVersion of the stored form.
pub const CORE: &str = "v1";
/// The apiVersion of the other form.
pub const EVENTS_V1: &str = "events.k8s.io/v1";

/// Zero values a version always renders: (field, value) for fields that are not `omitempty`
/// in its Go type, or structs that Go's encoder renders even when empty.
fn zero_values(api_version: &str) -> &'static [(&'static str, ZeroValue)] {
    if api_version == EVENTS_V1 {
        &[
            ("eventTime", ZeroValue::Null),
            ("regarding", ZeroValue::Object),
            ("deprecatedSource", ZeroValue::Object),
            ("deprecatedFirstTimestamp", ZeroValue::Null),
            ("deprecatedLastTimestamp", ZeroValue::Null),
        ]
    } else {
        &[
            ("involvedObject", ZeroValue::Object),
            ("source", ZeroValue::Object),
            ("firstTimestamp", ZeroValue::Null),
            ("lastTimestamp", ZeroValue::Null),
            ("eventTime", ZeroValue::Null),
            ("reportingComponent", ZeroValue::Empty),
            ("reportingInstance", ZeroValue::Empty),
        ]
    }
}

/// The strings and counts a version leaves out at their zero value (`omitempty`).
fn omit_empty(api_version: &str) -> &'static [&'static str] {
    if api_version == EVENTS_V1 {
        &[
            "reportingController",
            "reportingInstance",
            "action",
            "reason",
            "note",
            "type",
            "deprecatedCount",
        ]
    } else {
        &["message", "reason", "type", "action", "count"]
    }
}

/// How Go renders a zero value.
#[derive(Debug, Clone, Copy)]
enum ZeroValue {
    /// `null` (a `metav1.Time` or `MicroTime`).
    Null,
    /// `{}` (a struct).
    Object,
    /// `""` (a string).
    Empty,
}

impl ZeroValue {
    fn value(self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Object => Value::Object(Map::new()),
            Self::Empty => Value::String(String::new()),
        }
    }
}

/// `event` (either version) in `api_version`: its fields renamed, the target's apiVersion, and
/// the strings and counts the target leaves out when empty left out. An event already in
/// that version keeps its fields.
pub fn convert(event: &Value, api_version: &str) -> Value {
    let Some(fields) = event.as_object() else {
        return event.clone();
    };
    let to_events_v1 = api_version == EVENTS_V1;
    let mut out = Map::with_capacity(fields.len() + 4);
    for (name, value) in fields {
        // A field named as the other version names one is unknown in this one (stored by a
        // write without `fieldValidation`): it would overwrite the renamed field.
        let other_name = RENAMED
            .iter()
            .any(|&(core, v1)| name == if to_events_v1 { v1 } else { core });
        if other_name {
            continue;
        }
        let renamed = RENAMED.iter().find_map(|&(core, v1)| {
            if to_events_v1 && name == core {
                Some(v1)
            } else if !to_events_v1 && name == v1 {
                Some(core)
            } else {
                None
            }
        });
        out.insert(renamed.unwrap_or(name).to_string(), value.clone());
    }
    // Go leaves out the target's `omitempty` strings and counts at their zero value.
    out.retain(|name, value| {
        let omitted = omit_empty(api_version).contains(&name.as_str());
        !(omitted && (value.as_str() == Some("") || value.as_i64() == Some(0)))
    });
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    Value::Object(out)
}

/// `event` (in `api_version`) with the zero values Go renders for absent fields.
fn with_zero_values(mut event: Value, api_version: &str) -> Value {
    if let Some(fields) = event.as_object_mut() {
        for (name, zero) in zero_values(api_version) {
            if fields.get(*name).is_none_or(Value::is_null) {
                fields.insert((*name).to_string(), zero.value());
            }
        }
    }
    event
}

/// `event` (in `api_version`) without the fields that hold only the zero value Go renders:
/// what is stored does not gain fields by a round trip through the other version.
fn without_zero_values(mut event: Value, api_version: &str) -> Value {
    if let Some(fields) = event.as_object_mut() {
        for (name, zero) in zero_values(api_version) {
            if fields.get(*name).is_some_and(|v| *v == zero.value()) {
                fields.remove(*name);
            }
        }
    }
    event
}

/// `object`, read from the store, as `rt` serves it: converted to events.k8s.io/v1 for that
/// resource, itself for every other.
pub fn served(rt: &ResourceType, object: Arc<Value>) -> Arc<Value> {
    if rt.stored_as_core_events() {
        Arc::new(with_zero_values(convert(&object, EVENTS_V1), EVENTS_V1))
    } else {
        object
    }
}

/// `object`, as `rt` serves it, as the store keeps it: converted to core/v1 for
/// events.k8s.io/v1 Events.
pub fn stored(rt: &ResourceType, object: Value) -> Value {
    if rt.stored_as_core_events() {
        stored_core_event(object)
    } else {
        object
    }
}

/// An Event of either version as the store keeps it (core/v1, without Go's zero values).
pub fn stored_core_event(event: Value) -> Value {
    without_zero_values(convert(&event, CORE), CORE)
}

/// The fields an update through events.k8s.io/v1 may not change: (core/v1 name, the name
/// kube-apiserver's message gives it, its Go type), in the order `ValidateEventUpdate` lists
/// them.
const FIXED_IN_EVENTS_V1: [(&str, &str, Rendered); 13] = [
    ("involvedObject", "involvedObject", Rendered::Reference),
    ("reason", "reason", Rendered::Text),
    ("message", "message", Rendered::Text),
    ("source", "source", Rendered::Source),
    ("firstTimestamp", "firstTimestamp", Rendered::Time),
    ("lastTimestamp", "lastTimestamp", Rendered::Time),
    ("count", "count", Rendered::Count),
    ("type", "type", Rendered::Text),
    ("eventTime", "eventTime", Rendered::MicroTime),
    ("action", "action", Rendered::Text),
    ("related", "related", Rendered::OptionalReference),
    ("reportingComponent", "reportingController", Rendered::Text),
    ("reportingInstance", "reportingInstance", Rendered::Text),
];

/// A field's Go type, for comparing and printing it as kube-apiserver does.
#[derive(Debug, Clone, Copy)]
enum Rendered {
    /// A string (absent is `""`).
    Text,
    /// An int32 (absent is 0).
    Count,
    /// A `metav1.Time` (absent is null), printed in UTC to the second.
    Time,
    /// A `metav1.MicroTime` (absent is null), printed in UTC to the microsecond.
    MicroTime,
    /// An ObjectReference (absent fields are `""`).
    Reference,
    /// A pointer to an ObjectReference (absent is null).
    OptionalReference,
    /// An EventSource (absent fields are `""`).
    Source,
}

const REFERENCE_FIELDS: [(&str, &str); 7] = [
    ("Kind", "kind"),
    ("Namespace", "namespace"),
    ("Name", "name"),
    ("UID", "uid"),
    ("APIVersion", "apiVersion"),
    ("ResourceVersion", "resourceVersion"),
    ("FieldPath", "fieldPath"),
];

const SOURCE_FIELDS: [(&str, &str); 2] = [("Component", "component"), ("Host", "host")];

impl Rendered {
    /// The value as Go holds it, rendered as kube-apiserver's messages print it: strings
    /// quoted, structs as JSON with Go's field names (internal types have no JSON tags).
    fn render(self, value: &Value) -> String {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let quoted = |t: String| Value::String(t).to_string();
        // In the struct's field order (a JSON map would sort them).
        let fields = |names: &[(&str, &str)]| {
            let listed: Vec<String> = names
                .iter()
                .map(|(go, json)| {
                    format!("{}:{}", quoted((*go).into()), quoted(text(&value[*json])))
                })
                .collect();
            format!("{{{}}}", listed.join(","))
        };
        match self {
            Rendered::Text => quoted(text(value)),
            Rendered::Count => value.as_i64().unwrap_or(0).to_string(),
            Rendered::Time | Rendered::MicroTime => match (value, self.instant(value)) {
                (_, Some((secs, nanos))) => {
                    let whole = crate::objects::rfc3339(secs);
                    quoted(match self {
                        Rendered::MicroTime => {
                            format!("{}.{:06}Z", whole.trim_end_matches('Z'), nanos / 1000)
                        }
                        _ => whole,
                    })
                }
                (Value::String(t), None) => quoted(t.clone()),
                _ => "null".into(),
            },
            Rendered::Reference => fields(&REFERENCE_FIELDS),
            Rendered::OptionalReference if value.is_null() => "null".into(),
            Rendered::OptionalReference => fields(&REFERENCE_FIELDS),
            Rendered::Source => fields(&SOURCE_FIELDS),
        }
    }

    /// A time's instant (UTC seconds since the epoch, nanoseconds), as Go compares times; none
    /// for another kind of value, an absent time or one that does not parse.
    fn instant(self, value: &Value) -> Option<(u64, i64)> {
        let micro = match self {
            Rendered::Time => false,
            Rendered::MicroTime => true,
            _ => return None,
        };
        let (secs, nanos) = crate::time::parse(value.as_str()?, micro).ok()?;
        Some((u64::try_from(secs).ok()?, nanos))
    }

    /// Whether two values are the same as Go compares them: times as instants, the rest as
    /// printed.
    fn same(self, a: &Value, b: &Value) -> bool {
        match (self.instant(a), self.instant(b)) {
            (Some(x), Some(y)) => x == y,
            _ => self.render(a) == self.render(b),
        }
    }
}

/// What an update through events.k8s.io/v1 changes that it may not (`new` and `old` as that
/// version serves them), in kube-apiserver's words: such an update may change the metadata and
/// the series only. An update through core/v1 may change anything, as there.
pub fn fixed_field_errors(new: &Value, old: &Value) -> Vec<String> {
    let (new, old) = (convert(new, CORE), convert(old, CORE));
    FIXED_IN_EVENTS_V1
        .iter()
        .filter(|(field, _, rendered)| !rendered.same(&new[*field], &old[*field]))
        .map(|(field, named, rendered)| {
            let now = rendered.render(&new[*field]);
            format!("{named}: Invalid value: {now}: field is immutable")
        })
        .collect()
}

/// What kube-apiserver refuses in a write through events.k8s.io/v1 (`new` and `old` as that
/// version serves them), its causes in its order: the series (when it is new or changed),
/// then a new Event's rules ([`crate::storage_rules::event`], its first failure) or the fields
/// an update may not change. An update is not held to a new Event's rules (an Event written
/// through core/v1 need not satisfy them). `None` when it passes.
pub fn write_errors(new: &Value, old: Option<&Value>) -> Option<Vec<String>> {
    let mut errors = Vec::new();
    if old.is_none_or(|old| series_of(&old["series"]) != series_of(&new["series"])) {
        errors.extend(series_errors(&new["series"]));
    }
    match old {
        Some(old) => errors.extend(fixed_field_errors(new, old)),
        None => errors.extend(crate::storage_rules::event(new).err()),
    }
    (!errors.is_empty()).then_some(errors)
}

/// A series as Go holds it, to compare: none, or its count (absent is 0) and last observed
/// time (absent and null alike).
fn series_of(series: &Value) -> Option<(i64, Option<&str>)> {
    (!series.is_null()).then(|| {
        (
            series["count"].as_i64().unwrap_or(0),
            series["lastObservedTime"].as_str(),
        )
    })
}

/// A series' errors, in kube-apiserver's words (which print no value for the count).
fn series_errors(series: &Value) -> Vec<String> {
    if series.is_null() {
        return Vec::new();
    }
    let mut errors = Vec::new();
    if series["count"].as_i64().unwrap_or(0) < 2 {
        errors.push(r#"series.count: Invalid value: "": should be at least 2"#.to_string());
    }
    if series["lastObservedTime"].is_null() {
        errors.push("series.lastObservedTime: Required value".to_string());
    }
    errors
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
