//! What a DELETE answers, from a raw HTTP client: a Status or the object, as kube-apiserver
//! answers.

use super::bad_input::raw;
use super::*;

/// A DELETE that removes an object answers as kube-apiserver does for its kind: a `Status` of
/// success naming the resource (ConfigMaps, Leases and most kinds), or the object (claims,
/// volumes and the kinds whose stores return it); an object only marked is always returned.
#[tokio::test]
async fn a_delete_answers_with_a_status_or_the_object_as_kube_apiserver_does() {
    let f = start().await;
    let make = |path: &'static str, body: &'static str| {
        let f = &f;
        async move {
            let (code, made) = raw(
                f,
                "POST",
                path,
                "application/json",
                body.as_bytes().to_vec(),
            )
            .await;
            assert_eq!(code, 201, "{made}");
            made
        }
    };
    let maps = "/api/v1/namespaces/default/configmaps";
    let made = make(maps, r#"{"metadata":{"name":"c"}}"#).await;
    let (code, answer) = raw(
        &f,
        "DELETE",
        &format!("{maps}/c"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        answer,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": "c", "kind": "configmaps", "uid": made["metadata"]["uid"]}})
    );
    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let made = make(leases, r#"{"metadata":{"name":"l"}}"#).await;
    let (_, answer) = raw(
        &f,
        "DELETE",
        &format!("{leases}/l"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(
        answer["details"],
        serde_json::json!({"name": "l", "group": "coordination.k8s.io", "kind": "leases", "uid": made["metadata"]["uid"]})
    );
    // A claim's DELETE answers with the claim.
    let claims = "/api/v1/namespaces/default/persistentvolumeclaims";
    make(
        claims,
        r#"{"metadata":{"name":"p"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}"#,
    )
    .await;
    let (code, answer) = raw(
        &f,
        "DELETE",
        &format!("{claims}/p"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(
        (code, answer["kind"].as_str()),
        (200, Some("PersistentVolumeClaim")),
        "{answer}"
    );
    // A ConfigMap only marked (it has a finalizer) is answered with itself.
    make(
        maps,
        r#"{"metadata":{"name":"kept","finalizers":["example.dev/keep"]}}"#,
    )
    .await;
    let (_, answer) = raw(
        &f,
        "DELETE",
        &format!("{maps}/kept"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(answer["kind"], "ConfigMap", "{answer}");
    assert!(
        answer["metadata"]["deletionTimestamp"].is_string(),
        "{answer}"
    );
    // Its last finalizer taken off by a patch removes it: the answer is the object as the
    // patch left it, at the version it had (kube-apiserver's answer).
    let (code, removed) = raw(
        &f,
        "PATCH",
        &format!("{maps}/kept"),
        "application/merge-patch+json",
        br#"{"metadata":{"finalizers":null,"labels":{"c":"d"}}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 200, "{removed}");
    assert_eq!(removed["metadata"]["labels"], serde_json::json!({"c": "d"}));
    assert!(removed["metadata"].get("finalizers").is_none(), "{removed}");
    assert_eq!(
        removed["metadata"]["resourceVersion"], answer["metadata"]["resourceVersion"],
        "{removed}"
    );
    let (code, _) = raw(
        &f,
        "GET",
        &format!("{maps}/kept"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 404, "removed");
    // A dry run that would remove answers as the removal would.
    make(maps, r#"{"metadata":{"name":"d"}}"#).await;
    let (_, answer) = raw(
        &f,
        "DELETE",
        &format!("{maps}/d?dryRun=All"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(answer["status"], "Success", "{answer}");
    let (code, _) = raw(
        &f,
        "GET",
        &format!("{maps}/d"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200, "a dry run removes nothing");
}
