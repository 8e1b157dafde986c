//! ConfigMaps and Secrets as kube-apiserver checks them: their base64 fields must decode (a
//! 400 at decoding, before validation), an `immutable` one keeps its data and stays
//! immutable, and a Secret keeps its type. Messages checked against kube-apiserver v1.36.2.

use serde_json::Value;

/// Where Go's standard base64 decoding (padded, newlines skipped) stops on `text`, if it does:
/// the byte index kube-apiserver names in `illegal base64 data at input byte N`.
pub fn base64_error(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let symbol = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    let skipped = |b: u8| b == b'\r' || b == b'\n';
    // How many symbols the quantum being read has.
    let mut have = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if skipped(b) {
            i += 1;
            continue;
        }
        if b == b'=' {
            // Padding ends the data: after two symbols two `=`, after three one.
            match have {
                2 => {
                    let next = (i + 1..bytes.len()).find(|&j| !skipped(bytes[j]));
                    match next {
                        Some(j) if bytes[j] == b'=' => i = j,
                        // Go names the byte before the one that is not padding.
                        Some(j) => return Some(j - 1),
                        None => return Some(bytes.len()),
                    }
                }
                3 => {}
                _ => return Some(i),
            }
            return (i + 1..bytes.len()).find(|&j| !skipped(bytes[j]));
        }
        if !symbol(b) {
            return Some(i);
        }
        have = (have + 1) % 4;
        i += 1;
    }
    // Input ended inside a quantum: Go names the byte as many symbols back from the end as
    // the quantum has (newlines within it counted as bytes, not symbols).
    (have != 0).then(|| bytes.len() - have)
}

/// A Secret's `data` or a ConfigMap's `binaryData` whose value is not base64: kube-apiserver's
/// decoding error, as the 400's message says it. Not checked when the update keeps `old`'s.
pub fn undecodable(kind: &str, object: &Value, old: Option<&Value>) -> Option<String> {
    let field = match kind {
        "Secret" => "data",
        "ConfigMap" => "binaryData",
        _ => return None,
    };
    if old.is_some_and(|old| old[field] == object[field]) {
        return None;
    }
    let values = object.get(field)?.as_object()?;
    values.values().find_map(|value| {
        let at = match value {
            Value::String(text) => base64_error(text)?,
            // Not a string at all: refused at its first byte (kube-apiserver's JSON decoder
            // words this one differently).
            _ => 0,
        };
        Some(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: illegal base64 data at input byte {at}"
        ))
    })
}

/// What may not change in a ConfigMap or Secret: with `immutable: true` stored, its data (and
/// a ConfigMap's binaryData) and `immutable` itself; a Secret's `type`. Each error found, in
/// kube-apiserver's order.
pub fn immutable_errors(kind: &str, object: &Value, old: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if kind == "Secret" && object["type"] != old["type"] {
        errors.push(format!(
            "type: Invalid value: {}: field is immutable",
            object["type"]
        ));
    }
    if old["immutable"] == Value::Bool(true) {
        let forbidden =
            |field: &str| format!("{field}: Forbidden: field is immutable when `immutable` is set");
        if object["immutable"] != Value::Bool(true) {
            errors.push(forbidden("immutable"));
        }
        if !same_map(&object["data"], &old["data"]) {
            errors.push(forbidden("data"));
        }
        if kind == "ConfigMap" && !same_map(&object["binaryData"], &old["binaryData"]) {
            errors.push(forbidden("binaryData"));
        }
    }
    errors
}

/// Two maps the same, an absent one the same as an empty one.
fn same_map(a: &Value, b: &Value) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|m| m.is_empty());
    a == b || (empty(a) && empty(b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_stops_where_gos_decoder_stops() {
        // kube-apiserver v1.36.2's byte for each (and None for what it takes).
        let rows = [
            ("not base64!", Some(3)),
            ("YQ", Some(0)),
            ("YQ=", Some(3)),
            ("Y", Some(0)),
            ("a b", Some(1)),
            ("YQ==", None),
            ("YWI=", None),
            ("YWJj", None),
            ("", None),
            ("YW\nJj", None),
            ("YQ==YQ==", Some(4)),
            ("YQ=x", Some(2)),
            ("Y===", Some(1)),
            ("YWJ=x", Some(4)),
            ("YQ=\n=", None),
            ("YQ==\n", None),
            ("YQ\n", Some(1)),
            ("YWJjZ\nA", Some(5)),
            ("=", Some(0)),
            ("YWJjZA", Some(4)),
            ("é", Some(0)),
        ];
        for (text, want) in rows {
            assert_eq!(base64_error(text), want, "{text:?}");
        }
        assert_eq!(
            undecodable(
                "Secret",
                &json!({"data": {"a": "YQ==", "b": "not base64!"}}),
                None
            )
            .unwrap(),
            "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 3"
        );
        assert!(undecodable("Secret", &json!({"data": {"a": "YQ=="}}), None).is_none());
        assert!(undecodable("ConfigMap", &json!({"data": {"a": "not base64!"}}), None).is_none());
        assert!(undecodable("ConfigMap", &json!({"binaryData": {"a": 7}}), None).is_some());
        // Stored before it was checked, kept as it is: not refused.
        let stored = json!({"data": {"a": "YQ"}, "metadata": {"finalizers": ["f"]}});
        let released = json!({"data": {"a": "YQ"}, "metadata": {}});
        assert!(undecodable("Secret", &released, Some(&stored)).is_none());
        assert!(undecodable("Secret", &json!({"data": {"a": "Y"}}), Some(&stored)).is_some());
    }

    #[test]
    fn immutable_config_keeps_its_data_and_a_secret_its_type() {
        let old = json!({"immutable": true, "data": {"a": "1"}, "type": "Opaque"});
        let rows: [(Value, &[&str]); 5] = [
            (
                json!({"immutable": true, "data": {"a": "1"}, "type": "Opaque"}),
                &[],
            ),
            (
                json!({"immutable": false, "data": {"a": "2"}, "type": "Opaque"}),
                &[
                    "immutable: Forbidden: field is immutable when `immutable` is set",
                    "data: Forbidden: field is immutable when `immutable` is set",
                ],
            ),
            (
                json!({"immutable": true, "data": {"a": "1"}, "type": "example.com/other"}),
                &["type: Invalid value: \"example.com/other\": field is immutable"],
            ),
            (
                json!({"immutable": true, "data": {"a": "1"}, "type": "Opaque", "metadata": {"labels": {"x": "y"}}}),
                &[],
            ),
            (
                json!({"data": {"a": "1"}, "type": "Opaque"}),
                &["immutable: Forbidden: field is immutable when `immutable` is set"],
            ),
        ];
        for (object, want) in rows {
            assert_eq!(immutable_errors("Secret", &object, &old), want, "{object}");
        }
        let map = json!({"immutable": true, "binaryData": {"b": "YQ=="}});
        assert_eq!(
            immutable_errors("ConfigMap", &json!({"immutable": true}), &map),
            ["binaryData: Forbidden: field is immutable when `immutable` is set"]
        );
        // A mutable one may become immutable with a change of its data.
        assert!(
            immutable_errors(
                "ConfigMap",
                &json!({"immutable": true, "data": {"a": "2"}}),
                &json!({"data": {"a": "1"}})
            )
            .is_empty()
        );
    }
}
