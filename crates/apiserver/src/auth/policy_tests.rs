use super::*;
use crate::auth::attributes::of_request;
use serde_json::json;

fn objects(values: Vec<Value>) -> Vec<Arc<Value>> {
    values.into_iter().map(Arc::new).collect()
}

fn policy() -> Policy {
    let cluster_roles = objects(vec![
        json!({"metadata": {"name": "claims-reader"},
               "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list"]}]}),
        json!({"metadata": {"name": "nodes-reader", "labels": {"aggregate-to-viewer": "true"}},
               "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}),
        json!({"metadata": {"name": "classes-reader", "labels": {"aggregate-to-viewer": "true"}},
               "rules": [{"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["list"]}]}),
        json!({"metadata": {"name": "viewer"},
               "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"aggregate-to-viewer": "true"}}]},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        json!({"metadata": {"name": "discovery"},
               "rules": [{"nonResourceURLs": ["/api", "/api/*"], "verbs": ["get"]}]}),
    ]);
    let roles = objects(vec![json!({
        "metadata": {"name": "leases", "namespace": "kube-system"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"]}]
    })]);
    let cluster_bindings = objects(vec![
        json!({"metadata": {"name": "readers"}, "roleRef": {"kind": "ClusterRole", "name": "viewer"},
               "subjects": [{"kind": "Group", "name": "viewers"}]}),
        json!({"metadata": {"name": "discovery"}, "roleRef": {"kind": "ClusterRole", "name": "discovery"},
               "subjects": [{"kind": "Group", "name": "system:authenticated"}]}),
        // A ServiceAccount subject of a ClusterRoleBinding needs its namespace.
        json!({"metadata": {"name": "no-namespace"}, "roleRef": {"kind": "ClusterRole", "name": "claims-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "nobody"}]}),
    ]);
    let bindings = objects(vec![
        json!({"metadata": {"name": "sa-leases", "namespace": "kube-system"},
               "roleRef": {"kind": "Role", "name": "leases"},
               "subjects": [{"kind": "ServiceAccount", "name": "csi"}]}),
        json!({"metadata": {"name": "claims-in-team", "namespace": "team"},
               "roleRef": {"kind": "ClusterRole", "name": "claims-reader"},
               "subjects": [{"kind": "User", "name": "alice"}]}),
        // A RoleBinding of a Role of another namespace grants nothing.
        json!({"metadata": {"name": "elsewhere", "namespace": "team"},
               "roleRef": {"kind": "Role", "name": "leases"},
               "subjects": [{"kind": "User", "name": "alice"}]}),
    ]);
    Policy::compile(&cluster_roles, &roles, &cluster_bindings, &bindings)
}

fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.into(),
        uid: String::new(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

#[test]
fn bindings_grant_their_roles_rules_where_they_apply() {
    let policy = policy();
    let csi = User::service_account("kube-system", "csi", "uid");
    let alice = user("alice", &[AUTHENTICATED]);
    let viewer = user("bob", &["viewers", AUTHENTICATED]);
    let nobody = User::service_account("default", "nobody", "uid");
    let get = |path: &str| of_request("GET", path, None, false);
    let cases: Vec<(&User, Attributes, Option<&str>)> = vec![
        (
            &csi,
            of_request(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
                None,
                false,
            ),
            Some(
                r#"RoleBinding "kube-system/sa-leases" of Role "leases" to ServiceAccount "csi"/"kube-system""#,
            ),
        ),
        (
            &csi,
            of_request(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
                None,
                false,
            ),
            None,
        ),
        (
            &csi,
            of_request(
                "DELETE",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
                None,
                false,
            ),
            None,
        ),
        (
            &alice,
            get("/api/v1/namespaces/team/persistentvolumeclaims/c"),
            Some(
                r#"RoleBinding "team/claims-in-team" of ClusterRole "claims-reader" to User "alice""#,
            ),
        ),
        (
            &alice,
            get("/api/v1/namespaces/other/persistentvolumeclaims/c"),
            None,
        ),
        // Listing every namespace's claims needs a cluster-wide grant.
        (&alice, get("/api/v1/persistentvolumeclaims"), None),
        (
            &alice,
            get("/apis/coordination.k8s.io/v1/namespaces/team/leases/l"),
            None,
        ),
        (
            &alice,
            get("/api/v1"),
            Some(
                r#"ClusterRoleBinding "discovery" of ClusterRole "discovery" to Group "system:authenticated""#,
            ),
        ),
        (&alice, get("/apis"), None),
        // The aggregated ClusterRole holds its members' rules, not its own.
        (
            &viewer,
            get("/api/v1/nodes/n1"),
            Some(r#"ClusterRoleBinding "readers" of ClusterRole "viewer" to Group "viewers""#),
        ),
        (
            &viewer,
            get("/apis/storage.k8s.io/v1/storageclasses"),
            Some(r#"ClusterRoleBinding "readers" of ClusterRole "viewer" to Group "viewers""#),
        ),
        (
            &viewer,
            of_request("DELETE", "/api/v1/nodes/n1", None, false),
            None,
        ),
        (
            &nobody,
            get("/api/v1/namespaces/default/persistentvolumeclaims"),
            None,
        ),
    ];
    for (who, attributes, want) in cases {
        assert_eq!(
            policy.allowed_by(who, &attributes).as_deref(),
            want,
            "{} {attributes:?}",
            who.name
        );
    }
}

#[test]
fn an_aggregated_role_holds_the_union_of_the_roles_its_selectors_match() {
    let policy = policy();
    let viewer = &policy.aggregated()["viewer"];
    assert_eq!(viewer.len(), 2);
    assert!(viewer.contains(&json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]})));
    let expressions = objects(vec![
        json!({"metadata": {"name": "a", "labels": {"tier": "gold"}}, "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        json!({"metadata": {"name": "b", "labels": {"tier": "iron"}}, "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}]}),
        json!({"metadata": {"name": "agg"}, "aggregationRule": {"clusterRoleSelectors": [
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["iron"]}, {"key": "tier", "operator": "Exists"}]}
        ]}}),
    ]);
    let policy = Policy::compile(&expressions, &[], &[], &[]);
    assert_eq!(
        policy.aggregated()["agg"],
        vec![json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]})]
    );
}

#[test]
fn a_users_holdings_are_remembered_and_grouped_by_namespace() {
    let policy = policy();
    let alice = user("alice", &[AUTHENTICATED]);
    let first = policy.granted(&alice);
    assert!(Arc::ptr_eq(&first, &policy.granted(&alice)));
    assert_eq!(first.cluster.len(), 1, "discovery");
    assert_eq!(first.namespaced["team"].len(), 2);
    assert_eq!(
        first.rules_in("team").len(),
        2,
        "discovery's and claims-reader's; the missing Role gives none"
    );
    assert_eq!(first.rules_in("").len(), 1);
}
