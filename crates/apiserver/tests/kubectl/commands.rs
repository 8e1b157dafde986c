//! Everyday kubectl commands: get, watch, describe, events, auth and discovery.

use super::*;

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

/// One Events resource in two versions, as kube-apiserver keeps it: an Event written through
/// events.k8s.io/v1 is listed and selected through core/v1 (what `kubectl get events` and
/// `kubectl describe` read) and the other way round; a patch through one is read through the
/// other.
#[tokio::test]
async fn events_written_through_either_version_are_read_through_both() {
    let f = start().await;
    let v1 = "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: e1\neventTime: 2026-11-29T06:00:00.000001Z\nreportingController: ctl\nreportingInstance: inst\naction: Act\nreason: Why\ntype: Normal\nregarding:\n  kind: Pod\n  name: p1\n  namespace: default\nnote: hello\n";
    let core = "apiVersion: v1\nkind: Event\nmetadata:\n  name: e2\ninvolvedObject:\n  kind: Pod\n  name: p2\n  namespace: default\nreason: R\nmessage: m\ncount: 3\ntype: Warning\nsource:\n  component: c\n";
    for manifest in [v1, core] {
        let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(manifest)).await;
        assert!(ok, "{err}");
    }
    let items = async |args: &[&str]| {
        let (ok, out, err) = kubectl(&f, args, None).await;
        assert!(ok, "{args:?}: {err}");
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        list["items"].as_array().unwrap().clone()
    };
    let core_items = items(&["get", "events", "-o", "json"]).await;
    let e1 = core_items.iter().find(|e| e["metadata"]["name"] == "e1");
    let e1 = e1.unwrap_or_else(|| panic!("e1 is not listed through core/v1: {core_items:?}"));
    assert_eq!(e1["apiVersion"], "v1");
    assert_eq!(e1["message"], "hello");
    assert_eq!(e1["involvedObject"]["name"], "p1");
    assert_eq!(e1["reportingComponent"], "ctl");
    assert!(
        e1.get("note").is_none() && e1.get("regarding").is_none(),
        "{e1}"
    );
    let v1_items = items(&["get", "events.events.k8s.io", "-o", "json"]).await;
    let e2 = v1_items.iter().find(|e| e["metadata"]["name"] == "e2");
    let e2 = e2.unwrap_or_else(|| panic!("e2 is not listed through events.k8s.io: {v1_items:?}"));
    assert_eq!(e2["apiVersion"], "events.k8s.io/v1");
    assert_eq!(e2["note"], "m");
    assert_eq!(e2["regarding"]["name"], "p2");
    assert_eq!(e2["deprecatedCount"], 3);
    assert_eq!(e2["deprecatedSource"]["component"], "c");
    assert!(
        e2.get("message").is_none() && e2.get("count").is_none(),
        "{e2}"
    );
    // Each version's field selectors, whichever version wrote the Event.
    let names = |items: Vec<serde_json::Value>| -> Vec<String> {
        items
            .iter()
            .map(|e| {
                e["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    let selected = items(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=p1",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(names(selected), ["e1"]);
    let selected = items(&[
        "get",
        "events.events.k8s.io",
        "--field-selector",
        "regarding.name=p2",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(names(selected), ["e2"]);
    let selected = items(&[
        "get",
        "events.events.k8s.io",
        "--field-selector",
        "reportingController=ctl",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(names(selected), ["e1"]);
    // An update through events.k8s.io/v1 may change the series and metadata only (kube's
    // message); one through core/v1 anything. Each is read through the other version.
    let patch = async |resource: &str, body: &str| {
        kubectl(
            &f,
            &["patch", resource, "e2", "--type=merge", "-p", body],
            None,
        )
        .await
    };
    let (ok, _, err) = patch("events.events.k8s.io", r#"{"note":"patched"}"#).await;
    assert!(!ok, "a note changed through events.k8s.io/v1");
    assert!(
        err.contains(
            r#"The Event "e2" is invalid: message: Invalid value: "patched": field is immutable"#
        ),
        "{err}"
    );
    let series = r#"{"series":{"count":2,"lastObservedTime":"2026-11-29T06:05:00.000000Z"},"metadata":{"labels":{"a":"b"}}}"#;
    let (ok, _, err) = patch("events.events.k8s.io", series).await;
    assert!(ok, "{err}");
    let (ok, _, err) = patch("events", r#"{"message":"patched"}"#).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&f, &["get", "event", "e2", "-o", "json"], None).await;
    assert!(ok, "{err}");
    let e2: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(e2["message"], "patched", "{e2}");
    assert_eq!(e2["series"]["count"], 2, "{e2}");
    assert_eq!(e2["metadata"]["labels"]["a"], "b", "{e2}");
    assert_eq!(e2["count"], 3, "{e2}");
    // A server-side apply through events.k8s.io/v1, read through core/v1.
    let applied = v1
        .replace("name: e1", "name: e3")
        .replace("note: hello", "note: applied");
    let (ok, _, err) = kubectl(&f, &["apply", "--server-side", "-f", "-"], Some(&applied)).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&f, &["get", "event", "e3", "-o", "json"], None).await;
    assert!(ok, "{err}");
    let e3: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(e3["message"], "applied", "{e3}");
    assert_eq!(e3["involvedObject"]["name"], "p1", "{e3}");
    // The table of either version has kube-apiserver's event columns.
    let (ok, out, err) = kubectl(&f, &["get", "events.events.k8s.io"], None).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("LAST SEEN"), "{out}");
    assert!(
        out.contains("pod/p1") && out.contains("pod/p2") && out.contains("patched"),
        "{out}"
    );
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
