//! The store's tests: durability, history bounds, resuming and refusals.
#![allow(clippy::unwrap_used)]
use super::*;
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
async fn a_watch_cannot_resume_from_the_future() {
    let store = Store::open(None, limits(), Options::default()).unwrap();
    let rv = put(&store, "a", json!({"metadata": {"name": "a"}}));
    assert!(store.watch_from(rv).is_ok());
    assert_eq!(
        store.watch_from(rv + 5).err(),
        Some(ResumeError::TooLarge(rv))
    );
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
    assert!(matches!(store.watch_from(1), Err(ResumeError::Gone(_))));
    let (backlog, _) = store.watch_from(last - 2).unwrap();
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
