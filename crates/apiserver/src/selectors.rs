//! Label and field selectors.

use std::collections::BTreeMap;

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

fn split_top(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in text.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

/// A requirement's key must be a label key and its values label values, as kube-apiserver's
/// selector parser requires (`bad===x` is refused, not read as the value `=x`).
fn check_requirement(req: &LabelReq) -> Result<(), String> {
    let (key, values): (&str, &[String]) = match req {
        LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, std::slice::from_ref(v)),
        LabelReq::In(k, vs) | LabelReq::NotIn(k, vs) => (k, vs),
        LabelReq::Exists(k) | LabelReq::NotExists(k) => (k, &[]),
    };
    if let Some(why) = crate::meta_rules::qualified_name_error(key) {
        return Err(format!(
            "unable to parse requirement: key: Invalid value: {key:?}: {why}"
        ));
    }
    for (i, value) in values.iter().enumerate() {
        if let Some(why) = crate::meta_rules::label_value_error(value) {
            return Err(format!(
                "unable to parse requirement: values[{i}][{key}]: Invalid value: {value:?}: {why}"
            ));
        }
    }
    Ok(())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(text) {
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelReq::NotIn(
                    k.trim().into(),
                    set_values(v).ok_or_else(|| format!("invalid selector {part:?}"))?,
                )
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelReq::In(
                    k.trim().into(),
                    set_values(v).ok_or_else(|| format!("invalid selector {part:?}"))?,
                )
            } else if part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                LabelReq::Exists(part.clone())
            } else {
                return Err(format!("unable to parse requirement: {part:?}"));
            };
            check_requirement(&req)?;
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Whether an object's labels satisfy the selector.
    pub fn matches_object(&self, object: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = object["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&labels)
    }
}

/// A parsed field selector: `path=value`, `path==value`, `path!=value`, comma separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, String, bool)>);

const FIELDS: [&str; 15] = [
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "spec.volumeName",
    "spec.storageClassName",
    "spec.claimRef.name",
    "spec.claimRef.namespace",
    "involvedObject.name",
    "involvedObject.namespace",
    "involvedObject.uid",
    "involvedObject.kind",
    // Events, as kube-apiserver selects them (kubectl get events --field-selector reason=...).
    "reason",
    "type",
    "reportingComponent",
];

impl FieldSelector {
    /// Parses a field selector; unknown fields are refused (as kube-apiserver does).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, value, equal) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!("invalid field selector {part:?}"));
            };
            let path = path.trim();
            if !FIELDS.contains(&path) && !path.starts_with("involvedObject.") {
                return Err(format!("field label not supported: {path}"));
            }
            out.push((path.to_string(), value.trim().to_string(), equal));
        }
        Ok(FieldSelector(out))
    }

    /// Whether the object satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, value, equal)| {
            let mut cur = object;
            for part in path.split('.') {
                cur = &cur[part];
            }
            let actual = cur.as_str().unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors() {
        let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "fast")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=fast", true),
            ("app!=web", false),
            ("tier in (fast,slow)", true),
            ("tier notin (fast)", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&labels),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in x").is_err());
        for bad in [
            "bad===x",
            "Bad Key=x",
            "a=b c",
            "a in (x,-y)",
            "/x",
            "a!=x!",
        ] {
            let refused = LabelSelector::parse(bad).unwrap_err();
            assert!(
                refused.starts_with("unable to parse requirement: "),
                "{bad}: {refused}"
            );
        }
        let refused = LabelSelector::parse("bad===x").unwrap_err();
        assert!(
            refused.starts_with(r#"unable to parse requirement: values[0][bad]: Invalid value: "=x": a valid label must be"#),
            "{refused}"
        );
        for good in ["a=", "example.com/a in (x, y_z)", "!b", "k.io/c", "a==B-1"] {
            assert!(LabelSelector::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn field_selectors() {
        let obj = serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        assert!(
            FieldSelector::parse("metadata.name=a,spec.nodeName=n1")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            !FieldSelector::parse("metadata.name!=a")
                .unwrap()
                .matches(&obj)
        );
        assert!(FieldSelector::parse("spec.bogus=1").is_err());
        let event = serde_json::json!({"reason": "FailedScheduling", "type": "Warning", "involvedObject": {"name": "web"}});
        assert!(
            FieldSelector::parse("involvedObject.name=web,reason=FailedScheduling,type=Warning")
                .unwrap()
                .matches(&event)
        );
        assert!(
            !FieldSelector::parse("reason=Scheduled")
                .unwrap()
                .matches(&event)
        );
    }
}
