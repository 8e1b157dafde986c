//! Server-side dry runs, as kubectl asks for them (`--dry-run=server`, `kubectl diff`): every
//! write verb answers what it would do, and nothing is written.

use super::*;

fn config_map(a: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dry\n  namespace: team\ndata:\n  a: \"{a}\"\n"
    )
}

/// The resourceVersion of a list of every ConfigMap: the server's newest version, which any
/// write (of any object) moves on.
async fn newest_version(f: &Fixture) -> String {
    let kubeconfig = kube::config::Kubeconfig::read_from(&f.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(client);
    let list = maps.list(&Default::default()).await.unwrap();
    list.metadata.resource_version.unwrap()
}

#[tokio::test]
async fn kubectl_dry_runs_answer_and_write_nothing() {
    let f = start().await;
    let (ok, _, err) = kubectl(&f, &["create", "namespace", "team"], None).await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&config_map("1"))).await;
    assert!(ok, "{err}");
    let before = newest_version(&f).await;

    // Each answers with the object as the write would leave it.
    let answers: [(&[&str], String, &str); 5] = [
        (
            &[
                "apply",
                "--dry-run=server",
                "-o",
                "jsonpath={.data.a}",
                "-f",
                "-",
            ],
            config_map("2"),
            "2",
        ),
        (
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--dry-run=server",
                "-o",
                "jsonpath={.data.a}",
                "-f",
                "-",
            ],
            config_map("3"),
            "3",
        ),
        (
            &[
                "replace",
                "--dry-run=server",
                "-o",
                "jsonpath={.data.a}",
                "-f",
                "-",
            ],
            config_map("4"),
            "4",
        ),
        (
            &[
                "patch",
                "configmap",
                "dry",
                "-n",
                "team",
                "--dry-run=server",
                "-p",
                r#"{"data":{"b":"5"}}"#,
                "-o",
                "jsonpath={.data.b}",
            ],
            String::new(),
            "5",
        ),
        (
            &[
                "label",
                "configmap",
                "dry",
                "-n",
                "team",
                "tier=gold",
                "--dry-run=server",
                "-o",
                "jsonpath={.metadata.labels.tier}",
            ],
            String::new(),
            "gold",
        ),
    ];
    for (args, stdin, want) in answers {
        let stdin = (!stdin.is_empty()).then_some(stdin.as_str());
        let (ok, out, err) = kubectl(&f, args, stdin).await;
        assert!(ok, "kubectl {args:?}: {err}");
        assert_eq!(out, want, "kubectl {args:?}");
    }

    // kubectl diff asks for a dry run of the change and shows it: exit status 1, differences.
    let (ok, out, err) = kubectl(&f, &["diff", "-f", "-"], Some(&config_map("6"))).await;
    assert!(!ok, "differences found: {out} {err}");
    assert!(
        out.contains("-  a: \"1\"") && out.contains("+  a: \"6\""),
        "{out} {err}"
    );
    let (ok, out, err) = kubectl(&f, &["diff", "-f", "-"], Some(&config_map("1"))).await;
    assert!(ok, "no differences: {out} {err}");

    // Deletes, the namespace's included (whose deletion would empty it).
    for args in [
        &[
            "delete",
            "configmap",
            "dry",
            "-n",
            "team",
            "--dry-run=server",
        ][..],
        &["delete", "namespace", "team", "--dry-run=server"],
    ] {
        let (ok, out, err) = kubectl(&f, args, None).await;
        assert!(ok && out.contains("(server dry run)"), "{out} {err}");
    }

    assert_eq!(newest_version(&f).await, before, "nothing was written");
    let (ok, out, err) = kubectl(
        &f,
        &["get", "configmap", "dry", "-n", "team", "-o", "json"],
        None,
    )
    .await;
    assert!(ok, "{err}");
    let stored: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stored["data"], serde_json::json!({"a": "1"}));
    assert!(stored["metadata"]["labels"].is_null(), "{stored}");
    assert!(
        stored["metadata"]["deletionTimestamp"].is_null(),
        "{stored}"
    );
    let (ok, out, err) = kubectl(
        &f,
        &["get", "namespace", "team", "-o", "jsonpath={.status.phase}"],
        None,
    )
    .await;
    assert!(ok && out == "Active", "{out} {err}");

    // The same commands for real change what the dry runs showed.
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&config_map("2"))).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &f,
        &[
            "get",
            "configmap",
            "dry",
            "-n",
            "team",
            "-o",
            "jsonpath={.data.a}",
        ],
        None,
    )
    .await;
    assert!(ok && out == "2", "{out} {err}");
    assert_ne!(newest_version(&f).await, before);
}

/// The dry runs kubectl does not make, through kube-rs: a delete that only marks (finalizers),
/// a delete-collection, and a server-side apply that would create.
#[tokio::test]
async fn dry_runs_of_marking_deletes_collections_and_creating_applies_store_nothing() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
    let f = start().await;
    let kubeconfig = kube::config::Kubeconfig::read_from(&f.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let maps: kube::Api<ConfigMap> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let held: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "held", "labels": {"set": "a"}, "finalizers": ["example.com/keep"]},
    }))
    .unwrap();
    let held = maps.create(&PostParams::default(), &held).await.unwrap();
    let before = newest_version(&f).await;

    let marked = maps
        .delete("held", &DeleteParams::default().dry_run())
        .await
        .unwrap()
        .left()
        .expect("a delete that marks answers the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(
        marked.metadata.resource_version, held.metadata.resource_version,
        "the version it has"
    );
    let listed = maps
        .delete_collection(
            &DeleteParams::default().dry_run(),
            &ListParams::default().labels("set=a"),
        )
        .await
        .unwrap()
        .left()
        .expect("the objects as they would be");
    assert_eq!(listed.items.len(), 1);
    assert!(listed.items[0].metadata.deletion_timestamp.is_some());
    let applied = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "applied"}, "data": {"a": "1"},
    });
    let would_be = maps
        .patch(
            "applied",
            &PatchParams::apply("tester").dry_run(),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    assert_eq!(would_be.data.unwrap()["a"], "1");
    assert_eq!(
        would_be.metadata.resource_version, None,
        "a new object has none"
    );

    assert_eq!(newest_version(&f).await, before, "nothing was written");
    assert!(maps.get_opt("applied").await.unwrap().is_none());
    let kept = maps.get("held").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
}
