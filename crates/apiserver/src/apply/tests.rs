use super::*;

fn deployment(replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"app": "d"}},
           "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
}

#[test]
fn field_sets_are_written_as_fields_v1() {
    let set = field_set(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "labels": {"a": "b"}, "finalizers": ["x"]},
        "data": {"k": "v"}, "spec": {"containers": [{"name": "n", "image": "i"}], "args": ["a"]}}));
    assert_eq!(
        set,
        json!({
            "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"x\"": {}}},
            "f:data": {"f:k": {}},
            "f:spec": {"f:containers": {"k:{\"name\":\"n\"}": {".": {}, "f:name": {}, "f:image": {}}}, "f:args": {}}
        })
    );
    let paths: Vec<String> = leaves(&set).iter().map(|p| describe(p)).collect();
    assert!(
        paths.contains(&".spec.containers[name=\"n\"].image".to_string()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&".metadata.finalizers[=\"x\"]".to_string()),
        "{paths:?}"
    );
    assert!(paths.contains(&".spec.args".to_string()), "{paths:?}");
}

#[test]
fn applies_conflict_on_values_other_managers_own_unless_forced() {
    let first = decide(
        &json!({"metadata": {"name": "d"}}),
        &deployment(1, "a:1"),
        "a",
        "apps/v1",
        false,
    );
    assert!(first.conflicts.is_empty());
    let live = first.object;
    // The same values under another manager: shared ownership, no conflict.
    let same = decide(&live, &deployment(1, "a:1"), "b", "apps/v1", false);
    assert!(same.conflicts.is_empty());
    // Another value: a conflict for each field, naming the owner.
    let other = decide(&live, &deployment(2, "a:2"), "b", "apps/v1", false);
    let described: Vec<String> = other
        .conflicts
        .iter()
        .map(|c| format!("{} {}", c.manager, describe(&c.path)))
        .collect();
    assert_eq!(
        described,
        vec![
            "a .spec.replicas",
            "a .spec.template.spec.containers[name=\"app\"].image"
        ]
    );
    let error = conflict_error(&other.conflicts);
    assert_eq!(error.code, 409);
    assert!(
        error
            .message
            .starts_with("Apply failed with 2 conflicts: conflict with \"a\": .spec.replicas"),
        "{}",
        error.message
    );
    // Forced: b takes the fields over; a keeps the rest.
    let forced = decide(&live, &deployment(2, "a:2"), "b", "apps/v1", true);
    assert!(forced.conflicts.is_empty());
    assert_eq!(forced.object["spec"]["replicas"], 2);
    let owners = managers(&forced.object);
    let a = owners.iter().find(|m| m.name == "a").unwrap();
    assert!(!a.owned.iter().any(|p| describe(p) == ".spec.replicas"));
    assert!(
        a.owned
            .iter()
            .any(|p| describe(p) == ".metadata.labels.app")
    );
}

#[test]
fn an_update_takes_the_fields_it_changes_so_a_later_apply_conflicts() {
    let live = decide(&json!({}), &deployment(1, "a:1"), "alice", "apps/v1", false).object;
    let mut edited = live.clone();
    edited["spec"]["replicas"] = json!(3);
    record_update(&live, &mut edited, "kubectl-edit", "apps/v1");
    let owners = managers(&edited);
    let editor = owners.iter().find(|m| m.name == "kubectl-edit").unwrap();
    assert_eq!(editor.operation, "Update");
    let owned: Vec<String> = editor.owned.iter().map(|p| describe(p)).collect();
    assert_eq!(owned, [".spec.replicas"]);
    let alice = owners.iter().find(|m| m.name == "alice").unwrap();
    assert!(!alice.owned.iter().any(|p| describe(p) == ".spec.replicas"));
    let again = decide(&edited, &deployment(1, "a:1"), "alice", "apps/v1", false);
    assert_eq!(
        conflict_error(&again.conflicts).message,
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: .spec.replicas"
    );
    // Nothing changed, or nobody applied: left as it is.
    let mut same = edited.clone();
    record_update(&edited, &mut same, "other", "apps/v1");
    assert_eq!(same, edited);
    let mut plain = json!({"spec": {"replicas": 1}});
    let old = plain.clone();
    plain["spec"]["replicas"] = json!(2);
    record_update(&old, &mut plain, "other", "apps/v1");
    assert!(plain["metadata"]["managedFields"].is_null());
    assert_eq!(
        update_manager(None, Some("kubectl-edit/v1.32.0 (linux/amd64)")),
        "kubectl-edit"
    );
    assert_eq!(update_manager(Some("mine"), Some("kubectl/v1")), "mine");
}

#[test]
fn an_update_that_removes_every_owned_field_leaves_no_field_ownership() {
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "m"}, "data": {"k": "v"}});
    let live = decide(&json!({}), &config, "alice", "v1", false).object;
    assert_eq!(managers(&live).len(), 1);
    let mut emptied = live.clone();
    if let Some(meta) = emptied["metadata"].as_object_mut() {
        meta.remove("name");
    }
    if let Some(object) = emptied.as_object_mut() {
        object.remove("data");
        object.remove("apiVersion");
        object.remove("kind");
    }
    record_update(&live, &mut emptied, "editor", "v1");
    assert!(
        emptied["metadata"].get("managedFields").is_none(),
        "{}",
        emptied["metadata"]
    );
}

#[test]
fn fields_a_manager_stops_applying_are_removed_unless_shared() {
    let live = decide(
        &json!({}),
        &json!({"metadata": {"labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}}),
        "a",
        "v1",
        false,
    )
    .object;
    let live = decide(
        &live,
        &json!({"metadata": {"labels": {"y": "2"}}}),
        "b",
        "v1",
        false,
    )
    .object;
    let after = decide(&live, &json!({"data": {"k": "v"}}), "a", "v1", false).object;
    assert_eq!(
        after["metadata"]["labels"],
        json!({"y": "2"}),
        "x removed, y kept (b owns it)"
    );
    assert_eq!(after["data"], json!({"k": "v"}));
    let items = decide(
        &json!({}),
        &json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
        "m",
        "v1",
        false,
    )
    .object;
    let fewer = decide(
        &items,
        &json!({"spec": {"containers": [{"name": "a"}]}}),
        "m",
        "v1",
        false,
    )
    .object;
    assert_eq!(fewer["spec"]["containers"], json!([{"name": "a"}]));
}
