//! The server driven by kube-rs, the client our controllers use.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

async fn start(
    data_dir: Option<std::path::PathBuf>,
) -> (
    apiserver::RunningServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with(apiserver::Config {
        data_dir,
        ..Default::default()
    })
    .await
}

async fn start_with(
    config: apiserver::Config,
) -> (
    apiserver::RunningServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(config, async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let client = client_for(&server).await;
    (server, client, tx)
}

async fn client_for(server: &apiserver::RunningServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn pvc(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()
}

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
    c.metadata.labels = Some(BTreeMap::from([("ignored".to_string(), "yes".to_string())]));
    let after = claims
        .replace_status("s", &PostParams::default(), &c)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Bound")
    );
    assert!(
        after.metadata.labels.is_none(),
        "metadata changes are ignored on /status"
    );
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
async fn watches_resume_and_old_versions_are_gone() {
    let (_server, client, tx) = start_with(apiserver::Config {
        history: 5,
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = api.create(&PostParams::default(), &cm("w0")).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    api.create(&PostParams::default(), &cm("w1")).await.unwrap();
    api.delete("w0", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", c.metadata.name.unwrap())),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", c.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED w1", "DELETED w0"]);
    for i in 2..12 {
        api.create(&PostParams::default(), &cm(&format!("w{i}")))
            .await
            .unwrap();
    }
    let old = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    futures::pin_mut!(old);
    match old.next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    let _ = tx.send(());
}

#[tokio::test]
async fn kube_runtime_watchers_see_everything_with_plain_and_streaming_lists() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    for config in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ] {
        let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
        let stream = watcher(api.clone(), config)
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        reader.wait_until_ready().await.unwrap();
        let name = format!("after-{}", rand_suffix());
        api.create(&PostParams::default(), &cm(&name))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while reader
            .state()
            .iter()
            .all(|c| c.metadata.name.as_deref() != Some(name.as_str()))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "reflector never saw {name}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            reader
                .state()
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some("before"))
        );
        task.abort();
    }
}

fn rand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000
    )
}

#[tokio::test]
async fn namespace_deletion_cascades() {
    let (_server, client, _stop) = start(None).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
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
async fn acknowledged_writes_survive_a_restart_and_versions_keep_increasing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut last = 0u64;
    for i in 0..20 {
        let c = api
            .create(&PostParams::default(), &cm(&format!("d{i}")))
            .await
            .unwrap();
        last = c.metadata.resource_version.unwrap().parse().unwrap();
    }
    let _ = stop.send(());
    server.join().await;
    let (_server, client, _stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        20
    );
    let next = api
        .create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    let rv: u64 = next.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > last, "resourceVersion {rv} must continue after {last}");
}

#[tokio::test]
async fn requests_need_the_token() {
    let (server, _client, _stop) = start(None).await;
    let kc = server.kubeconfig().replace(server.token(), "wrong-token");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kc).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let bad = kube::Client::try_from(config).unwrap();
    let err = Api::<ConfigMap>::namespaced(bad, "default")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 401),
        "{err:?}"
    );
}

#[tokio::test]
async fn faults_switch_on_and_off_and_close_watches() {
    use apiserver::faults::FaultRule;
    let (server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rule = |verb: &str, error: Option<u16>, latency_ms: u64| FaultRule {
        resource: "configmaps".into(),
        verb: verb.into(),
        latency_ms,
        error,
        probability: 1.0,
    };
    server.set_faults(vec![rule("CREATE", Some(500), 0)]);
    let err = api
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 500),
        "{err:?}"
    );
    server.set_faults(vec![rule("CREATE", Some(409), 0)]);
    let err = api
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );
    server.set_faults(vec![rule("LIST", None, 300)]);
    let started = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.set_faults(Vec::new());
    api.create(&PostParams::default(), &cm("x")).await.unwrap();

    // 429 carries Retry-After, as kube-apiserver's.
    server.set_faults(vec![rule("GET", Some(429), 0)]);
    let out = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            &format!("Authorization: Bearer {}", server.token()),
            &format!("{}/api/v1/namespaces/default/configmaps/x", server.url()),
        ])
        .output()
        .await
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(
        headers.contains(" 429") && headers.contains("retry-after: 1"),
        "{headers}"
    );
    server.set_faults(Vec::new());

    // Closing watches ends open streams.
    let stream = api
        .watch(&WatchParams::default().timeout(60), "0")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first, WatchEvent::Added(_)));
    server.close_watches(Some("configmaps"));
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch was closed");
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
async fn a_watch_with_a_label_selector_sees_objects_enter_and_leave_it() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let stream = api
        .watch(&WatchParams::default().labels("team=a"), "0")
        .await
        .unwrap();
    let mut stream = Box::pin(stream);
    let labelled: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "m", "labels": {"team": "a"}}}))
            .unwrap();
    api.create(&PostParams::default(), &labelled).await.unwrap();
    let relabel = |team: &str| Patch::Merge(json!({"metadata": {"labels": {"team": team}}}));
    api.patch("m", &PatchParams::default(), &relabel("b"))
        .await
        .unwrap();
    // Changes while outside the selector are not sent.
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    api.patch("m", &PatchParams::default(), &relabel("a"))
        .await
        .unwrap();
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch event")
            .unwrap()
            .unwrap();
        match event {
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED", "DELETED", "ADDED", "DELETED"]);
}

/// Pages of a list come from one snapshot: what changes between pages does not show, and a
/// token older than the history is 410 Expired.
#[tokio::test]
async fn continue_tokens_page_through_one_snapshot_or_expire() {
    let (_server, client, tx) = start_with(apiserver::Config {
        history: 20,
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let names = |l: &kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    };
    assert_eq!(names(&first), ["c0", "c1"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    // Between pages: one not yet listed is deleted, one is added, one is changed.
    api.delete("c3", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("c25"))
        .await
        .unwrap();
    let mut changed = api.get("c2").await.unwrap();
    changed.data = Some(BTreeMap::from([("changed".to_string(), "yes".to_string())]));
    api.replace("c2", &PostParams::default(), &changed)
        .await
        .unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["c2", "c3"]);
    assert!(
        !second.items[0]
            .data
            .as_ref()
            .unwrap()
            .contains_key("changed"),
        "the snapshot's c2, not today's"
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let third = api
        .list(&ListParams::default().continue_token(second.metadata.continue_.as_deref().unwrap()))
        .await
        .unwrap();
    assert_eq!(names(&third), ["c4"]);
    assert!(third.metadata.continue_.is_none());
    // Enough changes to push the snapshot out of the history: the token expires.
    for round in 0..30 {
        let mut c = api.get("c0").await.unwrap();
        c.data = Some(BTreeMap::from([("round".to_string(), round.to_string())]));
        api.replace("c0", &PostParams::default(), &c).await.unwrap();
    }
    let err = api
        .list(&ListParams::default().continue_token(&token))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );
    let err = api
        .list(&ListParams::default().continue_token("not-a-token"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );
    let _ = tx.send(());
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

/// Runs `each(0)`, ..., `each(n - 1)` as tasks at once and waits for all; their outputs in
/// that order (a panic in one fails the test).
async fn all_at_once<F, Fut>(n: usize, each: F) -> Vec<Fut::Output>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let tasks = (0..n).map(|w| tokio::spawn(each(w)));
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// That `data` holds `value` under each of `<prefix>0` to `<prefix>{n-1}`.
fn assert_every_key(data: &BTreeMap<String, String>, prefix: &str, n: usize, value: &str) {
    for w in 0..n {
        let key = format!("{prefix}{w}");
        assert_eq!(data.get(&key).map(String::as_str), Some(value), "{data:?}");
    }
}

/// Concurrent updates: those that name no resourceVersion all succeed, each on the version
/// it replaces; of those that name the same one, one wins and the others get a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_with_and_without_resource_versions() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("u")).await.unwrap();
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..10 {
                let mut c = cm("u");
                c.data = Some(BTreeMap::from([("k".to_string(), format!("{w}-{i}"))]));
                api.replace("u", &PostParams::default(), &c).await.unwrap();
            }
        }
    })
    .await;
    // With resourceVersions: of two updates from one version, one wins.
    let read = api.get("u").await.unwrap();
    let results = all_at_once(8, |w| {
        let (api, mut c) = (api.clone(), read.clone());
        c.data = Some(BTreeMap::from([("k".to_string(), format!("rv-{w}"))]));
        async move { api.replace("u", &PostParams::default(), &c).await }
    })
    .await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, kube::Error::Api(s) if s.code == 409)),
        "{results:?}"
    );
    let last = api.get("u").await.unwrap();
    let winner = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
    assert_eq!(last.data, winner.data);
}

/// Patches and server-side applies that name no resourceVersion apply to the newest version,
/// durable or not: many at once on one object all succeed (kube-apiserver retries them; none
/// is a conflict). Before, they read the durable version while the write checked the newest,
/// and most failed with "the object keeps changing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_without_a_resource_version_all_apply() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client, _stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("p")).await.unwrap();
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..10 {
                let patch = json!({"data": {format!("k{w}"): format!("{i}")}});
                api.patch("p", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        }
    })
    .await;
    assert_every_key(&api.get("p").await.unwrap().data.unwrap(), "k", 16, "9");
    // Server-side applies by as many field managers, each of its own key, the same.
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..5 {
                let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "p"}, "data": {format!("a{w}"): format!("{i}")}});
                let params = PatchParams::apply(&format!("manager-{w}"));
                api.patch("p", &params, &Patch::Apply(&config))
                    .await
                    .unwrap();
            }
        }
    })
    .await;
    assert_every_key(&api.get("p").await.unwrap().data.unwrap(), "a", 16, "4");
}
