//! What kube-apiserver sets on objects as they are written, read back through kubectl as it
//! shows them there (each checked against kube-apiserver v1.36's answers).

use super::*;

const OBJECTS: &str = "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: from-claim}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}, storageClassName: gold, dataSource: {kind: PersistentVolumeClaim, name: src}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: from-snapshot}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}, storageClassName: gold, dataSourceRef: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: local}
spec: {accessModes: [ReadWriteOnce], capacity: {storage: 1Gi}, hostPath: {path: /tmp/x}}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: va}
spec: {attacher: d.example.com, nodeName: n1, source: {persistentVolumeName: local}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: gold
  annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}
provisioner: d.example.com
";

#[tokio::test]
async fn storage_objects_read_back_as_kube_apiserver_writes_them() {
    let f = start().await;
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(OBJECTS)).await;
    assert!(ok, "{err}");
    let get = |args: &'static [&'static str]| {
        let f = &f;
        async move {
            let (ok, out, err) = kubectl(f, args, None).await;
            assert!(ok, "kubectl {args:?}: {err}");
            out
        }
    };
    // A claim's data source is mirrored into the other field.
    let pvc = r#"{"kind":"PersistentVolumeClaim","name":"src"}"#;
    assert_eq!(
        get(&[
            "get",
            "pvc",
            "from-claim",
            "-o",
            "jsonpath={.spec.dataSourceRef}"
        ])
        .await,
        pvc
    );
    let snap = r#"{"apiGroup":"snapshot.storage.k8s.io","kind":"VolumeSnapshot","name":"snap"}"#;
    assert_eq!(
        get(&[
            "get",
            "pvc",
            "from-snapshot",
            "-o",
            "jsonpath={.spec.dataSource}"
        ])
        .await,
        snap
    );
    // A replace that sends only `dataSource` (the manifest again, labelled) gets the other
    // filled in again, as kube-apiserver's update does: not a change of an immutable spec.
    let replaced = OBJECTS.split("---\n").next().unwrap().replace(
        "metadata: {name: from-claim}",
        "metadata: {name: from-claim, labels: {again: \"yes\"}}",
    );
    let (ok, _, err) = kubectl(&f, &["replace", "-f", "-"], Some(&replaced)).await;
    assert!(ok, "{err}");
    assert_eq!(
        get(&[
            "get",
            "pvc",
            "from-claim",
            "-o",
            "jsonpath={.metadata.labels.again} {.spec.dataSourceRef}"
        ])
        .await,
        format!("yes {pvc}")
    );
    // Two that disagree are refused with kube-apiserver's message.
    let (ok, _, err) = kubectl(
        &f,
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: torn}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}, dataSource: {kind: PersistentVolumeClaim, name: a}, dataSourceRef: {kind: PersistentVolumeClaim, name: b}}\n"),
    )
    .await;
    assert!(
        !ok && err.contains(r#"PersistentVolumeClaim "torn" is invalid: spec: Invalid value: {}: must match dataSourceRef"#),
        "{err}"
    );
    // A volume's phase has the time it was set; a hostPath its empty type.
    let stamped = get(&[
        "get",
        "pv",
        "local",
        "-o",
        "jsonpath={.status.lastPhaseTransitionTime}",
    ])
    .await;
    assert!(stamped.ends_with('Z') && stamped.len() == 20, "{stamped}");
    assert_eq!(
        get(&["get", "pv", "local", "-o", "jsonpath={.spec.hostPath}"]).await,
        r#"{"path":"/tmp/x","type":""}"#
    );
    assert_eq!(
        get(&["get", "volumeattachment", "va", "-o", "jsonpath={.status}"]).await,
        r#"{"attached":false}"#
    );
    // Namespaces carry their name as a label, which selects them.
    let (ok, _, err) = kubectl(&f, &["create", "namespace", "team"], None).await;
    assert!(ok, "{err}");
    assert_eq!(
        get(&[
            "get",
            "namespaces",
            "-l",
            "kubernetes.io/metadata.name=team",
            "-o",
            "name"
        ])
        .await,
        "namespace/team\n"
    );
    // kubectl get marks the default class.
    let classes = get(&["get", "storageclass"]).await;
    assert!(classes.contains("gold (default)"), "{classes}");
    // A selector that does not parse is refused, not read as matching nothing.
    let (ok, _, err) = kubectl(&f, &["get", "pvc", "-l", "bad===x"], None).await;
    assert!(
        !ok && err.contains("unable to parse requirement: found '=', expected: identifier"),
        "{err}"
    );
    // A claim is selected by its name and namespace only, as in kube-apiserver.
    let (ok, _, err) = kubectl(
        &f,
        &["get", "pvc", "--field-selector", "status.phase=Bound"],
        None,
    )
    .await;
    assert!(
        !ok && err.contains(r#""status.phase" is not a known field selector: only "metadata.name", "metadata.namespace""#),
        "{err}"
    );
}

const TYPO: &str = "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: typo}
spec: {storageClass: gold, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
";

/// A field the kind does not have (`storageClass` for `storageClassName`): kubectl asks for
/// strict validation and the write is refused, as kube-apiserver refuses it; with
/// `--validate=warn` it is dropped with a warning, with `--validate=false` dropped silently.
#[tokio::test]
async fn unknown_fields_are_refused_warned_or_dropped_as_kubectl_asks() {
    let f = start().await;
    for verb in ["create", "apply"] {
        let (ok, _, err) = kubectl(&f, &[verb, "-f", "-"], Some(TYPO)).await;
        assert!(
            !ok && err.contains(r#"strict decoding error: unknown field "spec.storageClass""#),
            "kubectl {verb}: {err}"
        );
    }
    let (ok, _, err) = kubectl(&f, &["apply", "--server-side", "-f", "-"], Some(TYPO)).await;
    assert!(
        !ok && err.contains(".spec.storageClass: field not declared in schema"),
        "{err}"
    );
    let (ok, _, err) = kubectl(&f, &["get", "pvc", "typo"], None).await;
    assert!(!ok && err.contains("not found"), "nothing was made: {err}");

    let (ok, _, err) = kubectl(&f, &["create", "--validate=warn", "-f", "-"], Some(TYPO)).await;
    assert!(ok, "{err}");
    assert!(
        err.contains(r#"unknown field "spec.storageClass""#),
        "warned: {err}"
    );
    let (ok, out, err) = kubectl(&f, &["get", "pvc", "typo", "-o", "jsonpath={.spec}"], None).await;
    assert!(
        ok && !out.contains("storageClass\""),
        "dropped: {out} {err}"
    );
    // kubectl replace asks for strict validation too.
    let typo_again = TYPO.replace("storage: 1Gi", "storage: 2Gi");
    let (ok, _, err) = kubectl(&f, &["replace", "-f", "-"], Some(&typo_again)).await;
    assert!(
        !ok && err.contains(r#"unknown field "spec.storageClass""#),
        "{err}"
    );
    // With --validate=false (Ignore) the field is dropped without a word.
    let (ok, _, err) = kubectl(&f, &["replace", "--validate=false", "-f", "-"], Some(TYPO)).await;
    assert!(ok && !err.contains("unknown field"), "{err}");
}

/// A field stored by a write that did not name `fieldValidation` (kube-rs, client-go, curl) is
/// not the doing of kubectl's later strict writes: apply (a patch), a replace of the object
/// read back and an edit-like patch all pass and leave it; a strict patch that changes it is
/// refused.
#[tokio::test]
async fn fields_stored_before_do_not_make_kubectls_strict_writes_fail() {
    let f = start().await;
    let client = kube::Client::new(f.server.local_service("legacy-test").unwrap(), "default");
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "default");
    let legacy: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "old"}, "data": {"a": "1"}}),
    )
    .unwrap();
    maps.create(&Default::default(), &legacy).await.unwrap();
    // A field the kind does not have, written without fieldValidation.
    let params = kube::api::PatchParams::default();
    maps.patch(
        "old",
        &params,
        &kube::api::Patch::Merge(serde_json::json!({"legacy": 1})),
    )
    .await
    .unwrap();
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: old}\ndata: {a: \"2\"}\n";
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(manifest)).await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &f,
        &["apply", "-f", "-"],
        Some(&manifest.replace("\"2\"", "\"3\"")),
    )
    .await;
    assert!(ok, "{err}");
    let read = || async {
        let (ok, out, err) = kubectl(
            &f,
            &["get", "cm", "old", "-o", "jsonpath={.data.a} {.legacy}"],
            None,
        )
        .await;
        assert!(ok, "{err}");
        out
    };
    assert_eq!(
        read().await,
        "3 1",
        "applied twice, and the stored field kept"
    );
    // A replace of the object read back sends it again, unchanged: not refused.
    let (ok, read_back, err) = kubectl(&f, &["get", "cm", "old", "-o", "json"], None).await;
    assert!(ok, "{err}");
    let read_back = read_back.replace(r#""a": "3""#, r#""a": "4""#);
    let (ok, _, err) = kubectl(&f, &["replace", "-f", "-"], Some(&read_back)).await;
    assert!(ok, "{err}");
    assert_eq!(read().await, "4 1", "replaced, and the stored field kept");
    // Changing it is the patch's doing.
    let strict = kube::api::PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..Default::default()
    };
    let refused = maps
        .patch(
            "old",
            &strict,
            &kube::api::Patch::Merge(serde_json::json!({"legacy": 2})),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains(r#"unknown field \"legacy\""#)
            || refused.to_string().contains(r#"unknown field "legacy""#),
        "{refused}"
    );
}
