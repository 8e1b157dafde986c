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

/// A template that cannot be resolved. Final until the class or claim changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// A `${...}` token that is not allowed in this field.
    #[error(
        "secret {field} template {template:?} uses {token:?}, which is not allowed there (allowed: {allowed})"
    )]
    UnknownToken {
        /// `name` or `namespace`.
        field: &'static str,
        /// The template.
        template: String,
        /// The token.
        token: String,
        /// Allowed tokens.
        allowed: &'static str,
    },
    /// `${` without `}`.
    #[error("secret {field} template {template:?} has an unterminated ${{")]
    Unterminated {
        /// `name` or `namespace`.
        field: &'static str,
        /// The template.
        template: String,
    },
    /// The claim lacks the annotation a template names.
    #[error("secret name template {template:?} needs claim annotation {key:?}, which is not set")]
    MissingAnnotation {
        /// The template.
        template: String,
        /// The annotation key.
        key: String,
    },
    /// The resolved value is not a valid Kubernetes name.
    #[error("secret {field} {value:?} (from template {template:?}) is not a valid {rule}")]
    InvalidName {
        /// `name` or `namespace`.
        field: &'static str,
        /// The resolved value.
        value: String,
        /// The template.
        template: String,
        /// Which naming rule.
        rule: &'static str,
    },
}

const NAMESPACE_TOKENS: &str = "${pv.name}, ${pvc.namespace}";
const NAME_TOKENS: &str = "${pv.name}, ${pvc.namespace}, ${pvc.name}, ${pvc.annotations['KEY']}";

fn expand(
    field: &'static str,
    template: &str,
    ctx: &TemplateContext<'_>,
) -> Result<String, SecretError> {
    let allowed = if field == "namespace" {
        NAMESPACE_TOKENS
    } else {
        NAME_TOKENS
    };
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| SecretError::Unterminated {
            field,
            template: template.to_string(),
        })?;
        let token = &after[..end];
        let unknown = || SecretError::UnknownToken {
            field,
            template: template.to_string(),
            token: format!("${{{token}}}"),
            allowed,
        };
        match token {
            "pv.name" => out.push_str(ctx.pv_name),
            "pvc.namespace" => out.push_str(ctx.pvc_namespace),
            "pvc.name" if field == "name" => out.push_str(ctx.pvc_name),
            t if field == "name" && annotation_key(t).is_some() => {
                let key = annotation_key(t).unwrap_or_default();
                let value = ctx
                    .pvc_annotations
                    .and_then(|a| a.get(key))
                    .ok_or_else(|| SecretError::MissingAnnotation {
                        template: template.to_string(),
                        key: key.to_string(),
                    })?;
                out.push_str(value);
            }
            _ => return Err(unknown()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
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
            field: "namespace",
            value: namespace,
            template: template.namespace.clone(),
            rule: "DNS-1123 label",
        });
    }
    let name = expand("name", &template.name, ctx)?;
    if !is_dns_subdomain(&name) {
        return Err(SecretError::InvalidName {
            field: "name",
            value: name,
            template: template.name.clone(),
            rule: "DNS-1123 subdomain",
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
    fn bad_templates_are_refused_with_the_reason() {
        let ann = BTreeMap::new();
        let cases = [
            (t("${pvc.uid}", "ns"), "not allowed"),
            (t("x", "${pvc.name}"), "not allowed"),
            (t("x", "${pvc.annotations['a']}"), "not allowed"),
            (t("${pv.name", "ns"), "unterminated"),
            (t("${pvc.annotations['missing']}", "ns"), "missing"),
            (t("Upper", "ns"), "DNS-1123 subdomain"),
            (t("x", "bad_ns"), "DNS-1123 label"),
            (t("x", "a.b"), "DNS-1123 label"),
        ];
        for (template, words) in cases {
            let err = resolve(&template, &ctx(&ann)).unwrap_err();
            assert!(err.to_string().contains(words), "{template:?}: {err}");
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
            let text = err.to_string();
            assert!(
                text.contains("not allowed") || text.contains("not set"),
                "{name}: {text}"
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
