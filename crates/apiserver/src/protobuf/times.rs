//! The times of an object of a built-in kind, checked as kube-apiserver checks them when it
//! decodes the object: every `metav1.Time` and `metav1.MicroTime` field the message table
//! knows (metadata, conditions, Events, Leases...) must parse as its layout says.

use serde_json::Value;

use super::schema::{Cardinality, Kind, Message, Schema};
use crate::time::{self, TimeError};

/// Checks the times of `object` (of `kind` in `api_version`); kinds without a message pass.
pub fn check(api_version: &str, kind: &str, object: &Value) -> Result<(), TimeError> {
    let schema = Schema::builtin();
    match schema.for_kind(api_version, kind) {
        Some(super::schema::Shape::Object(message)) => walk(schema, message, object),
        _ => Ok(()),
    }
}

fn walk(schema: &Schema, message: &Message, object: &Value) -> Result<(), TimeError> {
    for field in &message.fields {
        // Only times and the messages holding one are looked at: a volume's spec has dozens
        // of volume sources, none with a time.
        if !field.timed {
            continue;
        }
        if field.cardinality == Cardinality::Inline {
            if let Kind::Message(inner) = &field.kind
                && let Some(inner) = schema.message(inner)
            {
                walk(schema, inner, object)?;
            }
            continue;
        }
        let Some(value) = object.get(&field.json) else {
            continue;
        };
        let values: Vec<&Value> = match field.cardinality {
            Cardinality::One => vec![value],
            Cardinality::Repeated => value
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default(),
            Cardinality::Map => value
                .as_object()
                .map(|m| m.values().collect())
                .unwrap_or_default(),
            Cardinality::Inline => Vec::new(),
        };
        for value in values {
            match &field.kind {
                Kind::Time | Kind::MicroTime => {
                    if let Some(text) = value.as_str() {
                        time::parse(text, field.kind == Kind::MicroTime)?;
                    }
                }
                Kind::Message(name) => {
                    if let Some(inner) = schema.message(name) {
                        walk(schema, inner, value)?;
                    }
                }
                Kind::String
                | Kind::Bytes
                | Kind::I32
                | Kind::I64
                | Kind::Bool
                | Kind::Quantity
                | Kind::IntOrString
                | Kind::Fields
                | Kind::Extra => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_known_time_field_is_checked_where_it_is() {
        let event = |last: &str| json!({"metadata": {"name": "e"}, "involvedObject": {"name": "p"}, "lastTimestamp": last});
        assert!(check("v1", "Event", &event("2026-11-23T10:00:00Z")).is_ok());
        assert!(check("v1", "Event", &event("202é-11-23T10:00:00Z")).is_err());
        let lease = |renew: &str| json!({"metadata": {"name": "l"}, "spec": {"renewTime": renew}});
        assert!(
            check(
                "coordination.k8s.io/v1",
                "Lease",
                &lease("2026-11-23T10:00:00.000000Z")
            )
            .is_ok()
        );
        assert!(
            check(
                "coordination.k8s.io/v1",
                "Lease",
                &lease("2026-11-23T10:00:00Z")
            )
            .is_err()
        );
        // In a list of messages, and in the metadata every kind has.
        let claim = json!({"metadata": {"name": "c", "deletionTimestamp": "2026-11-23T10:00:00Z"},
                           "status": {"conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": "yesterday"}]}});
        assert!(check("v1", "PersistentVolumeClaim", &claim).is_err());
        // A custom resource has no message: it passes.
        assert!(check("example.com/v1", "Widget", &json!({"when": "never"})).is_ok());
    }

    #[test]
    fn inlined_messages_holding_times_are_checked_and_the_others_passed_over() {
        // D inlines B (a time) and holds E (no time) and an inlined F (no time).
        let schema = Schema::parse("D x=1:~B e=2:E y=3:~F\nB t=1:time\nE s=1\nF u=1").unwrap();
        let d = schema.message("D").unwrap();
        assert!(walk(&schema, d, &json!({"t": "2026-11-23T10:00:00Z"})).is_ok());
        assert!(walk(&schema, d, &json!({"t": "yesterday"})).is_err());
        // Fields without a time are not looked at, whatever they hold.
        assert!(walk(&schema, d, &json!({"e": {"s": 1}, "u": []})).is_ok());
    }
}
