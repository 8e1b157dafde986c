//! Tests of unknown-field reading: built-in and custom kinds, stored fields, hostile bodies.
#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

fn rt(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
    crate::registry::Registry::built_in(group, plural)
}

#[test]
fn unknown_fields_of_built_in_kinds_are_found_and_dropped() {
    let claims = schema_of(&rt("", "persistentvolumeclaims")).unwrap();
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "bogus": 1, "labels": {"any": "key"}},
        "spec": {"storageClass": "x", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}, "extra": 2},
                 "dataSourceRef": {"kind": "K", "name": "n", "namespace": "o"}},
        "status": {"junk": 1, "phase": "Pending"},
    });
    let unknown = find(&claims, &mut claim, None, true).named;
    let mut sorted = unknown.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "metadata.bogus",
            "spec.resources.extra",
            "spec.storageClass",
            "status.junk"
        ]
    );
    assert_eq!(
        claim,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "labels": {"any": "key"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "dataSourceRef": {"kind": "K", "name": "n", "namespace": "o"}},
            "status": {"phase": "Pending"},
        })
    );
    let pods = schema_of(&rt("", "pods")).unwrap();
    let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "b", "resources": {"limits": {"cpu": "1"}}},
        {"name": "c", "image": "d", "bogus": true},
    ], "nodeSelector": {"any": "thing"}}});
    assert_eq!(
        find(&pods, &mut pod, None, true).named,
        ["spec.containers[1].bogus"]
    );
    // A key that starts with `$` is a field like any other once a patch is applied (a
    // patch's directives are gone by then).
    let mut dollar = json!({"spec": {"$x": 1, "containers": []}});
    assert_eq!(find(&pods, &mut dollar, None, true).named, ["spec.$x"]);
}

#[test]
fn custom_resources_follow_their_schema_and_keep_what_it_preserves() {
    let mut pool = (*rt("", "configmaps")).clone();
    // Its type and metadata go unsaid, as in most definitions.
    pool.schema = Some(Arc::new(json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer"},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }},
        },
    })));
    let schema = schema_of(&pool).unwrap();
    let mut object = json!({"apiVersion": "example.dev/v1", "kind": "Pool",
        "metadata": {"name": "p", "labels": {"a": "b"}, "anything": 1},
        "spec": {"size": 1, "sise": 2, "free": {"x": {"y": 1}}}});
    // Its metadata is ObjectMeta, as kube-apiserver reads a custom resource's.
    assert_eq!(
        find(&schema, &mut object, None, true).named,
        ["metadata.anything", "spec.sise"]
    );
}

#[test]
fn a_custom_resources_metadata_is_object_meta_whatever_its_schema_lists() {
    let mut pool = (*rt("", "configmaps")).clone();
    // A schema that lists metadata with a few properties, and an embedded resource.
    pool.schema = Some(Arc::new(json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
            "spec": {"type": "object", "properties": {
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                             "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}},
            }},
        },
    })));
    let schema = schema_of(&pool).unwrap();
    let applied = json!({"apiVersion": "example.dev/v1", "kind": "Pool",
        "metadata": {"name": "p", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                     "finalizers": ["f"]},
        "spec": {"template": {"apiVersion": "v1", "kind": "Thing",
                              "metadata": {"name": "t", "labels": {"x": "y"}},
                              "spec": {"size": 1}}}});
    let mut object = applied.clone();
    let unknown = find(&schema, &mut object, None, true);
    assert_eq!(unknown.count, 0, "{unknown:?}");
    assert_eq!(object, applied, "nothing known is dropped");
    let mut object = json!({"kind": "Pool", "metadata": {"name": "p", "bogus": 1},
        "spec": {"template": {"kind": "Thing", "metadata": {"nope": 1}, "spec": {"size": 1, "extra": 2}}}});
    assert_eq!(
        find(&schema, &mut object, None, true).named,
        [
            "metadata.bogus",
            "spec.template.metadata.nope",
            "spec.template.spec.extra"
        ]
    );
}

#[test]
fn fields_stored_before_are_not_the_writes_and_stay() {
    let claims = schema_of(&rt("", "persistentvolumeclaims")).unwrap();
    // Stored by a write that did not name fieldValidation.
    let stored = json!({"metadata": {"name": "c", "old": 1},
        "spec": {"storageClass": "x", "accessModes": ["ReadWriteOnce"]}});
    let mut patched = json!({"metadata": {"name": "c", "old": 1, "labels": {"a": "b"}},
        "spec": {"storageClass": "x", "accessModes": ["ReadWriteOnce"], "fresh": true}});
    assert_eq!(
        judge(&claims, FieldValidation::Warn, &mut patched, Some(&stored)),
        Verdict::Write {
            warnings: vec![r#"299 - "unknown field \"spec.fresh\"""#.into()],
            dropped: true,
        }
    );
    assert_eq!(
        patched,
        json!({"metadata": {"name": "c", "old": 1, "labels": {"a": "b"}},
            "spec": {"storageClass": "x", "accessModes": ["ReadWriteOnce"]}})
    );
    // A stored unknown field the write changes is the write's.
    let mut changed = json!({"metadata": {"name": "c", "old": 2}, "spec": {"storageClass": "x"}});
    let before = changed.clone();
    let Verdict::Refuse(unknown) = judge(
        &claims,
        FieldValidation::Strict,
        &mut changed,
        Some(&stored),
    ) else {
        panic!("a changed unknown field is refused");
    };
    assert_eq!(unknown.named, ["metadata.old"]);
    assert_eq!(changed, before, "a refused object is left as it came");
    let mut ignored = json!({"spec": {"bogus": 1}});
    assert_eq!(
        judge(&claims, FieldValidation::Ignore, &mut ignored, None),
        Verdict::Write {
            warnings: vec![],
            dropped: true,
        }
    );
    assert_eq!(ignored, json!({"spec": {}}));
}

#[test]
fn a_hostile_body_names_a_bounded_number_of_bounded_paths() {
    let claims = schema_of(&rt("", "persistentvolumeclaims")).unwrap();
    let mut spec = Map::new();
    for i in 0..(MAX_NAMED + 50) {
        spec.insert(format!("f{i:04}"), json!(1));
    }
    let huge = "k".repeat(1 << 20);
    spec.insert(huge.clone(), json!({"deeper": {huge.clone(): 1}}));
    let mut object = json!({"spec": spec});
    let unknown = find(&claims, &mut object, None, true);
    assert_eq!(unknown.count, MAX_NAMED + 51);
    assert_eq!(unknown.named.len(), MAX_NAMED);
    assert!(unknown.named.iter().all(|p| p.len() <= MAX_PATH + 3));
    assert_eq!(object, json!({"spec": {}}));
    assert!(unknown.listed().ends_with(", and 51 more unknown fields"));
    assert_eq!(unknown.warnings().len(), MAX_NAMED + 1);
    let mut long = json!({"spec": {huge.clone(): 1}});
    let named = find(&claims, &mut long, None, true).named;
    assert_eq!(named[0].len(), MAX_PATH + 3);
    assert!(named[0].starts_with("spec.kkk") && named[0].ends_with("k..."));
}

#[test]
fn field_validation_takes_kube_apiservers_four_values() {
    assert_eq!(
        field_validation(&Method::POST, Some("Strict")).unwrap(),
        FieldValidation::Strict
    );
    assert_eq!(
        field_validation(&Method::PUT, None).unwrap(),
        FieldValidation::Unset
    );
    assert_eq!(
        field_validation(&Method::DELETE, Some("nonsense")).unwrap(),
        FieldValidation::Unset
    );
    let refused = field_validation(&Method::POST, Some("bogus")).unwrap_err();
    assert_eq!(
        refused.message,
        r#"CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "bogus": supported values: "", "Ignore", "Strict", "Warn""#
    );
    let two = Unknown {
        named: vec!["a".into(), "b.c".into()],
        count: 2,
    };
    assert_eq!(two.listed(), r#"unknown field "a", unknown field "b.c""#);
    assert_eq!(
        two.warnings(),
        [
            r#"299 - "unknown field \"a\"""#,
            r#"299 - "unknown field \"b.c\"""#
        ]
    );
}

#[test]
fn embedded_resources_in_lists_and_under_preserved_fields_are_read_as_kube_apiserver_reads_them() {
    let mut pool = (*rt("", "configmaps")).clone();
    pool.schema = Some(Arc::new(json!({
        "type": "object",
        "properties": {
            "resources": {"type": "array", "items": {"type": "object", "x-kubernetes-embedded-resource": true,
                "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}},
            "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                         "x-kubernetes-preserve-unknown-fields": true},
            "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "properties": {"inner": {"type": "object", "properties": {"size": {"type": "integer"}}}}},
            "empty": {"type": "object"},
        },
    })));
    let schema = schema_of(&pool).unwrap();
    let mut object = json!({"kind": "Pool", "metadata": {"name": "p"},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "spec": {"size": 1}}],
        "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", "bogus": 1}, "spec": {"anything": true}},
        "open": {"free": 1, "inner": {"size": 2, "extra": 3}},
        "empty": {"gone": 1}});
    assert_eq!(
        find(&schema, &mut object, None, true).named,
        ["empty.gone", "open.inner.extra", "template.metadata.bogus"]
    );
    assert_eq!(object["resources"][0]["metadata"], json!({"name": "x"}));
    assert_eq!(object["open"]["free"], 1);
    assert_eq!(object["template"]["spec"]["anything"], true);
    // A preserved root still has its metadata read.
    let mut free = (*rt("", "configmaps")).clone();
    free.schema = Some(Arc::new(
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    ));
    let schema = schema_of(&free).unwrap();
    let mut object = json!({"metadata": {"name": "f", "bogus": 1}, "spec": {"any": 1}});
    assert_eq!(
        find(&schema, &mut object, None, true).named,
        ["metadata.bogus"]
    );
}

#[test]
fn a_stored_list_item_is_found_by_its_name_wherever_it_moved() {
    let pods = schema_of(&rt("", "pods")).unwrap();
    let stored = json!({"spec": {"containers": [{"name": "a", "image": "i", "x": 1}]}});
    let mut applied = json!({"spec": {"containers": [
        {"name": "z", "image": "j"}, {"name": "a", "image": "i", "x": 1}]}});
    assert_eq!(find(&pods, &mut applied, Some(&stored), true).count, 0);
    let mut moved_in = json!({"spec": {"containers": [{"name": "z", "image": "j", "x": 1}]}});
    assert_eq!(
        find(&pods, &mut moved_in, Some(&stored), true).named,
        ["spec.containers[0].x"]
    );
}

#[test]
fn warnings_stay_within_kube_apiservers_budget() {
    let long = Unknown {
        named: (0..40).map(|i| format!("{i}{}", "p".repeat(300))).collect(),
        count: 40,
    };
    // Each text is 318 characters: twelve fit whole (3,816), the thirteenth cut to 256
    // (4,072), and no more.
    let warnings = long.warnings();
    assert_eq!(warnings.len(), 13);
    assert_eq!(warnings[11].len(), warnings[10].len());
    assert!(
        warnings[12].len() < warnings[10].len() - 50,
        "{}",
        warnings[12]
    );
    let short = Unknown {
        named: vec!["spéc".into()],
        count: 1,
    };
    assert_eq!(short.warnings(), [r#"299 - "unknown field \"spéc\"""#]);
}
