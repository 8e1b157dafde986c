//! The server driven by the real kubectl, and fed bad input.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Fixture, kubectl, start};

use std::process::{Command, Stdio};
use std::time::Duration;

const CLAIM: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n";

#[tokio::test]
async fn kubectl_works_against_the_server() {
    let f = start().await;
    let (ok, out, err) = kubectl(&f, &["apply", "-f", "-"], Some(CLAIM)).await;
    assert!(ok, "{err}");
    assert!(out.contains("persistentvolumeclaim/data created"), "{out}");
    let (ok, out, _) = kubectl(&f, &["apply", "-f", "-"], Some(CLAIM)).await;
    assert!(ok && out.contains("unchanged"), "{out}");
    let (ok, out, _) = kubectl(&f, &["get", "pvc"], None).await;
    assert!(
        ok && out.contains("NAME") && out.contains("data") && out.contains("Pending"),
        "{out}"
    );
    let (ok, out, _) = kubectl(&f, &["get", "pvc", "data", "-o", "yaml"], None).await;
    assert!(
        ok && out.contains("volumeMode: Filesystem") && out.contains("uid:"),
        "{out}"
    );
    for args in [
        vec!["label", "pvc", "data", "app=web"],
        vec!["annotate", "pvc", "data", "note=hi"],
        vec![
            "patch",
            "pvc",
            "data",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"m":"1"}}}"#,
        ],
        vec![
            "patch",
            "pvc",
            "data",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/j","value":"2"}]"#,
        ],
        vec![
            "patch",
            "pvc",
            "data",
            "--type",
            "strategic",
            "-p",
            r#"{"metadata":{"labels":{"s":"3"}}}"#,
        ],
    ] {
        let (ok, _, err) = kubectl(&f, &args, None).await;
        assert!(ok, "{args:?}: {err}");
    }
    let (ok, out, _) = kubectl(
        &f,
        &["get", "pvc", "-l", "app=web,m=1,j=2,s=3", "-o", "name"],
        None,
    )
    .await;
    assert!(ok && out.trim() == "persistentvolumeclaim/data", "{out}");

    // A finalizer holds the deletion; removing it lets the object go.
    kubectl(
        &f,
        &[
            "patch",
            "pvc",
            "data",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
        ],
        None,
    )
    .await;
    let (ok, _, err) = kubectl(&f, &["delete", "pvc", "data", "--wait=false"], None).await;
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(
        &f,
        &[
            "get",
            "pvc",
            "data",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ],
        None,
    )
    .await;
    assert!(!out.is_empty(), "deletionTimestamp set");
    kubectl(
        &f,
        &[
            "patch",
            "pvc",
            "data",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )
    .await;
    let (ok, _, err) = kubectl(
        &f,
        &["wait", "--for=delete", "pvc/data", "--timeout=10s"],
        None,
    )
    .await;
    assert!(ok, "{err}");
}

#[tokio::test]
async fn kubectl_get_watch_streams_changes() {
    use std::io::BufRead;
    let f = start().await;
    let first = CLAIM.replace("name: data", "name: first");
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&first)).await;
    assert!(ok, "{err}");
    let mut watcher = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", f.kubeconfig.display()))
        .arg(common::cache_dir(&f.kubeconfig))
        .args(["get", "pvc", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Every line kubectl prints, from either stream, as it comes.
    // (The server runs on this test's thread: waiting here must not block it.)
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    for stream in [
        Box::new(watcher.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(watcher.stderr.take().unwrap()),
    ] {
        let tx = lines_tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let mut seen = Vec::new();
    let mut wait_for_line = async |what: &str, wanted: &dyn Fn(&str) -> bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match tokio::time::timeout_at(deadline, lines.recv()).await {
                Ok(Some(line)) if wanted(&line) => return line,
                Ok(Some(line)) => seen.push(line),
                Ok(None) => panic!("kubectl exited before it printed {what}; it printed {seen:?}"),
                Err(_) => panic!("kubectl never printed {what}; it printed {seen:?}"),
            }
        }
    };
    // The list (of one claim) is printed: a claim created now can only come through the
    // watch.
    wait_for_line("the listed claim", &|l| l.starts_with("first ")).await;
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(CLAIM)).await;
    assert!(ok, "{err}");
    let line = wait_for_line("the new claim", &|l| l.starts_with("data ")).await;
    assert!(line.contains("Pending"), "{line}");
    let _ = watcher.kill();
    let _ = watcher.wait();
}

#[tokio::test]
async fn a_wrong_token_is_refused() {
    let f = start().await;
    let text = std::fs::read_to_string(&f.kubeconfig)
        .unwrap()
        .replace(f.server.token(), "nope");
    std::fs::write(&f.kubeconfig, text).unwrap();
    let (ok, _, err) = kubectl(&f, &["get", "pvc"], None).await;
    assert!(
        !ok && (err.contains("Unauthorized") || err.contains("credentials")),
        "{err}"
    );
}

fn http_client(f: &Fixture) -> (String, String) {
    (f.server.url(), f.server.token().to_string())
}

async fn raw(
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
    let out = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "--http1.1",
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
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
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

#[tokio::test]
async fn kubectl_get_all_lists_the_resources_in_the_all_category() {
    let f = start().await;
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d1\nspec:\n  selector:\n    matchLabels: {app: d1}\n  template:\n    metadata:\n      labels: {app: d1}\n    spec:\n      containers:\n      - name: c\n        image: nginx\n";
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(deployment)).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&f, &["get", "all"], None).await;
    assert!(ok, "{err}");
    assert!(out.contains("deployment.apps/d1"), "{out}");
    let _ = &f.server;
}

#[tokio::test]
async fn kubectl_get_events_shows_kube_apiservers_columns() {
    let f = start().await;
    let event = "apiVersion: v1\nkind: Event\nmetadata:\n  name: e1\ninvolvedObject:\n  kind: PersistentVolumeClaim\n  name: data\n  namespace: default\nreason: ProvisioningSucceeded\nmessage: Successfully provisioned volume pvc-1\ntype: Normal\n";
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(event)).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&f, &["get", "events"], None).await;
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        vec!["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{out}"
    );
    let row = out.lines().nth(1).unwrap_or("");
    for cell in [
        "Normal",
        "ProvisioningSucceeded",
        "persistentvolumeclaim/data",
        "Successfully provisioned volume pvc-1",
    ] {
        assert!(row.contains(cell), "{out}");
    }
    let _ = &f.server;
}

#[tokio::test]
async fn kubectl_auth_whoami_and_can_i_answer_for_the_tokens_user() {
    let f = start().await;
    let (ok, out, err) = kubectl(&f, &["auth", "whoami"], None).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("volstack-admin") && out.contains("system:masters"),
        "{out}"
    );
    let (ok, out, err) = kubectl(
        &f,
        &["auth", "can-i", "create", "persistentvolumeclaims"],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "yes");
    let (ok, out, err) = kubectl(&f, &["auth", "can-i", "delete", "storageclasses"], None).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "yes");
    let _ = &f.server;
}

/// kubectl's typed clients send protobuf: `kubectl create ...` works and what it made reads
/// back in JSON as it was meant.
#[tokio::test]
async fn kubectl_create_commands_send_protobuf_and_work() {
    let f = start().await;
    let commands: &[&[&str]] = &[
        &["create", "namespace", "team"],
        &["create", "configmap", "c1", "--from-literal=a=b"],
        &["create", "secret", "generic", "s1", "--from-literal=p=q"],
        &["create", "serviceaccount", "sa1"],
        &["create", "deployment", "d1", "--image=nginx"],
    ];
    for args in commands {
        let (ok, out, err) = kubectl(&f, args, None).await;
        assert!(ok, "kubectl {args:?}: {err}");
        assert!(out.contains("created"), "{out}");
    }
    let json = |args: &'static [&'static str]| {
        let f = &f;
        async move {
            let (ok, out, err) = kubectl(f, args, None).await;
            assert!(ok, "{err}");
            serde_json::from_str::<serde_json::Value>(&out).unwrap()
        }
    };
    let ns = json(&["get", "namespace", "team", "-o", "json"]).await;
    assert_eq!(ns["status"]["phase"], "Active");
    let cm = json(&["get", "configmap", "c1", "-o", "json"]).await;
    assert_eq!(cm["data"], serde_json::json!({"a": "b"}));
    // Go writes every string of ObjectMeta; the empty ones are not stored.
    assert!(cm["metadata"].get("generateName").is_none(), "{cm}");
    let secret = json(&["get", "secret", "s1", "-o", "json"]).await;
    assert_eq!(secret["data"]["p"], "cQ==");
    assert_eq!(secret["type"], "Opaque");
    let deployment = json(&["get", "deployment", "d1", "-o", "json"]).await;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx");
    assert_eq!(container["name"], "nginx");
    assert_eq!(deployment["spec"]["replicas"], 1);
    // Deleting sends DeleteOptions in protobuf.
    let (ok, _, err) = kubectl(&f, &["delete", "configmap", "c1"], None).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&f, &["get", "configmaps", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert!(!out.contains("configmap/c1"), "{out}");
    let _ = &f.server;
}

fn deployment_yaml(replicas: u32, containers: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n"
    );
    for (name, image) in containers {
        yaml.push_str(&format!("      - name: {name}\n        image: {image}\n"));
    }
    yaml
}

async fn deployment_json(f: &Fixture) -> serde_json::Value {
    let (ok, out, err) = kubectl(f, &["get", "deployment", "web", "-o", "json"], None).await;
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn container_images(d: &serde_json::Value) -> Vec<(String, String)> {
    d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["image"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Client-side apply sends strategic merge patches: containers merge by name, so a container
/// someone else added survives a re-apply that changes the list.
#[tokio::test]
async fn kubectl_apply_merges_containers_by_name_and_keeps_what_others_added() {
    let f = start().await;
    let first = deployment_yaml(1, &[("app", "app:1")]);
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&first)).await;
    assert!(ok, "{err}");
    let sidecar =
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"sidecar:1"}]}}}}"#;
    let (ok, _, err) = kubectl(&f, &["patch", "deployment", "web", "-p", sidecar], None).await;
    assert!(ok, "{err}");
    let apply_and_list = |containers: &'static [(&'static str, &'static str)]| {
        let f = &f;
        async move {
            let yaml = deployment_yaml(1, containers);
            let (ok, _, err) = kubectl(f, &["apply", "-f", "-"], Some(&yaml)).await;
            assert!(ok, "{err}");
            let mut images = container_images(&deployment_json(f).await);
            images.sort();
            images
        }
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(n, i)| (n.to_string(), i.to_string()))
            .collect()
    };
    assert_eq!(
        apply_and_list(&[("app", "app:2"), ("extra", "extra:1")]).await,
        pairs(&[
            ("app", "app:2"),
            ("extra", "extra:1"),
            ("sidecar", "sidecar:1")
        ])
    );
    // Removing a container from the file removes it (and only it).
    assert_eq!(
        apply_and_list(&[("app", "app:2")]).await,
        pairs(&[("app", "app:2"), ("sidecar", "sidecar:1")])
    );
    let _ = &f.server;
}

/// Server-side apply: a second manager's different value is a conflict worded as
/// kube-apiserver words it; --force-conflicts takes the field over.
#[tokio::test]
async fn kubectl_server_side_apply_reports_conflicts_and_forces_them() {
    let f = start().await;
    let apply = |manager: &'static str, replicas: u32, force: bool| {
        let f = &f;
        async move {
            let yaml = deployment_yaml(replicas, &[("app", "app:1")]);
            let manager = format!("--field-manager={manager}");
            let mut args = vec!["apply", "--server-side", manager.as_str(), "-f", "-"];
            if force {
                args.push("--force-conflicts");
            }
            kubectl(f, &args, Some(&yaml)).await
        }
    };
    let (ok, out, err) = apply("alice", 1, false).await;
    assert!(ok, "{err}");
    assert!(out.contains("serverside-applied"), "{out}");
    // The same configuration again: no change, no conflict.
    let (ok, _, err) = apply("alice", 1, false).await;
    assert!(ok, "{err}");
    let (ok, _, err) = apply("bob", 2, false).await;
    assert!(!ok);
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"alice\": .spec.replicas"),
        "{err}"
    );
    assert_eq!(deployment_json(&f).await["spec"]["replicas"], 1);
    let (ok, _, err) = apply("bob", 2, true).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &f,
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    let d: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["spec"]["replicas"], 2);
    let managed = d["metadata"]["managedFields"].as_array().unwrap();
    let owner_of_replicas: Vec<&str> = managed
        .iter()
        .filter(|m| !m["fieldsV1"]["f:spec"]["f:replicas"].is_null())
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(owner_of_replicas, vec!["bob"]);
    // alice still owns what bob did not take.
    assert!(
        managed
            .iter()
            .any(|m| m["manager"] == "alice" && !m["fieldsV1"]["f:spec"]["f:selector"].is_null())
    );
    // A plain update takes the fields it changes: alice's next apply of another value
    // conflicts with the patcher, as against kube-apiserver.
    let (ok, _, err) = kubectl(
        &f,
        &[
            "patch",
            "deployment",
            "web",
            "-p",
            r#"{"spec":{"minReadySeconds":5}}"#,
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &f,
        &["apply", "--server-side", "--field-manager=alice", "-f", "-"],
        Some(
            &deployment_yaml(2, &[("app", "app:1")])
                .replace("  replicas: 2\n", "  replicas: 2\n  minReadySeconds: 0\n"),
        ),
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("conflict with \"kubectl-patch\" using apps/v1: .spec.minReadySeconds"),
        "{err}"
    );
    let _ = &f.server;
}

/// kubectl reads aggregated discovery: two requests (/api, /apis), no per-group fallback.
#[tokio::test]
async fn kubectl_discovers_everything_from_aggregated_discovery() {
    let f = start().await;
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = format!("--cache-dir={}", cache.path().display());
    let (ok, out, err) = kubectl(&f, &["api-resources", "-v=6", &cache_arg], None).await;
    assert!(ok, "{err}");
    for resource in [
        "persistentvolumeclaims",
        "csidrivers",
        "leases",
        "deployments",
    ] {
        assert!(out.contains(resource), "{out}");
    }
    let requests: Vec<&str> = err.lines().filter(|l| l.contains("GET https://")).collect();
    assert!(
        requests
            .iter()
            .any(|l| l.contains("/apis ") || l.contains("/apis?")),
        "{err}"
    );
    assert!(
        !requests
            .iter()
            .any(|l| l.contains("/apis/storage.k8s.io/v1")),
        "kubectl fell back to per-group discovery: {requests:#?}"
    );
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
