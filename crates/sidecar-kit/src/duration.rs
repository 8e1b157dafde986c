//! Go-style durations (`time.ParseDuration`): `300ms`, `1.5h`, `2h45m`, `10s`, `0`.

use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a Go duration such as 300ms, 10s, 1m30s or 2h")]
pub struct DurationError(pub String);

/// Parses a Go duration. Negative durations are refused: no flag of ours accepts them.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError(text.to_string());
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err());
    }
    let mut rest = s;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err()),
        };
        total_nanos += value * scale;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(err());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration as Go's `Duration.String()` does for whole milliseconds and above
/// (`1m30s`, `500ms`, `0s`).
pub fn format_go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return if d.is_zero() {
            "0s".into()
        } else {
            format!("{}µs", d.as_micros())
        };
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let frac_ms = d.subsec_millis();
    let sec_text = if frac_ms == 0 {
        format!("{s}s")
    } else {
        let frac = format!("{frac_ms:03}");
        format!("{s}.{}s", frac.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => sec_text,
        (0, m) => format!("{m}m{sec_text}"),
        (h, m) => format!("{h}h{m}m{sec_text}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let table: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("300ms", Duration::from_millis(300)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(9900)),
            ("5m", Duration::from_secs(300)),
            ("100us", Duration::from_micros(100)),
            ("100µs", Duration::from_micros(100)),
            ("7ns", Duration::from_nanos(7)),
        ];
        for (text, want) in table {
            assert_eq!(parse_go_duration(text).unwrap(), *want, "{text}");
        }
    }

    #[test]
    fn refuses_malformed_durations() {
        for text in ["", "10", "s", "1x", "-1s", "1s2", ".s", "1..2s"] {
            assert!(parse_go_duration(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
    }
}
