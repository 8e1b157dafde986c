//! The store's tests: durability, history bounds, resuming and refusals.
#![allow(clippy::unwrap_used)]
use super::*;
use durable_log::Options;
use serde_json::json;

fn limits() -> HistoryLimits {
    HistoryLimits {
        count: 1000,
        bytes: 1 << 20,
    }
}

fn put(store: &Store, name: &str, value: Value) -> u64 {
    store
        .write("/configmaps", "ns", name, |_, _| {
            Ok::<_, StoreError>(Write2::Put(value))
        })
        .unwrap()
        .1
}

#[test]
fn depth_counts_objects_and_arrays() {
    assert_eq!(depth(&json!(1)), 0);
    assert_eq!(depth(&json!({"a": [1, {"b": {}}]})), 4);
}

#[tokio::test]
async fn a_write_is_visible_only_after_it_is_durable_and_rvs_continue_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(Some(dir.path()), limits(), Options::default()).unwrap();
    let rv = put(&store, "a", json!({"metadata": {"name": "a"}}));
    store.wait_durable(rv).await.unwrap();
    assert!(store.get("/configmaps", "ns", "a").is_some());
    assert_eq!(store.current_rv(), rv);
    drop(store);
    let store = Store::open(Some(dir.path()), limits(), Options::default()).unwrap();
    assert_eq!(store.current_rv(), rv);
    let next = put(&store, "b", json!({"metadata": {"name": "b"}}));
    assert!(next > rv);
}

#[tokio::test]
async fn a_second_write_reads_the_first_before_it_is_durable() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}, "v": 1}));
    let seen = store
        .write("/configmaps", "ns", "a", |current, _| {
            Ok::<_, StoreError>(match current {
                Some(c) => Write2::Put(
                    json!({"metadata": {"name": "a"}, "v": c["v"].as_i64().unwrap_or(0) + 1}),
                ),
                None => Write2::Keep,
            })
        })
        .unwrap();
    assert_eq!(seen.0.unwrap()["v"], 2);
}

#[tokio::test]
async fn a_watch_from_the_future_hears_every_change_made_after_it_began() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    let rv = put(&store, "a", json!({"metadata": {"name": "a"}}));
    let (backlog, mut live) = store.watch_from("/configmaps", rv + 2).unwrap();
    assert!(backlog.is_empty());
    let later: Vec<u64> = ["b", "c", "d"]
        .iter()
        .map(|name| put(&store, name, json!({"metadata": {"name": name}})))
        .collect();
    // The watcher skips those up to the version it asked for; the store gives them all.
    for want in later {
        assert_eq!(live.recv().await.unwrap().rv, want);
    }
}

#[tokio::test]
async fn a_watcher_hears_only_the_changes_of_its_resource() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    let write = |resource: &str, name: &str| {
        store
            .write(resource, "ns", name, |_, _| {
                Ok::<_, StoreError>(Write2::Put(json!({"metadata": {"name": name}})))
            })
            .unwrap()
            .1
    };
    let first = write("/configmaps", "a");
    write("/secrets", "s");
    let (_, _, mut secrets) = store.snapshot_and_watch("/secrets", None);
    let (backlog, mut maps) = store.watch_from("/configmaps", first - 1).unwrap();
    // The history replays only the resource's own changes.
    assert_eq!(backlog.len(), 1);
    assert_eq!(backlog[0].resource, "/configmaps");
    write("/secrets", "t");
    let b = write("/configmaps", "b");
    assert_eq!(maps.try_recv().unwrap().rv, b);
    assert!(maps.try_recv().is_err());
    assert_eq!(secrets.try_recv().unwrap().object["metadata"]["name"], "t");
    assert!(secrets.try_recv().is_err());
    // A resource whose watchers left loses its feed at its next change, and gets one anew
    // for the next watcher.
    drop(maps);
    write("/configmaps", "c");
    assert!(!store.core.inner.lock().feeds.contains_key("/configmaps"));
    assert!(store.core.inner.lock().feeds.contains_key("/secrets"));
    let (_, _, mut again) = store.snapshot_and_watch("/configmaps", None);
    let d = write("/configmaps", "d");
    assert_eq!(again.try_recv().unwrap().rv, d);
}

#[tokio::test]
async fn a_watcher_too_far_behind_its_feed_resumes_from_the_history() {
    let store = Store::open(
        None,
        HistoryLimits {
            count: 100_000,
            bytes: 1 << 30,
        },
        Options::default(),
    )
    .unwrap();
    let first = put(&store, "a", json!({"metadata": {"name": "a"}}));
    let (_, _, mut live) = store.snapshot_and_watch("/configmaps", None);
    let mut last = first;
    for i in 0..=MAX_FEED {
        last = put(
            &store,
            "a",
            json!({"metadata": {"name": "a"}, "data": {"i": i.to_string()}}),
        );
    }
    // The feed holds at most MAX_FEED changes: this watcher has missed one.
    assert!(matches!(
        live.try_recv(),
        Err(broadcast::error::TryRecvError::Lagged(1))
    ));
    // Its client watches again from the last version it saw: nothing is lost.
    let (backlog, _) = store.watch_from("/configmaps", first).unwrap();
    assert_eq!(backlog.len(), MAX_FEED + 1);
    assert_eq!(backlog.last().map(|c| c.rv), Some(last));
}

#[tokio::test]
async fn the_history_is_bounded_in_bytes() {
    let store = Store::open(
        None,
        HistoryLimits {
            count: 1000,
            bytes: 4096,
        },
        Options::default(),
    )
    .unwrap();
    let big = "x".repeat(1000);
    let mut last = 0;
    for i in 0..20 {
        last = put(
            &store,
            &format!("o{i}"),
            json!({"metadata": {"name": "o"}, "data": big}),
        );
    }
    assert!(matches!(
        store.watch_from("/configmaps", 1),
        Err(Compacted { .. })
    ));
    let (backlog, _) = store.watch_from("/configmaps", last - 2).unwrap();
    assert_eq!(backlog.len(), 2);
}

#[test]
fn objects_too_deep_to_read_back_are_refused() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    let mut deep = json!("leaf");
    for _ in 0..=MAX_DEPTH {
        deep = json!({ "d": deep });
    }
    let result = store.write("/configmaps", "ns", "deep", |_, _| {
        Ok::<_, StoreError>(Write2::Put(deep))
    });
    assert!(matches!(result, Err(StoreError::TooDeep)));
}

#[tokio::test]
async fn an_old_version_is_freed_once_replaced_and_out_of_the_history() {
    let dir = tempfile::tempdir().unwrap();
    // A history of two changes: the first version is held by the first change and, as its
    // `previous`, by the second, so it is freed when the second leaves, at the fourth write.
    // (`wait_durable` returns after the log's report has published the write.)
    let limits = HistoryLimits {
        count: 2,
        bytes: 1 << 20,
    };
    let store = Store::open(Some(dir.path()), limits, Options::default()).unwrap();
    let rv = put(&store, "a", json!({"metadata": {"name": "a"}, "v": 1}));
    store.wait_durable(rv).await.unwrap();
    let first = Arc::downgrade(&store.get("/configmaps", "ns", "a").unwrap());
    let rv = put(&store, "a", json!({"metadata": {"name": "a"}, "v": 2}));
    store.wait_durable(rv).await.unwrap();
    // Replaced, but the history still holds it (a watch may resume before the second).
    assert!(first.upgrade().is_some());
    let rv = put(&store, "b", json!({"metadata": {"name": "b"}}));
    store.wait_durable(rv).await.unwrap();
    let rv = put(&store, "c", json!({"metadata": {"name": "c"}}));
    store.wait_durable(rv).await.unwrap();
    assert!(first.upgrade().is_none(), "the first version is still held");
    assert_eq!(store.get("/configmaps", "ns", "a").unwrap()["v"], 2);
}

/// A release before 2026-11-29 stored events.k8s.io/v1 Events apart; opening its data moves
/// them to the core Events, converted, in the order written (a later deletion of the moved
/// Event through the core key stays deleted).
#[tokio::test]
async fn events_v1_stored_apart_by_an_older_release_are_moved_to_the_core_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(Some(dir.path()), limits(), Options::default()).unwrap();
    let old_key = "events.k8s.io/events";
    let v1 = |name: &str| {
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
            "eventTime": "2026-11-28T10:00:00.000001Z", "reportingController": "ctl",
            "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal",
            "regarding": {"kind": "Pod", "name": "p"}, "note": "n"})
    };
    let mut rv = 0;
    for name in ["kept", "gone", "deleted-before"] {
        let value = v1(name);
        rv = store
            .write(old_key, "ns", name, |_, _| {
                Ok::<_, StoreError>(Write2::Put(value))
            })
            .unwrap()
            .1;
    }
    // A deletion the older release wrote.
    let rv = store
        .write(old_key, "ns", "deleted-before", |_, _| {
            Ok::<_, StoreError>(Write2::Delete)
        })
        .unwrap()
        .1
        .max(rv);
    store.wait_durable(rv).await.unwrap();
    drop(store);
    let store = Store::open(Some(dir.path()), limits(), Options::default()).unwrap();
    assert!(store.get(old_key, "ns", "kept").is_none());
    assert!(store.get("/events", "ns", "deleted-before").is_none());
    let moved = store.get("/events", "ns", "kept").unwrap();
    assert_eq!(moved["apiVersion"], "v1");
    assert_eq!(moved["message"], "n");
    assert_eq!(moved["involvedObject"]["name"], "p");
    assert_eq!(moved["reportingComponent"], "ctl");
    let rv = store
        .write("/events", "ns", "gone", |_, _| {
            Ok::<_, StoreError>(Write2::Delete)
        })
        .unwrap()
        .1;
    store.wait_durable(rv).await.unwrap();
    drop(store);
    let store = Store::open(Some(dir.path()), limits(), Options::default()).unwrap();
    assert!(store.get("/events", "ns", "gone").is_none());
    assert_eq!(store.get("/events", "ns", "kept").unwrap()["message"], "n");
    assert_eq!(store.list("/events", Some("ns")).0.len(), 1);
}

/// A namespace's objects, resource by resource: neither another namespace whose name starts
/// the same nor a resource whose name extends another's is mixed in.
#[test]
fn a_namespaces_objects_are_found_resource_by_resource() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    for (resource, namespace, name) in [
        ("/configmaps", "ns", "a"),
        ("/configmaps", "ns", "b"),
        ("/configmaps", "ns2", "c"),
        ("/configmaps", "n", "d"),
        ("/configmapsx", "ns", "e"),
        ("/events", "", "cluster-wide"),
        ("/events", "ns", "f"),
        ("/pods", "other", "g"),
        ("/secrets", "ns", "h"),
    ] {
        store
            .write(resource, namespace, name, |_, _| {
                Ok::<_, StoreError>(Write2::Put(json!({"metadata": {"name": name}})))
            })
            .unwrap();
    }
    let pairs = |list: Vec<(String, String)>| {
        list.into_iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        pairs(store.in_namespace("ns")),
        [
            "/configmaps a",
            "/configmaps b",
            "/configmapsx e",
            "/events f",
            "/secrets h"
        ]
    );
    assert_eq!(pairs(store.in_namespace("ns2")), ["/configmaps c"]);
    assert_eq!(pairs(store.in_namespace("n")), ["/configmaps d"]);
    assert!(store.in_namespace("none").is_empty());
}
