//! Every acknowledged write and nothing else, across a full disk, refused objects,
//! compactions and restarts; private files.

use super::*;

/// POSTs a JSON body.
async fn post_json(client: &kube::Client, path: &str, body: &Value) -> (u16, String) {
    raw(
        client,
        "POST",
        path,
        "application/json",
        body.to_string().into_bytes(),
        "t",
    )
    .await
}

/// DELETEs a path without a body.
async fn delete_path(client: &kube::Client, path: &str) -> (u16, String) {
    raw(client, "DELETE", path, "application/json", Vec::new(), "t").await
}

#[tokio::test]
async fn a_failed_log_write_is_never_visible_and_later_writes_are_refused_until_restart() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("small");
    std::fs::create_dir(&dir).unwrap();
    // A full disk is a 2 MiB tmpfs: the tests run as root (as CI does); without the right to
    // mount one this test fails, it does not pass without running.
    let _tmpfs = Tmpfs::mount(&dir, "2m")
        .expect("mounting a tmpfs is not permitted here: run the tests as root (CAP_SYS_ADMIN)");
    let data = dir.join("data");
    let s = start(durable(&data)).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let payload = "x".repeat(200 * 1024);
    let mut acknowledged = Vec::new();
    let mut failed = None;
    for i in 0..40 {
        let name = format!("fill{i}");
        match api
            .create(&PostParams::default(), &cm(&name, &payload))
            .await
        {
            Ok(_) => acknowledged.push(name),
            Err(kube::Error::Api(status)) => {
                assert!(status.code >= 500, "{status:?}");
                failed = Some(name);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let failed = failed.expect("the 2 MiB disk never filled");
    assert!(!acknowledged.is_empty());
    // Not visible, not a conflict on retry, and every later write is refused with 503.
    assert!(api.get_opt(&failed).await.unwrap().is_none());
    let retry = api
        .create(&PostParams::default(), &cm(&failed, "small"))
        .await
        .unwrap_err();
    assert!(
        matches!(retry, kube::Error::Api(ref s) if s.code == 503),
        "{retry:?}"
    );
    let (code, body) = raw(&s.client, "GET", "/readyz", "text/plain", Vec::new(), "t").await;
    assert_ne!(code, 200, "readyz: {body}");
    // After a restart (with room again) exactly the acknowledged objects are there.
    assert_eq!(names(&api).await, sorted(acknowledged.clone()));
    let copy = root.path().join("copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let _ = s.stop.send(());
    s.server.join().await;
    let s = start(durable(&copy)).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    assert_eq!(names(&api).await, sorted(acknowledged));
    api.create(&PostParams::default(), &cm(&failed, "small"))
        .await
        .unwrap();
}

/// Names of the config maps, in the server's (sorted) order.
async fn names(api: &Api<ConfigMap>) -> Vec<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = json!({ "n": v });
    }
    v
}

#[tokio::test]
async fn deeply_nested_objects_are_refused_and_later_writes_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let path = "/api/v1/namespaces/default/configmaps";
    let deep = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "extra": nested(125)});
    let (code, message) = post_json(&s.client, path, &deep).await;
    assert_eq!(code, 400, "{message}");
    assert!(message.contains("nested"), "{message}");
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok"}, "extra": nested(90)});
    let (code, message) = post_json(&s.client, path, &ok).await;
    assert_eq!(code, 200, "{message}");
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &cm("later", "v"))
        .await
        .unwrap();
    // A merge patch cannot nest an object past the limit either.
    let patch = json!({"extra": nested(105)});
    let err = api
        .patch("ok", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400),
        "{err:?}"
    );
    let s = restart(s, dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    assert!(api.get_opt("ok").await.unwrap().is_some());
    assert!(api.get_opt("later").await.unwrap().is_some());
}

#[tokio::test]
async fn versions_increase_across_restarts_and_a_list_from_the_future_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let mut seen = 0u64;
    for i in 0..5 {
        let c = api
            .create(&PostParams::default(), &cm(&format!("a{i}"), "v"))
            .await
            .unwrap();
        seen = seen.max(c.metadata.resource_version.unwrap().parse().unwrap());
        api.delete(&format!("a{i}"), &Default::default())
            .await
            .unwrap();
    }
    let listed = list_rv(&api).await;
    seen = seen.max(listed);
    let s = restart(s, dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let after = api
        .create(&PostParams::default(), &cm("b", "v"))
        .await
        .unwrap();
    let rv: u64 = after.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > seen, "{rv} after {seen}");
    let future = rv + 1000;
    let (code, message) = raw(
        &s.client,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?resourceVersion={future}"),
        "application/json",
        Vec::new(),
        "t",
    )
    .await;
    assert_eq!(code, 504, "{message}");
    assert!(message.contains("Too large resource version"), "{message}");
    // A watch from there stays open, as kube-apiserver's does, and ends at its timeout with
    // nothing to pass on.
    let (code, events) = raw(
        &s.client,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={future}&timeoutSeconds=1"
        ),
        "application/json",
        Vec::new(),
        "t",
    )
    .await;
    assert_eq!((code, events.as_str()), (200, ""));
}

#[tokio::test]
async fn the_data_directory_and_every_file_in_it_are_private() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let s = start(apiserver::Config {
        kubeconfig_path: Some(dir.join("kubeconfig")),
        ..durable(&dir)
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &cm("c", "v"))
        .await
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        files += 1;
    }
    assert!(
        files >= 4,
        "token, certificate, key, kubeconfig and the log: {files}"
    );
}

/// An object larger than etcd stores (1.5 MiB as kube-apiserver stores it: protobuf for
/// built-in kinds) is refused as kube-apiserver refuses it, by create and by update, and
/// nothing of it is kept.
#[tokio::test]
async fn objects_larger_than_etcd_stores_are_refused() {
    let s = start(apiserver::Config::default()).await;
    let client = client_for(&s.server, true).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let big = "x".repeat(1600 * 1024);
    let err = configmaps
        .create(&PostParams::default(), &cm("big", &big))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 500 && st.message == "etcdserver: request is too large"),
        "{err:?}"
    );
    assert!(configmaps.get_opt("big").await.unwrap().is_none());
    // Just under the limit is fine, and growing it past the limit by an update is refused.
    let fits = "x".repeat(1400 * 1024);
    configmaps
        .create(&PostParams::default(), &cm("grows", &fits))
        .await
        .unwrap();
    let patch = json!({"data": {"more": "y".repeat(200 * 1024)}});
    let err = configmaps
        .patch("grows", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 500),
        "{err:?}"
    );
    // A Secret's data is base64 in JSON (1.87 MiB here) but raw bytes in etcd (1.4 MiB).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "default");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "binary"},
        "data": {"blob": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![7u8; 1400 * 1024])},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// The log is compacted into a snapshot as it grows; a restart reads the snapshot and the log
/// after it and sees exactly the acknowledged objects (with a small threshold, many
/// compactions happen during the run).
#[tokio::test]
async fn a_compacted_log_restarts_to_exactly_the_acknowledged_objects() {
    let dir = tempfile::tempdir().unwrap();
    let config = |dir: &Path| apiserver::Config {
        data_dir: Some(dir.to_path_buf()),
        log: durable_log::Options {
            compact_min_bytes: 16 * 1024,
            ..durable_log::Options::default()
        },
        ..Default::default()
    };
    let s = start(config(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..300 {
        let name = format!("cm-{i}");
        api.create(&PostParams::default(), &cm(&name, &"x".repeat(200)))
            .await
            .unwrap();
        expected.insert(name.clone(), "x".repeat(200));
        if i % 3 == 0 {
            api.delete(&name, &Default::default()).await.unwrap();
            expected.remove(&name);
        } else if i % 3 == 1 {
            let patch = json!({"data": {"k": format!("updated-{i}")}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            expected.insert(name, format!("updated-{i}"));
        }
    }
    let files = durable_log::files::list(dir.path()).unwrap();
    assert!(
        files.snapshots.last().copied().unwrap_or(0) > 0,
        "the log was compacted"
    );
    let _ = s.stop.send(());
    s.server.join().await;
    let s = start(config(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let found: std::collections::BTreeMap<String, String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.data.unwrap_or_default().remove("k").unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(found, expected);
}

/// A CustomResourceDefinition a DELETE marked before a restart still goes once its last
/// custom resource does: the cleanup starts again with the server.
#[tokio::test]
async fn a_definition_being_deleted_at_a_restart_goes_once_its_last_custom_resource_does() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let definitions = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let definition = format!("{definitions}/gadgets.example.volstack.dev");
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.volstack.dev"},
        "spec": {"group": "example.volstack.dev", "scope": "Cluster",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let (code, message) = post_json(&s.client, definitions, &crd).await;
    assert_eq!(code, 200, "{message}");
    let held = json!({"apiVersion": "example.volstack.dev/v1", "kind": "Gadget",
        "metadata": {"name": "held", "finalizers": ["example.volstack.dev/hold"]}});
    let (code, message) =
        post_json(&s.client, "/apis/example.volstack.dev/v1/gadgets", &held).await;
    assert_eq!(code, 200, "{message}");
    let (code, message) = delete_path(&s.client, &definition).await;
    assert_eq!(code, 200, "{message}");

    let s = restart(s, dir.path()).await;
    let (code, body) = raw(
        &s.client,
        "GET",
        &definition,
        "application/json",
        Vec::new(),
        "t",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let marked: Value = serde_json::from_str(&body).unwrap();
    assert!(
        !marked["metadata"]["deletionTimestamp"].is_null(),
        "{marked}"
    );
    release_then_gone(
        &s,
        "/apis/example.volstack.dev/v1/gadgets/held",
        &definition,
    )
    .await;
}

/// Takes the finalizers off the object at `held`, then waits (30 s at most) until `path` is
/// gone.
async fn release_then_gone(s: &Server, held: &str, path: &str) {
    let (code, message) = raw(
        &s.client,
        "PATCH",
        held,
        "application/merge-patch+json",
        br#"{"metadata":{"finalizers":null}}"#.to_vec(),
        "t",
    )
    .await;
    assert_eq!(code, 200, "{message}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = raw(&s.client, "GET", path, "application/json", Vec::new(), "t").await;
        if code == 404 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} is still there: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A namespace being deleted at a restart is still emptied and removed once its last object's
/// finalizer comes off: the deletion starts again with the server.
#[tokio::test]
async fn a_namespace_being_deleted_at_a_restart_goes_once_its_last_object_does() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let (code, message) = post_json(
        &s.client,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "leaving"}}),
    )
    .await;
    assert_eq!(code, 200, "{message}");
    let held = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": ["example.volstack.dev/hold"]}});
    let (code, message) =
        post_json(&s.client, "/api/v1/namespaces/leaving/configmaps", &held).await;
    assert_eq!(code, 200, "{message}");
    let namespace = "/api/v1/namespaces/leaving";
    let (code, message) = delete_path(&s.client, namespace).await;
    assert_eq!(code, 200, "{message}");

    let s = restart(s, dir.path()).await;
    release_then_gone(&s, "/api/v1/namespaces/leaving/configmaps/held", namespace).await;
}
