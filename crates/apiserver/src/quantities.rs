//! Quantities stored as kube-apiserver stores them (apimachinery's `Quantity` read and
//! written again, checked against kube-apiserver v1.36.2 by
//! `cli/tests/real_cluster/quantities.rs`): a text its parse takes for canonical is kept as written (`1Gi`, `+5M`, `1E3`, `05M`);
//! otherwise a binary quantity of at least 1024 becomes the largest power of 1024 that divides
//! it (`1024Mi` is `1Gi`, `1536Ki` stays), every other one decimal with an exponent that is a
//! multiple of three and its SI suffix (`100000000` is `100M`, `1.5` is `1500m`, `0.5Ki` is
//! `512`), exponent forms exponents (`1.5e6` is `1500e3`). A resource list's values (a claim's
//! requests and capacity, a volume's capacity, a Node's, a Pod's containers') are rounded up
//! to milli units first (`1n` is `1m`), a lone quantity (a storage capacity's, an `emptyDir`'s
//! size limit) to nano units.

use serde_json::Value;

use crate::claim_rules::nano_units;

/// How a quantity was written, which decides how it is written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `Ki` to `Ei`.
    BinarySi,
    /// No suffix, or `n` to `E`.
    DecimalSi,
    /// `e<n>` or `E<n>`.
    DecimalExponent,
}

/// The binary suffixes by power of 1024.
const BINARY: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Nano units in one unit, and in a milli unit.
const NANO: u128 = 1_000_000_000;
const NANO_PER_MILLI: u128 = 1_000_000;

/// How a quantity is rounded where it is stored: a resource list's values (a claim's requests,
/// a volume's capacity) up to milli units, as kube-apiserver's `SetDefaults_ResourceList`
/// does; a lone quantity (a storage capacity's) up to nano units, as its parse does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Up to 10^-3.
    Milli,
    /// Up to 10^-9.
    Nano,
}

/// A quantity's parts as written: sign, integer digits without leading zeros, fraction
/// digits, and its suffix's format and exponent (of 2 for binary, of 10 otherwise). The one
/// reading of a quantity's text here ([`crate::claim_rules`] values it from these parts).
pub(crate) struct Written<'a> {
    pub(crate) negative: bool,
    pub(crate) num: &'a str,
    pub(crate) denom: &'a str,
    format: Format,
    pub(crate) exponent: i32,
}

impl Written<'_> {
    /// The power of two of a binary suffix (`Ki` is 10), else 0.
    pub(crate) fn binary_exponent(&self) -> i32 {
        if self.format == Format::BinarySi {
            self.exponent
        } else {
            0
        }
    }

    /// The power of ten of a decimal suffix or exponent, else 0.
    pub(crate) fn decimal_exponent(&self) -> i32 {
        if self.format == Format::BinarySi {
            0
        } else {
            self.exponent
        }
    }
}

/// The parts of `text`, or None when it is not a quantity (no digits, two points, an unknown
/// suffix).
pub(crate) fn written(text: &str) -> Option<Written<'_>> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (num, denom) = number.split_once('.').unwrap_or((number, ""));
    if num.is_empty() && denom.is_empty() || denom.contains('.') {
        return None;
    }
    let (format, exponent) = match suffix {
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let power = BINARY.iter().position(|b| *b == suffix)?;
            (Format::BinarySi, i32::try_from(power).ok()? * 10)
        }
        "n" => (Format::DecimalSi, -9),
        "u" => (Format::DecimalSi, -6),
        "m" => (Format::DecimalSi, -3),
        "" => (Format::DecimalSi, 0),
        "k" => (Format::DecimalSi, 3),
        "M" => (Format::DecimalSi, 6),
        "G" => (Format::DecimalSi, 9),
        "T" => (Format::DecimalSi, 12),
        "P" => (Format::DecimalSi, 15),
        "E" => (Format::DecimalSi, 18),
        other => (
            Format::DecimalExponent,
            other.strip_prefix(['e', 'E'])?.parse().ok()?,
        ),
    };
    Some(Written {
        negative,
        num: num.trim_start_matches('0'),
        denom,
        format,
        exponent,
    })
}

/// Whether kube-apiserver keeps the text as written: its parse reuses a string it takes for
/// canonical (apimachinery's fast path: a binary quantity without a fraction whose number is
/// not a multiple of 8, or a decimal one with at most 18 digits, a scale that is a multiple
/// of three and at least nano, and a number neither starting with 0 nor ending in 000), and
/// the rounding keeps it when it changes nothing.
fn kept_as_written(parts: &Written<'_>, rounding: Rounding) -> bool {
    let digits = i32::try_from(parts.num.len() + parts.denom.len()).unwrap_or(i32::MAX);
    // apimachinery's `num + denom`, its integer part "0" when only zeros were written.
    let num = if parts.num.is_empty() { "0" } else { parts.num };
    let shifted = format!("{num}{}", parts.denom);
    let Ok(value) = shifted.parse::<i64>() else {
        return false;
    };
    let scale = match parts.format {
        Format::BinarySi => {
            let precision = 15
                - i32::try_from(parts.num.len()).unwrap_or(i32::MAX)
                - (parts.exponent * 3 / 10)
                - 1;
            if !parts.denom.is_empty() || precision < 0 {
                return false;
            }
            if value.checked_mul(1i64 << parts.exponent).is_none() || value & 0x07 == 0 {
                return false;
            }
            0
        }
        Format::DecimalSi | Format::DecimalExponent => {
            let scale = parts.exponent - i32::try_from(parts.denom.len()).unwrap_or(i32::MAX);
            if 18 - digits < 0
                || scale < -9
                || scale % 3 != 0
                || shifted.ends_with("000")
                || shifted.starts_with('0')
            {
                return false;
            }
            scale
        }
    };
    match rounding {
        Rounding::Milli => scale >= -3,
        Rounding::Nano => true,
    }
}

/// The text kube-apiserver stores for `text`, rounded as `rounding` says; None when it is not
/// a quantity (or does not fit in 128 bits, or its decimal exponent has no SI suffix): then
/// it is left as written.
pub fn stored(text: &str, rounding: Rounding) -> Option<String> {
    let text = text.trim();
    let parts = written(text)?;
    let nano = nano_units(text)?;
    if nano == 0 {
        return Some("0".into());
    }
    if kept_as_written(&parts, rounding) {
        return Some(text.to_string());
    }
    let sign = if nano < 0 { "-" } else { "" };
    let mut mantissa = nano.unsigned_abs();
    if rounding == Rounding::Milli {
        mantissa = mantissa
            .div_ceil(NANO_PER_MILLI)
            .checked_mul(NANO_PER_MILLI)?;
    }
    if parts.format == Format::BinarySi && mantissa.is_multiple_of(NANO) && mantissa / NANO >= 1024
    {
        let mut value = mantissa / NANO;
        let mut power = 0;
        while value.is_multiple_of(1024) && power < BINARY.len() - 1 {
            value /= 1024;
            power += 1;
        }
        return Some(format!("{sign}{value}{}", BINARY[power]));
    }
    let mut exponent: i32 = -9;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exponent += 1;
    }
    // The exponent down to a multiple of three.
    match exponent.rem_euclid(3) {
        1 => {
            mantissa = mantissa.checked_mul(10)?;
            exponent -= 1;
        }
        2 => {
            mantissa = mantissa.checked_mul(100)?;
            exponent -= 2;
        }
        _ => {}
    }
    let suffix = match parts.format {
        Format::DecimalExponent if exponent == 0 => String::new(),
        Format::DecimalExponent => format!("e{exponent}"),
        Format::DecimalSi | Format::BinarySi => match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => return None,
        }
        .to_string(),
    };
    Some(format!("{sign}{mantissa}{suffix}"))
}

/// The quantities of a claim, volume, Node or storage capacity written in canonical form
/// (what is not a quantity is left for validation to refuse); a Pod's and its templates' are
/// in [`crate::pod_defaults`].
pub fn canonicalize(group: &str, plural: &str, object: &mut Value) {
    let paths: &[&[&str]] = match (group, plural) {
        ("", "persistentvolumeclaims") => &[
            &["spec", "resources", "requests"],
            &["spec", "resources", "limits"],
            &["status", "capacity"],
            &["status", "allocatedResources"],
        ],
        ("", "persistentvolumes") => &[&["spec", "capacity"]],
        ("", "nodes") => &[&["status", "capacity"], &["status", "allocatable"]],
        _ => &[],
    };
    for path in paths {
        let map = path
            .iter()
            .try_fold(&mut *object, |at, part| at.get_mut(*part))
            .and_then(Value::as_object_mut);
        for value in map.into_iter().flat_map(|m| m.values_mut()) {
            canonical_in_place(value, Rounding::Milli);
        }
    }
    if (group, plural) == ("storage.k8s.io", "csistoragecapacities") {
        for field in ["capacity", "maximumVolumeSize"] {
            if let Some(value) = object.get_mut(field) {
                canonical_in_place(value, Rounding::Nano);
            }
        }
    }
}

/// Writes `value` (a quantity's text) as kube-apiserver stores it; anything else is left. A
/// JSON number (kubectl sends YAML's `cpu: 1` so) is stored as text: integers and plain
/// decimals as kube-apiserver reads them; one in exponent form as serde_json writes it (`1e3`
/// becomes `1000.0`, stored `1k`, where kube-apiserver keeps `1e3`).
pub(crate) fn canonical_in_place(value: &mut Value, rounding: Rounding) {
    if let Value::Number(number) = value {
        *value = Value::String(number.to_string());
    }
    if let Some(canonical) = value.as_str().and_then(|text| stored(text, rounding))
        && value.as_str() != Some(canonical.as_str())
    {
        *value = Value::String(canonical);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What kube-apiserver v1.36.2 stored for a claim's request (`tests/real_cluster/quantities.rs`
    /// compares every server answer with ours).
    #[test]
    fn quantities_are_stored_as_kube_apiserver_stores_them() {
        // (written, stored in a resource list, stored alone)
        let table = [
            ("1Gi", "1Gi", "1Gi"),
            ("1024Mi", "1Gi", "1Gi"),
            ("2048Ki", "2Mi", "2Mi"),
            ("1536Ki", "1536Ki", "1536Ki"),
            ("1000Mi", "1000Mi", "1000Mi"),
            ("3Mi", "3Mi", "3Mi"),
            ("1.5Gi", "1536Mi", "1536Mi"),
            ("0.5Gi", "512Mi", "512Mi"),
            ("0.5Ki", "512", "512"),
            ("0.3Ki", "307200m", "307200m"),
            ("1023", "1023", "1023"),
            ("1500", "1500", "1500"),
            ("10000", "10k", "10k"),
            ("100000000", "100M", "100M"),
            ("1073741824", "1073741824", "1073741824"),
            ("1000M", "1G", "1G"),
            ("1.5M", "1500k", "1500k"),
            ("05M", "05M", "05M"),
            ("1.5", "1500m", "1500m"),
            ("0.1", "100m", "100m"),
            ("1e3", "1e3", "1e3"),
            ("1E3", "1E3", "1E3"),
            ("1.5e6", "1500e3", "1500e3"),
            ("1E", "1E", "1E"),
            ("1n", "1m", "1n"),
            ("0.1n", "1m", "1n"),
            ("1e-12", "1e-3", "1e-9"),
            ("0", "0", "0"),
            ("0Gi", "0", "0"),
            ("+5M", "+5M", "+5M"),
            ("-1024Mi", "-1Gi", "-1Gi"),
            (" 1Gi ", "1Gi", "1Gi"),
        ];
        for (written, list, alone) in table {
            assert_eq!(
                stored(written, Rounding::Milli).as_deref(),
                Some(list),
                "{written:?}"
            );
            assert_eq!(
                stored(written, Rounding::Nano).as_deref(),
                Some(alone),
                "{written:?}"
            );
        }
        for left in ["", "abc", "1Zi", "1000E"] {
            assert_eq!(stored(left, Rounding::Milli), None, "{left:?}");
        }
    }

    #[test]
    fn a_claims_and_a_volumes_quantities_are_made_canonical() {
        let mut claim = json!({"spec": {"resources": {"requests": {"storage": "1024Mi"},
                                                      "limits": {"storage": "2048Mi"}}},
                               "status": {"capacity": {"storage": "1000M"}}});
        canonicalize("", "persistentvolumeclaims", &mut claim);
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert_eq!(claim["spec"]["resources"]["limits"]["storage"], "2Gi");
        assert_eq!(claim["status"]["capacity"]["storage"], "1G");
        let mut volume = json!({"spec": {"capacity": {"storage": "not a size"}}});
        canonicalize("", "persistentvolumes", &mut volume);
        assert_eq!(
            volume["spec"]["capacity"]["storage"], "not a size",
            "left for validation"
        );
        let mut capacity = json!({"capacity": "1048576Ki", "maximumVolumeSize": "1.5Gi"});
        canonicalize("storage.k8s.io", "csistoragecapacities", &mut capacity);
        assert_eq!(
            capacity,
            json!({"capacity": "1Gi", "maximumVolumeSize": "1536Mi"})
        );
        let mut other = json!({"data": {"storage": "1024Mi"}});
        canonicalize("", "configmaps", &mut other);
        assert_eq!(other["data"]["storage"], "1024Mi", "other kinds untouched");
    }
}
