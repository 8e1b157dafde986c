//! kube-apiserver's checks of a PersistentVolumeClaim spec that clients notice: a storage
//! request that is a valid, positive quantity, and access modes and volume mode from the
//! supported sets. Messages are kube-apiserver's, so kubectl prints the same line.

use serde_json::Value;

use crate::storage_rules::{ACCESS_MODES, VOLUME_MODES, one_of, quantity};

/// The first field error of a claim spec, as `path: Type: detail`.
pub fn check_spec(spec: &Value) -> Result<(), String> {
    for mode in spec["accessModes"].as_array().into_iter().flatten() {
        if mode.is_null() {
            return Err(unsupported("spec.accessModes", mode, &ACCESS_MODES));
        }
        one_of("spec.accessModes", mode, &ACCESS_MODES)?;
    }
    one_of("spec.volumeMode", &spec["volumeMode"], &VOLUME_MODES)?;
    quantity(
        "spec.resources[storage]",
        &spec["resources"]["requests"]["storage"],
        true,
    )
}

pub fn unsupported(path: &str, value: &Value, supported: &[&str]) -> String {
    let shown = match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "{path}: Unsupported value: {shown}: supported values: {}",
        list.join(", ")
    )
}

/// The sign of a Kubernetes quantity (-1, 0 or 1), or None when it is not a quantity.
pub fn quantity_sign(text: &str) -> Option<i8> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 || !valid_suffix(suffix) {
        return None;
    }
    let zero = number.bytes().all(|b| b == b'0' || b == b'.');
    Some(match (zero, negative) {
        (true, _) => 0,
        (false, true) => -1,
        (false, false) => 1,
    })
}

fn valid_suffix(suffix: &str) -> bool {
    const SUFFIXES: [&str; 16] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    // Decimal exponent: e or E, an optional sign, digits.
    let Some(exponent) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_are_recognised_with_their_sign() {
        let cases = [
            ("1Gi", Some(1)),
            ("+5", Some(1)),
            ("1.5G", Some(1)),
            ("0", Some(0)),
            ("0.0Mi", Some(0)),
            ("-5Gi", Some(-1)),
            ("1e3", Some(1)),
            ("2E-2", Some(1)),
            ("abc", None),
            ("", None),
            ("1.2.3", None),
            ("5GB", None),
            ("1e", None),
        ];
        for (text, want) in cases {
            assert_eq!(quantity_sign(text), want, "{text:?}");
        }
    }

    #[test]
    fn claim_specs_get_kube_apiservers_messages() {
        let cases = [
            (
                json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "-5Gi"}}}),
                Some("spec.resources[storage]: Invalid value: \"-5Gi\": must be greater than zero"),
            ),
            (
                json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "0"}}}),
                Some("spec.resources[storage]: Invalid value: \"0\": must be greater than zero"),
            ),
            (
                json!({"accessModes": ["Bogus"], "resources": {"requests": {"storage": "1Gi"}}}),
                Some(
                    "spec.accessModes: Unsupported value: \"Bogus\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
                ),
            ),
            (
                json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Raw", "resources": {"requests": {"storage": "1Gi"}}}),
                Some(
                    "spec.volumeMode: Unsupported value: \"Raw\": supported values: \"Block\", \"Filesystem\"",
                ),
            ),
            (
                json!({"accessModes": ["ReadWriteOncePod"], "volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}}}),
                None,
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(check_spec(&spec).err().as_deref(), want, "{spec}");
        }
    }
}
