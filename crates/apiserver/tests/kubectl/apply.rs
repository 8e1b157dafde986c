//! kubectl create and apply: protobuf bodies, client-side merges and server-side apply.

use super::*;

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
