//! kube-apiserver's checks of object metadata: label keys and values, annotation keys and
//! total size, finalizer names. Messages are kube-apiserver's (`path: Type: detail`), so
//! kubectl prints the same line.

use serde_json::Value;

/// kube-apiserver's limit on the total size of an object's annotations (keys and values).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const PREFIX_PART: &str = "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Why `key` is not a qualified name (`[prefix/]name`), as kube-apiserver says it.
pub fn qualified_name_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.contains('/') {
        return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if prefix.len() > 253 || !crate::objects::is_dns_subdomain(prefix) {
            return Some(PREFIX_PART.into());
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 bytes".into());
    }
    if !name_part_ok(name) {
        return Some(NAME_PART.into());
    }
    None
}

/// Why `value` is not a label value, as kube-apiserver says it.
pub fn label_value_error(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some("must be no more than 63 bytes".into());
    }
    (!value.is_empty() && !name_part_ok(value)).then(|| LABEL_VALUE.to_string())
}

fn shown(value: &str) -> String {
    format!("{value:?}")
}

/// Every metadata error, as `path: Type: detail`, in kube-apiserver's order.
pub fn check(metadata: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(labels) = metadata["labels"].as_object() {
        for (key, value) in labels {
            if let Some(why) = qualified_name_error(key) {
                errors.push(format!(
                    "metadata.labels: Invalid value: {}: {why}",
                    shown(key)
                ));
            }
            match value.as_str() {
                None => errors.push(format!(
                    "metadata.labels: Invalid value: {value}: must be a string"
                )),
                Some(text) => {
                    if let Some(why) = label_value_error(text) {
                        errors.push(format!(
                            "metadata.labels: Invalid value: {}: {why}",
                            shown(text)
                        ));
                    }
                }
            }
        }
    }
    if let Some(annotations) = metadata["annotations"].as_object() {
        let mut total = 0;
        for (key, value) in annotations {
            if let Some(why) = qualified_name_error(&key.to_ascii_lowercase()) {
                errors.push(format!(
                    "metadata.annotations: Invalid value: {}: {why}",
                    shown(key)
                ));
            }
            total += key.len() + value.as_str().map_or(0, str::len);
        }
        if total > MAX_ANNOTATIONS_BYTES {
            errors.push(format!(
                "metadata.annotations: Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"
            ));
        }
    }
    if let Some(finalizers) = metadata["finalizers"].as_array() {
        for (i, finalizer) in finalizers.iter().enumerate() {
            let text = finalizer.as_str().unwrap_or_default();
            if let Some(why) = qualified_name_error(text) {
                errors.push(format!(
                    "metadata.finalizers[{i}]: Invalid value: {}: {why}",
                    shown(text)
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn metadata_is_checked_as_kube_apiserver_checks_it() {
        let ok = [
            json!({"labels": {"app": "x", "example.com/tier": "", "a.b-c_d": "V.1"}}),
            json!({"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "Some.Key": "x"}}),
            json!({"finalizers": ["kubernetes.io/pvc-protection", "kubernetes", "external-provisioner.volume.kubernetes.io/finalizer"]}),
        ];
        for metadata in ok {
            assert_eq!(check(&metadata), Vec::<String>::new(), "{metadata}");
        }
        let bad = [
            (
                json!({"labels": {"bad key": "x"}}),
                "metadata.labels: Invalid value: \"bad key\": name part must consist",
            ),
            (
                json!({"labels": {"Example.com/x": "x"}}),
                "metadata.labels: Invalid value: \"Example.com/x\": prefix part a lowercase RFC 1123",
            ),
            (
                json!({"labels": {"a": "-x"}}),
                "metadata.labels: Invalid value: \"-x\": a valid label must be an empty string",
            ),
            (
                json!({"labels": {"a": "x".repeat(64)}}),
                "must be no more than 63 bytes",
            ),
            (
                json!({"labels": {"a/b/c": "x"}}),
                "a qualified name must consist",
            ),
            (
                json!({"annotations": {"/x": "y"}}),
                "metadata.annotations: Invalid value: \"/x\": prefix part must be non-empty",
            ),
            (
                json!({"annotations": {"a": "x".repeat(MAX_ANNOTATIONS_BYTES)}}),
                "metadata.annotations: Too long: may not be more than 262144 bytes",
            ),
            (
                json!({"finalizers": ["ok.io/x", "not ok"]}),
                "metadata.finalizers[1]: Invalid value: \"not ok\"",
            ),
        ];
        for (metadata, expected) in bad {
            let error = check(&metadata).join("\n");
            assert!(
                error.starts_with(expected) || error.contains(expected),
                "{error}"
            );
        }
        // Every error is named, in kube-apiserver's order (a label's key, then its value).
        let long = "k".repeat(70);
        let errors =
            check(&json!({"labels": {long.clone(): long.clone()}, "finalizers": ["not ok"]}));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].ends_with("name part must be no more than 63 bytes"),
            "{errors:?}"
        );
        assert!(
            errors[1].ends_with(": must be no more than 63 bytes"),
            "{errors:?}"
        );
        assert!(
            errors[2].starts_with("metadata.finalizers[0]"),
            "{errors:?}"
        );
    }
}
