//! Structural-schema validation of custom resources, as kube-apiserver does it for a
//! CustomResourceDefinition's `openAPIV3Schema`: types (with `x-kubernetes-int-or-string`),
//! `required`, `enum`, `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`,
//! `properties`, `items` and `additionalProperties`, with kube-apiserver's messages. Unknown
//! fields are kept (no pruning); a null counts as absent. `metadata`, `apiVersion` and `kind`
//! are checked elsewhere.

use serde_json::Value;

/// Every problem of `object` against `schema` (the root `openAPIV3Schema`), as field errors.
pub fn check(schema: &Value, object: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (name, sub) in properties {
            if matches!(name.as_str(), "metadata" | "apiVersion" | "kind") {
                continue;
            }
            if let Some(value) = object.get(name).filter(|v| !v.is_null()) {
                walk(sub, value, name, &mut errors);
            }
        }
    }
    for name in required(schema) {
        if !matches!(name, "metadata" | "apiVersion" | "kind")
            && object.get(name).is_none_or(Value::is_null)
        {
            errors.push(format!("{name}: Required value"));
        }
    }
    errors
}

fn required(schema: &Value) -> impl Iterator<Item = &str> {
    schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if !matches!(type_of(value), "integer" | "string") {
            errors.push(format!(
                "{path}: Invalid value: {}: {path} in body must be of type integer,string: {:?}",
                shown(value),
                type_of(value)
            ));
        }
        return;
    }
    if let Some(want) = schema["type"].as_str() {
        let have = type_of(value);
        let fits = have == want || (want == "number" && have == "integer");
        if !fits {
            errors.push(format!(
                "{path}: Invalid value: {}: {path} in body must be of type {want}: {have:?}",
                shown(value)
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(shown).collect();
        errors.push(format!(
            "{path}: Unsupported value: {}: supported values: {}",
            shown(value),
            list.join(", ")
        ));
    }
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = schema["minimum"].as_f64()
                && x < min
            {
                errors.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should be greater than or equal to {}",
                    schema["minimum"]
                ));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && x > max
            {
                errors.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should be less than or equal to {}",
                    schema["maximum"]
                ));
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64()
                && chars < min
            {
                errors.push(format!(
                    "{path}: Invalid value: {s:?}: {path} in body should be at least {min} chars long"
                ));
            }
            if let Some(max) = schema["maxLength"].as_u64()
                && chars > max
            {
                errors.push(format!(
                    "{path}: Too long: may not be more than {max} bytes"
                ));
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema["minItems"].as_u64()
                && n < min
            {
                errors.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should have at least {min} items"
                ));
            }
            if let Some(max) = schema["maxItems"].as_u64()
                && n > max
            {
                errors.push(format!(
                    "{path}: Too many: {n}: must have at most {max} items"
                ));
            }
            if schema["items"].is_object() {
                for (i, item) in items.iter().enumerate() {
                    if !item.is_null() {
                        walk(&schema["items"], item, &format!("{path}[{i}]"), errors);
                    }
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            for (name, field) in fields {
                if field.is_null() {
                    continue;
                }
                let sub = properties
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
                if let Some(sub) = sub {
                    walk(sub, field, &format!("{path}.{name}"), errors);
                }
            }
            for name in required(schema) {
                if fields.get(name).is_none_or(Value::is_null) {
                    errors.push(format!("{path}.{name}: Required value"));
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;

    fn schema() -> serde_json::Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["min", "template"],
                    "properties": {
                        "min": {"type": "integer", "minimum": 0},
                        "mode": {"type": "string", "enum": ["A", "B"]},
                        "name": {"type": "string", "minLength": 1},
                        "size": {"x-kubernetes-int-or-string": true},
                        "modes": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": ["X"]}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "template": {"type": "object"},
                    },
                },
            },
        })
    }

    #[test]
    fn custom_resources_are_checked_against_their_schema_with_kube_apiservers_words() {
        let good = json!({"metadata": {"name": "x", "labels": {"a": 1}}, "spec": {"min": 2, "mode": "A", "size": "1Gi", "modes": ["X"], "labels": {"k": "v"}, "template": {}, "unknown": {"kept": true}}});
        assert_eq!(check(&schema(), &good), Vec::<String>::new());
        let cases = [
            (json!({}), "spec: Required value"),
            (
                json!({"spec": {"template": {}}}),
                "spec.min: Required value",
            ),
            (
                json!({"spec": {"min": -1, "template": {}}}),
                "spec.min: Invalid value: -1: spec.min in body should be greater than or equal to 0",
            ),
            (
                json!({"spec": {"min": "two", "template": {}}}),
                "spec.min: Invalid value: \"two\": spec.min in body must be of type integer: \"string\"",
            ),
            (
                json!({"spec": {"min": 1, "mode": "C", "template": {}}}),
                "spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\"",
            ),
            (
                json!({"spec": {"min": 1, "name": "", "template": {}}}),
                "spec.name: Invalid value: \"\": spec.name in body should be at least 1 chars long",
            ),
            (
                json!({"spec": {"min": 1, "size": true, "template": {}}}),
                "spec.size: Invalid value: true: spec.size in body must be of type integer,string: \"boolean\"",
            ),
            (
                json!({"spec": {"min": 1, "modes": [], "template": {}}}),
                "spec.modes: Invalid value: 0: spec.modes in body should have at least 1 items",
            ),
            (
                json!({"spec": {"min": 1, "modes": ["Y"], "template": {}}}),
                "spec.modes[0]: Unsupported value: \"Y\": supported values: \"X\"",
            ),
            (
                json!({"spec": {"min": 1, "labels": {"k": 3}, "template": {}}}),
                "spec.labels.k: Invalid value: 3: spec.labels.k in body must be of type string: \"integer\"",
            ),
        ];
        for (object, want) in cases {
            assert_eq!(
                check(&schema(), &object),
                vec![want.to_string()],
                "{object}"
            );
        }
        assert!(
            check(&schema(), &json!({"spec": {"min": null, "template": {}}}))[0]
                .contains("Required value"),
            "null counts as absent"
        );
    }
}
