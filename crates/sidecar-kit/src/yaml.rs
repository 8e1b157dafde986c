//! YAML documents as JSON values: the manifests of `deploy/kubernetes` and the files flags
//! name (a recycler Pod template), read as kube-apiserver and kubectl read them.

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// A YAML value as JSON (keys as strings; anchors are not followed).
pub fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Yaml::Integer(n) => Value::from(*n),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                let key = match key {
                    Yaml::String(s) | Yaml::Real(s) => s.clone(),
                    Yaml::Integer(n) => n.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    _ => continue,
                };
                out.insert(key, to_json(value));
            }
            Value::Object(out)
        }
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// The objects of a multi-document YAML (or JSON) text, empty documents skipped; the error is
/// the parser's.
pub fn objects(text: &str) -> Result<Vec<Value>, String> {
    let documents = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    Ok(documents
        .iter()
        .map(to_json)
        .filter(Value::is_object)
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_and_json_documents_read_as_objects() {
        let text = "a: 1\nb: [x, 2.5, true]\n---\n---\n{\"c\": {\"d\": null}}\n";
        assert_eq!(
            objects(text).unwrap(),
            vec![
                json!({"a": 1, "b": ["x", 2.5, true]}),
                json!({"c": {"d": null}})
            ]
        );
        assert!(objects("a: [1, 2").is_err());
        assert!(objects("just text").unwrap().is_empty());
    }
}
