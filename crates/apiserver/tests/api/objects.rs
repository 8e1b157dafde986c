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
async fn namespace_deletion_cascades() {
    let (_server, client, _stop) = start(None).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    // As kube-apiserver's NamespaceLifecycle admission: these three are kept.
    for kept in ["default", "kube-system", "kube-public"] {
        let refused = namespaces
            .delete(kept, &DeleteParams::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 403
                && s.message == format!("namespaces \"{kept}\" is forbidden: this namespace may not be deleted")),
            "{refused}"
        );
        let ns = namespaces.get(kept).await.unwrap();
        assert!(ns.metadata.deletion_timestamp.is_none(), "{kept}");
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    api.create(&PostParams::default(), &cm("inside"))
        .await
        .unwrap();
    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while namespaces.get("team").await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(api.get("inside").await.is_err());
}

#[tokio::test]
async fn a_namespace_deleted_again_and_again_is_finished_by_one_task() {
    let (server, client, _stop) = start(None).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "held"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "held");
    let mut kept = cm("kept");
    kept.metadata.finalizers = Some(vec!["test/hold".into()]);
    api.create(&PostParams::default(), &kept).await.unwrap();
    // Each delete of the Terminating namespace answers; one task works on its contents.
    for _ in 0..20 {
        namespaces
            .delete("held", &DeleteParams::default())
            .await
            .unwrap();
    }
    assert_eq!(server.finishing_namespaces(), (vec!["held".to_string()], 1));
    // The finalizer gone, the namespace goes and its task ends.
    api.patch(
        "kept",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while namespaces.get_opt("held").await.unwrap().is_some()
        || !server.finishing_namespaces().0.is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the namespace stays"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A namespace held by an object's finalizer for minutes is still emptied and removed once the
/// finalizer goes (the task used to give up after two minutes); taking the namespace's own
/// finalizer off meanwhile does not remove it (its `kubernetes` finalizer holds it until it is
/// empty); an emptied namespace is finalized and kept by its own finalizer until that goes.
/// Paused time, an in-process client.
#[tokio::test(start_paused = true)]
async fn a_namespace_held_for_minutes_goes_once_its_finalizers_go() {
    let (server, _network, _stop) = start(None).await;
    let client = kube::Client::new(server.local_service("held-test/1.0").unwrap(), "default");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let held_by = |name: &str| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "finalizers": ["test/ns-hold"]}}))
            .unwrap()
    };
    let unhold = || Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let gone = |name: &'static str| {
        let (namespaces, server) = (namespaces.clone(), &server);
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while namespaces.get_opt(name).await.unwrap().is_some()
                || !server.finishing_namespaces().0.is_empty()
            {
                assert!(tokio::time::Instant::now() < deadline, "{name} stays");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    namespaces
        .create(&PostParams::default(), &held_by("long"))
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "long");
    let mut kept = cm("kept");
    kept.metadata.finalizers = Some(vec!["test/hold".into()]);
    api.create(&PostParams::default(), &kept).await.unwrap();
    namespaces
        .delete("long", &DeleteParams::default())
        .await
        .unwrap();
    // Ten minutes of (paused) time: the object is marked, the namespace still Terminating and
    // its task still at work.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let held = api.get("kept").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let phase = namespaces
        .get("long")
        .await
        .unwrap()
        .status
        .and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Terminating"));
    assert_eq!(server.finishing_namespaces().0, vec!["long".to_string()]);
    // Its own finalizer off while the object is held: still there, held by `kubernetes`.
    namespaces
        .patch("long", &PatchParams::default(), &unhold())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let left = namespaces.get("long").await.unwrap();
    let finalizers = left.spec.and_then(|s| s.finalizers);
    assert_eq!(finalizers, Some(vec!["kubernetes".to_string()]));
    assert_eq!(server.finishing_namespaces().0, vec!["long".to_string()]);
    // The object's finalizer gone, the object goes, then the namespace, and its task ends.
    api.patch("kept", &PatchParams::default(), &unhold())
        .await
        .unwrap();
    gone("long").await;

    // Empty and held by its own finalizer: finalized, then kept until that goes.
    namespaces
        .create(&PostParams::default(), &held_by("own"))
        .await
        .unwrap();
    namespaces
        .delete("own", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let own = namespaces.get("own").await.unwrap();
        assert!(own.metadata.deletion_timestamp.is_some());
        let finalized = own
            .spec
            .and_then(|s| s.finalizers)
            .is_none_or(|f| f.is_empty());
        if finalized && server.finishing_namespaces().0.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "own is not finalized"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An update keeps it finalized (the `kubernetes` finalizer does not come back).
    let labelled = namespaces
        .patch(
            "own",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    assert!(
        labelled
            .spec
            .and_then(|s| s.finalizers)
            .is_none_or(|f| f.is_empty())
    );
    namespaces
        .patch("own", &PatchParams::default(), &unhold())
        .await
        .unwrap();
    gone("own").await;
}

/// A namespace held by a finalizer of its spec besides `kubernetes` is emptied and finalized,
/// then waits for whoever owns that finalizer to take it off through the `finalize`
/// subresource (update only); a namespace whose spec holds no finalizer goes at once when
/// deleted, its contents left, as in kube-apiserver.
#[tokio::test]
async fn a_namespace_held_by_another_spec_finalizer_waits_for_finalize() {
    let (_server, client, _stop) = start(None).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = |name: &str, finalizers: serde_json::Value| -> Namespace {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"finalizers": finalizers}}),
        )
        .unwrap()
    };
    let finalizers = |ns: &Namespace| {
        ns.spec
            .clone()
            .and_then(|s| s.finalizers)
            .unwrap_or_default()
    };
    let made = namespaces
        .create(
            &PostParams::default(),
            &body("other", json!(["example.com/x"])),
        )
        .await
        .unwrap();
    assert_eq!(finalizers(&made), vec!["example.com/x", "kubernetes"]);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    maps.create(&PostParams::default(), &cm("inside"))
        .await
        .unwrap();
    namespaces
        .delete("other", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ns = namespaces.get("other").await.unwrap();
        if finalizers(&ns) == vec!["example.com/x"]
            && maps.get_opt("inside").await.unwrap().is_none()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not emptied and finalized: {ns:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only an update: a GET of the subresource is refused.
    let read = namespaces
        .get_subresource("finalize", "other")
        .await
        .unwrap_err();
    assert!(
        matches!(read, kube::Error::Api(ref s) if s.code == 405),
        "{read:?}"
    );
    namespaces
        .replace_subresource(
            "finalize",
            "other",
            &PostParams::default(),
            &body("other", json!([])),
        )
        .await
        .unwrap();
    assert!(namespaces.get_opt("other").await.unwrap().is_none());

    // Finalized while active, then deleted: gone at once, its contents left behind.
    namespaces
        .create(&PostParams::default(), &body("bare", json!([])))
        .await
        .unwrap();
    let bare: Api<ConfigMap> = Api::namespaced(client.clone(), "bare");
    bare.create(&PostParams::default(), &cm("left"))
        .await
        .unwrap();
    let finalized = namespaces
        .replace_subresource(
            "finalize",
            "bare",
            &PostParams::default(),
            &body("bare", json!([])),
        )
        .await
        .unwrap();
    assert!(finalizers(&finalized).is_empty());
    assert!(finalized.metadata.deletion_timestamp.is_none());
    namespaces
        .delete("bare", &DeleteParams::default())
        .await
        .unwrap();
    assert!(namespaces.get_opt("bare").await.unwrap().is_none());
    assert!(bare.get_opt("left").await.unwrap().is_some());
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
