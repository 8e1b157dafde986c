//! Tests of the object rules: status updates, graceful deletion, spec comparison.
#![allow(clippy::unwrap_used)]
use super::*;

/// The built-in resource type `plural` of `group`, as the server knows it.
fn built_in(group: &str, plural: &str) -> std::sync::Arc<crate::registry::ResourceType> {
    crate::registry::Registry::default()
        .find(group, "v1", plural)
        .unwrap()
}

#[test]
fn a_status_update_takes_only_the_status_from_the_request() {
    let rt = built_in("", "persistentvolumeclaims");
    let current = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "labels": {"a": "1"},
                     "resourceVersion": "5", "generation": 3},
        "spec": {"volumeName": "pv-1"},
        "status": {"phase": "Pending"},
    });
    let incoming = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u2", "labels": {"b": "2"},
                     "resourceVersion": "5"},
        "spec": {"volumeName": "pv-2"},
        "status": {"phase": "Bound"},
    });
    let next = merge_update(&rt, &current, incoming.clone(), true).unwrap();
    assert_eq!(next["status"], json!({"phase": "Bound"}));
    assert_eq!(
        next["spec"]["volumeName"], "pv-1",
        "the spec is the stored one"
    );
    // Its metadata is the request's (kube-apiserver keeps a status write's labels), the fixed
    // fields apart.
    assert_eq!(next["metadata"]["labels"], json!({"b": "2"}));
    assert_eq!(next["metadata"]["uid"], "u1");
    assert_eq!(next["metadata"]["generation"], 3);
    // A VolumeAttachment's status write cannot touch its finalizers or labels (kube-apiserver
    // resets its metadata for status), so it cannot take the attacher's finalizer off.
    let attachments = built_in("storage.k8s.io", "volumeattachments");
    let attached = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": "va", "uid": "u", "labels": {"a": "1"}, "finalizers": ["external-attacher/d"],
                     "deletionTimestamp": "2026-11-29T00:00:00Z", "resourceVersion": "5"},
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        "status": {"attached": true}});
    let stripped = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": "va", "resourceVersion": "5"}, "status": {"attached": false}});
    let next = merge_update(&attachments, &attached, stripped, true).unwrap();
    assert_eq!(
        next["metadata"]["finalizers"],
        json!(["external-attacher/d"])
    );
    assert_eq!(next["metadata"]["labels"], json!({"a": "1"}));
    assert_eq!(next["status"], json!({"attached": false}));
    // A custom resource's status write keeps the stored metadata.
    let mut pool = (*rt).clone();
    pool.custom = true;
    let kept = merge_update(&pool, &current, incoming.clone(), true).unwrap();
    assert_eq!(kept["metadata"]["labels"], json!({"a": "1"}));
    assert_eq!(kept["status"], json!({"phase": "Bound"}));
    // A request without a status empties it.
    let mut bare = incoming;
    bare.as_object_mut().unwrap().remove("status");
    let next = merge_update(&rt, &current, bare, true).unwrap();
    assert!(next["status"].is_null(), "{next}");
    assert_eq!(next["spec"]["volumeName"], "pv-1");
}

#[test]
fn empty_metadata_maps_and_lists_are_not_stored() {
    let rt = built_in("", "configmaps");
    let empties =
        json!({"labels": {}, "annotations": null, "finalizers": [], "ownerReferences": []});
    let mut created = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
    for (key, value) in empties.as_object().unwrap() {
        created["metadata"][key] = value.clone();
    }
    prepare_create(&rt, "ns", &mut created).unwrap();
    for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
        assert!(created["metadata"].get(key).is_none(), "{key}: {created}");
    }
    // An update that adds only empty ones leaves the object as it was; ones that hold
    // something stay.
    let mut incoming = created.clone();
    for (key, value) in empties.as_object().unwrap() {
        incoming["metadata"][key] = value.clone();
    }
    let next = merge_update(&rt, &created, incoming.clone(), false).unwrap();
    assert_eq!(next, created);
    incoming["metadata"]["labels"] = json!({"a": "b"});
    let next = merge_update(&rt, &created, incoming, false).unwrap();
    assert_eq!(next["metadata"]["labels"], json!({"a": "b"}));
    assert!(next["metadata"].get("annotations").is_none(), "{next}");
}

#[test]
fn only_the_kinds_kube_apiserver_gives_a_generation_have_one() {
    let registry = crate::registry::Registry::default();
    let crd = json!({"spec": {"group": "example.dev", "scope": "Cluster",
        "names": {"plural": "pools", "kind": "Pool"}, "versions": [{"name": "v1", "served": true}]}});
    registry.set_custom(&[crd]);
    let rows = [
        ("", "pods", true),
        ("apps", "deployments", true),
        ("apps", "statefulsets", true),
        ("apiextensions.k8s.io", "customresourcedefinitions", true),
        ("example.dev", "pools", true),
        ("", "configmaps", false),
        ("", "persistentvolumeclaims", false),
        ("", "persistentvolumes", false),
        ("storage.k8s.io", "storageclasses", false),
        ("storage.k8s.io", "volumeattachments", false),
    ];
    for (group, plural, has) in rows {
        let rt = registry.find(group, "v1", plural).unwrap();
        let mut object = json!({"metadata": {"name": "x", "generation": 7}, "spec": {"a": 1}});
        prepare_create(&rt, "ns", &mut object).unwrap();
        assert_eq!(
            object["metadata"].get("generation"),
            has.then_some(&json!(1)),
            "{group}/{plural}"
        );
        let mut changed = object.clone();
        changed["spec"]["a"] = json!(2);
        let next = merge_update(&rt, &object, changed, false).unwrap();
        assert_eq!(
            next["metadata"].get("generation"),
            has.then_some(&json!(2)),
            "{group}/{plural}"
        );
    }
}

#[test]
fn only_what_is_outside_metadata_and_status_counts_as_the_spec() {
    let base = json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {"p": "A"}});
    let cases = [
        (json!({"metadata": {"name": "b"}, "spec": {"x": 1}}), true),
        (json!({"spec": {"x": 1}, "status": {"p": "B"}}), true),
        (json!({"metadata": {"name": "a"}, "spec": {"x": 2}}), false),
        (json!({"spec": {"x": 1}, "data": {}}), false),
        (json!({"metadata": {}}), false),
        (json!("not an object"), false),
    ];
    for (other, same) in cases {
        let same_spec = |a, b| same_apart_from(a, b, &["metadata", "status"]);
        assert_eq!(same_spec(&base, &other), same, "{other}");
        assert_eq!(same_spec(&other, &base), same, "{other}");
    }
}

#[test]
fn subdomains_have_no_limit_per_part_but_labels_do() {
    let long = format!("csi-{}", "a".repeat(64));
    assert!(is_dns_subdomain(&long) && !is_dns_label(&long));
    assert!(is_dns_subdomain("a.b-c.d") && !is_dns_subdomain("a..b") && !is_dns_subdomain("-a"));
    assert!(!is_dns_subdomain(&"a".repeat(254)) && !is_dns_subdomain("A"));
}

#[test]
fn timestamps_round_trip() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(1_700_000_000));
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
}

#[test]
fn assigned_running_pods_are_deleted_gracefully_and_only_ever_sooner() {
    let pod = |node: &str, phase: &str, term: Option<i64>| json!({"metadata": {"name": "p"}, "spec": {"nodeName": node, "terminationGracePeriodSeconds": term}, "status": {"phase": phase}});
    let cases = [
        (pod("", "Pending", None), None, 0),
        (pod("n1", "Running", None), None, 30),
        (pod("n1", "Running", Some(5)), None, 5),
        (pod("n1", "Running", Some(5)), Some(0), 0),
        (pod("n1", "Running", None), Some(12), 12),
        (pod("n1", "Succeeded", None), None, 0),
        (pod("n1", "Failed", None), Some(10), 0),
        (pod("n1", "Running", None), Some(-3), 0),
    ];
    for (p, requested, want) in cases {
        assert_eq!(pod_grace_seconds(&p, requested), want, "{p} {requested:?}");
    }
    let first = graceful_deletion(&pod("n1", "Running", None), 30).unwrap();
    assert_eq!(first["metadata"]["deletionGracePeriodSeconds"], json!(30));
    let at = parse_rfc3339(first["metadata"]["deletionTimestamp"].as_str().unwrap()).unwrap();
    let now = parse_rfc3339(&now_rfc3339()).unwrap();
    assert!(at >= now + 29 && at <= now + 31, "now + grace");
    assert!(
        graceful_deletion(&first, 30).is_none(),
        "the same grace: no change"
    );
    assert!(graceful_deletion(&first, 60).is_none(), "never later");
    let sooner = graceful_deletion(&first, 1).unwrap();
    assert_eq!(sooner["metadata"]["deletionGracePeriodSeconds"], json!(1));
}

#[test]
fn a_claims_update_mirrors_its_data_sources_and_a_status_write_is_not_checked_for_them() {
    let rt = built_in("", "persistentvolumeclaims");
    let source = json!({"kind": "PersistentVolumeClaim", "name": "src"});
    let mut created = json!({"metadata": {"name": "c"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
        "dataSource": source}});
    prepare_create(&rt, "ns", &mut created).unwrap();
    assert_eq!(created["spec"]["dataSourceRef"], source);
    // A replace that sends only dataSource gets dataSourceRef again: the spec is unchanged.
    let mut incoming = created.clone();
    incoming["spec"]
        .as_object_mut()
        .unwrap()
        .remove("dataSourceRef");
    let next = merge_update(&rt, &created, incoming, false).unwrap();
    assert_eq!(next["spec"], created["spec"]);
    validate(&rt, &next, Some(&created)).unwrap();
    // A claim stored with two that disagree (before they were checked) still takes status
    // writes, whose spec is the stored one; a change of its spec is refused.
    let mut torn = created.clone();
    torn["spec"]["dataSourceRef"]["name"] = json!("other");
    let status = merge_update(
        &rt,
        &torn,
        json!({"metadata": {"name": "c"}, "status": {"phase": "Bound"}}),
        true,
    )
    .unwrap();
    validate(&rt, &status, Some(&torn)).unwrap();
    let mut relabelled = torn.clone();
    relabelled["spec"]["volumeName"] = json!("pv");
    let refused = validate(&rt, &relabelled, Some(&torn)).unwrap_err();
    assert!(
        refused.message.contains("must match dataSourceRef"),
        "{}",
        refused.message
    );
}

#[test]
fn a_built_in_kinds_nulls_are_absent_fields_and_a_custom_resources_stay() {
    let registry = crate::registry::Registry::default();
    let claims = registry.find("", "v1", "persistentvolumeclaims").unwrap();
    let mut claim = json!({"metadata": {"name": "c", "labels": null}, "spec": {
        "dataSource": {"apiGroup": null, "kind": "PersistentVolumeClaim", "name": "src"},
        "selector": null, "accessModes": ["ReadWriteOnce", null]}, "status": null});
    check_type(&claims, &mut claim).unwrap();
    assert_eq!(
        claim,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
            "spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"},
                     "accessModes": ["ReadWriteOnce", null]}})
    );
    // A typed client's update (nulls left out) is then the same spec as the stored one.
    let mut stored = claim.clone();
    prepare_create(&claims, "ns", &mut stored).unwrap();
    let mut typed = stored.clone();
    typed["spec"]["dataSource"]["apiGroup"] = Value::Null;
    let next = merge_update(&claims, &stored, typed, false).unwrap();
    assert_eq!(next["spec"], stored["spec"]);
    let mut pool = (*claims).clone();
    pool.custom = true;
    pool.kind = "Pool".into();
    let mut custom = json!({"kind": "Pool", "metadata": {"name": "p"}, "spec": {"size": null}});
    check_type(&pool, &mut custom).unwrap();
    assert_eq!(custom["spec"], json!({"size": null}));
}

#[test]
fn a_pods_status_write_without_its_qos_class_keeps_the_stored_one() {
    let rt = built_in("", "pods");
    let current = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {"containers": [{"name": "c", "image": "i:1"}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    });
    let write = |status: Value| {
        let incoming = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "5"}, "status": status});
        merge_update(&rt, &current, incoming, true).unwrap()["status"].clone()
    };
    assert_eq!(
        write(json!({"phase": "Running"})),
        json!({"phase": "Running", "qosClass": "BestEffort"})
    );
    assert_eq!(
        write(json!({"phase": "Running", "qosClass": ""}))["qosClass"],
        "BestEffort"
    );
    // One given is the write's (validation is not this rule's).
    assert_eq!(
        write(json!({"phase": "Running", "qosClass": "Burstable"}))["qosClass"],
        "Burstable"
    );
}
