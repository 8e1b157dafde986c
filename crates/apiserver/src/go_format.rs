//! JSON values written as Go's `fmt` prints them once decoded into `interface{}` values:
//! kube-apiserver puts a strategic merge patch it refuses in its message so
//! (`map[bogus:1 data:map[b:9]]`).

use std::fmt::Write as _;

use serde_json::Value;

/// `value` as Go's `%v` prints it: maps as `map[k:v ...]` with sorted keys, lists as
/// `[a b]`, strings bare, `<nil>` for null, integers that fit 64 bits as integers and other
/// numbers as Go's shortest `%g`.
pub fn go_text(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("<nil>"),
        Value::Bool(flag) => {
            let _ = write!(out, "{flag}");
        }
        Value::Number(number) => match number.as_i64() {
            Some(integer) => {
                let _ = write!(out, "{integer}");
            }
            None => out.push_str(&go_float(number.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(text) => out.push_str(text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push_str("map[");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(key);
                out.push(':');
                write_value(out, &fields[key]);
            }
            out.push(']');
        }
    }
}

/// A float as Go's `%v` writes it: the shortest digits that read back, in exponent form
/// (`1e+21`, `1e-05`) when the exponent is below -4 or at least 6.
fn go_float(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "NaN".into()
        } else if x > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        return format!("{x}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn values_print_as_kube_apiserver_prints_a_refused_patch() {
        // kube-apiserver v1.36.2's messages for these two patches.
        let patch: Value = serde_json::from_str(
            r#"{"zdata":{"b":"9"},"bogus":1,"data":{"k":"v"},"l":[1,"x",true,null,{"a":2.5}]}"#,
        )
        .unwrap();
        assert_eq!(
            go_text(&patch),
            "map[bogus:1 data:map[k:v] l:[1 x true <nil> map[a:2.5]] zdata:map[b:9]]"
        );
        let numbers: Value = serde_json::from_str(
            r#"{"n":[1000000,1234567,0.00001,1e21,-0.0,12345678901234567890,"a b","",{}, []]}"#,
        )
        .unwrap();
        assert_eq!(
            go_text(&numbers),
            "map[n:[1000000 1234567 1e-05 1e+21 -0 1.2345678901234567e+19 a b  map[] []]]"
        );
        assert_eq!(go_float(1000000.5), "1.0000005e+06");
        assert_eq!(go_float(0.0001), "0.0001");
        assert_eq!(go_float(100000.0), "100000");
    }
}
