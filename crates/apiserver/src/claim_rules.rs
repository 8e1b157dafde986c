//! kube-apiserver's checks of a PersistentVolumeClaim spec that clients notice: a storage
//! request that is a valid, positive quantity, access modes and volume mode from the
//! supported sets, what an update may change (the storage request of a bound claim, never
//! below its capacity), and the `PersistentVolumeClaimResize` admission (growing needs a
//! class that allows expansion). Messages are kube-apiserver's, so kubectl prints the same line.

use std::cmp::Ordering;

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

/// The storage request of a claim object, as written.
fn storage_request(claim: &Value) -> Option<&str> {
    claim["spec"]["resources"]["requests"]["storage"].as_str()
}

/// How two quantities compare (None when one is not a quantity, or too large to compare).
pub fn quantity_cmp(a: &str, b: &str) -> Option<Ordering> {
    Some(nano_units(a)?.cmp(&nano_units(b)?))
}

/// Whether the update from `old` to `new` changes a claim's spec beyond what kube-apiserver
/// lets change: `volumeName` once, the default class once, `volumeAttributesClassName`, and
/// the storage request of a claim that is Bound; and whether it shrinks the request below the
/// claim's capacity (allowed down to just above it, to recover from a failed expansion).
pub fn check_update(new: &Value, old: &Value) -> Result<(), String> {
    let mut a = old["spec"].clone();
    let mut b = new["spec"].clone();
    let bound = new["status"]["phase"].as_str() == Some("Bound");
    for v in [&mut a, &mut b] {
        if let Some(m) = v.as_object_mut() {
            m.remove("volumeAttributesClassName");
        }
        if bound && let Some(requests) = v["resources"]["requests"].as_object_mut() {
            requests.remove("storage");
        }
    }
    // Binding sets volumeName once; the default class is assigned once.
    for field in ["volumeName", "storageClassName"] {
        if a[field].is_null() || a[field] == "" {
            for v in [&mut a, &mut b] {
                if let Some(m) = v.as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
    if a != b {
        return Err("spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims".into());
    }
    let (Some(new_size), Some(old_size)) = (storage_request(new), storage_request(old)) else {
        return Ok(());
    };
    if quantity_cmp(new_size, old_size) == Some(Ordering::Less) {
        let capacity = old["status"]["capacity"]["storage"].as_str();
        // No capacity recorded compares as zero, as in kube-apiserver.
        let at_or_below = capacity
            .and_then(|c| quantity_cmp(new_size, c))
            .is_some_and(|o| o != Ordering::Greater);
        if at_or_below {
            return Err(
                "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
                    .into(),
            );
        }
    }
    Ok(())
}

/// What `PersistentVolumeClaimResize` says of an update from `old` to `new` that grows the
/// storage request: the claim must have been Bound, and both name the same class, which
/// `allows_expansion` (its `allowVolumeExpansion` is true; false when it does not exist).
/// None: admitted.
pub fn refuse_resize(
    new: &Value,
    old: &Value,
    allows_expansion: impl FnOnce(&str) -> bool,
) -> Option<&'static str> {
    let (new_size, old_size) = (storage_request(new)?, storage_request(old)?);
    if quantity_cmp(new_size, old_size) != Some(Ordering::Greater) {
        return None;
    }
    if old["status"]["phase"].as_str() != Some("Bound") {
        return Some("Only bound persistent volume claims can be expanded");
    }
    let (class, old_class) = (claim_class(new), claim_class(old));
    let allowed = !class.is_empty() && class == old_class && allows_expansion(class);
    (!allowed).then_some(
        "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
    )
}

/// A claim's class: the beta annotation first, then `spec.storageClassName` ("" for none).
pub fn claim_class(claim: &Value) -> &str {
    claim["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"]
        .as_str()
        .or_else(|| claim["spec"]["storageClassName"].as_str())
        .unwrap_or_default()
}

/// A quantity in units of 10^-9 (exact for every quantity with at most nine decimals below
/// the unit), or None when it is not one or does not fit.
pub(crate) fn nano_units(text: &str) -> Option<i128> {
    let parts = crate::quantities::written(text)?;
    let binary = u32::try_from(parts.binary_exponent()).ok()?;
    let mut value: i128 = 0;
    for digit in parts.num.bytes().chain(parts.denom.bytes()) {
        value = value
            .checked_mul(10)?
            .checked_add(i128::from(digit - b'0'))?;
    }
    let fraction_digits = i32::try_from(parts.denom.len()).ok()?;
    let exponent = parts
        .decimal_exponent()
        .checked_add(9)?
        .checked_sub(fraction_digits)?;
    value = value.checked_mul(1i128.checked_shl(binary)?)?;
    if exponent >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)?;
    } else {
        // Below a nano unit: kept as its ceiling, which orders every quantity the API accepts.
        let divisor = 10i128.checked_pow(exponent.unsigned_abs())?;
        let rounded_up = value % divisor != 0;
        value = value / divisor + i128::from(rounded_up);
    }
    Some(if parts.negative { -value } else { value })
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
    let parts = crate::quantities::written(text)?;
    let zero = parts.num.is_empty() && parts.denom.bytes().all(|b| b == b'0');
    Some(match (zero, parts.negative) {
        (true, _) => 0,
        (false, true) => -1,
        (false, false) => 1,
    })
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
    fn quantities_compare_exactly_across_suffixes() {
        let cases = [
            ("1Gi", "1073741824", Some(Ordering::Equal)),
            ("1Gi", "1G", Some(Ordering::Greater)),
            ("1.5Gi", "1536Mi", Some(Ordering::Equal)),
            ("2Gi", "2147483649", Some(Ordering::Less)),
            ("1e3", "1k", Some(Ordering::Equal)),
            ("500m", "1", Some(Ordering::Less)),
            ("-1", "0", Some(Ordering::Less)),
            ("8Ei", "9223372036854775807", Some(Ordering::Greater)),
            ("1Gi", "lots", None),
            ("1e400", "1", None),
            (
                "123456789012345678901234567890123456789e-38",
                "1",
                Some(Ordering::Greater),
            ),
        ];
        for (a, b, want) in cases {
            assert_eq!(quantity_cmp(a, b), want, "{a} vs {b}");
        }
    }

    fn claim(phase: &str, request: &str, capacity: Option<&str>, class: &str) -> Value {
        let mut c = json!({
            "metadata": {"name": "c"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "volumeName": "pv-1", "resources": {"requests": {"storage": request}}},
            "status": {"phase": phase},
        });
        if let Some(capacity) = capacity {
            c["status"]["capacity"] = json!({"storage": capacity});
        }
        c
    }

    #[test]
    fn updates_change_only_what_kube_apiserver_lets_change() {
        const IMMUTABLE: &str = "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";
        const BELOW: &str = "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity";
        let cases = [
            // (old, new, error)
            (
                claim("Bound", "1Gi", Some("1Gi"), "fast"),
                claim("Bound", "2Gi", Some("1Gi"), "fast"),
                None,
            ),
            (
                claim("Pending", "1Gi", None, "fast"),
                claim("Pending", "2Gi", None, "fast"),
                Some(IMMUTABLE),
            ),
            (
                claim("Bound", "1Gi", Some("1Gi"), "fast"),
                claim("Bound", "1Gi", Some("1Gi"), "slow"),
                Some(IMMUTABLE),
            ),
            // Shrinking: not to the capacity or below, but back towards it after a failed growth.
            (
                claim("Bound", "2Gi", Some("1Gi"), "fast"),
                claim("Bound", "1Gi", Some("1Gi"), "fast"),
                Some(BELOW),
            ),
            (
                claim("Bound", "2Gi", Some("1Gi"), "fast"),
                claim("Bound", "512Mi", Some("1Gi"), "fast"),
                Some(BELOW),
            ),
            (
                claim("Bound", "3Gi", Some("1Gi"), "fast"),
                claim("Bound", "2Gi", Some("1Gi"), "fast"),
                None,
            ),
            (
                claim("Bound", "2Gi", None, "fast"),
                claim("Bound", "1Gi", None, "fast"),
                None,
            ),
        ];
        for (old, new, want) in cases {
            assert_eq!(
                check_update(&new, &old).err().as_deref(),
                want,
                "{old} -> {new}"
            );
        }
        // A change of the class of attributes is always allowed by this check.
        let old = claim("Bound", "1Gi", Some("1Gi"), "fast");
        let mut new = old.clone();
        new["spec"]["volumeAttributesClassName"] = json!("gold");
        assert_eq!(check_update(&new, &old), Ok(()));
    }

    #[test]
    fn growing_needs_a_bound_claim_and_a_class_that_allows_expansion() {
        const CLASS: &str = "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize";
        let allows = |name: &str| name == "expandable";
        let cases = [
            (
                claim("Bound", "1Gi", Some("1Gi"), "expandable"),
                claim("Bound", "2Gi", Some("1Gi"), "expandable"),
                None,
            ),
            (
                claim("Bound", "1Gi", Some("1Gi"), "fixed"),
                claim("Bound", "2Gi", Some("1Gi"), "fixed"),
                Some(CLASS),
            ),
            (
                claim("Bound", "1Gi", Some("1Gi"), ""),
                claim("Bound", "2Gi", Some("1Gi"), ""),
                Some(CLASS),
            ),
            (
                claim("Pending", "1Gi", None, "expandable"),
                claim("Pending", "2Gi", None, "expandable"),
                Some("Only bound persistent volume claims can be expanded"),
            ),
            // Not growing: nothing to say.
            (
                claim("Bound", "2Gi", Some("1Gi"), "fixed"),
                claim("Bound", "1500Mi", Some("1Gi"), "fixed"),
                None,
            ),
            (
                claim("Bound", "1Gi", Some("1Gi"), "fixed"),
                claim("Bound", "1024Mi", Some("1Gi"), "fixed"),
                None,
            ),
        ];
        for (old, new, want) in cases {
            assert_eq!(refuse_resize(&new, &old, allows), want, "{old} -> {new}");
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
