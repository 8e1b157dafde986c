//! `kubectl explain` reads the OpenAPI v3 documents: built-in kinds with their Kubernetes
//! schemas and descriptions, custom resources with their definitions'.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl;

#[tokio::test]
async fn kubectl_explain_walks_built_in_kinds_and_custom_resources() {
    let f = common::start().await;
    let (ok, out, err) = kubectl(&f, &["explain", "pvc.spec.dataSourceRef"], None).await;
    assert!(ok, "{err}");
    assert!(out.contains("KIND:       PersistentVolumeClaim"), "{out}");
    assert!(
        out.contains("FIELD: dataSourceRef <TypedObjectReference>"),
        "{out}"
    );
    assert!(out.contains("apiGroup\t<string>"), "{out}");
    let (ok, out, err) = kubectl(
        &f,
        &["explain", "csistoragecapacities.maximumVolumeSize"],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("GROUP:      storage.k8s.io"), "{out}");
    let (ok, out, err) = kubectl(&f, &["explain", "deployments.spec.replicas"], None).await;
    assert!(ok && out.contains("<integer>"), "{out} {err}");
    // A custom resource: its definition's schema.
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "pools.example.volstack.dev"},
      "spec": {"group": "example.volstack.dev", "scope": "Cluster",
        "names": {"kind": "Pool", "listKind": "PoolList", "plural": "pools", "singular": "pool"},
        "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
          "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "minimum": {"type": "integer", "description": "Volumes kept ready."}}}}}}}]}}"#;
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(crd)).await;
    assert!(ok, "{err}");
    let mut explained = String::new();
    for _ in 0..100 {
        let (ok, out, _) = kubectl(&f, &["explain", "pools.spec.minimum"], None).await;
        if ok {
            explained = out;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(explained.contains("Volumes kept ready."), "{explained}");
}
