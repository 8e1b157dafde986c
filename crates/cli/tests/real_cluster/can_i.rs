//! `kubectl auth can-i --list` as each of our ServiceAccounts gives the same answer on our API
//! server as on kube-apiserver, with the manifests of `deploy/kubernetes` applied to both.
//! kube-apiserver here carries one OpenShift default (`system:openshift:public-info-viewer`:
//! `/.well-known` and `/.well-known/*` for everyone) that upstream Kubernetes does not have;
//! those two rows are left out of the comparison.

use crate::bed::manifest;
use testbed::kubectl_with;

/// The rows of a `can-i --list` table, spaces collapsed, sorted, without the OpenShift rows.
fn rows(table: &str) -> Vec<String> {
    let mut rows: Vec<String> = table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|row| !row.is_empty())
        .filter(|row| {
            !matches!(
                row.as_str(),
                "[/.well-known] [] [get]" | "[/.well-known/*] [] [get]"
            )
        })
        .collect();
    rows.sort();
    rows
}

const ACCOUNTS: [&str; 3] = [
    "system:serviceaccount:default:csi-provisioner",
    "system:serviceaccount:default:csi-attacher",
    "system:serviceaccount:default:pv-controller",
];

fn answers(kubeconfig: &std::path::Path) -> Vec<(String, Vec<String>)> {
    ACCOUNTS
        .iter()
        .map(|account| {
            let table = kubectl_with(
                kubeconfig,
                &["auth", "can-i", "--list", &format!("--as={account}")],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            (account.to_string(), rows(&table))
        })
        .collect()
}

#[tokio::test]
async fn can_i_list_answers_as_kube_apiserver_does_for_our_manifests() {
    let manifests = [
        manifest("rbac.yaml"),
        manifest("rbac-volume-sets.yaml"),
        manifest("attacher-rbac.yaml"),
        manifest("pv-controller-rbac.yaml"),
    ];
    let plane = crate::bed::bare_control_plane().await;
    for path in &manifests {
        plane
            .kubectl(&["apply", "-f", &path.display().to_string()])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let theirs = answers(plane.admin_kubeconfig());

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let _server = apiserver::serve(
        apiserver::Config {
            kubeconfig_path: Some(kubeconfig.clone()),
            ..Default::default()
        },
        async {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    // kubectl runs as a process: the server's runtime keeps its thread while kubectl waits.
    let ours = tokio::task::spawn_blocking(move || {
        for path in &manifests {
            let applied = kubectl_with(&kubeconfig, &["apply", "-f", &path.display().to_string()]);
            assert!(applied.is_ok(), "{applied:?}");
        }
        answers(&kubeconfig)
    })
    .await
    .unwrap();
    for ((account, theirs), (_, ours)) in theirs.iter().zip(&ours) {
        assert_eq!(ours, theirs, "can-i --list as {account} differs");
        assert!(theirs.len() > 5, "{account}: {theirs:?}");
    }
}
