//! Kubernetes resource quantities, parsed exactly.
//!
//! `resource.Quantity` in apimachinery accepts `<sign><digits>[.<digits>]<suffix>` where the
//! suffix is a binary SI suffix (`Ki` .. `Ei`), a decimal SI suffix (`n u m k M G T P E`) or a
//! decimal exponent (`e3`, `E-2`). Conversions to an integer round *up* (away from zero), as
//! apimachinery's `Value()` does; `kube_quantity` truncates, which would under-provision.

use std::fmt;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is empty.
    #[error("quantity is empty")]
    Empty,
    /// The string does not follow the quantity grammar.
    #[error("quantity {0:?} is not a valid Kubernetes quantity")]
    Syntax(String),
    /// The value does not fit into a signed 64-bit integer.
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

/// An exactly parsed quantity: `mantissa * 10^exp10 * 2^exp2`, with a sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

const MAX_DIGITS: usize = 38;

impl Quantity {
    /// Parses a quantity string exactly (no rounding happens here).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let s = text.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let syntax = || QuantityError::Syntax(text.to_string());
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(syntax());
        }
        if frac_part.contains('.') {
            return Err(syntax());
        }
        let digits: String = format!("{int_part}{frac_part}");
        let trimmed = digits.trim_start_matches('0');
        if trimmed.len() > MAX_DIGITS {
            return Err(QuantityError::TooLarge(text.to_string()));
        }
        let mantissa: u128 = if trimmed.is_empty() {
            0
        } else {
            trimmed.parse().map_err(|_| syntax())?
        };
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| syntax())?;
        let (exp10, exp2) = parse_suffix(suffix).ok_or_else(syntax)?;
        Ok(Quantity {
            negative: negative && mantissa != 0,
            mantissa,
            exp10: exp10 - frac_len,
            exp2,
        })
    }

    /// The value rounded up (away from zero) to an integer, as apimachinery's `Value()`.
    pub fn to_i64_ceil(&self) -> Option<i64> {
        let mut value = self.mantissa;
        for _ in 0..self.exp2 {
            value = value.checked_mul(2)?;
        }
        if self.exp10 >= 0 {
            for _ in 0..self.exp10 {
                value = value.checked_mul(10)?;
            }
        } else {
            let mut divisor: u128 = 1;
            for _ in 0..(-self.exp10) {
                divisor = match divisor.checked_mul(10) {
                    Some(d) => d,
                    // More than 38 fractional digits: the value rounds to 0 or 1.
                    None => {
                        return Some(if value == 0 {
                            0
                        } else if self.negative {
                            -1
                        } else {
                            1
                        });
                    }
                };
            }
            value = value.div_ceil(divisor);
        }
        let v = i64::try_from(value).ok()?;
        Some(if self.negative { -v } else { v })
    }

    /// Whether the quantity is exactly zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative
    }
}

fn parse_suffix(suffix: &str) -> Option<(i32, u32)> {
    let r = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let valid = !exp.is_empty()
                && exp
                    .strip_prefix(['-', '+'])
                    .unwrap_or(exp)
                    .bytes()
                    .all(|b| b.is_ascii_digit());
            if !valid {
                return None;
            }
            let e: i32 = exp.parse().ok()?;
            if !(-1000..=1000).contains(&e) {
                return None;
            }
            (e, 0)
        }
    };
    Some(r)
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Parses a quantity and rounds it up to whole bytes; refuses values that overflow `i64`.
pub fn parse_bytes(text: &str) -> Result<i64, QuantityError> {
    Quantity::parse(text)?
        .to_i64_ceil()
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
}

/// A claim's `spec.resources.requests.storage` in bytes, when set and valid.
pub fn claim_request_bytes(
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
) -> Option<i64> {
    let q = claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    parse_bytes(&q.0).ok()
}

/// Formats a byte count the way apimachinery prints a `BinarySI` quantity: the largest
/// binary suffix that divides the value exactly, and plain digits below 1024 or when no
/// suffix divides it.
pub fn format_binary_si(bytes: i64) -> String {
    BinarySi(bytes).to_string()
}

struct BinarySi(i64);

impl fmt::Display for BinarySi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        let v = self.0;
        if v > -1024 && v < 1024 {
            return write!(f, "{v}");
        }
        let mut mantissa = i128::from(v);
        let mut index = 0;
        while index < SUFFIXES.len() - 1 && mantissa % 1024 == 0 {
            mantissa /= 1024;
            index += 1;
        }
        write!(f, "{mantissa}{}", SUFFIXES[index])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rounds_up_like_apimachinery() {
        let table: &[(&str, i64)] = &[
            ("0", 0),
            ("1", 1),
            ("1Ki", 1024),
            ("1Mi", 1 << 20),
            ("1Gi", 1 << 30),
            ("10Gi", 10 << 30),
            ("1.5Gi", 3 << 29),
            ("1G", 1_000_000_000),
            ("1.5G", 1_500_000_000),
            ("100M", 100_000_000),
            ("1k", 1000),
            ("1e3", 1000),
            ("1E6", 1_000_000),
            ("1.1", 2),
            ("0.1", 1),
            ("100m", 1),
            ("1000m", 1),
            ("1001m", 2),
            ("1n", 1),
            ("-1.5", -2),
            ("+5", 5),
            (".5Ki", 512),
            ("5.", 5),
            ("8Ei", i64::MAX),
        ];
        for (text, want) in table.iter().take(table.len() - 1) {
            assert_eq!(parse_bytes(text).unwrap(), *want, "{text}");
        }
        // 8Ei is one past i64::MAX.
        assert!(matches!(
            parse_bytes("8Ei"),
            Err(QuantityError::TooLarge(_))
        ));
        assert_eq!(parse_bytes("7Ei").unwrap(), 7 << 60);
    }

    #[test]
    fn rejects_malformed_quantities() {
        for text in [
            "", " ", "abc", "1Gb", "1 Gi", "--1", "1..2", "1.2.3", "Gi", "1e", "1ex", "1KiB",
            "1e99999",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text:?} should be refused");
        }
        assert!(matches!(
            parse_bytes("99999999999999999999999999999999999999999"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            parse_bytes("1e30"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn zero_and_sign_are_reported() {
        assert!(Quantity::parse("0Gi").unwrap().is_zero());
        assert!(Quantity::parse("-0").unwrap().is_zero());
        assert!(!Quantity::parse("-0").unwrap().is_negative());
        assert!(Quantity::parse("-1Mi").unwrap().is_negative());
    }

    #[test]
    fn formats_binary_si_like_apimachinery() {
        let table: &[(i64, &str)] = &[
            (0, "0"),
            (1023, "1023"),
            (1024, "1Ki"),
            (1500, "1500"),
            (1 << 30, "1Gi"),
            (3 << 29, "1536Mi"),
            (10 << 30, "10Gi"),
            (1_000_000_000, "1000000000"),
            (5 << 40, "5Ti"),
            (-2048, "-2Ki"),
        ];
        for (bytes, want) in table {
            assert_eq!(format_binary_si(*bytes), *want, "{bytes}");
        }
    }

    #[test]
    fn format_then_parse_round_trips() {
        for bytes in [
            0,
            1,
            1023,
            1024,
            4096,
            1 << 20,
            (1 << 30) + 1,
            7 << 50,
            i64::MAX,
        ] {
            assert_eq!(parse_bytes(&format_binary_si(bytes)).unwrap(), bytes);
        }
    }
}
