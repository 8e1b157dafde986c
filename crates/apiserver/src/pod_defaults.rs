//! What kube-apiserver adds to a Pod it is given (compared with kube-apiserver v1.36.2 by
//! `cli/tests/real_cluster/pods.rs`):
//! - the v1 defaults of a Pod at every write (`SetDefaults_Pod`, `SetDefaults_PodSpec`, and
//!   those of containers, ports, probes, HTTP actions, field references and volumes, in
//!   `pkg/apis/core/v1`): requests taken from limits where a container has none, its
//!   resource lists rounded up to milli units and written canonically;
//! - the status a create starts from: phase `Pending` and the QoS class.
//!
//! The admission plugins kube-apiserver runs on a Pod's create are in [`crate::admission`].
//!
//! Not done: the pod-level resources' defaults (`spec.resources` from the containers') and
//! their part in the QoS class; a `schedulingGates` Pod's `SchedulingGated` condition;
//! `matchLabelKeys` merged into affinity and spread selectors; an image volume's pull policy.

use serde_json::{Map, Value, json};

use crate::quantities::{Rounding, canonical_in_place};

/// The defaults of a Pod being written (created or updated).
pub fn defaults(pod: &mut Value) {
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec_defaults(spec, Kind::Pod);
    }
}

/// The defaults of the Pod templates of a workload being written (`group`/`plural`): those
/// of a Pod's spec without the Pod's own (requests from limits, `enableServiceLinks`), and
/// a StatefulSet's claim templates'.
pub fn template_defaults(group: &str, plural: &str, object: &mut Value) {
    let template: &[&str] = match (group, plural) {
        ("apps", "deployments" | "replicasets" | "daemonsets" | "statefulsets") => {
            &["spec", "template", "spec"]
        }
        _ => return,
    };
    let spec = template
        .iter()
        .try_fold(&mut *object, |at, part| at.get_mut(*part))
        .and_then(Value::as_object_mut);
    if let Some(spec) = spec {
        spec_defaults(spec, Kind::Template);
    }
    let claims = object
        .get_mut("spec")
        .and_then(|spec| spec.get_mut("volumeClaimTemplates"))
        .and_then(Value::as_array_mut);
    for claim in claims
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        claim_template_defaults(claim);
        // `SetDefaults_PersistentVolumeClaim` runs on a template too.
        let status = claim.entry("status").or_insert(Value::Null);
        if !status.is_object() {
            *status = json!({});
        }
        if let Some(status) = status.as_object_mut() {
            set_text(status, "phase", "Pending");
        }
    }
}

/// Whose spec is defaulted: a Pod's gets more than a template's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Template,
}

/// The ServiceAccount a Pod spec names: `serviceAccountName`, else the deprecated
/// `serviceAccount`.
pub(crate) fn account_name(spec: &Map<String, Value>) -> Option<String> {
    ["serviceAccountName", "serviceAccount"]
        .into_iter()
        .filter_map(|field| spec.get(field).and_then(Value::as_str))
        .find(|name| !name.is_empty())
        .map(str::to_string)
}

fn spec_defaults(spec: &mut Map<String, Value>, kind: Kind) {
    // The v1 conversion keeps one name: the deprecated field always mirrors it.
    if let Some(account) = account_name(spec) {
        spec.insert("serviceAccountName".into(), json!(account));
        spec.insert("serviceAccount".into(), json!(account));
    }
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    for field in ["containers", "initContainers"] {
        for container in items_mut(spec, field) {
            if kind == Kind::Pod {
                requests_from_limits(container);
            }
            container_defaults(container, host_network && kind == Kind::Pod);
        }
    }
    for container in items_mut(spec, "ephemeralContainers") {
        container_defaults(container, false);
    }
    for volume in items_mut(spec, "volumes") {
        volume_defaults(volume);
    }
    if let Some(overhead) = spec.get_mut("overhead") {
        resource_list(overhead);
    }
    if let Some(resources) = spec.get_mut("resources") {
        resource_lists(resources);
    }
    set_text(spec, "dnsPolicy", "ClusterFirst");
    set_text(spec, "restartPolicy", "Always");
    set(spec, "securityContext", json!({}));
    set(spec, "terminationGracePeriodSeconds", json!(30));
    set_text(spec, "schedulerName", "default-scheduler");
    if kind == Kind::Pod {
        set(spec, "enableServiceLinks", json!(true));
    }
}

/// The status a Pod is created with: `Pending`, with the QoS class of its containers.
pub fn initial_status(pod: &Value) -> Value {
    json!({"phase": "Pending", "qosClass": qos_class(&pod["spec"])})
}

/// A Pod's status write (`next`, over `current`): the QoS class is set at create and
/// immutable, so a write without one (an older kubelet's) gets the stored one back, as
/// kube-apiserver's Pod status strategy does.
pub(crate) fn keep_qos_class(current: &Value, next: &mut Value) {
    let stored = &current["status"]["qosClass"];
    if let Some(status) = next.get_mut("status").and_then(Value::as_object_mut)
        && status
            .get("qosClass")
            .is_none_or(|class| class.is_null() || class.as_str() == Some(""))
        && !stored.is_null()
    {
        status.insert("qosClass".into(), stored.clone());
    }
}

/// The QoS class kube-apiserver gives a Pod (`ComputePodQOS` over its containers and init
/// containers, CPU and memory only; a zero quantity counts as unset).
pub fn qos_class(spec: &Value) -> &'static str {
    use std::collections::BTreeMap;
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    let containers = ["containers", "initContainers"]
        .into_iter()
        .flat_map(|field| spec[field].as_array().into_iter().flatten());
    for container in containers {
        let resources = &container["resources"];
        for (list, into) in [("requests", &mut requests), ("limits", &mut limits)] {
            let mut named = 0;
            for name in ["cpu", "memory"] {
                let value = resources[list][name]
                    .as_str()
                    .and_then(crate::claim_rules::nano_units)
                    .unwrap_or(0);
                if value > 0 {
                    *into.entry(name).or_insert(0) += value;
                    named += 1;
                }
            }
            if list == "limits" && named < 2 {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed && requests.len() == limits.len() && requests == limits {
        return "Guaranteed";
    }
    "Burstable"
}

/// The objects of the list `field` of `spec` (none when it is not a list).
fn items_mut<'a>(
    spec: &'a mut Map<String, Value>,
    field: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    spec.get_mut(field)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Sets `field` unless it holds a value (missing or null counts as unset).
pub(crate) fn set(object: &mut Map<String, Value>, field: &str, value: Value) {
    if object.get(field).is_none_or(Value::is_null) {
        object.insert(field.into(), value);
    }
}

/// Sets the text `field` unless it holds one: missing, null and `""` count as unset (a Go
/// string's zero value, as kube-apiserver's defaults read it).
fn set_text(object: &mut Map<String, Value>, field: &str, value: &str) {
    if object
        .get(field)
        .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    {
        object.insert(field.into(), json!(value));
    }
}

/// A container's requests take each limit it does not request (Pods only, not templates).
fn requests_from_limits(container: &mut Map<String, Value>) {
    let Some(resources) = container
        .get_mut("resources")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else {
        return;
    };
    // An empty map is not stored: it adds no requests either.
    if limits.is_empty() {
        return;
    }
    let requests = resources.entry("requests").or_insert(Value::Null);
    if requests.is_null() {
        *requests = json!({});
    }
    if let Some(requests) = requests.as_object_mut() {
        for (name, value) in limits {
            requests.entry(name).or_insert(value);
        }
    }
}

fn container_defaults(container: &mut Map<String, Value>, host_network: bool) {
    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
    let policy = if image_tag(image) == Some("latest") {
        "Always"
    } else {
        "IfNotPresent"
    };
    set_text(container, "imagePullPolicy", policy);
    set_text(container, "terminationMessagePath", "/dev/termination-log");
    set_text(container, "terminationMessagePolicy", "File");
    // A struct, not a pointer, in kube-apiserver's types: always written, `{}` when empty.
    set(container, "resources", json!({}));
    if let Some(resources) = container.get_mut("resources") {
        resource_lists(resources);
    }
    for port in items_mut(container, "ports") {
        set_text(port, "protocol", "TCP");
        if host_network
            && port.get("hostPort").and_then(Value::as_i64).unwrap_or(0) == 0
            && let Some(number) = port.get("containerPort").cloned()
        {
            port.insert("hostPort".into(), number);
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = container.get_mut(probe).and_then(Value::as_object_mut) {
            for (field, value) in [
                ("timeoutSeconds", 1),
                ("periodSeconds", 10),
                ("successThreshold", 1),
                ("failureThreshold", 3),
            ] {
                if probe.get(field).and_then(Value::as_i64).unwrap_or(0) == 0 {
                    probe.insert(field.into(), json!(value));
                }
            }
            http_get(probe);
            if let Some(grpc) = probe.get_mut("grpc").and_then(Value::as_object_mut) {
                set(grpc, "service", json!(""));
            }
        }
    }
    if let Some(lifecycle) = container
        .get_mut("lifecycle")
        .and_then(Value::as_object_mut)
    {
        for handler in lifecycle.values_mut().filter_map(Value::as_object_mut) {
            http_get(handler);
        }
    }
    for variable in items_mut(container, "env") {
        if let Some(reference) = variable
            .get_mut("valueFrom")
            .and_then(|from| from.get_mut("fieldRef"))
            .and_then(Value::as_object_mut)
        {
            set_text(reference, "apiVersion", "v1");
        }
    }
}

/// `SetDefaults_HTTPGetAction` on a probe's or a lifecycle handler's `httpGet`.
fn http_get(handler: &mut Map<String, Value>) {
    if let Some(action) = handler.get_mut("httpGet").and_then(Value::as_object_mut) {
        for (field, value) in [("path", "/"), ("scheme", "HTTP")] {
            if action
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                action.insert(field.into(), json!(value));
            }
        }
    }
}

/// The tag of an image reference, `latest` when it has neither a tag nor a digest; None for a
/// digest without a tag or no image (as `parsers.ParseImageName` reads a valid reference; one
/// it cannot parse, such as an upper-case repository, gets `IfNotPresent` there and is read
/// here as if valid).
fn image_tag(image: &str) -> Option<&str> {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    if name.is_empty() {
        return None;
    }
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((_, tag)) => Some(tag),
        None if digest.is_some() => None,
        None => Some("latest"),
    }
}

/// The volume sources whose `defaultMode` is 0644 when unset.
const MODE_SOURCES: [&str; 4] = ["secret", "configMap", "downwardAPI", "projected"];

fn volume_defaults(volume: &mut Map<String, Value>) {
    if volume.keys().all(|key| key == "name") {
        volume.insert("emptyDir".into(), json!({}));
    }
    for source in MODE_SOURCES {
        if let Some(source) = volume.get_mut(source).and_then(Value::as_object_mut) {
            set(source, "defaultMode", json!(0o644));
        }
    }
    if let Some(host_path) = volume.get_mut("hostPath").and_then(Value::as_object_mut) {
        set(host_path, "type", json!(""));
    }
    if let Some(limit) = volume
        .get_mut("emptyDir")
        .and_then(|dir| dir.get_mut("sizeLimit"))
    {
        canonical_in_place(limit, Rounding::Nano);
    }
    downward_field_refs(volume.get_mut("downwardAPI"));
    let sources = volume
        .get_mut("projected")
        .and_then(|projected| projected.get_mut("sources"))
        .and_then(Value::as_array_mut);
    for source in sources.into_iter().flatten() {
        if let Some(token) = source
            .get_mut("serviceAccountToken")
            .and_then(Value::as_object_mut)
        {
            set(token, "expirationSeconds", json!(3600));
        }
        downward_field_refs(source.get_mut("downwardAPI"));
    }
    let template = volume
        .get_mut("ephemeral")
        .and_then(|ephemeral| ephemeral.get_mut("volumeClaimTemplate"))
        .and_then(Value::as_object_mut);
    if let Some(template) = template {
        claim_template_defaults(template);
    }
}

/// `SetDefaults_ObjectFieldSelector` on a downward API source's items (a volume's, a
/// projected volume's).
fn downward_field_refs(source: Option<&mut Value>) {
    let items = source
        .and_then(|source| source.get_mut("items"))
        .and_then(Value::as_array_mut);
    for item in items.into_iter().flatten() {
        if let Some(reference) = item.get_mut("fieldRef").and_then(Value::as_object_mut) {
            set_text(reference, "apiVersion", "v1");
        }
    }
}

/// A claim template's (an ephemeral volume's, a StatefulSet's): `{}` metadata (a struct in
/// kube-apiserver's types, always written), the claim spec's `volumeMode`, its resource
/// lists canonical.
fn claim_template_defaults(template: &mut Map<String, Value>) {
    set(template, "metadata", json!({}));
    if let Some(spec) = template.get_mut("spec").and_then(Value::as_object_mut) {
        set(spec, "volumeMode", json!("Filesystem"));
        if let Some(resources) = spec.get_mut("resources") {
            resource_lists(resources);
        }
    }
}

/// A `ResourceRequirements`' requests and limits, as `SetDefaults_ResourceList` leaves them;
/// an empty or null one is not written (a map kube-apiserver omits when empty).
fn resource_lists(resources: &mut Value) {
    let Some(resources) = resources.as_object_mut() else {
        return;
    };
    for name in ["requests", "limits"] {
        let Some(list) = resources.get_mut(name) else {
            continue;
        };
        resource_list(list);
        if list.is_null() || list.as_object().is_some_and(Map::is_empty) {
            resources.remove(name);
        }
    }
}

fn resource_list(list: &mut Value) {
    for value in list
        .as_object_mut()
        .into_iter()
        .flat_map(|m| m.values_mut())
    {
        canonical_in_place(value, Rounding::Milli);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pod_defaults_tests.rs"]
mod tests;
