//! Field selectors, with the fields kube-apiserver lets each kind be selected by: most kinds
//! only `metadata.name` and `metadata.namespace`; Pods, Events (both groups), Namespaces, Nodes,
//! Secrets and custom resources their own lists (checked on kube-apiserver v1.36.2, field by field), each with
//! its message for a field it does not have.

use serde_json::Value;

use crate::registry::ResourceType;

/// Every kind's own fields.
const METADATA: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// The fields of the kinds that have more (or other) than [`METADATA`].
fn own_fields(rt: &ResourceType) -> Option<&'static [&'static str]> {
    if rt.custom {
        // Its definition's `selectableFields` are not read here.
        return Some(if rt.namespaced {
            &METADATA
        } else {
            &["metadata.name"]
        });
    }
    Some(match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            // The old name of spec.nodeName.
            "spec.host",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        ("", "events") => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "metadata.name",
            "metadata.namespace",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "namespaces") => &["metadata.name", "status.phase"],
        ("", "nodes") => &["metadata.name", "spec.unschedulable"],
        ("", "secrets") => &["metadata.name", "metadata.namespace", "type"],
        _ => return None,
    })
}

/// Why kube-apiserver refuses to select `rt`'s objects by `field`, if it does.
fn unsupported(rt: &ResourceType, field: &str) -> Option<String> {
    match own_fields(rt) {
        Some(fields) if fields.contains(&field) => None,
        Some(_) => Some(format!("field label not supported: {field}")),
        None if METADATA.contains(&field) => None,
        None => Some(format!(
            "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )),
    }
}

/// A field's value as selectors compare it: a string, a boolean written out (absent is
/// `false`), a core Event's `source` its component (else its reporting component), and a
/// Pod's `status.podIPs` nothing (kube-apiserver accepts the field but gives it no value).
fn value_of(object: &Value, field: &str) -> String {
    let at = |path: &str| path.split('.').fold(object, |cur, part| &cur[part]);
    let found = match field {
        "source" => match at("source.component") {
            Value::String(component) if !component.is_empty() => at("source.component"),
            _ => at("reportingComponent"),
        },
        "spec.host" => at("spec.nodeName"),
        "status.podIPs" => &Value::Null,
        _ => at(field),
    };
    match found {
        Value::String(text) => text.clone(),
        Value::Bool(flag) => flag.to_string(),
        Value::Null if matches!(field, "spec.hostNetwork" | "spec.unschedulable") => "false".into(),
        Value::Number(number) => number.to_string(),
        _ => String::new(),
    }
}

/// The core/v1 Event field an events.k8s.io/v1 field selector names (kube-apiserver's field
/// label conversion for that version).
fn core_event_field(field: &str) -> String {
    match field {
        "reportingController" => "reportingComponent".into(),
        _ => match field.strip_prefix("regarding.") {
            Some(rest) => format!("involvedObject.{rest}"),
            None => field.to_string(),
        },
    }
}

/// A parsed field selector: `path=value`, `path==value`, `path!=value`, comma separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, String, bool)>);

impl FieldSelector {
    /// Parses a field selector of `rt`'s objects; a field they cannot be selected by is
    /// refused with kube-apiserver's message.
    pub fn parse(text: &str, rt: &ResourceType) -> Result<Self, String> {
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
            if let Some(why) = unsupported(rt, path) {
                return Err(why);
            }
            // events.k8s.io/v1 Events are selected in their stored (core/v1) form.
            let path = if rt.stored_as_core_events() {
                core_event_field(path)
            } else {
                path.to_string()
            };
            out.push((path, value.trim().to_string(), equal));
        }
        Ok(FieldSelector(out))
    }

    /// Whether the object satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        self.0
            .iter()
            .all(|(path, value, equal)| (value_of(object, path) == *value) == *equal)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rt(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
        crate::registry::Registry::built_in(group, plural)
    }

    #[test]
    fn each_kind_is_selected_by_the_fields_kube_apiserver_has_for_it() {
        let only_metadata = |f: &str| {
            format!(
                "{f:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )
        };
        let not_supported = |f: &str| format!("field label not supported: {f}");
        // Each row as kube-apiserver v1.36.2 answered it.
        let rows = [
            (
                "",
                "persistentvolumeclaims",
                "status.phase",
                Some(only_metadata("status.phase")),
            ),
            (
                "",
                "persistentvolumeclaims",
                "spec.volumeName",
                Some(only_metadata("spec.volumeName")),
            ),
            ("", "persistentvolumeclaims", "metadata.namespace", None),
            ("", "persistentvolumes", "metadata.namespace", None),
            (
                "",
                "persistentvolumes",
                "spec.claimRef.name",
                Some(only_metadata("spec.claimRef.name")),
            ),
            (
                "storage.k8s.io",
                "volumeattachments",
                "spec.nodeName",
                Some(only_metadata("spec.nodeName")),
            ),
            ("", "configmaps", "bogus.x", Some(only_metadata("bogus.x"))),
            ("", "pods", "spec.nodeName", None),
            ("", "pods", "status.nominatedNodeName", None),
            ("", "pods", "bogus.x", Some(not_supported("bogus.x"))),
            ("", "events", "involvedObject.fieldPath", None),
            ("", "events", "source", None),
            (
                "",
                "events",
                "regarding.name",
                Some(not_supported("regarding.name")),
            ),
            ("", "events", "action", Some(not_supported("action"))),
            ("events.k8s.io", "events", "regarding.name", None),
            ("events.k8s.io", "events", "reportingController", None),
            (
                "events.k8s.io",
                "events",
                "involvedObject.name",
                Some(not_supported("involvedObject.name")),
            ),
            ("", "namespaces", "status.phase", None),
            (
                "",
                "namespaces",
                "metadata.namespace",
                Some(not_supported("metadata.namespace")),
            ),
            ("", "nodes", "spec.unschedulable", None),
            (
                "",
                "nodes",
                "status.phase",
                Some(not_supported("status.phase")),
            ),
            ("", "secrets", "type", None),
            ("", "pods", "spec.host", None),
        ];
        for (group, plural, field, want) in rows {
            let got = FieldSelector::parse(&format!("{field}=x"), &rt(group, plural)).err();
            assert_eq!(got, want, "{group}/{plural} {field}");
        }
    }

    #[test]
    fn selected_values_are_compared_as_kube_apiserver_writes_them() {
        let pods = rt("", "pods");
        let pod = json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"},
            "status": {"podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}});
        let selects = |rt: &ResourceType, text: &str, object: &Value| {
            FieldSelector::parse(text, rt).unwrap().matches(object)
        };
        assert!(selects(&pods, "metadata.name=a,spec.nodeName=n1", &pod));
        assert!(!selects(&pods, "metadata.name!=a", &pod));
        assert!(selects(&pods, "spec.hostNetwork=false", &pod));
        assert!(!selects(&pods, "status.podIPs=10.0.0.1", &pod));
        assert!(selects(&pods, "status.podIPs=", &pod));
        let events = rt("", "events");
        let event = json!({"reason": "FailedScheduling", "type": "Warning",
            "involvedObject": {"name": "web"}, "source": {"component": "default-scheduler"}});
        assert!(selects(
            &events,
            "involvedObject.name=web,reason=FailedScheduling,type=Warning,source=default-scheduler",
            &event
        ));
        assert!(!selects(&events, "reason=Scheduled", &event));
        let reported = json!({"reportingComponent": "volstack-provisioner"});
        assert!(selects(&events, "source=volstack-provisioner", &reported));
        assert!(selects(&pods, "spec.host=n1", &pod));
        let mut pools = (*rt("", "configmaps")).clone();
        pools.custom = true;
        assert_eq!(
            FieldSelector::parse("spec.size=1", &pools).unwrap_err(),
            "field label not supported: spec.size"
        );
        assert!(selects(&pools, "metadata.namespace=ns", &pod));
        pools.namespaced = false;
        assert_eq!(
            FieldSelector::parse("metadata.namespace=", &pools).unwrap_err(),
            "field label not supported: metadata.namespace"
        );
        let nodes = rt("", "nodes");
        assert!(selects(
            &nodes,
            "spec.unschedulable=true",
            &json!({"spec": {"unschedulable": true}})
        ));
        assert!(FieldSelector::parse("metadata.name", &pods).is_err());
    }
}
