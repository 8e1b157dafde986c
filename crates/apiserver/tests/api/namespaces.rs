//! Namespaces: their deletion cascades, is kept at while finalizers hold their contents, and
//! ends as kube-apiserver's does (the `kubernetes` finalizer, the `finalize` subresource).

use super::*;

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
/// subresource (update only); a namespace whose spec holds no finalizer is marked by its first
/// DELETE and goes at the next, its contents left, as in kube-apiserver.
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

    // Finalized while active (a name neither standard nor qualified is refused, as there),
    // then deleted: marked by the first DELETE, gone at the next, its contents left behind.
    namespaces
        .create(&PostParams::default(), &body("bare", json!([])))
        .await
        .unwrap();
    let bare: Api<ConfigMap> = Api::namespaced(client.clone(), "bare");
    bare.create(&PostParams::default(), &cm("left"))
        .await
        .unwrap();
    let refused = namespaces
        .replace_subresource(
            "finalize",
            "bare",
            &PostParams::default(),
            &body("bare", json!(["foo"])),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("spec.finalizers[0]: Invalid value: \"foo\": name is neither a standard finalizer name nor is it fully qualified")),
        "{refused:?}"
    );
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
    let marked = namespaces.get("bare").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    namespaces
        .delete("bare", &DeleteParams::default())
        .await
        .unwrap();
    assert!(namespaces.get_opt("bare").await.unwrap().is_none());
    assert!(bare.get_opt("left").await.unwrap().is_some());
}
