//! The harness itself on the real control plane: it starts, the administrator may do
//! everything, a ServiceAccount only what RBAC grants, and the audit log shows the refusal.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use testbed::{ControlPlane, Options, service_account_user};

#[tokio::test]
async fn a_service_account_gets_what_rbac_grants_and_its_refusals_are_audited() {
    let plane = ControlPlane::start(Options {
        controllers: None,
        scheduler: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let admin = plane.admin().await.unwrap();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "probe"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let kubeconfig = plane
        .service_account_kubeconfig("default", "probe")
        .await
        .unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .unwrap();
    let probe = kube::Client::try_from(config).unwrap();
    let refused = Api::<Node>::all(probe)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused:?}"
    );
    // The administrator lists nodes (none: there is no kubelet).
    let nodes = Api::<Node>::all(admin)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(nodes.items.is_empty());
    let user = service_account_user("default", "probe");
    let refusals = plane
        .refusals(|u| u == user)
        .expect("read kube-apiserver's audit log");
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].verb, "list");
    assert_eq!(refusals[0].what, "nodes");
    // kubectl as the probe says the same.
    let answer = testbed::kubectl_with(&kubeconfig, &["auth", "can-i", "list", "nodes"]);
    assert!(answer.is_err(), "{answer:?}");
}
