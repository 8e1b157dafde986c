//! Secret references: resolving `${...}` templates and validating the result.

use std::collections::BTreeMap;

use super::parameters::SecretTemplate;

/// A resolved secret reference (sidecar-kit's, shared with the attacher and the node).
pub use sidecar_kit::secrets::SecretRef;

/// What a template may refer to.
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    /// The PV (and volume) name.
    pub pv_name: &'a str,
    /// Claim name.
    pub pvc_name: &'a str,
    /// Claim namespace.
    pub pvc_namespace: &'a str,
    /// Claim annotations.
    pub pvc_annotations: Option<&'a BTreeMap<String, String>>,
}

/// A template that cannot be resolved. Final until the class or claim changes. In
/// external-provisioner's words, but for an unterminated `${` (there Go's `os.Expand` drops it
/// silently and the rest is taken as the value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Tokens that do not resolve there: unknown, not allowed in this field, or a claim
    /// annotation that is not set; sorted, each once.
    #[error("error resolving value {template:?}: invalid tokens: [{}]", go_quoted(.tokens))]
    InvalidTokens {
        /// The template.
        template: String,
        /// The tokens, without `${` and `}`.
        tokens: Vec<String>,
    },
    /// `${` without `}`.
    #[error("secret {field} template {template:?} has an unterminated ${{")]
    Unterminated {
        /// `name` or `namespace`.
        field: &'static str,
        /// The template.
        template: String,
    },
    /// The resolved value is not a valid secret or namespace name.
    #[error("{}", invalid_name(.template, .value, .what))]
    InvalidName {
        /// `secret name` or `namespace name`.
        what: &'static str,
        /// The resolved value.
        value: String,
        /// The template.
        template: String,
    },
}

/// Go's `%q` of a list of strings: each quoted, space separated.
fn go_quoted(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("{t:?}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Upstream's words for a value that is not a valid name.
fn invalid_name(template: &str, value: &str, what: &str) -> String {
    if template == value {
        format!("{template:?} is not a valid {what}")
    } else {
        format!("{template:?} resolved to {value:?} which is not a valid {what}")
    }
}

/// Expands the `${...}` tokens of `template` (the `name` or `namespace` of a secret): every
/// token that does not resolve is named in one error, as upstream names them.
fn expand(
    field: &'static str,
    template: &str,
    ctx: &TemplateContext<'_>,
) -> Result<String, SecretError> {
    let mut out = String::new();
    let mut invalid = std::collections::BTreeSet::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| SecretError::Unterminated {
            field,
            template: template.to_string(),
        })?;
        let token = &after[..end];
        let annotation =
            annotation_key(token).and_then(|key| ctx.pvc_annotations.and_then(|a| a.get(key)));
        match (token, annotation) {
            ("pv.name", _) => out.push_str(ctx.pv_name),
            ("pvc.namespace", _) => out.push_str(ctx.pvc_namespace),
            ("pvc.name", _) if field == "name" => out.push_str(ctx.pvc_name),
            (_, Some(value)) if field == "name" => out.push_str(value),
            _ => {
                invalid.insert(token.to_string());
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if !invalid.is_empty() {
        return Err(SecretError::InvalidTokens {
            template: template.to_string(),
            tokens: invalid.into_iter().collect(),
        });
    }
    Ok(out)
}

/// The KEY of a `pvc.annotations['KEY']` token (None for anything else, `pvc.annotations[']`
/// included).
fn annotation_key(token: &str) -> Option<&str> {
    token.strip_prefix("pvc.annotations['")?.strip_suffix("']")
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics or '-', alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Resolves a class's secret template for one claim.
pub fn resolve(
    template: &SecretTemplate,
    ctx: &TemplateContext<'_>,
) -> Result<SecretRef, SecretError> {
    let namespace = expand("namespace", &template.namespace, ctx)?;
    if !is_dns_label(&namespace) {
        return Err(SecretError::InvalidName {
            what: "namespace name",
            value: namespace,
            template: template.namespace.clone(),
        });
    }
    let name = expand("name", &template.name, ctx)?;
    if !is_dns_subdomain(&name) {
        return Err(SecretError::InvalidName {
            what: "secret name",
            value: name,
            template: template.name.clone(),
        });
    }
    Ok(SecretRef { name, namespace })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ctx(annotations: &BTreeMap<String, String>) -> TemplateContext<'_> {
        TemplateContext {
            pv_name: "pvc-123",
            pvc_name: "data",
            pvc_namespace: "team-a",
            pvc_annotations: Some(annotations),
        }
    }

    fn t(name: &str, ns: &str) -> SecretTemplate {
        SecretTemplate {
            name: name.into(),
            namespace: ns.into(),
        }
    }

    #[test]
    fn templates_resolve_every_allowed_token() {
        let ann = BTreeMap::from([("owner".to_string(), "alice".to_string())]);
        let table = [
            (t("fixed", "kube-system"), ("fixed", "kube-system")),
            (t("${pv.name}", "${pvc.namespace}"), ("pvc-123", "team-a")),
            (
                t("${pvc.name}-secret", "${pv.name}"),
                ("data-secret", "pvc-123"),
            ),
            (t("s-${pvc.annotations['owner']}", "ns"), ("s-alice", "ns")),
        ];
        for (template, (name, ns)) in table {
            let got = resolve(&template, &ctx(&ann)).unwrap();
            assert_eq!(
                (got.name.as_str(), got.namespace.as_str()),
                (name, ns),
                "{template:?}"
            );
        }
    }

    #[test]
    fn bad_templates_are_refused_in_upstreams_words() {
        let ann = BTreeMap::from([("owner".to_string(), "alice".to_string())]);
        let cases = [
            (
                t("${pvc.uid}", "ns"),
                r#"error resolving value "${pvc.uid}": invalid tokens: ["pvc.uid"]"#,
            ),
            (
                t("x", "${pvc.name}"),
                r#"error resolving value "${pvc.name}": invalid tokens: ["pvc.name"]"#,
            ),
            (
                t("x", "${pvc.annotations['owner']}"),
                r#"error resolving value "${pvc.annotations['owner']}": invalid tokens: ["pvc.annotations['owner']"]"#,
            ),
            (
                t("${pvc.annotations['missing']}-${b}-${a}-${b}", "ns"),
                r#"error resolving value "${pvc.annotations['missing']}-${b}-${a}-${b}": invalid tokens: ["a" "b" "pvc.annotations['missing']"]"#,
            ),
            (
                t("${pv.name", "ns"),
                r#"secret name template "${pv.name" has an unterminated ${"#,
            ),
            (t("Upper", "ns"), r#""Upper" is not a valid secret name"#),
            (
                t("${pvc.annotations['owner']}_x", "ns"),
                r#""${pvc.annotations['owner']}_x" resolved to "alice_x" which is not a valid secret name"#,
            ),
            (
                t("x", "bad_ns"),
                r#""bad_ns" is not a valid namespace name"#,
            ),
            (
                t("x", "${pvc.namespace}.b"),
                r#""${pvc.namespace}.b" resolved to "team-a.b" which is not a valid namespace name"#,
            ),
        ];
        for (template, words) in cases {
            let err = resolve(&template, &ctx(&ann)).unwrap_err();
            assert_eq!(err.to_string(), words, "{template:?}");
        }
    }

    #[test]
    fn truncated_annotation_tokens_are_refused_not_panics() {
        let ann = BTreeMap::new();
        for name in [
            "${pvc.annotations[']}",
            "${pvc.annotations['}",
            "${pvc.annotations[''']}",
        ] {
            let err = resolve(&t(name, "ns"), &ctx(&ann)).unwrap_err();
            assert!(
                matches!(err, SecretError::InvalidTokens { .. }),
                "{name}: {err}"
            );
        }
    }

    /// A property test over the template parser: any string made of template fragments and
    /// multi-byte characters resolves or is refused, never panics.
    #[test]
    fn no_template_makes_the_parser_panic() {
        const PIECES: [&str; 14] = [
            "${",
            "}",
            "pvc.annotations['",
            "']",
            "'",
            "[",
            "]",
            "pv.name",
            "pvc.name",
            "pvc.namespace",
            "é",
            "€",
            "a",
            "$",
        ];
        let mut ann = BTreeMap::new();
        ann.insert("k".to_string(), "v".to_string());
        ann.insert(String::new(), "empty".to_string());
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut name = String::new();
            let mut namespace = String::new();
            for i in 0..12 {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let piece = PIECES[(seed >> 33) as usize % PIECES.len()];
                if (seed >> 20).is_multiple_of(3) {
                    continue;
                }
                if i % 2 == 0 {
                    name.push_str(piece);
                } else {
                    namespace.push_str(piece);
                }
            }
            let template = t(&name, &namespace);
            let outcome = std::panic::catch_unwind(|| {
                let _ = resolve(&template, &ctx(&ann));
            });
            assert!(outcome.is_ok(), "panicked on {template:?}");
        }
    }

    #[test]
    fn dns_rules() {
        assert!(is_dns_label("a-1"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("a..b"));
    }
}
