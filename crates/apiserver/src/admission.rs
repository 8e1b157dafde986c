//! Mutating admission that kube-apiserver runs by default and clients observe in the object
//! a create returns: `DefaultStorageClass`, which gives a claim that names no class the
//! cluster's default StorageClass, `StorageObjectInUseProtection`, which gives every claim
//! and volume created its protection finalizer, and on a Pod `ServiceAccount`, `Priority` and
//! `DefaultTolerationSeconds` ([`pod`]).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::objects::parse_rfc3339;

/// The annotations that mark a StorageClass as the default (GA and beta; the value `"true"`).
/// sidecar-kit's vocabulary names them too; the API server does not depend on sidecar-kit.
const DEFAULT_CLASS_ANNOTATIONS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

/// StorageClasses' key in the store (`group/plural`, as `ResourceType::key` makes it; read on
/// every claim create, so not looked up in the registry each time).
pub(crate) const STORAGE_CLASSES: &str = "storage.k8s.io/storageclasses";

/// The beta annotation that names a claim's class (it takes precedence over the spec field).
const BETA_CLAIM_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// `DefaultStorageClass` on a claim being created: when it names no class (neither
/// `spec.storageClassName`, even `""`, nor the beta annotation), its class becomes the default
/// class among `classes`: the newest by creation time, then the first by name. No default, no
/// change. Returns the class set, if any.
pub fn default_storage_class(claim: &mut Value, classes: &[Arc<Value>]) -> Option<String> {
    if chooses_its_class(claim) {
        return None;
    }
    let chosen = classes
        .iter()
        .filter(|class| is_default(class))
        .filter_map(|class| {
            let name = class["metadata"]["name"].as_str()?;
            let created = class["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(parse_rfc3339)
                .unwrap_or(0);
            Some((created, name))
        })
        // Newest first; among equals, the first name.
        .max_by(|(ta, na), (tb, nb)| ta.cmp(tb).then_with(|| nb.cmp(na)))
        .map(|(_, name)| name.to_string())?;
    let spec = claim.as_object_mut()?.entry("spec").or_insert(json!({}));
    spec.as_object_mut()?
        .insert("storageClassName".into(), json!(chosen));
    Some(chosen)
}

/// `StorageObjectInUseProtection` on an object of the core group being created (`plural`): a
/// claim gets `kubernetes.io/pvc-protection`, a volume `kubernetes.io/pv-protection`, after
/// the finalizers it has, unless it has it. Returns whether it was added.
pub fn storage_object_in_use_protection(plural: &str, obj: &mut Value) -> bool {
    let finalizer = match plural {
        "persistentvolumeclaims" => "kubernetes.io/pvc-protection",
        "persistentvolumes" => "kubernetes.io/pv-protection",
        _ => return false,
    };
    let Some(meta) = obj
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert(json!({})))
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    let list = meta.entry("finalizers").or_insert(json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let Some(list) = list.as_array_mut() else {
        return false;
    };
    if list.iter().any(|f| f.as_str() == Some(finalizer)) {
        return false;
    }
    list.push(json!(finalizer));
    true
}

/// Whether a claim chose its class itself (`spec.storageClassName`, even `""`, or the beta
/// annotation): admission then leaves it alone, and need not look at the classes.
pub fn chooses_its_class(claim: &Value) -> bool {
    let annotated = claim["metadata"]["annotations"]
        .as_object()
        .is_some_and(|a| a.contains_key(BETA_CLAIM_CLASS));
    let named = claim["spec"]
        .get("storageClassName")
        .is_some_and(|c| !c.is_null());
    annotated || named
}

pub(crate) fn is_default(class: &Value) -> bool {
    DEFAULT_CLASS_ANNOTATIONS
        .iter()
        .any(|key| class["metadata"]["annotations"][key].as_str() == Some("true"))
}

/// A Pod being created: `ServiceAccount` (the account `default`, mirrored into the deprecated
/// `serviceAccount`), `Priority` and `DefaultTolerationSeconds` (300 s on not-ready and
/// unreachable nodes). Compared with kube-apiserver v1.36.2 by
/// `cli/tests/real_cluster/pods.rs`.
///
/// A Pod naming a PriorityClass other than the two built-in ones (the server serves none, so
/// none other exists), or giving a priority or preemption policy other than its class's, is
/// refused: the reason is returned (kube-apiserver's words, a 403 from the caller).
///
/// Not done: the ServiceAccount token volume kube-apiserver mounts into a Pod that does not
/// opt out (`automountServiceAccountToken: false`), its refusal of a Pod whose account does
/// not exist and the account's `imagePullSecrets`; PriorityClass objects; the refusal of an
/// update that changes what a Pod's spec may not change.
pub fn pod(pod: &mut Value) -> Result<(), String> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    if crate::pod_defaults::account_name(spec).is_none() {
        spec.insert("serviceAccountName".into(), json!("default"));
        spec.insert("serviceAccount".into(), json!("default"));
    }
    let class = spec
        .get("priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let priority = match class {
        // A cluster without a global default class.
        "" => 0,
        "system-node-critical" => 2_000_001_000,
        "system-cluster-critical" => 2_000_000_000,
        // The server serves no PriorityClasses, so none other than the built-in two exists:
        // kube-apiserver refuses a Pod naming a class it cannot find.
        other => return Err(format!("no PriorityClass with name {other} was found")),
    };
    if let Some(given) = spec.get("priority").and_then(Value::as_i64)
        && given != priority
    {
        return Err(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
        ));
    }
    let policy = "PreemptLowerPriority";
    if let Some(given) = spec.get("preemptionPolicy").and_then(Value::as_str)
        && given != policy
    {
        return Err(format!(
            "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
        ));
    }
    spec.insert("priority".into(), json!(priority));
    spec.insert("preemptionPolicy".into(), json!(policy));
    default_toleration_seconds(spec);
    Ok(())
}

/// A Pod being updated (not its status): `DefaultTolerationSeconds` again, and `Priority`'s
/// priority and preemption policy kept from `current` when the update leaves them out.
pub fn pod_update(current: &Value, pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ["priority", "preemptionPolicy"] {
        let stored = &current["spec"][field];
        if !stored.is_null() {
            crate::pod_defaults::set(spec, field, stored.clone());
        }
    }
    default_toleration_seconds(spec);
}

/// `DefaultTolerationSeconds`: a Pod that does not tolerate nodes being not ready or
/// unreachable does for 300 s.
fn default_toleration_seconds(spec: &mut serde_json::Map<String, Value>) {
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerations = spec.entry("tolerations").or_insert(Value::Null);
        if tolerations.is_null() {
            *tolerations = json!([]);
        }
        let Some(list) = tolerations.as_array_mut() else {
            continue;
        };
        if !list.iter().any(|t| tolerates_no_execute(t, key)) {
            list.push(json!({
                "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300,
            }));
        }
    }
}

/// Whether `toleration` already tolerates the NoExecute taint `key` (then
/// `DefaultTolerationSeconds` adds none for it).
fn tolerates_no_execute(toleration: &Value, key: &str) -> bool {
    let effect = toleration["effect"].as_str().unwrap_or_default();
    if !(effect.is_empty() || effect == "NoExecute") {
        return false;
    }
    match toleration["key"].as_str().unwrap_or_default() {
        "" => toleration["operator"].as_str() == Some("Exists"),
        other => other == key,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn class(name: &str, annotation: Option<(&str, &str)>, created: &str) -> Arc<Value> {
        let mut c =
            json!({"metadata": {"name": name, "creationTimestamp": created}, "provisioner": "p"});
        if let Some((k, v)) = annotation {
            c["metadata"]["annotations"] = json!({ k: v });
        }
        Arc::new(c)
    }

    #[test]
    fn the_storage_classes_key_is_the_registrys() {
        let classes = crate::registry::Registry::default()
            .find("storage.k8s.io", "v1", "storageclasses")
            .unwrap();
        assert_eq!(classes.key(), STORAGE_CLASSES);
    }

    const GA: &str = "storageclass.kubernetes.io/is-default-class";
    const BETA: &str = "storageclass.beta.kubernetes.io/is-default-class";

    #[test]
    fn claims_and_volumes_created_get_their_protection_finalizer_once() {
        // (resource, object, finalizers after, added)
        let cases = [
            (
                "persistentvolumeclaims",
                json!({"metadata": {"name": "c"}}),
                json!(["kubernetes.io/pvc-protection"]),
                true,
            ),
            (
                "persistentvolumes",
                json!({"metadata": {"name": "v", "finalizers": ["mine"]}}),
                json!(["mine", "kubernetes.io/pv-protection"]),
                true,
            ),
            (
                "persistentvolumes",
                json!({"metadata": {"name": "v", "finalizers": null}}),
                json!(["kubernetes.io/pv-protection"]),
                true,
            ),
            (
                "persistentvolumeclaims",
                json!({"metadata": {"name": "c", "finalizers": ["kubernetes.io/pvc-protection"]}}),
                json!(["kubernetes.io/pvc-protection"]),
                false,
            ),
        ];
        for (plural, mut obj, want, added) in cases {
            assert_eq!(
                storage_object_in_use_protection(plural, &mut obj),
                added,
                "{obj}"
            );
            assert_eq!(obj["metadata"]["finalizers"], want);
        }
        let mut pod = json!({"metadata": {"name": "p"}});
        assert!(!storage_object_in_use_protection("pods", &mut pod));
        assert_eq!(pod, json!({"metadata": {"name": "p"}}));
    }

    #[test]
    fn a_claim_without_a_class_gets_the_default() {
        let older = class("older", Some((GA, "true")), "2026-01-01T00:00:00Z");
        let newer = class("newer", Some((BETA, "true")), "2026-02-01T00:00:00Z");
        let twin_b = class("b", Some((GA, "true")), "2026-03-01T00:00:00Z");
        let twin_a = class("a", Some((GA, "true")), "2026-03-01T00:00:00Z");
        let not_default = class("plain", Some((GA, "false")), "2026-04-01T00:00:00Z");
        let unmarked = class("unmarked", None, "2026-05-01T00:00:00Z");
        let claim =
            || json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
        let no_class = json!({"metadata": {"name": "c"}});
        let empty = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": ""}});
        let named = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "gold"}});
        let null = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": null}});
        let beta =
            json!({"metadata": {"name": "c", "annotations": {BETA_CLAIM_CLASS: ""}}, "spec": {}});
        // (claim, classes, the class it ends with)
        type Case = (Value, Vec<Arc<Value>>, Option<&'static str>);
        let cases: Vec<Case> = vec![
            (claim(), vec![older.clone()], Some("older")),
            (claim(), vec![older.clone(), newer.clone()], Some("newer")),
            (
                claim(),
                vec![twin_b.clone(), newer.clone(), twin_a.clone()],
                Some("a"),
            ),
            (claim(), vec![not_default.clone(), unmarked.clone()], None),
            (claim(), vec![], None),
            (no_class, vec![older.clone()], Some("older")),
            (null, vec![older.clone()], Some("older")),
            (empty, vec![older.clone()], Some("")),
            (named, vec![older.clone()], Some("gold")),
            (beta.clone(), vec![older.clone()], None),
        ];
        for (i, (mut c, classes, want)) in cases.into_iter().enumerate() {
            default_storage_class(&mut c, &classes);
            assert_eq!(c["spec"]["storageClassName"].as_str(), want, "case {i}");
        }
        // A claim whose class is in the beta annotation keeps it there.
        let mut b = beta;
        assert_eq!(default_storage_class(&mut b, &[older]), None);
        assert!(b["spec"].get("storageClassName").is_none());
    }

    #[test]
    fn an_update_keeps_the_priority_and_gets_the_tolerations_again() {
        let mut made = json!({"spec": {"containers": []}});
        pod(&mut made).unwrap();
        // A manifest written again, without what admission added.
        let mut next = json!({"spec": {"containers": [], "tolerations": [{"key": "dedicated", "operator": "Exists"}]}});
        pod_update(&made, &mut next);
        assert_eq!(next["spec"]["priority"], 0);
        assert_eq!(next["spec"]["preemptionPolicy"], "PreemptLowerPriority");
        let keys: Vec<&str> = next["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "dedicated",
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable"
            ]
        );
        // What the update gives is kept.
        let mut next = json!({"spec": {"containers": [], "priority": 7}});
        pod_update(&made, &mut next);
        assert_eq!(next["spec"]["priority"], 7);
    }

    #[test]
    fn a_pod_giving_another_priority_or_policy_than_its_class_is_refused() {
        let refused = |spec: Value| pod(&mut json!({"spec": spec})).unwrap_err();
        assert_eq!(
            refused(json!({"priority": 5})),
            "the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 0 from the given PriorityClass name"
        );
        assert_eq!(
            refused(json!({"priorityClassName": "system-node-critical", "priority": 0})),
            "the integer value of priority (0) must not be provided in pod spec; priority admission controller computed 2000001000 from the given PriorityClass name"
        );
        assert_eq!(
            refused(json!({"preemptionPolicy": "Never"})),
            "the string value of PreemptionPolicy (Never) must not be provided in pod spec; priority admission controller computed PreemptLowerPriority from the given PriorityClass name"
        );
        // A class that does not exist (the server serves none but the built-in two).
        assert_eq!(
            refused(json!({"priorityClassName": "batch-low"})),
            "no PriorityClass with name batch-low was found"
        );
        // The class's own values are accepted.
        let mut same = json!({"spec": {"priority": 0, "preemptionPolicy": "PreemptLowerPriority"}});
        assert_eq!(pod(&mut same), Ok(()));
    }
}
