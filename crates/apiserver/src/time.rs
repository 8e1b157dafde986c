//! Kubernetes times in JSON, read as kube-apiserver reads them: `metav1.Time` is RFC 3339 to the
//! second (`2006-01-02T15:04:05Z07:00`, a fraction allowed), `metav1.MicroTime` to the
//! microsecond (`2006-01-02T15:04:05.000000Z07:00`, the six digits required). A value that is
//! not one is refused with Go's words, as kube-apiserver refuses it when it decodes the object;
//! nothing here indexes a string by bytes it has not checked, so any text is safe to read.

/// Go's layouts of the two kinds.
pub const TIME_LAYOUT: &str = "2006-01-02T15:04:05Z07:00";
/// MicroTime's.
pub const MICRO_LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

/// Why a time does not parse, in Go's `time.ParseError` words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeError(pub String);

impl std::fmt::Display for TimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Go's quoting of a value in a time error: printable ASCII as is, other bytes as `\xNN`.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for b in text.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

/// The elements of a layout, with how many digits a numeric one takes.
enum Element {
    Digits(&'static str, usize),
    Literal(u8),
    Fraction,
    Zone,
}

fn elements(micro: bool) -> Vec<Element> {
    let mut out = vec![
        Element::Digits("2006", 4),
        Element::Literal(b'-'),
        Element::Digits("01", 2),
        Element::Literal(b'-'),
        Element::Digits("02", 2),
        Element::Literal(b'T'),
        Element::Digits("15", 2),
        Element::Literal(b':'),
        Element::Digits("04", 2),
        Element::Literal(b':'),
        Element::Digits("05", 2),
    ];
    if micro {
        out.push(Element::Fraction);
    }
    out.push(Element::Zone);
    out
}

/// Seconds since the epoch (UTC) and nanoseconds of a time written as `layout` says.
pub fn parse(text: &str, micro: bool) -> Result<(i64, i64), TimeError> {
    let layout = if micro { MICRO_LAYOUT } else { TIME_LAYOUT };
    let bytes = text.as_bytes();
    let mut at = 0usize;
    let mut numbers = Vec::with_capacity(6);
    let mut nanos = 0i64;
    let mut offset = 0i64;
    // The rest of the layout from an element on, for the message.
    let layout_rest = |element: &Element| -> &'static str {
        match element {
            Element::Digits(text, _) => text,
            Element::Literal(b'-') => "-",
            Element::Literal(b'T') => "T",
            Element::Literal(_) => ":",
            Element::Fraction => ".000000",
            Element::Zone => "Z07:00",
        }
    };
    for element in elements(micro) {
        let fail = |at: usize| {
            let rest = text.get(at..).map_or_else(|| quote(text), quote);
            TimeError(format!(
                "parsing time {} as \"{layout}\": cannot parse {rest} as \"{}\"",
                quote(text),
                layout_rest(&element)
            ))
        };
        match element {
            Element::Digits(_, n) => {
                let digits = bytes
                    .get(at..at + n)
                    .filter(|d| d.iter().all(u8::is_ascii_digit));
                let Some(digits) = digits else {
                    return Err(fail(at));
                };
                numbers.push(
                    digits
                        .iter()
                        .fold(0i64, |v, d| v * 10 + i64::from(d - b'0')),
                );
                at += n;
            }
            Element::Literal(c) => {
                if bytes.get(at) != Some(&c) {
                    return Err(fail(at));
                }
                at += 1;
            }
            Element::Fraction => {
                let digits = bytes
                    .get(at + 1..at + 7)
                    .filter(|d| d.iter().all(u8::is_ascii_digit));
                match (bytes.get(at), digits) {
                    (Some(b'.'), Some(digits)) => {
                        nanos = digits
                            .iter()
                            .fold(0i64, |v, d| v * 10 + i64::from(d - b'0'))
                            * 1000;
                        at += 7;
                    }
                    _ => return Err(fail(at)),
                }
            }
            Element::Zone => {
                // Without a fraction in the layout, Go still reads one after the seconds.
                if !micro && bytes.get(at) == Some(&b'.') {
                    let digits = bytes[at + 1..]
                        .iter()
                        .take_while(|b| b.is_ascii_digit())
                        .count();
                    if digits == 0 {
                        return Err(fail(at));
                    }
                    let fraction = &bytes[at + 1..at + 1 + digits];
                    for (i, d) in fraction.iter().take(9).enumerate() {
                        nanos += i64::from(d - b'0') * 10i64.pow(8 - i as u32);
                    }
                    at += 1 + digits;
                }
                match bytes
                    .get(at..)
                    .and_then(|rest| rest.get(..6).or(Some(rest)))
                {
                    Some([b'Z', ..]) => at += 1,
                    Some([sign @ (b'+' | b'-'), h1, h2, b':', m1, m2])
                        if [h1, h2, m1, m2].iter().all(|b| b.is_ascii_digit()) =>
                    {
                        let digit = |b: &u8| i64::from(b - b'0');
                        let minutes =
                            (digit(h1) * 10 + digit(h2)) * 60 + digit(m1) * 10 + digit(m2);
                        offset = if *sign == b'+' {
                            minutes * 60
                        } else {
                            -minutes * 60
                        };
                        at += 6;
                    }
                    _ => return Err(fail(at)),
                }
            }
        }
    }
    if at != bytes.len() {
        return Err(TimeError(format!(
            "parsing time {}: extra text: {}",
            quote(text),
            quote(text.get(at..).unwrap_or_default())
        )));
    }
    let [year, month, day, hour, minute, second] = numbers[..] else {
        return Err(TimeError(format!("parsing time {}", quote(text))));
    };
    let range =
        |what: &str| TimeError(format!("parsing time {}: {what} out of range", quote(text)));
    if !(1..=12).contains(&month) {
        return Err(range("month"));
    }
    if hour > 23 {
        return Err(range("hour"));
    }
    if minute > 59 {
        return Err(range("minute"));
    }
    if second > 59 {
        return Err(range("second"));
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let in_month = usize::try_from(month - 1)
        .ok()
        .and_then(|m| days_in_month.get(m))
        .copied();
    if day < 1 || in_month.is_none_or(|n| day > n) {
        return Err(range("day"));
    }
    Ok((
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset,
        nanos,
    ))
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm, public domain
/// description).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_go_parses_them_and_bad_ones_get_gos_words() {
        let ok = [
            ("1970-01-01T00:00:10Z", false, (10, 0)),
            ("1970-01-01T00:00:10.5Z", false, (10, 500_000_000)),
            ("1970-01-01T01:00:10+01:00", false, (10, 0)),
            ("2024-02-29T00:00:00Z", false, (1_709_164_800, 0)),
            ("1970-01-01T00:00:10.000123Z", true, (10, 123_000)),
        ];
        for (text, micro, want) in ok {
            assert_eq!(parse(text, micro), Ok(want), "{text}");
        }
        let bad = [
            (
                "202é-11-23T10:00:00Z",
                false,
                r#"parsing time "202\xc3\xa9-11-23T10:00:00Z" as "2006-01-02T15:04:05Z07:00": cannot parse "202\xc3\xa9-11-23T10:00:00Z" as "2006""#,
            ),
            (
                "2026-13-23T10:00:00Z",
                false,
                r#"parsing time "2026-13-23T10:00:00Z": month out of range"#,
            ),
            (
                "2026-11-23T10:00:00Z",
                true,
                r#"parsing time "2026-11-23T10:00:00Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000""#,
            ),
            (
                "2023-02-29T10:00:00Z",
                false,
                r#"parsing time "2023-02-29T10:00:00Z": day out of range"#,
            ),
            (
                "2026-11-23",
                false,
                r#"parsing time "2026-11-23" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "T""#,
            ),
            (
                "2026-11-23T10:00:00Zjunk",
                false,
                r#"parsing time "2026-11-23T10:00:00Zjunk": extra text: "junk""#,
            ),
            (
                "1970-01-01T00:00:10+1",
                false,
                r#"parsing time "1970-01-01T00:00:10+1" as "2006-01-02T15:04:05Z07:00": cannot parse "+1" as "Z07:00""#,
            ),
            (
                "",
                false,
                r#"parsing time "" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "2006""#,
            ),
        ];
        for (text, micro, want) in bad {
            assert_eq!(
                parse(text, micro).map_err(|e| e.0),
                Err(want.to_string()),
                "{text}"
            );
        }
    }
}
