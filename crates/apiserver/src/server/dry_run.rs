//! Whether a write is carried out or only worked out (`dryRun`).

use super::*;

/// Whether a write is carried out or only worked out: a dry run (`dryRun=All`) answers what
/// the write would give, after the same checks, and stores nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Carried out.
    Store,
    /// Worked out only.
    DryRun,
}

/// The write mode a request asks for: `dryRun` in the query, or in a delete's DeleteOptions
/// body. `All` is the only value there is; any other, the empty one included, is refused with
/// kube-apiserver's 422 naming the options of the verb. Reads ignore it.
pub(crate) fn write_mode(
    method: &Method,
    dry_run: &[String],
    body: &[u8],
) -> Result<WriteMode, ApiError> {
    let Some(options) = WriteOptions::of(method) else {
        return Ok(WriteMode::Store);
    };
    // Every value the query gave (kube-apiserver's `dryRun` is a list), then the body's.
    let mut values: Vec<String> = dry_run.to_vec();
    // A body that is not JSON is refused by the delete that parses it.
    if method == Method::DELETE
        && let Ok(delete_options) = serde_json::from_slice::<Value>(body)
    {
        match &delete_options["dryRun"] {
            Value::Null => {}
            Value::Array(items) => {
                for item in items {
                    let Some(value) = item.as_str() else {
                        return Err(ApiError::bad_request(format!(
                            "DeleteOptions.dryRun must be a list of strings, not one holding {item}"
                        )));
                    };
                    values.push(value.to_string());
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "DeleteOptions.dryRun must be a list of strings, not {other}"
                )));
            }
        }
    }
    if values.is_empty() {
        return Ok(WriteMode::Store);
    }
    if values.iter().all(|v| v == "All") {
        return Ok(WriteMode::DryRun);
    }
    let listed = serde_json::to_string(&values).unwrap_or_default();
    Err(ApiError::invalid_options(
        options.kind(),
        &format!("dryRun: Unsupported value: {listed}: supported values: \"All\""),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Method, WriteMode, write_mode};
    use serde_json::json;

    #[test]
    fn a_dry_run_is_all_or_refused_naming_the_verbs_options() {
        use WriteMode::{DryRun, Store};
        let delete_options = br#"{"kind":"DeleteOptions","dryRun":["All"]}"#;
        let unsupported = |options: &str, values: &str| {
            Err(format!(
                "422 {options}.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: {values}: supported values: \"All\""
            ))
        };
        type Row<'a> = (Method, &'a [&'a str], &'a [u8], Result<WriteMode, String>);
        let rows: [Row; 18] = [
            (Method::POST, &["All"], b"{}", Ok(DryRun)),
            (Method::PUT, &["All"], b"{}", Ok(DryRun)),
            (Method::PATCH, &["All"], b"{}", Ok(DryRun)),
            (Method::DELETE, &["All"], b"", Ok(DryRun)),
            (Method::DELETE, &[], delete_options, Ok(DryRun)),
            (Method::DELETE, &[], br#"{"dryRun":[]}"#, Ok(Store)),
            (Method::DELETE, &[], b"", Ok(Store)),
            (Method::DELETE, &[], b"not json", Ok(Store)),
            (Method::PUT, &[], b"{}", Ok(Store)),
            // Reads ignore it, as kube-apiserver does.
            (Method::GET, &["nonsense"], b"", Ok(Store)),
            (
                Method::PUT,
                &[""],
                b"{}",
                unsupported("UpdateOptions", r#"[""]"#),
            ),
            (
                Method::POST,
                &["all"],
                b"{}",
                unsupported("CreateOptions", r#"["all"]"#),
            ),
            (
                Method::PATCH,
                &["foo"],
                b"{}",
                unsupported("PatchOptions", r#"["foo"]"#),
            ),
            // Given twice in the query: every value counts, as kube-apiserver's answer to
            // `?dryRun=All&dryRun=Bogus` lists them.
            (Method::POST, &["All", "All"], b"{}", Ok(DryRun)),
            (
                Method::POST,
                &["All", "Bogus"],
                b"{}",
                unsupported("CreateOptions", r#"["All","Bogus"]"#),
            ),
            (
                Method::DELETE,
                &["All"],
                br#"{"dryRun":["All","x"]}"#,
                unsupported("DeleteOptions", r#"["All","All","x"]"#),
            ),
            (
                Method::DELETE,
                &[],
                br#"{"dryRun":"All"}"#,
                Err("400 DeleteOptions.dryRun must be a list of strings, not \"All\"".into()),
            ),
            (
                Method::DELETE,
                &[],
                br#"{"dryRun":[1]}"#,
                Err("400 DeleteOptions.dryRun must be a list of strings, not one holding 1".into()),
            ),
        ];
        for (method, dry_run, body, want) in rows {
            let dry_run: Vec<String> = dry_run.iter().map(ToString::to_string).collect();
            let got = write_mode(&method, &dry_run, body)
                .map_err(|e| format!("{} {}", e.code, e.message));
            assert_eq!(
                got,
                want,
                "{method} {dry_run:?} {}",
                String::from_utf8_lossy(body)
            );
        }
        let refused = write_mode(&Method::PUT, &["x".to_string()], b"")
            .unwrap_err()
            .to_status();
        assert_eq!(
            refused["details"],
            json!({"group": "meta.k8s.io", "kind": "UpdateOptions", "causes": [{
                "reason": "FieldValueNotSupported",
                "message": "Unsupported value: [\"x\"]: supported values: \"All\"",
                "field": "dryRun",
            }]}),
            "kube-apiserver's details"
        );
    }
}
