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
