//! The admission kube-apiserver runs by default, as kubectl sees it: `DefaultStorageClass`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{kubectl, start};

fn claim(name: &str, class: Option<&str>) -> String {
    let class = class.map_or(String::new(), |c| format!("  storageClassName: \"{c}\"\n"));
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n{class}  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n"
    )
}

fn class(name: &str, default: bool) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"{default}\"\nprovisioner: example.com/p\n"
    )
}

/// The class a claim was stored with (empty when it has none).
async fn class_of(f: &common::Fixture, name: &str) -> String {
    let (ok, out, err) = kubectl(
        f,
        &[
            "get",
            "pvc",
            name,
            "-o",
            "jsonpath={.spec.storageClassName}",
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    out
}

/// The claims of `default`, through kube-rs with the fixture's kubeconfig.
async fn claims_api(
    f: &common::Fixture,
) -> kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&f.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default")
}

#[tokio::test]
async fn a_claim_created_without_a_class_gets_the_default_class() {
    let f = start().await;
    // No default class yet: the claim keeps no class (the PV controller assigns one later).
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&claim("early", None))).await;
    assert!(ok, "{err}");
    assert_eq!(class_of(&f, "early").await, "");

    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&class("plain", false))).await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&class("gold", true))).await;
    assert!(ok, "{err}");
    // What the create returns already carries it, dry run included.
    let (ok, out, err) = kubectl(
        &f,
        &[
            "create",
            "--dry-run=server",
            "-o",
            "jsonpath={.spec.storageClassName}",
            "-f",
            "-",
        ],
        Some(&claim("dry", None)),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "gold");
    let (ok, _, err) = kubectl(&f, &["get", "pvc", "dry"], None).await;
    assert!(
        !ok && err.contains("not found"),
        "a dry run stores nothing: {err}"
    );
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&claim("late", None))).await;
    assert!(ok, "{err}");
    assert_eq!(class_of(&f, "late").await, "gold");
    // A class named, even "", is the user's choice.
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&claim("none", Some("")))).await;
    assert!(ok, "{err}");
    assert_eq!(class_of(&f, "none").await, "");
    let (ok, _, err) = kubectl(
        &f,
        &["create", "-f", "-"],
        Some(&claim("chosen", Some("plain"))),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(class_of(&f, "chosen").await, "plain");
    // Admission runs on create only: the claim made before the default keeps no class.
    assert_eq!(class_of(&f, "early").await, "");
}

#[tokio::test]
async fn applying_to_the_status_of_a_missing_claim_creates_nothing() {
    use kube::api::{Patch, PatchParams};
    let f = start().await;
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&class("gold", true))).await;
    assert!(ok, "{err}");
    let claims = claims_api(&f).await;
    let status = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ghost"},
        "status": {"phase": "Bound"},
    });
    let err = claims
        .patch_status("ghost", &PatchParams::apply("test"), &Patch::Apply(&status))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
    let err = claims.get("ghost").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
}
