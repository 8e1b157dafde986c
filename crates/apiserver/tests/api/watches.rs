//! Watches and paged lists.

use super::*;

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

/// A watch from a version the server has not reached stays open, as kube-apiserver keeps it
/// (there, for as long as its timeout), and passes on only the changes after that version.
#[tokio::test]
async fn a_watch_from_a_future_version_waits_for_the_changes_after_it() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let made = api.create(&PostParams::default(), &cm("f0")).await.unwrap();
    let now: u64 = made.metadata.resource_version.unwrap().parse().unwrap();
    let from = now + 2;
    let stream = api
        .watch(&WatchParams::default().timeout(60), &from.to_string())
        .await
        .unwrap();
    futures::pin_mut!(stream);
    // Written one after another until one is past the version asked for.
    let mut past = None;
    for i in 1..10 {
        let made = api
            .create(&PostParams::default(), &cm(&format!("f{i}")))
            .await
            .unwrap();
        let rv: u64 = made.metadata.resource_version.unwrap().parse().unwrap();
        if rv > from {
            past = made.metadata.name;
            break;
        }
    }
    let past = past.expect("a write went past the version asked for");
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Added(c) => {
            let rv: u64 = c.metadata.resource_version.unwrap().parse().unwrap();
            assert!(rv > from, "{rv} is after {from}");
            assert_eq!(c.metadata.name, Some(past));
        }
        other => panic!("expected the first change after {from}, got {other:?}"),
    }
}

/// A watch of events.k8s.io/v1 Events sees the core/v1 Events written since, in its version,
/// selected by its own field names; a core/v1 watch sees an events.k8s.io/v1 write.
#[tokio::test]
async fn a_watch_of_either_events_version_sees_writes_through_the_other() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let (_server, client, _stop) = start(None).await;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let v1: Api<Event> = Api::namespaced(client, "default");
    let core_event = |name: &str, about: &str| -> CoreEvent {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": about, "namespace": "default"},
            "reason": "Started", "message": format!("{name} about {about}"), "count": 2,
            "type": "Normal", "source": {"component": "kubelet"}}))
        .unwrap()
    };
    let first = core
        .create(&PostParams::default(), &core_event("before", "p"))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let selected = WatchParams::default()
        .timeout(10)
        .fields("regarding.name=p");
    let stream = v1.watch(&selected, &rv).await.unwrap();
    futures::pin_mut!(stream);
    let core_stream = core
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap();
    futures::pin_mut!(core_stream);
    core.create(&PostParams::default(), &core_event("other", "q"))
        .await
        .unwrap();
    core.create(&PostParams::default(), &core_event("after", "p"))
        .await
        .unwrap();
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Added(event) => {
            assert_eq!(event.metadata.name.as_deref(), Some("after"));
            assert_eq!(event.note.as_deref(), Some("after about p"));
            assert_eq!(event.regarding.and_then(|r| r.name).as_deref(), Some("p"));
            assert_eq!(event.deprecated_count, Some(2));
        }
        other => panic!("expected the core Event about p, got {other:?}"),
    }
    let written: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "new"}, "eventTime": "2026-11-29T06:00:00.000001Z",
        "reportingController": "ctl", "reportingInstance": "i", "action": "Act", "reason": "Why",
        "type": "Normal", "regarding": {"kind": "Pod", "name": "p"}, "note": "through v1"}))
    .unwrap();
    v1.create(&PostParams::default(), &written).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match core_stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(event) => seen.push((
                event.metadata.name.unwrap_or_default(),
                event.message.unwrap_or_default(),
            )),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen[2],
        ("new".to_string(), "through v1".to_string()),
        "{seen:?}"
    );
    // Written back as read (k8s-openapi leaves out the null zero values the answer carried):
    // nothing changes, no new version.
    // Also one a manager applied (its managedFields own the fields the answer renders).
    let applied = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "applied"}, "eventTime": "2026-11-29T06:00:00.000001Z",
        "reportingController": "ctl", "reportingInstance": "i", "action": "Act", "reason": "Why",
        "type": "Normal", "regarding": {"kind": "Pod", "name": "p"}, "note": "applied"});
    v1.patch(
        "applied",
        &kube::api::PatchParams::apply("tester"),
        &kube::api::Patch::Apply(applied),
    )
    .await
    .unwrap();
    for name in ["after", "applied"] {
        let read = v1.get(name).await.unwrap();
        let written = v1
            .replace(name, &PostParams::default(), &read)
            .await
            .unwrap();
        assert_eq!(
            written.metadata.resource_version, read.metadata.resource_version,
            "{name}: {written:?}"
        );
    }
}
