//! Go `flag`-package compatibility for clap: single-dash long flags (`-csi-address=/x`,
//! `-v=5`) and Go booleans (`--flag`, `--flag=false`, `1`, `t`, `FALSE`...).

/// Rewrites single-dash long flags to the double-dash form clap expects. Stops at `--`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut done = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || done {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            done = true;
            out.push(arg);
            continue;
        }
        let single = arg.starts_with('-')
            && !arg.starts_with("--")
            && arg.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic());
        out.push(if single { format!("-{arg}") } else { arg });
    }
    out
}

/// Parses a boolean as Go's `strconv.ParseBool`.
pub fn parse_go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("invalid boolean value {other:?}")),
    }
}

/// Parses `key=value,key2=value2` (Go `--feature-gates` and `mapStringBool` style) into pairs.
pub fn parse_bool_map(text: &str) -> Result<Vec<(String, bool)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected NAME=true|false"))?;
            Ok((k.trim().to_string(), parse_go_bool(v.trim())?))
        })
        .collect()
}

/// Parses `key:value,key2:value2` (Go `--leader-election-labels`).
pub fn parse_label_list(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once(':')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("{item:?}: expected KEY:VALUE"))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        assert_eq!(
            normalize_args(args(&[
                "bin",
                "-csi-address=/x",
                "--timeout=5s",
                "-v",
                "5",
                "-leader-election",
                "--",
                "-x"
            ])),
            args(&[
                "bin",
                "--csi-address=/x",
                "--timeout=5s",
                "--v",
                "5",
                "--leader-election",
                "--",
                "-x"
            ])
        );
        assert_eq!(
            normalize_args(args(&["bin", "-5", "-"])),
            args(&["bin", "-5", "-"]),
            "numbers and - are values"
        );
    }

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }

    #[test]
    fn maps_and_label_lists() {
        assert_eq!(
            parse_bool_map("Topology=true, VolumeAttributesClass=false").unwrap(),
            vec![
                ("Topology".to_string(), true),
                ("VolumeAttributesClass".to_string(), false)
            ]
        );
        assert!(parse_bool_map("Topology").is_err());
        assert_eq!(
            parse_label_list("a:b,c:d").unwrap(),
            vec![("a".into(), "b".into()), ("c".into(), "d".into())]
        );
        assert!(parse_label_list("a=b").is_err());
    }
}
