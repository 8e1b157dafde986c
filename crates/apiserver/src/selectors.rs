//! Label and field selectors.

mod fields;
mod labels;

pub use fields::FieldSelector;
pub use labels::LabelSelector;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors() {
        let labels: std::collections::BTreeMap<String, String> =
            [("app", "web"), ("tier", "fast"), ("size", "5")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=fast", true),
            ("app = web", true),
            ("app!=web", false),
            ("tier in (fast,slow)", true),
            ("tier in (slow,,)", false),
            ("tier notin (fast)", false),
            ("app", true),
            ("!app", false),
            ("!missing,app", true),
            ("size>4,size<6", true),
            ("size>5", false),
            ("app>1", false),
            ("missing=", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&labels),
                want,
                "{sel}"
            );
        }
        // kube-apiserver v1.36.2's answers to each (its list's message after `field selector
        // "": `).
        let value_rule = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        let name_rule = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        let long = "k".repeat(70);
        let rows: Vec<(String, String)> = vec![
            ("bad===x".into(), "unable to parse requirement: found '=', expected: identifier".into()),
            ("a=b c".into(), "found 'c', expected: ',' or 'end of string'".into()),
            ("!a=b".into(), "found '=', expected: ',' or 'end of string'".into()),
            ("a in x".into(), "unable to parse requirement: found 'x' expected: '('".into()),
            ("a in (x,-y)".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"-y\": {value_rule}")),
            ("/x".into(), "unable to parse requirement: <nil>: Invalid value: \"/x\": prefix part must be non-empty".into()),
            ("a!=x!".into(), "found '!', expected: ',' or 'end of string'".into()),
            ("a in (x y)".into(), "unable to parse requirement: found 'y', expected: ',' or ')'".into()),
            ("a>x".into(), "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer".into()),
            ("a<-2".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"-2\": {value_rule}")),
            (",a".into(), "found ',', expected: !, identifier, or 'end of string'".into()),
            ("a,".into(), "found '', expected: identifier after ','".into()),
            ("a,,b".into(), "found ',', expected: identifier after ','".into()),
            ("(a)".into(), "found '(', expected: !, identifier, or 'end of string'".into()),
            ("a notin".into(), "unable to parse requirement: found '' expected: '('".into()),
            ("a=b=c".into(), "found '=', expected: ',' or 'end of string'".into()),
            ("!!a".into(), "unable to parse requirement: found '!', expected: identifier".into()),
            ("a<>3".into(), "unable to parse requirement: found '>', expected: identifier".into()),
            ("a=(b)".into(), "unable to parse requirement: found '(', expected: identifier".into()),
            ("Bad Key=x".into(), "unable to parse requirement: found 'Key', expected: in, notin, =, ==, !=, gt, lt".into()),
            ("=a".into(), "found '=', expected: !, identifier, or 'end of string'".into()),
            ("a in (".into(), "unable to parse requirement: found '', expected: ',', ')' or identifier".into()),
            ("a in (=".into(), "unable to parse requirement: found '=', expected: ',', ')' or identifier".into()),
            ("a in (x".into(), "unable to parse requirement: found '', expected: ',' or ')'".into()),
            ("a in (x,".into(), "unable to parse requirement: found '', expected: ',', or identifier".into()),
            ("-a=b".into(), format!("unable to parse requirement: <nil>: Invalid value: \"-a\": {name_rule}")),
            (format!("{long}=x"), format!("unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 bytes")),
        ];
        for (selector, message) in rows {
            assert_eq!(
                LabelSelector::parse(&selector).unwrap_err(),
                message,
                "{selector}"
            );
        }
        for good in [
            "a=",
            "a==",
            "a=in",
            "in=a",
            "example.com/a in (x, y_z)",
            "a in ()",
            "a in (,x,)",
            "!b",
            "!a,b",
            "k.io/c",
            "a==B-1",
            "x>1,y<2",
        ] {
            assert!(LabelSelector::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn any_text_parses_or_is_refused_without_a_panic() {
        let seed: u64 = 0x5eed_1abe;
        println!("seed {seed:#x}");
        let alphabet: Vec<char> = "ab/.-_=!(),<> \tinoté0".chars().collect();
        let mut state = seed;
        for _ in 0..5000 {
            let mut text = String::new();
            for _ in 0..(state % 12) {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                text.push(alphabet[(state >> 33) as usize % alphabet.len()]);
            }
            state = state.wrapping_add(1);
            if let Err(message) = LabelSelector::parse(&text) {
                assert!(!message.is_empty(), "{text:?}");
            }
        }
    }
}
