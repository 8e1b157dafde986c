//! Bad input, from kubectl and from a raw HTTP client: clean Status errors and
//! kube-apiserver's messages.

use super::*;

fn http_client(f: &Fixture) -> (String, String) {
    (f.server.url(), f.server.token().to_string())
}

/// What curl writes to stdout, over HTTP/1.1, not checking the server's certificate.
async fn curl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--http1.1"])
        .args(args)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(super) async fn raw(
    f: &Fixture,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let (url, token) = http_client(f);
    let dir = tempfile::tempdir().unwrap();
    let body_file = dir.path().join("body");
    std::fs::write(&body_file, body).unwrap();
    let text = curl(&[
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
        "-H",
        &format!("Authorization: Bearer {token}"),
        "-H",
        &format!("Content-Type: {content_type}"),
        "--data-binary",
        &format!("@{}", body_file.display()),
        &format!("{url}{path}"),
    ])
    .await;
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn bad_requests_get_clean_status_errors() {
    let f = start().await;
    let path = "/api/v1/namespaces/default/configmaps";
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let cases: Vec<(&str, Vec<u8>, &str, u16)> = vec![
        ("malformed", b"{not json".to_vec(), "application/json", 400),
        ("deep nesting", deep.into_bytes(), "application/json", 400),
        (
            "wrong kind",
            br#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"x"}}"#.to_vec(),
            "application/json",
            400,
        ),
        (
            "invalid name",
            br#"{"metadata":{"name":"Not_Valid"}}"#.to_vec(),
            "application/json",
            422,
        ),
        ("huge", vec![b' '; 4 * 1024 * 1024], "application/json", 413),
        (
            "not an object",
            b"[1,2,3]".to_vec(),
            "application/json",
            400,
        ),
    ];
    for (case, body, ct, want) in cases {
        let (code, status) = raw(&f, "POST", path, ct, body).await;
        assert_eq!(code, want, "{case}: {status}");
        if code != 413 {
            assert_eq!(status["kind"], "Status", "{case}");
            assert_eq!(status["code"], want, "{case}");
        }
    }
    let (code, _) = raw(
        &f,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/none",
        "application/xml",
        b"<x/>".to_vec(),
    )
    .await;
    // kube-apiserver checks the patch type before it looks the object up.
    assert_eq!(code, 415);
    raw(
        &f,
        "POST",
        path,
        "application/json",
        br#"{"metadata":{"name":"p"}}"#.to_vec(),
    )
    .await;
    let (code, status) = raw(
        &f,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/p",
        "application/xml",
        b"<x/>".to_vec(),
    )
    .await;
    assert_eq!(code, 415, "{status}");
    let (code, _) = raw(
        &f,
        "GET",
        "/api/v1/nonsense",
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 404);
}

/// `dryRun` takes `All` only: anything else, on any write verb, is kube-apiserver's 422 and
/// nothing is written (a write not dry-run would be).
#[tokio::test]
async fn a_dry_run_other_than_all_is_refused_on_every_verb() {
    let f = start().await;
    let items = "/api/v1/namespaces/default/configmaps";
    let object = br#"{"metadata":{"name":"kept"},"data":{"a":"1"}}"#;
    let (code, _) = raw(&f, "POST", items, "application/json", object.to_vec()).await;
    assert_eq!(code, 201);
    let one = format!("{items}/kept");
    let changed = br#"{"metadata":{"name":"kept"},"data":{"a":"2"}}"#;
    let cases: [(&str, String, &str, &[u8], &str); 6] = [
        (
            "POST",
            format!("{items}?dryRun=all"),
            "application/json",
            br#"{"metadata":{"name":"new"}}"#,
            "CreateOptions",
        ),
        (
            "PUT",
            format!("{one}?dryRun="),
            "application/json",
            changed,
            "UpdateOptions",
        ),
        (
            "PATCH",
            format!("{one}?dryRun=foo"),
            "application/merge-patch+json",
            br#"{"data":{"a":"2"}}"#,
            "PatchOptions",
        ),
        (
            "PATCH",
            format!("{one}?dryRun=yes&fieldManager=m"),
            "application/apply-patch+yaml",
            changed,
            "PatchOptions",
        ),
        (
            "DELETE",
            format!("{one}?dryRun=true"),
            "application/json",
            b"",
            "DeleteOptions",
        ),
        (
            "DELETE",
            one.clone(),
            "application/json",
            br#"{"dryRun":["Server"]}"#,
            "DeleteOptions",
        ),
    ];
    for (method, path, content_type, body, options) in cases {
        let (code, status) = raw(&f, method, &path, content_type, body.to_vec()).await;
        assert_eq!(code, 422, "{method} {path}: {status}");
        assert_eq!(status["reason"], "Invalid", "{status}");
        assert_eq!(status["details"]["kind"], options, "{status}");
        assert_eq!(
            status["details"]["causes"][0]["field"], "dryRun",
            "{status}"
        );
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "{options}.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: ["
            )) && message.ends_with("]: supported values: \"All\""),
            "{message}"
        );
    }
    let (code, kept) = raw(&f, "GET", &one, "application/json", Vec::new()).await;
    assert_eq!(code, 200);
    assert_eq!(kept["data"]["a"], "1", "{kept}");
    let (code, _) = raw(
        &f,
        "GET",
        &format!("{items}/new"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 404);
}

/// A patch asking for strict field validation is refused when the patched object has a field
/// its kind does not have; an unknown `fieldValidation` is kube-apiserver's 422.
#[tokio::test]
async fn a_strict_patch_with_an_unknown_field_is_refused() {
    let f = start().await;
    let items = "/api/v1/namespaces/default/configmaps";
    let (code, _) = raw(
        &f,
        "POST",
        items,
        "application/json",
        br#"{"metadata":{"name":"c"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 201);
    for content_type in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let (code, status) = raw(
            &f,
            "PATCH",
            &format!("{items}/c?fieldValidation=Strict"),
            content_type,
            br#"{"zdata":{"b":"9"},"bogus":1}"#.to_vec(),
        )
        .await;
        assert_eq!(code, 422, "{status}");
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with(r#" "" is invalid: patch: Invalid value: "#)
                && message.ends_with(
                    r#"strict decoding error: unknown field "bogus", unknown field "zdata""#
                ),
            "{message}"
        );
        // A strategic merge patch is shown as Go prints it (kube-apiserver's message).
        if content_type == "application/strategic-merge-patch+json" {
            assert_eq!(
                message,
                r#" "" is invalid: patch: Invalid value: "map[bogus:1 zdata:map[b:9]]": strict decoding error: unknown field "bogus", unknown field "zdata""#
            );
        }
    }
    let (code, status) = raw(
        &f,
        "POST",
        &format!("{items}?fieldValidation=Sometimes"),
        "application/json",
        br#"{"metadata":{"name":"d"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        r#"CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Sometimes": supported values: "", "Ignore", "Strict", "Warn""#
    );
    let (code, kept) = raw(
        &f,
        "GET",
        &format!("{items}/c"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200);
    assert!(kept.get("bogus").is_none(), "{kept}");
}

/// A server-side apply must name its field manager: kube-apiserver's 422 on PatchOptions.
#[tokio::test]
async fn an_apply_without_a_field_manager_is_refused_as_kube_apiserver_does() {
    let f = start().await;
    let (code, status) = raw(
        &f,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/new",
        "application/apply-patch+yaml",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"new"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#
    );
    assert_eq!(
        status["details"],
        serde_json::json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{
            "reason": "FieldValueRequired",
            "message": "Required value: is required for apply patch",
            "field": "fieldManager",
        }]})
    );
}

#[tokio::test]
async fn objects_whose_parts_are_not_objects_get_status_errors_not_a_dropped_connection() {
    let f = start().await;
    // Server-side apply of a configuration whose metadata is a number.
    let (code, status) = raw(
        &f,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/new?fieldManager=m",
        "application/apply-patch+yaml",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":5}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["kind"], "Status");
    // A Pod whose spec is a string, if the server takes it, cannot be bound.
    let (created, status) = raw(
        &f,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"odd"},"spec":"x"}"#.to_vec(),
    )
    .await;
    assert!(matches!(created, 201 | 400 | 422), "{created}: {status}");
    let (code, status) = raw(
        &f,
        "POST",
        "/api/v1/namespaces/default/pods/odd/binding",
        "application/json",
        br#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"odd"},"target":{"kind":"Node","name":"n1"}}"#.to_vec(),
    )
    .await;
    let want = if created == 201 { 422 } else { 404 };
    assert_eq!(code, want, "{status}");
    assert_eq!(status["kind"], "Status");
}

#[tokio::test]
async fn a_health_check_is_answered_without_reading_its_body() {
    let f = start().await;
    let (url, _) = http_client(&f);
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body");
    // Larger than any request body the server takes: a health check without a token once
    // buffered up to 3 MiB of it before answering (and answered this one 413).
    std::fs::write(&body, vec![b'x'; 4 * 1024 * 1024]).unwrap();
    let text = curl(&[
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        // curl asks first (Expect: 100-continue) and waits for leave to send the body; the
        // server answers without reading it, so the body is never sent.
        "-H",
        "Expect: 100-continue",
        "--expect100-timeout",
        "60",
        "-X",
        "GET",
        "--data-binary",
        &format!("@{}", body.display()),
        &format!("{url}/healthz"),
    ])
    .await;
    assert_eq!(text, "ok\n200");
}

#[tokio::test]
async fn a_watch_timeout_past_any_instant_keeps_the_watch_open() {
    let f = start().await;
    let (code, _) = raw(
        &f,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        br#"{"metadata":{"name":"seen"}}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 201);
    let (url, token) = http_client(&f);
    // curl stops after 2 s (exit 28); what the stream sent by then is kept.
    let text = curl(&[
        "-N",
        "--max-time",
        "2",
        "-H",
        &format!("Authorization: Bearer {token}"),
        &format!(
            "{url}/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=18446744073709551615"
        ),
    ])
    .await;
    assert!(
        text.contains(r#""type":"ADDED""#) && text.contains(r#""name":"seen""#),
        "{text}"
    );
}

#[tokio::test]
async fn kubectl_prints_kube_apiservers_validation_messages_for_claims() {
    let f = start().await;
    let claim = |storage: &str, mode: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: bad\nspec:\n  accessModes: [\"{mode}\"]\n  resources:\n    requests:\n      storage: \"{storage}\"\n"
        )
    };
    let cases = [
        (
            claim("-5Gi", "ReadWriteOnce"),
            "The PersistentVolumeClaim \"bad\" is invalid: spec.resources[storage]: Invalid value: \"-5Gi\": must be greater than zero",
        ),
        (
            claim("1Gi", "Bogus"),
            "The PersistentVolumeClaim \"bad\" is invalid: spec.accessModes: Unsupported value: \"Bogus\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
        ),
    ];
    for (manifest, want) in cases {
        let (ok, _, stderr) = kubectl(&f, &["apply", "-f", "-"], Some(&manifest)).await;
        assert!(!ok, "kubectl apply accepted {manifest}");
        assert!(stderr.contains(want), "{stderr}");
    }
    let _ = &f.server;
}

#[tokio::test]
async fn kubectl_prints_kube_apiservers_validation_messages_for_storage_types_and_metadata() {
    let f = start().await;
    let cases = [
        (
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: fast\nprovisioner: example.com/p\nvolumeBindingMode: Later\n",
            "The StorageClass \"fast\" is invalid: volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
        ),
        (
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv1\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n",
            "The PersistentVolume \"pv1\" is invalid: spec: Required value: must specify a volume type",
        ),
        (
            "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata:\n  name: va\nspec:\n  attacher: d\n  nodeName: n\n  source: {}\n",
            "The VolumeAttachment \"va\" is invalid: spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {\"bad key\": x}\n",
            "The ConfigMap \"c\" is invalid: metadata.labels: Invalid value: \"bad key\": name part must consist of alphanumeric characters",
        ),
        (
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: l\nspec:\n  leaseDurationSeconds: 0\n",
            "The Lease \"l\" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
        ),
    ];
    for (manifest, want) in cases {
        let (ok, _, stderr) = kubectl(&f, &["apply", "-f", "-"], Some(manifest)).await;
        assert!(!ok, "kubectl apply accepted {manifest}");
        assert!(stderr.contains(want), "{stderr}");
    }
    let _ = &f.server;
}

/// A time that does not parse is refused at create with kube-apiserver's 400 and Go's words
/// (it was stored, then `kubectl get events` made the server panic slicing it); a Lease's
/// MicroTime needs its six digits.
#[tokio::test]
async fn bad_times_are_refused_when_written_and_never_panic_the_server() {
    let f = start().await;
    let event = r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e1","namespace":"default"},"involvedObject":{"kind":"Pod","name":"p","namespace":"default"},"reason":"R","message":"m","type":"Normal","lastTimestamp":"202é-11-23T10:00:00Z"}"#;
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(event)).await;
    assert!(!ok);
    assert!(
        err.contains(r#"Event in version "v1" cannot be handled as a Event: parsing time "202\xc3\xa9-11-23T10:00:00Z" as "2006-01-02T15:04:05Z07:00": cannot parse "202\xc3\xa9-11-23T10:00:00Z" as "2006""#),
        "{err}"
    );
    let lease = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"l1","namespace":"default"},"spec":{"renewTime":"2026-11-23T10:00:00Z"}}"#;
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(lease)).await;
    assert!(
        !ok && err.contains(r#"cannot parse "Z" as ".000000""#),
        "{err}"
    );
    let good = lease.replace("10:00:00Z", "10:00:00.000000Z");
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&good)).await;
    assert!(ok, "{err}");
    // Reads of what is stored stay well: tables and protobuf.
    let (ok, _, err) = kubectl(&f, &["get", "events,leases"], None).await;
    assert!(ok, "{err}");
}

/// An immutable ConfigMap keeps its data, a Secret its type and base64 data that decodes, a
/// CSINode's driver its ID: kubectl prints kube-apiserver's messages for each.
#[tokio::test]
async fn immutable_config_secrets_and_csinode_drivers_are_refused_as_kube_apiserver_does() {
    let f = start().await;
    let run = |args: &'static [&'static str], stdin: &'static str| {
        let f = &f;
        async move { kubectl(f, args, Some(stdin)).await }
    };
    let (ok, _, err) = run(&["create", "-f", "-"], r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"icm"},"immutable":true,"data":{"a":"1"},"binaryData":{"b":"YQ=="}}"#).await;
    assert!(ok, "{err}");
    let (ok, _, err) = run(
        &["replace", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"icm"},"data":{"a":"2"}}"#,
    )
    .await;
    assert!(!ok, "refused");
    for line in [
        r#"The ConfigMap "icm" is invalid: "#,
        "* immutable: Forbidden: field is immutable when `immutable` is set",
        "* data: Forbidden: field is immutable when `immutable` is set",
        "* binaryData: Forbidden: field is immutable when `immutable` is set",
    ] {
        assert!(err.contains(line), "{line}: {err}");
    }
    let (ok, _, err) = run(
        &["create", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"a":"not base64!"}}"#,
    )
    .await;
    assert!(
        !ok && err.contains(r#"Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 3"#),
        "{err}"
    );
    let (ok, _, err) = run(&["create", "-f", "-"], r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"example.com/one","data":{"a":"YQ=="}}"#).await;
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["replace", "-f", "-"], r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"example.com/other","data":{"a":"YQ=="}}"#).await;
    assert!(
        !ok && err.contains(
            r#"Secret "s" is invalid: type: Invalid value: "example.com/other": field is immutable"#
        ),
        "{err}"
    );
    let (ok, _, err) = run(&["create", "-f", "-"], r#"{"apiVersion":"storage.k8s.io/v1","kind":"CSINode","metadata":{"name":"cn1"},"spec":{"drivers":[{"name":"d.example.com","nodeID":"n1","topologyKeys":["zone"]}]}}"#).await;
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["replace", "-f", "-"], r#"{"apiVersion":"storage.k8s.io/v1","kind":"CSINode","metadata":{"name":"cn1"},"spec":{"drivers":[{"name":"d.example.com","nodeID":"n2","topologyKeys":["zone","rack"]}]}}"#).await;
    assert!(
        !ok && err.contains(r#"The CSINode "cn1" is invalid: spec.drivers: Invalid value: {"Name":"d.example.com","NodeID":"n2","TopologyKeys":["zone","rack"],"Allocatable":null}: field is immutable"#),
        "{err}"
    );
}
