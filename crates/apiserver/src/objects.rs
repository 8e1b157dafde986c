//! What kube-apiserver does to objects on the way in: metadata, defaults, validation, and the
//! spec/status split of the status subresource.

use serde_json::{Map, Value, json};

use crate::registry::ResourceType;
use crate::status::ApiError;
use crate::storage_defaults;

mod pods;
mod update;

pub use self::pods::{graceful_deletion, pod_grace_seconds};
pub use self::update::merge_update;
pub(crate) use self::update::same_apart_from;

/// RFC 3339 UTC, seconds (metav1.Time).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem / 60) % 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm, public domain description).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!("{year:04}-{month:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// Seconds since the epoch of an RFC 3339 time (for ages in tables); None for anything else,
/// whatever its bytes.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    crate::time::parse(text, false)
        .ok()
        .and_then(|(secs, _)| u64::try_from(secs).ok())
}

/// A DNS-1123 label.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label_text(s)
}

/// Lowercase alphanumerics and `-`, starting and ending with an alphanumeric.
fn is_label_text(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain as kube-apiserver checks it: at most 253 characters of dot-separated
/// parts (no per-part limit: `csi-<64 hex digits>` is a valid VolumeAttachment name).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_text)
}

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

/// Checks `apiVersion`/`kind` against the URL and fills them in when missing; a built-in
/// kind's `null`s are dropped ([`drop_nulls`]).
pub fn check_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    match obj["kind"].as_str() {
        None => obj["kind"] = json!(rt.kind),
        Some(k) if k == rt.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind {k:?} does not match the resource {} (kind {:?})",
                rt.plural, rt.kind
            )));
        }
    }
    match obj["apiVersion"].as_str() {
        None => obj["apiVersion"] = json!(rt.api_version()),
        Some(v) if v == rt.api_version() => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the apiVersion {v:?} does not match {:?}",
                rt.api_version()
            )));
        }
    }
    if !rt.custom {
        drop_nulls(obj);
    }
    Ok(())
}

/// Removes every field whose value is `null`, at any depth: kube-apiserver decodes a built-in
/// kind into its Go type and a `null` becomes an absent field, so a stored object never has
/// one, and a client's typed object (which leaves absent fields out) compares equal to it.
/// (Where a map's value is `null`, kube-apiserver stores the empty string; it is dropped
/// here.) A custom resource keeps its `null`s, as its schema decides them.
pub(crate) fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.retain(|_, field| !field.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// Prepares a new object: name (or generateName), namespace, uid, timestamps, generation (for
/// kinds that have one).
pub fn prepare_create(
    rt: &ResourceType,
    namespace: &str,
    obj: &mut Value,
) -> Result<String, ApiError> {
    check_type(rt, obj)?;
    let meta = meta_mut(obj)?;
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        let prefix = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                &rt.kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        let suffix: String = (0..5)
            .map(|_| {
                const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                ALPHABET[rand::random_range(0..ALPHABET.len())] as char
            })
            .collect();
        name = format!("{prefix}{suffix}");
        meta.insert("name".into(), json!(name));
    }
    if rt.group == "rbac.authorization.k8s.io" {
        // RBAC objects are named as path segments (`system:basic-user`).
        if let Some(why) = path_segment_error(&name) {
            return Err(ApiError::invalid(
                &rt.kind,
                &name,
                &format!("metadata.name: Invalid value: {name:?}: {why}"),
            ));
        }
    } else {
        let valid = if rt.plural == "namespaces" {
            is_dns_label(&name)
        } else {
            is_dns_subdomain(&name)
        };
        if !valid {
            return Err(ApiError::invalid(
                &rt.kind,
                &name,
                &format!(
                    "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
    }
    if rt.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({namespace})"
                )));
            }
            _ => {
                meta.insert("namespace".into(), json!(namespace));
            }
        }
    } else {
        meta.remove("namespace");
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    if rt.has_generation() {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("resourceVersion");
    meta.remove("selfLink");
    meta.remove("managedFields");
    drop_empty_lists_and_maps(meta);
    // A Node is created with its status (as kubelet registers it); a Pod's comes from its
    // defaulted spec (below); every other kind with a status starts from its own.
    if rt.status && !(rt.group.is_empty() && matches!(rt.plural.as_str(), "nodes" | "pods")) {
        let status = initial_status(rt);
        obj["status"] = status;
    }
    apply_defaults(rt, obj);
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumeclaims") => storage_defaults::mirror_data_sources(obj),
        ("", "persistentvolumes") => {
            storage_defaults::stamp_phase_transition(None, obj, &now_rfc3339());
        }
        ("", "pods") => obj["status"] = crate::pod_defaults::initial_status(obj),
        _ => {}
    }
    Ok(name)
}

fn initial_status(rt: &ResourceType) -> Value {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumeclaims") | ("", "persistentvolumes") => json!({"phase": "Pending"}),
        ("storage.k8s.io", "volumeattachments") => json!({"attached": false}),
        ("", "namespaces") => json!({"phase": "Active"}),
        ("apiextensions.k8s.io", "customresourcedefinitions") => json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
            ]
        }),
        _ => json!({}),
    }
}

/// Defaults clients rely on.
/// A Secret's write-only `stringData` is merged into `data` (base64, its keys win) and never
/// stored or returned, as kube-apiserver does.
fn merge_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    if !map.get("data").is_some_and(Value::is_object) {
        map.insert("data".into(), json!({}));
    }
    if let Some(data) = map.get_mut("data").and_then(Value::as_object_mut) {
        for (key, value) in strings {
            let text = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            data.insert(
                key,
                Value::String(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

pub fn apply_defaults(rt: &ResourceType, obj: &mut Value) {
    let set_default = |obj: &mut Value, path: &[&str], value: Value| {
        let mut cur = obj;
        for (i, part) in path.iter().enumerate() {
            if !cur.is_object() {
                return;
            }
            if i == path.len() - 1 {
                if cur.get(*part).is_none_or(Value::is_null) {
                    cur[*part] = value;
                }
                return;
            }
            if cur.get(*part).is_none_or(Value::is_null) {
                cur[*part] = json!({});
            }
            cur = &mut cur[*part];
        }
    };
    crate::quantities::canonicalize(&rt.group, &rt.plural, obj);
    crate::pod_defaults::template_defaults(&rt.group, &rt.plural, obj);
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumeclaims") => {
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"))
        }
        ("", "persistentvolumes") => {
            set_default(
                obj,
                &["spec", "persistentVolumeReclaimPolicy"],
                json!("Retain"),
            );
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
            storage_defaults::default_host_path_type(obj);
        }
        ("storage.k8s.io", "storageclasses") => {
            set_default(obj, &["reclaimPolicy"], json!("Delete"));
            set_default(obj, &["volumeBindingMode"], json!("Immediate"));
        }
        ("", "namespaces") => {
            // Every new namespace is held by `kubernetes` (an update keeps the stored list, see
            // merge_update).
            crate::namespace_rules::held_at_create(obj);
            // Every namespace is labelled with its name (kube-apiserver's
            // NamespaceDefaultLabelName), on updates too.
            if let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string)
                && obj["metadata"].is_object()
            {
                if !obj["metadata"]["labels"].is_object() {
                    obj["metadata"]["labels"] = json!({});
                }
                obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            }
        }
        ("", "secrets") => {
            merge_string_data(obj);
            if obj.get("type").is_some_and(|t| t == "") {
                obj["type"] = Value::Null;
            }
            set_default(obj, &["type"], json!("Opaque"));
        }
        ("storage.k8s.io", "csidrivers") => {
            set_default(obj, &["spec", "attachRequired"], json!(true));
            set_default(obj, &["spec", "podInfoOnMount"], json!(false));
            set_default(obj, &["spec", "storageCapacity"], json!(false));
            set_default(obj, &["spec", "requiresRepublish"], json!(false));
            set_default(obj, &["spec", "seLinuxMount"], json!(false));
            set_default(
                obj,
                &["spec", "fsGroupPolicy"],
                json!("ReadWriteOnceWithFSType"),
            );
            set_default(
                obj,
                &["spec", "volumeLifecycleModes"],
                json!(["Persistent"]),
            );
        }
        ("", "pods") => crate::pod_defaults::defaults(obj),
        ("", "nodes") => crate::node_defaults::defaults(obj),
        ("apps", "deployments") => {
            set_default(obj, &["spec", "replicas"], json!(1));
            set_default(obj, &["spec", "revisionHistoryLimit"], json!(10));
            set_default(obj, &["spec", "progressDeadlineSeconds"], json!(600));
        }
        _ => {}
    }
}

/// Validations clients rely on (422 with the field path), with kube-apiserver's messages.
/// What kube-apiserver refuses while it decodes an object (before validation, a 400): a time
/// that does not parse.
pub fn decodes(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    crate::protobuf::times::check(&rt.api_version(), &rt.kind, obj).map_err(|error| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {error}",
            kind = rt.kind,
            version = rt.version
        ))
    })
}

pub fn validate(rt: &ResourceType, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    use crate::storage_rules as rules;
    // Base64 that does not decode fails at decoding in kube-apiserver, before any check: a
    // 400. An object stored before this was checked is not held to it while its data stays
    // (its finalizers can go).
    if rt.group.is_empty()
        && let Some(message) = crate::config_rules::undecodable(&rt.kind, obj, old)
    {
        return Err(ApiError::bad_request(message));
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = |msg: String| Err(ApiError::invalid(&rt.kind, name, &msg));
    let errors = crate::meta_rules::check(&obj["metadata"]);
    if !errors.is_empty() {
        return Err(ApiError::invalid_list(&rt.kind, name, &errors));
    }
    if let Some(schema) = &rt.schema {
        let errors = crate::schema::check(schema, obj);
        if !errors.is_empty() {
            return Err(ApiError::invalid_list(&rt.kind, name, &errors));
        }
    }
    if let (("", "configmaps" | "secrets"), Some(old)) =
        ((rt.group.as_str(), rt.plural.as_str()), old)
    {
        let errors = crate::config_rules::immutable_errors(&rt.kind, obj, old);
        if !errors.is_empty() {
            return Err(ApiError::invalid_list(&rt.kind, name, &errors));
        }
    }
    if rt.stored_as_core_events() {
        return crate::event_versions::write_errors(obj, old).map_or(Ok(()), |errors| {
            Err(ApiError::invalid_list(&rt.kind, name, &errors))
        });
    }
    if (rt.group.as_str(), rt.plural.as_str()) == ("", "namespaces") {
        let errors = crate::namespace_rules::spec_finalizer_errors(obj);
        if !errors.is_empty() {
            return Err(ApiError::invalid_list(&rt.kind, name, &errors));
        }
    }
    let checked = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "persistentvolumeclaims") => claim(obj, old),
        ("", "persistentvolumes") => rules::persistent_volume(obj, old),
        ("", "events") => rules::core_event(obj),
        ("storage.k8s.io", "storageclasses") => rules::storage_class(obj, old),
        ("storage.k8s.io", "csidrivers") => rules::csi_driver(obj, old),
        ("storage.k8s.io", "csinodes") => rules::csi_node(obj, old),
        ("storage.k8s.io", "volumeattachments") => rules::volume_attachment(obj, old),
        ("storage.k8s.io", "csistoragecapacities") => rules::storage_capacity(obj, old),
        ("coordination.k8s.io", "leases") => rules::lease(obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") if old.is_none() => {
            new_definition(obj)
        }
        ("rbac.authorization.k8s.io", "roles" | "clusterroles") => {
            crate::rbac_rules::role(obj, rt.namespaced)
        }
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            crate::rbac_rules::binding(obj, old, rt.namespaced)
        }
        _ => Ok(()),
    };
    checked.or_else(invalid)
}

/// Why a name cannot be a path segment (kube-apiserver's ValidatePathSegmentName), if it
/// cannot.
fn path_segment_error(name: &str) -> Option<String> {
    if name == "." || name == ".." {
        return Some(format!("may not be '{name}'"));
    }
    ["/", "%"]
        .iter()
        .find(|c| name.contains(*c))
        .map(|c| format!("may not contain '{c}'"))
}

/// The annotation a definition in a group of the Kubernetes project must carry.
pub const API_APPROVED: &str = "api-approved.kubernetes.io";

/// A new CustomResourceDefinition: named `plural.group`, and one of a group of the Kubernetes
/// project (`k8s.io`, `kubernetes.io` and their subdomains) names its API review, as
/// kube-apiserver requires.
fn new_definition(obj: &Value) -> Result<(), String> {
    let group = obj["spec"]["group"].as_str().unwrap_or_default();
    // Its name is its plural and group (which name its objects' type and where they are kept).
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or_default();
    if name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name: Invalid value: {}: must be spec.names.plural+\".\"+spec.group",
            Value::from(name)
        ));
    }
    let protected = ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|d| group == *d || group.ends_with(&format!(".{d}")));
    let approval = obj["metadata"]["annotations"][API_APPROVED].as_str();
    if protected && approval.is_none_or(str::is_empty) {
        return Err(format!(
            "metadata.annotations[{API_APPROVED}]: Required value: protected groups must have approval annotation \"{API_APPROVED}\", see https://github.com/kubernetes/enhancements/pull/1111"
        ));
    }
    Ok(())
}

/// A PersistentVolumeClaim: its spec, and what may change after creation.
fn claim(obj: &Value, old: Option<&Value>) -> Result<(), String> {
    let spec = &obj["spec"];
    crate::claim_rules::check_spec(spec)?;
    // A status write keeps the spec (kube-apiserver validates a claim's status alone).
    if old.is_none_or(|old| old["spec"] != *spec) {
        crate::storage_defaults::check_data_sources(spec)?;
    }
    if spec["accessModes"].as_array().is_none_or(Vec::is_empty) && old.is_none() {
        return Err("spec.accessModes: Required value: at least 1 access mode is required".into());
    }
    if spec["resources"]["requests"]["storage"].is_null()
        && spec["dataSourceRef"].is_null()
        && old.is_none()
    {
        return Err("spec.resources[storage]: Required value".into());
    }
    if let Some(old) = old {
        crate::claim_rules::check_update(obj, old)?;
    }
    Ok(())
}

/// Drops metadata's labels, annotations, finalizers and owner references when they are empty
/// or null: kube-apiserver stores ObjectMeta's maps and lists only when they hold something
/// (Go's `omitempty`), so a patch of `"annotations": {}` (what `kubectl diff` sends for an
/// object never applied) leaves none, and a stored object reads back as it does there.
fn drop_empty_lists_and_maps(meta: &mut Map<String, Value>) {
    for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
        let empty = match meta.get(key) {
            Some(Value::Null) => true,
            Some(Value::Object(map)) => map.is_empty(),
            Some(Value::Array(list)) => list.is_empty(),
            _ => false,
        };
        if empty {
            meta.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
