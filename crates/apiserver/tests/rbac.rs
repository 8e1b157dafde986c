//! RBAC on our server, through the real kubectl: ServiceAccount tokens from the TokenRequest
//! API, users of a token file, Roles and bindings deciding each request with kube-apiserver's
//! 403, impersonation (`--as`), the reviews (`auth whoami`, `auth can-i`), aggregation and the
//! escalation checks.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Fixture, kubectl};

const SETUP: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: claims, namespace: default}
rules:
  - apiGroups: [""]
    resources: ["persistentvolumeclaims"]
    verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-claims, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: claims}
subjects:
  - {kind: ServiceAccount, name: reader, namespace: default}
"#;

async fn ok(f: &Fixture, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = kubectl(f, args, stdin).await;
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

/// kubectl with another user's token.
async fn kubectl_as(f: &Fixture, token: &str, args: &[&str]) -> (bool, String, String) {
    let token = format!("--token={token}");
    let args: Vec<&str> = std::iter::once(token.as_str())
        .chain(args.iter().copied())
        .collect();
    kubectl(f, &args, None).await
}

async fn token_of(f: &Fixture, account: &str) -> String {
    ok(f, &["create", "token", account, "--duration=1h"], None)
        .await
        .trim()
        .to_string()
}

#[tokio::test]
async fn a_service_account_may_do_what_its_role_grants_and_gets_kube_apiservers_403_otherwise() {
    let f = common::start().await;
    ok(&f, &["apply", "-f", "-"], Some(SETUP)).await;
    let token = token_of(&f, "reader").await;
    let (allowed, _, err) = kubectl_as(&f, &token, &["get", "pvc"]).await;
    assert!(allowed, "{err}");
    let (allowed, _, err) = kubectl_as(&f, &token, &["get", "nodes"]).await;
    assert!(!allowed);
    assert!(
        err.contains(r#"nodes is forbidden: User "system:serviceaccount:default:reader" cannot list resource "nodes" in API group "" at the cluster scope"#),
        "{err}"
    );
    let (_, who, _) = kubectl_as(
        &f,
        &token,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .await;
    assert_eq!(who, "system:serviceaccount:default:reader");
    // Refusals are counted under their code.
    let refused: u64 = f
        .server
        .request_counts()
        .iter()
        .filter(|((verb, resource, code, _), _)| {
            verb == "LIST" && resource == "nodes" && *code == 403
        })
        .map(|(_, n)| n)
        .sum();
    assert!(refused >= 1);
    // Refused requests for made-up resources share one series without a resource: a client
    // cannot add series by inventing paths.
    for path in [
        "/api/v1/madeup-one",
        "/api/v1/namespaces/default/madeup-two/x",
    ] {
        let (allowed, _, _) = kubectl_as(&f, &token, &["get", "--raw", path]).await;
        assert!(!allowed, "{path}");
    }
    let counts = f.server.request_counts();
    assert!(
        counts
            .keys()
            .all(|(_, resource, _, _)| !resource.starts_with("madeup")),
        "{counts:?}"
    );
    let unnamed: u64 = counts
        .iter()
        .filter(|((_, resource, code, _), _)| resource.is_empty() && *code == 403)
        .map(|(_, n)| n)
        .sum();
    assert!(unnamed >= 2, "{counts:?}");

    // A token does not outlive its account: the account deleted, its token is refused.
    ok(&f, &["delete", "serviceaccount", "reader"], None).await;
    let (allowed, _, err) = kubectl_as(&f, &token, &["get", "pvc"]).await;
    assert!(!allowed && err.contains("Unauthorized"), "{err}");
    // Nor an account made again under its name (another uid), though the token was accepted
    // before and is remembered.
    ok(&f, &["create", "serviceaccount", "reader"], None).await;
    let (allowed, _, err) = kubectl_as(&f, &token, &["get", "pvc"]).await;
    assert!(!allowed && err.contains("Unauthorized"), "{err}");
    // A token of the new account is accepted.
    let token = token_of(&f, "reader").await;
    let (allowed, _, err) = kubectl_as(&f, &token, &["get", "pvc"]).await;
    assert!(allowed, "{err}");
}

#[tokio::test]
async fn can_i_answers_truthfully_for_an_impersonated_service_account() {
    let f = common::start().await;
    ok(&f, &["apply", "-f", "-"], Some(SETUP)).await;
    let sa = "--as=system:serviceaccount:default:reader";
    let yes = ok(
        &f,
        &["auth", "can-i", "list", "persistentvolumeclaims", sa],
        None,
    )
    .await;
    assert_eq!(yes.trim(), "yes");
    let (allowed, out, _) = kubectl(
        &f,
        &["auth", "can-i", "delete", "persistentvolumeclaims", sa],
        None,
    )
    .await;
    assert!(!allowed);
    assert_eq!(out.trim(), "no");
    let (allowed, out, _) = kubectl(
        &f,
        &[
            "auth",
            "can-i",
            "list",
            "persistentvolumeclaims",
            "-n",
            "other",
            sa,
        ],
        None,
    )
    .await;
    assert!(!allowed && out.trim() == "no");
    let list = ok(&f, &["auth", "can-i", "--list", sa], None).await;
    assert!(list.contains("persistentvolumeclaims"), "{list}");
    assert!(list.contains("[get list]"), "{list}");
    assert!(
        list.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{list}"
    );
    assert!(list.contains("[/api/*]"), "{list}");
    assert!(!list.contains("nodes"), "{list}");
    // Acting as the account: its 403 names it.
    let (allowed, _, err) = kubectl(&f, &["get", "nodes", sa], None).await;
    assert!(
        !allowed
            && err.contains(
                r#"User "system:serviceaccount:default:reader" cannot list resource "nodes""#
            ),
        "{err}"
    );
    // The account may not impersonate anyone.
    let token = token_of(&f, "reader").await;
    let (allowed, _, err) = kubectl(
        &f,
        &[
            &format!("--token={token}"),
            "get",
            "pvc",
            "--as=system:serviceaccount:kube-system:admin",
        ],
        None,
    )
    .await;
    assert!(!allowed);
    assert!(
        err.contains(r#"serviceaccounts "admin" is forbidden: User "system:serviceaccount:default:reader" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "kube-system""#),
        "{err}"
    );
}

#[tokio::test]
async fn no_one_grants_more_than_they_hold() {
    let f = common::start().await;
    let setup = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: delegate, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: rbac-writer, namespace: default}
rules:
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["roles", "rolebindings"]
    verbs: ["create", "get"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: delegate, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: rbac-writer}
subjects:
  - {kind: ServiceAccount, name: delegate, namespace: default}
"#;
    ok(&f, &["apply", "-f", "-"], Some(setup)).await;
    let token = format!("--token={}", token_of(&f, "delegate").await);
    let held = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: maps, namespace: default}\nrules: [{apiGroups: [\"\"], resources: [\"configmaps\"], verbs: [\"get\"]}]\n";
    let (created, _, err) = kubectl(&f, &[&token, "create", "-f", "-"], Some(held)).await;
    assert!(created, "{err}");
    let more = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: secrets-too, namespace: default}\nrules: [{apiGroups: [\"\"], resources: [\"secrets\"], verbs: [\"get\"]}]\n";
    let (created, _, err) = kubectl(&f, &[&token, "create", "-f", "-"], Some(more)).await;
    assert!(!created);
    assert!(
        err.contains(r#"roles.rbac.authorization.k8s.io "secrets-too" is forbidden: user "system:serviceaccount:default:delegate""#)
            && err.contains("is attempting to grant RBAC permissions not currently held")
            && err.contains(r#"Resources:["secrets"]"#),
        "{err}"
    );
}

#[tokio::test]
async fn an_aggregated_cluster_role_holds_its_members_rules_and_shows_them() {
    let f = common::start().await;
    let setup = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: storage-viewer}
aggregationRule:
  clusterRoleSelectors:
    - matchLabels: {example.com/aggregate-to-storage-viewer: "true"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: classes
  labels: {example.com/aggregate-to-storage-viewer: "true"}
rules:
  - apiGroups: ["storage.k8s.io"]
    resources: ["storageclasses"]
    verbs: ["list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: viewers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: storage-viewer}
subjects:
  - {kind: User, name: carol}
"#;
    ok(&f, &["apply", "-f", "-"], Some(setup)).await;
    let yes = ok(
        &f,
        &["auth", "can-i", "list", "storageclasses", "--as=carol"],
        None,
    )
    .await;
    assert_eq!(yes.trim(), "yes");
    let rules = ok(
        &f,
        &[
            "get",
            "clusterrole",
            "storage-viewer",
            "-o",
            "jsonpath={.rules[0].resources}",
        ],
        None,
    )
    .await;
    assert_eq!(rules, r#"["storageclasses"]"#);
}

#[tokio::test]
async fn users_of_a_token_file_are_who_the_file_says() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let tokens = apiserver::auth::tokens::parse_token_file(
        "node-secret,system:node:n1,n1,\"system:nodes\"\n",
    )
    .unwrap();
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(
        apiserver::Config {
            kubeconfig_path: Some(kubeconfig.clone()),
            static_tokens: tokens,
            ..Default::default()
        },
        async {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    let f = Fixture {
        _dir: dir,
        kubeconfig,
        server,
        _stop: _tx,
    };
    let who = ok(
        &f,
        &[
            "--token=node-secret",
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.groups}",
        ],
        None,
    )
    .await;
    assert_eq!(who, r#"["system:nodes","system:authenticated"]"#);
    let (allowed, _, err) = kubectl(&f, &["--token=node-secret", "get", "pods"], None).await;
    assert!(
        !allowed && err.contains(r#"User "system:node:n1" cannot list resource "pods""#),
        "{err}"
    );
}
