//! Objects: what the server sets, checks and keeps on create, update and delete.

use super::*;

#[tokio::test]
async fn crud_sets_metadata_and_enforces_optimistic_concurrency() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    let err = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    let mut changed = created.clone();
    changed.data = Some(BTreeMap::from([("k".to_string(), "w".to_string())]));
    let replaced = api
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = replaced
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    let stale = api
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{stale:?}"
    );

    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["x"], "1");
    let json_patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/k", "value": "z"}]))
            .unwrap();
    let patched = api
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(json_patch))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "z");
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"annotations": {"s": "t"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.annotations.unwrap()["s"], "t");

    api.delete("a", &DeleteParams::default()).await.unwrap();
    let gone = api.get("a").await.unwrap_err();
    assert!(matches!(gone, kube::Error::Api(ref s) if s.code == 404 && s.reason == "NotFound"));
}

#[tokio::test]
async fn generate_name_selectors_and_paging() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..7 {
        let mut c: ConfigMap = serde_json::from_value(json!({"metadata": {"generateName": "gen-", "labels": {"i": i.to_string(), "even": (i % 2 == 0).to_string()}}})).unwrap();
        c = api.create(&PostParams::default(), &c).await.unwrap();
        assert!(c.metadata.name.unwrap().starts_with("gen-"));
    }
    assert_eq!(
        api.list(&ListParams::default().labels("even=true"))
            .await
            .unwrap()
            .items
            .len(),
        4
    );
    assert_eq!(
        api.list(&ListParams::default().labels("i in (1,2,3)"))
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    let first = api.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().unwrap();
    let second = api
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 4);
    let bad = api
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
        .unwrap_err();
    assert!(matches!(bad, kube::Error::Api(ref s) if s.code == 400));
}

#[tokio::test]
async fn defaults_validation_and_immutability_follow_kube_apiserver() {
    let (_server, client, _stop) = start(None).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let c = claims
        .create(&PostParams::default(), &pvc("c"))
        .await
        .unwrap();
    assert_eq!(
        c.spec.as_ref().unwrap().volume_mode.as_deref(),
        Some("Filesystem")
    );
    assert_eq!(c.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    let mut changed = c.clone();
    changed.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    let err = claims
        .replace("c", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("spec")),
        "{err:?}"
    );
    let bad: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "Bad_Name"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})).unwrap();
    let err = claims
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("metadata.name")),
        "{err:?}"
    );
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "sc"}, "provisioner": "p"})).unwrap();
    let sc = classes.create(&PostParams::default(), &sc).await.unwrap();
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}})).unwrap();
    let pv = pvs.create(&PostParams::default(), &pv).await.unwrap();
    assert_eq!(
        pv.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    let missing_ns: Api<ConfigMap> = Api::namespaced(client, "nowhere");
    let err = missing_ns
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_status_subresource_splits_spec_and_status() {
    let (_server, client, _stop) = start(None).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let mut c = claims
        .create(&PostParams::default(), &pvc("s"))
        .await
        .unwrap();
    c.status.as_mut().unwrap().phase = Some("Bound".into());
    c.metadata.labels = Some(BTreeMap::from([("kept".to_string(), "yes".to_string())]));
    c.spec.as_mut().unwrap().volume_name = Some("ignored".into());
    let after = claims
        .replace_status("s", &PostParams::default(), &c)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Bound")
    );
    // kube-apiserver v1.36.2 keeps a claim's status write's labels and ignores its spec.
    assert_eq!(
        after.metadata.labels,
        Some(BTreeMap::from([("kept".to_string(), "yes".to_string())])),
        "metadata changes are kept on /status"
    );
    assert_eq!(after.spec.as_ref().unwrap().volume_name, None);
    let mut main = after.clone();
    main.status.as_mut().unwrap().phase = Some("Lost".into());
    let after = claims
        .replace("s", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        after.status.unwrap().phase.as_deref(),
        Some("Bound"),
        "status changes are ignored on the main resource"
    );
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("f", &DeleteParams::default()).await.unwrap();
    let held = api.get("f").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get("f").await.is_err(), "gone with the last finalizer");
    let precondition = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm("p")).await.unwrap();
    let err = api.delete("p", &precondition).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409));
}

#[tokio::test]
async fn secret_string_data_is_merged_into_data_and_never_stored() {
    use k8s_openapi::api::core::v1::Secret;
    let (_server, client, _stop) = start(None).await;
    let api: Api<Secret> = Api::namespaced(client, "default");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s1"},
        "data": {"kept": "a2VwdA==", "p": "b2xk"},
        "stringData": {"p": "q"}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &secret).await.unwrap();
    assert!(created.string_data.is_none());
    let data = created.data.unwrap();
    assert_eq!(data["p"].0, b"q", "stringData wins over data");
    assert_eq!(data["kept"].0, b"kept");
    let patched = api
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"new": "value"}})),
        )
        .await
        .unwrap();
    assert!(patched.string_data.is_none());
    assert_eq!(patched.data.unwrap()["new"].0, b"value");
    let read = api.get("s1").await.unwrap();
    assert!(read.string_data.is_none());
    assert_eq!(read.data.unwrap().len(), 3);
}

#[tokio::test]
async fn a_pod_is_bound_to_a_node_once_through_its_binding_subresource() {
    let (_server, client, _stop) = start(None).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let binding = |node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    // A dry run answers as the binding would and assigns nothing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let status: serde_json::Value = pods
        .create_subresource("binding", "web", &dry, &binding("node-1"))
        .await
        .unwrap();
    assert_eq!(status["status"], "Success");
    let unbound = pods.get("web").await.unwrap();
    assert_eq!(unbound.spec.unwrap().node_name, None);
    let status: serde_json::Value = pods
        .create_subresource("binding", "web", &PostParams::default(), &binding("node-2"))
        .await
        .unwrap();
    assert_eq!(status["status"], "Success");
    let bound = pods.get("web").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-2"));
    let conditions = bound.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );
    // Assigned once: a second binding is a conflict; a missing pod is 404; a bad body 422.
    let again = pods
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "web",
            &PostParams::default(),
            &binding("node-3"),
        )
        .await;
    assert!(
        matches!(again, Err(kube::Error::Api(s)) if s.code == 409 && s.message.contains("already assigned to node \"node-2\""))
    );
    let missing = pods
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "nope",
            &PostParams::default(),
            &json!({"metadata": {"name": "nope"}, "target": {"name": "node-1"}}),
        )
        .await;
    assert!(matches!(missing, Err(kube::Error::Api(s)) if s.code == 404));
    let empty = pods
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "web",
            &PostParams::default(),
            &json!({"target": {}}),
        )
        .await;
    assert!(matches!(empty, Err(kube::Error::Api(s)) if s.code == 422));
}
